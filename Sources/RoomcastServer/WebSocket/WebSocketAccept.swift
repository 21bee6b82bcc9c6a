import COpenSSL
import RoomcastCore

/// The `Sec-WebSocket-Accept` value for a client's `Sec-WebSocket-Key`
/// (RFC 6455 §4.2.2 item 5.4): base64 of the SHA-1 of the key followed by
/// the protocol's GUID, both from OpenSSL's libcrypto (EVP_Digest,
/// EVP_EncodeBlock). Always 28 characters. The key is not secret: it may
/// be logged.
///
/// - Returns: nil only if libcrypto fails (no SHA-1 in the provider: a
///   broken installation); the caller answers 500 and closes.
func webSocketAccept(key: String) -> String? {
    var input = Array(WebSocketHandshake.acceptInput(key: key).utf8)
    var digest = [UInt8](repeating: 0, count: Int(SHA_DIGEST_LENGTH))
    var digestLength: UInt32 = 0
    let ok = input.withUnsafeMutableBytes { i in
        digest.withUnsafeMutableBufferPointer { d in
            EVP_Digest(i.baseAddress, i.count, d.baseAddress, &digestLength, EVP_sha1(), nil)
        }
    }
    guard ok == 1, digestLength == SHA_DIGEST_LENGTH else { return nil }
    // 20 bytes give 28 base64 characters and EVP_EncodeBlock's NUL.
    var encoded = [UInt8](repeating: 0, count: 29)
    let n = encoded.withUnsafeMutableBufferPointer { e in
        digest.withUnsafeBufferPointer { EVP_EncodeBlock(e.baseAddress, $0.baseAddress, Int32($0.count)) }
    }
    guard n == 28 else { return nil }
    return String(decoding: encoded[0..<28], as: UTF8.self)
}
