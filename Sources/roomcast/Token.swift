import RoomcastCrypto
import Glibc
import RoomcastCore

// `roomcast token`: a development token (docs/protocol/tokens.md §13), HS256 with
// OpenSSL's HMAC, from a line of an `[auth] key_file`.

/// Mints and prints the token `invocation` describes.
/// - Returns: 0, or 1 with a one-line reason on stderr (unreadable key
///   file, no such kid, a kid that is not HS256).
func runToken(_ invocation: Invocation) -> Int32 {
    func fail(_ message: String) -> Int32 {
        _ = writeAll(2, "roomcast token: \(message)\n")
        return 1
    }
    guard let path = invocation.keyFile, let kid = invocation.kid, let sub = invocation.sub else { return 1 }
    guard let f = fopen(path, "r") else { return fail("\(path): \(String(cString: strerror(errno)))") }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = fread(&chunk, 1, chunk.count, f)
        if n == 0 { break }
        bytes += chunk[0..<n]
    }
    fclose(f)
    let keys: TokenKeySet
    do {
        keys = try TokenKeySet.parse(String(decoding: bytes, as: UTF8.self), file: path)
    } catch {
        return fail(error.description)
    }
    guard let key = keys.key(kid) else { return fail("\(path) has no key '\(kid)' (it has \(keys.keys.map(\.id).joined(separator: ", ")))") }
    guard key.algorithm == .hs256 else {
        return fail("key '\(kid)' is \(key.algorithm.rawValue): a key file holds only its public half, which cannot sign; use an HS256 key")
    }
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    var claims = TokenClaims(sub: sub, exp: Int64(ts.tv_sec) + Int64(invocation.ttlMs / 1000), name: invocation.name,
                             rooms: [invocation.room ?? "*"])
    claims.nbf = nil
    let header = #"{"alg":"HS256","kid":"# + jsonStringLiteral(kid) + #","typ":"JWT"}"#
    let input = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(claims.json)
    guard let mac = hmacSHA256(key: key.key, data: Array(input.utf8)) else { return fail("HMAC-SHA256 failed in OpenSSL") }
    _ = writeAll(1, input + "." + Base64URL.encode(mac) + "\n")
    return 0
}
