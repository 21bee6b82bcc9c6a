// The pure parts of signed joins (docs/protocol/tokens.md §13): base64url, the
// JSON reader, the JWS parts, the claims and their clock, the key file,
// the Notice message and the removal of UserInfo field 5.
import Testing
@testable import RoomcastCore

@Suite struct Base64URLTests {
    @Test("RFC 4648 §10 vectors, in the URL alphabet and without padding")
    func vectors() {
        for (plain, encoded) in [("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy")] {
            #expect(Base64URL.encode(Array(plain.utf8)) == encoded)
            #expect(Base64URL.decode(encoded) == Array(plain.utf8))
        }
        #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
        #expect(Base64URL.decode("-_8") == [0xFB, 0xFF])
    }

    @Test("refused: padding, the base64 alphabet, 4n+1 characters, non-zero trailing bits", arguments: ["Zg==", "+/8", "/_8", "Zm9vY", "Zh", "Zm9=", " Zg"])
    func refused(text: String) {
        #expect(Base64URL.decode(text) == nil)
    }
}

@Suite struct JSONReaderTests {
    @Test func values() throws {
        let v = try parseJSON(Array(#" {"a": [1, -2.5e1, true, false, null], "b": "x\"\u00e9\ud83d\ude00\n"} "#.utf8))
        #expect(v["a"] == .array([.number(1), .number(-25), .bool(true), .bool(false), .null]))
        #expect(v["b"] == .string("x\"é😀\n"))
    }

    @Test("refused", arguments: [#"{"a":1,}"#, #"{"a":1,"a":2}"#, "[01]", #""\ud800""#, "{} x", "'a'", "[1,]", #"{"a" 1}"#, "NaN", "1e999", "\"\u{01}\""])
    func refused(text: String) {
        #expect(throws: JSONError.self) { try parseJSON(Array(text.utf8)) }
    }

    @Test func depthIsBounded() {
        #expect(throws: JSONError.self) { try parseJSON(Array((String(repeating: "[", count: 100) + String(repeating: "]", count: 100)).utf8)) }
        #expect(throws: JSONError.self) { try parseJSON([0x22, 0xC3, 0x28, 0x22]) }  // invalid UTF-8 in a string
    }
}

/// A token from parts (not signed: these tests stop before the signature).
private func token(header: String, payload: String, signature: [UInt8] = [1, 2, 3]) -> [UInt8] {
    Array((Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(Array(payload.utf8)) + "." + Base64URL.encode(signature)).utf8)
}

@Suite struct TokenTests {
    @Test func partsAndHeader() throws {
        let t = token(header: #"{"alg":"HS256","kid":"k1","typ":"JWT"}"#, payload: #"{"sub":"a","exp":5}"#)
        let jws = try CompactJWS(t)
        #expect(jws.algorithm == "HS256" && jws.keyID == "k1" && jws.signature == [1, 2, 3])
        #expect(jws.payload == Array(#"{"sub":"a","exp":5}"#.utf8))
        #expect(jws.signingInput == Array(t[..<t.lastIndex(of: UInt8(ascii: "."))!]))
    }

    @Test("malformed tokens and alg none", arguments: [
        ("a.b", "token_invalid"), ("a.b.c.d", "token_invalid"), ("", "token_invalid"),
    ])
    func malformed(text: String, code: String) {
        #expect(throws: TokenError.self) { try CompactJWS(Array(text.utf8)) }
    }

    @Test func algNoneAndHeaders() {
        #expect(throws: TokenError.algorithmNone) { try CompactJWS(token(header: #"{"alg":"none","kid":"k"}"#, payload: "{}")) }
        #expect(throws: TokenError.malformed("header has no string 'kid'")) { try CompactJWS(token(header: #"{"alg":"HS256"}"#, payload: "{}")) }
        #expect(throws: TokenError.self) { try CompactJWS(token(header: #"{"alg":"HS256","kid":"k","crit":["x"]}"#, payload: "{}")) }
        #expect(throws: TokenError.self) { try CompactJWS(token(header: "[1]", payload: "{}")) }
        #expect(throws: TokenError.self) { try CompactJWS([UInt8](repeating: 0x41, count: CompactJWS.maxBytes + 1)) }
    }

    @Test func claims() throws {
        let c = try TokenClaims(json: Array(#"{"sub":"u1","exp":1700000000.9,"nbf":1,"name":"Al","level":7,"icon":"http://i","rooms":["a","*"],"role":"moderator","may":["text",42,"gift","7"],"iat":99999999999,"iss":"x"}"#.utf8))
        #expect(c == TokenClaims(sub: "u1", exp: 1_700_000_000, nbf: 1, name: "Al", level: 7, icon: "http://i", rooms: ["a", "*"],
                                 role: .moderator, may: [2, 42, 3, 7]))
        #expect(c.displayName == "Al")
        let minimal = try TokenClaims(json: Array(#"{"sub":"u1","exp":5}"#.utf8))
        #expect(minimal.role == .viewer && minimal.may == nil && minimal.rooms == nil && minimal.displayName == "u1")
    }

    @Test("claims refused", arguments: [
        #"{"exp":5}"#, #"{"sub":"a"}"#, #"{"sub":1,"exp":5}"#, #"{"sub":"a","exp":"5"}"#, #"{"sub":"a","exp":5,"rooms":"a"}"#,
        #"{"sub":"a","exp":5,"role":"admin"}"#, #"{"sub":"a","exp":5,"may":["shout"]}"#, #"{"sub":"a","exp":5,"may":[70000]}"#,
        #"{"sub":"a","exp":5,"level":1.5}"#, "[]",
    ])
    func claimsRefused(json: String) {
        #expect(throws: TokenError.self) { try TokenClaims(json: Array(json.utf8)) }
    }

    @Test("exp and nbf with 30 s of leeway; iat never")
    func clock() throws {
        let c = TokenClaims(sub: "a", exp: 1000, nbf: 500)
        try c.checkTime(now: 1000)
        try c.checkTime(now: 1010)  // 10 s past exp still joins
        try c.checkTime(now: 1030)
        #expect(throws: TokenError.expired(exp: 1000, now: 1031)) { try c.checkTime(now: 1031) }
        try c.checkTime(now: 470)
        #expect(throws: TokenError.notYetValid(nbf: 500, now: 469)) { try c.checkTime(now: 469) }
        #expect(TokenError.expired(exp: 1, now: 100).code == "token_expired")
        #expect(TokenError.roomForbidden(room: "x").code == "room_forbidden")
        #expect(TokenError.badSignature(kid: "k").code == "token_invalid")
    }

    @Test("rooms: bytes compared, * any, none given: only the default room")
    func rooms() {
        let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
        #expect(TokenClaims(sub: "a", exp: 1, rooms: [nfc]).permits(room: nfc, defaultRoom: "lobby"))
        #expect(!TokenClaims(sub: "a", exp: 1, rooms: [nfc]).permits(room: nfd, defaultRoom: "lobby"))
        #expect(TokenClaims(sub: "a", exp: 1, rooms: ["*"]).permits(room: nfd, defaultRoom: "lobby"))
        #expect(TokenClaims(sub: "a", exp: 1).permits(room: "lobby", defaultRoom: "lobby"))
        #expect(!TokenClaims(sub: "a", exp: 1).permits(room: "other", defaultRoom: "lobby"))
    }
}

@Suite struct KeyFileTests {
    static let secret = Base64URL.encode([UInt8](repeating: 7, count: 32))
    static let pub = Base64URL.encode([UInt8](repeating: 9, count: 32))

    @Test func parses() throws {
        let set = try TokenKeySet.parse("# keys\n\n  a HS256 \(Self.secret)  # comment\nb\tEdDSA\t\(Self.pub)\r\n", file: "k")
        #expect(set.keys == [TokenKey(id: "a", algorithm: .hs256, key: [UInt8](repeating: 7, count: 32)),
                             TokenKey(id: "b", algorithm: .edDSA, key: [UInt8](repeating: 9, count: 32))])
        #expect(set.key("b")?.algorithm == .edDSA && set.key("c") == nil)
        #expect(set.keys[0].description == "a (HS256)")
    }

    @Test("bad lines are refused with their line, never quoting a key", arguments: [
        ("a HS256", 1, "expected 'KID ALG KEY' (3 fields), found 2"),
        ("\na RS256 \(secret)", 2, "algorithm 'RS256' is not HS256 or EdDSA"),
        ("a HS256 \(secret)=", 1, "KEY is not base64url"),
        ("a HS256 AAAA", 1, "an HS256 secret of 3 bytes is too short"),
        ("a EdDSA \(secret)AAAA", 1, "an Ed25519 public key is 32 bytes, this one 35"),
        ("a HS256 \(secret)\na EdDSA \(pub)", 2, "key 'a' is listed twice"),
    ])
    func refused(text: String, line: Int, reason: String) throws {
        let error = try #require(throws: ConfigError.self) { try TokenKeySet.parse(text, file: "k") }
        #expect(error.line == line)
        #expect(error.reason.contains(reason), "\(error.reason)")
        #expect(!error.reason.contains(Self.secret) && !error.reason.contains(Self.pub))
    }

    @Test func emptyFileIsRefused() {
        #expect(throws: ConfigError(file: "k", line: nil, reason: "no key (expected lines of 'KID ALG KEY')")) {
            try TokenKeySet.parse("# nothing\n", file: "k")
        }
    }
}

@Suite struct SignedJoinWireTests {
    @Test("field 5 is removed, every other byte kept in its order, unknown fields included")
    func removingToken() throws {
        let plain = UserInfo(level: 5, name: "alice", iconURL: "http://x/a.png", room: "lobby").serialized()
        let withToken = UserInfo(level: 5, name: "alice", iconURL: "http://x/a.png", room: "lobby", token: "t.o.k").serialized()
        #expect(withToken.withUnsafeBytes { UserInfo.removingDaemonFields($0) } == plain)
        #expect(plain.withUnsafeBytes { UserInfo.removingDaemonFields($0) } == nil, "nothing to remove")
        // A token before the name, twice, and an unknown field 9 after it: only field 5 goes.
        let odd: [UInt8] = [0x2A, 1, 0x61] + [0x08, 5, 0x12, 1, 0x62, 0x1A, 0] + [0x2A, 2, 0x62, 0x63] + [0x48, 1]
        #expect(odd.withUnsafeBytes { UserInfo.removingDaemonFields($0) } == [0x08, 5, 0x12, 1, 0x62, 0x1A, 0, 0x48, 1])
        #expect(try UserInfo(protobuf: withToken).token == "t.o.k")
    }

    @Test("the relay relays a join and remembers it for the synthesized leave without its token")
    func relayStripsToken() throws {
        final class Sink: FrameSink {
            var frames: [[UInt8]] = []
            func broadcast(_ frame: UnsafeRawBufferPointer, from sender: Int, to members: [Int], except: Int) -> Int {
                frames.append(Array(frame)); return members.count
            }
        }
        var relay = Relay(settings: RelaySettings())
        let sink = Sink()
        relay.connect(0)
        relay.connect(1)
        let join = FrameCodec.encode(type: 0, body: UserInfo(level: 1, name: "a", iconURL: "", token: "secret").serialized(), byteOrder: .little)
        _ = join.withUnsafeBytes { relay.receive(from: 0, type: 0, frame: $0, sink: sink) }
        relay.disconnect(0, sink: sink)
        let plain = UserInfo(level: 1, name: "a", iconURL: "").serialized()
        #expect(sink.frames == [FrameCodec.encode(type: 0, body: plain, byteOrder: .little), FrameCodec.encode(type: 1, body: plain, byteOrder: .little)])
        // A client may not send a notice.
        let notice = FrameCodec.encode(type: 9, body: Notice(code: "x").serialized(), byteOrder: .little)
        let event = notice.withUnsafeBytes { relay.receive(from: 1, type: 9, frame: $0, sink: sink) }
        guard case .rejected(_, 1, false, .noticeFromClient) = event else { Issue.record("\(event)"); return }
    }

    @Test func notice() throws {
        let n = Notice(code: "token_expired", text: "bye", retryAfterMs: 1500, count: -1)
        #expect(try Notice(protobuf: n.serialized()) == n)
        #expect(Notice(code: "a").serialized() == [0x0A, 1, 0x61])
        #expect(throws: ProtoError.missingRequired(message: "Notice", name: "code")) { try Notice(protobuf: [0x18, 1]) }
    }
}

@Suite struct AuthConfigTests {
    @Test("[auth] and protocol.notice_type: bad values and broken rules are refused with their line", arguments: [
        ("[auth]\nrequired = yes\n", 2, "auth.required = yes needs auth.key_file"),
        ("[auth]\nkey_file = /k\nanonymous = read\n", 3, "auth.anonymous = read only applies with auth.required = yes"),
        ("[auth]\nkey_file = keys\n", 2, "auth.key_file: 'keys' is not an absolute path"),
        ("[auth]\nviewer_may = text, shout\n", 2, "auth.viewer_may: 'shout' is not text, gift or a frame type number"),
        ("[auth]\nanonymous = write\n", 2, "auth.anonymous: 'write' is not one of none, read"),
        ("[protocol]\nnotice_type = 8\n", 2, "protocol.notice_type: 8 is the same as protocol.heartbeat_type"),
    ])
    func refused(text: String, line: Int, reason: String) throws {
        let error = try #require(throws: ConfigError.self) { try Config.parse(text, file: "t") }
        #expect(error.line == line && error.reason.hasPrefix(reason), "\(error)")
    }

    @Test func defaults() {
        #expect(Config.defaults.auth == .init(keyFile: "", required: false, anonymous: .none, viewerMay: [2]))
        #expect(Config.defaults.protocol.noticeType == 9)
    }
}
