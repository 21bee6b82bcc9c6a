import COpenSSL

/// HMAC-SHA256 (RFC 2104 with SHA-256) from OpenSSL's libcrypto: the JWS
/// `HS256` of signed joins (RFC 7518 §3.2), which the daemon verifies and
/// `roomcast token` signs. Cryptography is never the project's own code.
/// - Parameters:
///   - key: the shared secret, any length (bytes).
///   - data: the signing input (bytes).
/// - Returns: the 32-byte MAC, or nil when OpenSSL fails.
public func hmacSHA256(key: [UInt8], data: [UInt8]) -> [UInt8]? {
    var mac = [UInt8](repeating: 0, count: 32)
    var length: UInt32 = 0
    let ok = key.withUnsafeBufferPointer { k in
        data.withUnsafeBufferPointer { d in
            mac.withUnsafeMutableBufferPointer { m in
                HMAC(EVP_sha256(), k.baseAddress, Int32(k.count), d.baseAddress, d.count, m.baseAddress, &length) != nil
            }
        }
    }
    return ok && length == 32 ? mac : nil
}
