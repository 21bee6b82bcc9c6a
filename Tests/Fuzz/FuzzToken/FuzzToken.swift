// libFuzzer target: the token parser (base64url, the JWS header, the
// claims' JSON and their checks) never crashes on any input, and what it
// accepts is consistent: a decoded part re-encodes to the same text, and
// claims it reads pass or fail the clock check without trapping.
// Build and run: `make fuzz`.
import RoomcastCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzToken(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: data == nil ? 0 : size))
    if let decoded = Base64URL.decode(bytes) {
        precondition(Array(Base64URL.encode(decoded).utf8) == bytes, "base64url is not canonical")
    }
    _ = try? parseJSON(bytes)
    _ = try? TokenClaims(json: bytes).checkTime(now: 1_800_000_000)
    if let jws = try? CompactJWS(bytes) {
        precondition(jws.signingInput.count < bytes.count, "signing input longer than the token")
        if let claims = try? TokenClaims(json: jws.payload) {
            _ = claims.permits(room: "lobby", defaultRoom: "lobby")
            _ = try? claims.checkTime(now: claims.exp)
        }
    }
    return 0
}
