import COpenSSL

/// SHA-256 (FIPS 180-4) from OpenSSL's libcrypto (EVP_Digest): the
/// fingerprint of an API request by `Idempotency-Key` (docs/api.md), so that
/// a key reused with another request is told apart without keeping the body.
/// - Parameter data: the bytes to digest.
/// - Returns: the 32-byte digest, or nil when OpenSSL fails.
public func sha256(_ data: [UInt8]) -> [UInt8]? {
    var digest = [UInt8](repeating: 0, count: 32)
    var length: UInt32 = 0
    let ok = data.withUnsafeBufferPointer { d in
        digest.withUnsafeMutableBufferPointer { m in
            EVP_Digest(d.baseAddress, d.count, m.baseAddress, &length, EVP_sha256(), nil) == 1
        }
    }
    return ok && length == 32 ? digest : nil
}
