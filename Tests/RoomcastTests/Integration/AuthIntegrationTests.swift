// Signed joins against the real roomcastd (docs/protocol/tokens.md §13), with
// tokens minted by PyJWT (Reference/jwt_mint.py), an implementation that is
// not ours. Needs python3 with `pip install pyjwt cryptography` (make deps).
import Foundation
import Glibc
import RoomcastCore
import Testing

/// Mints tokens with PyJWT: one request object per token (see jwt_mint.py).
func mintTokens(_ requests: [[String: Any]]) throws -> [String] {
    let lines = try requests.map { String(decoding: try JSONSerialization.data(withJSONObject: $0), as: UTF8.self) }
    let (out, err) = try runReferenceScript("jwt_mint.py", lines: lines, needs: "`pip install pyjwt cryptography`")
    let tokens = String(decoding: out, as: UTF8.self).split(separator: "\n").map(String.init)
    guard tokens.count == requests.count else { throw HarnessError("\(requests.count) requests, \(tokens.count) tokens: \(err)") }
    return tokens
}

/// Keys and a key file for the tests.
struct TestKeys {
    static let secret = Base64URL.encode((0..<32).map { UInt8($0) &* 7 &+ 1 })
    static let otherSecret = Base64URL.encode((0..<32).map { UInt8($0) &* 11 &+ 3 })
    static let seed = Base64URL.encode((0..<32).map { UInt8($0) })
    /// The Ed25519 public key of `seed`, as PyJWT's `cryptography` derives it.
    static let publicKey: String = (try? mintTokens([["op": "pub", "seed": seed]]).first) ?? ""

    static var now: Int { Int(Date().timeIntervalSince1970) }

    /// Writes a key file with mode 600 and returns its path.
    static func writeKeyFile(_ dir: TempDirectory, _ text: String, name: String = "keys", mode: mode_t = 0o600) throws -> String {
        let path = try dir.write(name, text)
        chmod(path, mode)
        return path
    }

    static var fileText: String { "# test keys\nhs1 HS256 \(secret)\n\ned1\tEdDSA \(publicKey)  # the public half\n" }

    static func hs(_ claims: [String: Any], kid: String = "hs1", secret: String = secret, tamper: Bool = false) -> [String: Any] {
        ["alg": "HS256", "kid": kid, "secret": secret, "claims": claims, "tamper": tamper]
    }
    static func ed(_ claims: [String: Any], kid: String = "ed1") -> [String: Any] {
        ["alg": "EdDSA", "kid": kid, "seed": seed, "claims": claims]
    }
}

/// A daemon with `[auth]` on, its key file in a directory of its own.
final class AuthDaemon {
    let keysDir: TempDirectory
    let keyPath: String
    let daemon: Daemon

    init(_ settings: [String: String] = [:], keys: String = TestKeys.fileText) throws {
        keysDir = try TempDirectory()
        keyPath = try TestKeys.writeKeyFile(keysDir, keys)
        daemon = try Daemon(["auth.key_file": keyPath].merging(settings) { $1 })
    }
}

/// Notices the daemon sent (frames of type 9), decoded.
func notices(_ frames: [Frame]) -> [Notice] {
    frames.filter { $0.type == 9 }.compactMap { try? Notice(protobuf: $0.body) }
}

/// The first notice `c` receives within `timeout` (other frames are skipped).
func nextNotice(_ c: TestClient, timeout: Duration = .seconds(3)) -> Notice? {
    let deadline = monotonicMs() + Int64(timeout.ms)
    while monotonicMs() < deadline {
        guard let f = c.receiveFrame(timeout: .milliseconds(max(1, deadline - monotonicMs()))) else { return nil }
        if f.type == 9 { return try? Notice(protobuf: f.body) }
    }
    return nil
}

func user(_ name: String, room: String? = nil, token: String? = nil) -> UserInfo {
    UserInfo(level: 3, name: name, iconURL: "https://img.example/\(name).png", room: room, token: token)
}

@Suite("Signed joins (real roomcastd, tokens from PyJWT)", .serialized)
struct AuthIntegrationTests {
    @Test("every bad token is refused with its notice code, the connection stays open, the journal says why without the token")
    func refusalTable() throws {
        let a = try AuthDaemon(["auth.required": "yes"])
        let d = a.daemon
        let now = TestKeys.now
        let good: [String: Any] = ["sub": "alice", "exp": now + 600, "rooms": ["stage"]]
        let nfc = "jos\u{E9}", nfd = "jose\u{301}"
        let cases: [(what: String, request: [String: Any], name: String, room: String, code: String)] = [
            ("alg none", ["alg": "none", "kid": "hs1", "claims": good], "alice", "stage", "token_invalid"),
            ("HS256 signed with ed1's public key (a key of the wrong type)",
             TestKeys.hs(good, kid: "ed1", secret: TestKeys.publicKey), "alice", "stage", "token_invalid"),
            ("bad signature (another secret)", TestKeys.hs(good, secret: TestKeys.otherSecret), "alice", "stage", "token_invalid"),
            ("tampered payload", TestKeys.hs(good, tamper: true), "mallory", "stage", "token_invalid"),
            ("unknown kid", TestKeys.hs(good, kid: "nope"), "alice", "stage", "token_invalid"),
            ("exp 60 s past", TestKeys.hs(["sub": "alice", "exp": now - 60, "rooms": ["stage"]]), "alice", "stage", "token_expired"),
            ("nbf 60 s ahead", TestKeys.ed(["sub": "alice", "exp": now + 600, "nbf": now + 60, "rooms": ["stage"]]), "alice", "stage", "token_invalid"),
            ("room outside rooms", TestKeys.hs(good), "alice", "backstage", "room_forbidden"),
            ("sub NFC, UserInfo name NFD", TestKeys.ed(["sub": nfc, "exp": now + 600, "rooms": ["*"]]), nfd, "stage", "identity_mismatch"),
            ("no token at all", [:], "alice", "stage", "token_required"),
        ]
        let tokens = try mintTokens(cases.filter { !$0.request.isEmpty }.map(\.request))
        var minted = tokens.makeIterator()
        var table: [String] = ["| bad token | client got | journal got |", "|---|---|---|"]
        for c in cases {
            let token = c.request.isEmpty ? nil : minted.next()!
            let client = try d.connect()
            try client.send(Wire.join(user(c.name, room: c.room, token: token)))
            let notice = try #require(nextNotice(client), "\(c.what): no notice")
            #expect(notice.code == c.code, "\(c.what): \(notice)")
            #expect(notice.count == 1, "\(c.what): one violation so far")
            client.expectOpen()
            let line = d.stderr.wait(forLineWith: ["REASON=\(c.code)", client.address], timeout: .seconds(3))
            #expect(line, "\(c.what): no log line")
            let logged = d.stderr.line(with: ["REASON=\(c.code)", client.address]) ?? ""
            if let token, let signature = token.split(separator: ".", omittingEmptySubsequences: false).last, !signature.isEmpty {
                #expect(!d.stderr.current.contains(signature), "\(c.what): the signature reached the log")
            }
            #expect(token.map { !d.stderr.current.contains($0) } ?? true, "\(c.what): the token reached the log")
            let detail = logged.range(of: "refused ").map { String(logged[$0.upperBound...].prefix(150)) } ?? logged
            table.append("| \(c.what) | `\(notice.code)`: \(notice.text ?? "") | REASON=\(c.code): \(detail) |")
        }
        print(table.joined(separator: "\n"))

        // 10 s past exp still joins (30 s leeway), and so does a good EdDSA token.
        let late = try mintTokens([TestKeys.hs(["sub": "alice", "exp": now - 10, "rooms": ["stage"]]),
                                   TestKeys.ed(["sub": "bob", "exp": now + 600, "rooms": ["*"], "iat": now + 3600])])
        let alice = try d.connect(), bob = try d.connect()
        try bob.send(Wire.join(user("bob", room: "stage", token: late[1])))
        #expect(bob.receiveFrame()?.wire == Wire.join(user("bob", room: "stage")), "bob joins (an iat in the future is no reason to refuse)")
        try alice.send(Wire.join(user("alice", room: "stage", token: late[0])))
        #expect(bob.receiveFrame()?.wire == Wire.join(user("alice", room: "stage")), "10 s past exp still joins; relayed without field 5")
    }

    @Test("a mismatched name is refused (identity_mismatch) while the rest relays byte-identical; not_permitted outside may")
    func identityAndMay() throws {
        let d = try AuthDaemon().daemon
        let now = TestKeys.now
        let t = try mintTokens([TestKeys.hs(["sub": "u-1", "name": "alice", "exp": now + 600, "rooms": ["stage"]]),
                                TestKeys.ed(["sub": "u-2", "name": "bob", "exp": now + 600, "rooms": ["stage"], "may": ["text", "gift", 42]])])
        let a = try d.connect(), b = try d.connect()
        let alice = user("alice", room: "stage"), bob = user("bob", room: "stage")
        try a.send(Wire.join(user("alice", room: "stage", token: t[0])))
        #expect(a.receiveFrame()?.wire == Wire.join(alice), "the echo carries fields 1-4 as sent, no token")
        try b.send(Wire.join(user("bob", room: "stage", token: t[1])))
        #expect(a.receiveFrame()?.wire == Wire.join(bob), "bob's join reaches alice without field 5")
        #expect(b.receiveFrame()?.wire == Wire.join(bob))

        // Alice claims to be bob: refused, told, relayed nowhere.
        try a.send(Wire.text(Wire.user("bob"), "sent 99 x yacht"))
        #expect(nextNotice(a)?.code == "identity_mismatch")
        b.expectNoFrame(within: .milliseconds(200), "(the forged text)")
        // A viewer (viewer_may = text) may not send a gift or an opaque frame.
        try a.send(Wire.gift(user("alice"), "yacht", count: 99))
        #expect(nextNotice(a)?.code == "not_permitted")
        try a.send(Wire.frame(42, [1, 2, 3]))
        #expect(nextNotice(a)?.code == "not_permitted", "third violation")
        a.expectClosed(within: .seconds(2), "(protocol.max_violations = 3 counts refusals)")
        #expect(b.receiveFrame()?.wire == Wire.leave(alice), "bob hears only alice's (token-free) leave")

        // Bob's honest text, gift and opaque frame arrive byte for byte.
        let c = try d.connect()
        let carol = try mintTokens([TestKeys.hs(["sub": "carol", "exp": now + 600, "rooms": ["stage"]])])[0]
        try c.send(Wire.join(user("carol", room: "stage", token: carol)))
        #expect(b.receiveFrame()?.wire == Wire.join(user("carol", room: "stage")))
        #expect(c.receiveFrame()?.wire == Wire.join(user("carol", room: "stage")))
        let frames = [Wire.text(Wire.user("bob"), "hi"), Wire.gift(Wire.user("bob"), "rose", count: 3), Wire.frame(42, [9, 8, 7])]
        for f in frames { try b.send(f) }
        #expect(c.receiveFrames(3).map(\.wire) == frames, "texts, gifts and opaque frames are never rewritten")
    }

    @Test("the token's level and icon bind the UserInfo; a moderator may send gifts and opaque frames without may; signed joins over WebSocket, JSON and LTB subprotocols")
    func claimsRolesAndWebSocket() throws {
        let d = try AuthDaemon(["websocket.listen": "127.0.0.1:0"]).daemon
        let now = TestKeys.now
        let t = try mintTokens([
            TestKeys.hs(["sub": "m-1", "name": "mod", "level": 3, "icon": "https://img.example/mod.png", "exp": now + 600,
                         "rooms": ["stage"], "role": "moderator"]),
            TestKeys.hs(["sub": "web", "exp": now + 600, "rooms": ["stage"]]),
            TestKeys.hs(["sub": "ws-ltb", "exp": now + 600, "rooms": ["stage"]]),
        ])
        let m = try d.connect()
        var forged = user("mod", room: "stage", token: t[0])
        forged.level = 99
        try m.send(Wire.join(forged))
        #expect(nextNotice(m)?.code == "identity_mismatch", "a level the token does not give")
        forged.level = 3
        forged.iconURL = "https://img.example/other.png"
        try m.send(Wire.join(forged))
        #expect(nextNotice(m)?.code == "identity_mismatch", "an icon the token does not give")
        try m.send(Wire.join(user("mod", room: "stage", token: t[0])))
        #expect(m.receiveFrame()?.wire == Wire.join(user("mod", room: "stage")))

        // roomcast.json.v1: the nickname command's token; roomcast.ltb.v1: a join frame with field 5.
        let wj = try WebSocketTestClient.open(d)
        try wj.sendJSON(["cmd": "nickname", "nickname": "web", "room": "stage", "token": t[1]])
        #expect(wj.receiveJSON()?["nickname"] as? String == "web", "its join echo")
        #expect(m.receiveFrame()?.wire == Wire.frame(0, UserInfo(level: 0, name: "web", iconURL: "", room: "stage").serialized()))
        let wl = try WebSocketTestClient.open(d, subprotocol: "roomcast.ltb.v1")
        try wl.sendBinary(Wire.join(user("ws-ltb", room: "stage", token: t[2])))
        #expect(m.receiveFrame()?.wire == Wire.join(user("ws-ltb", room: "stage")), "relayed without the token")
        try wl.sendBinary(Wire.text(Wire.user("mod"), "forged"))
        var refusal: Notice?
        while refusal == nil, let msg = wl.receiveMessage() {  // its own join echo comes first
            if msg.payload.count > 6 && msg.payload[4] == 9 { refusal = try? Notice(protobuf: Array(msg.payload[6...])) }
        }
        #expect(refusal?.code == "identity_mismatch", "a forged name over WebSocket is refused as over TCP")
        m.expectNoFrame(within: .milliseconds(200), "(the forged text)")

        // A moderator's default may is every type: a gift and an opaque frame reach the room.
        let frames = [Wire.gift(user("mod"), "rose", count: 2), Wire.frame(42, [4, 2])]
        for f in frames { try m.send(f) }
        var got: [[UInt8]] = []
        while got.count < 2, let msg = wl.receiveMessage() { got.append(msg.payload) }
        #expect(got.filter { frames.contains($0) }.count == 2, "the moderator's gift and opaque frame, byte for byte")
        // Refusals count toward max_violations (3) over WebSocket too, and end with the close frame 1008.
        for _ in 0..<2 { try wl.sendBinary(Wire.text(Wire.user("mod"), "forged")) }
        #expect(wl.expectCloseCode() == 1008)
    }

    @Test("refusals are logged once per client address per minute, all counted in STATUS=")
    func refusalLogIsRateLimitedAndCounted() throws {
        let d = try AuthDaemon(["protocol.max_violations": "10"]).daemon
        let c = try d.connect()
        for _ in 0..<5 {
            try c.send(Wire.join(user("x", room: "stage", token: "not.a.token")))
            #expect(nextNotice(c)?.code == "token_invalid")
        }
        #expect(d.stderr.wait(forLineWith: ["REASON=token_invalid", c.address], timeout: .seconds(3)))
        let lines = d.stderr.current.split(separator: "\n").filter { $0.contains("REASON=token_invalid") && $0.contains(c.address) }
        #expect(lines.count == 1, "five refusals, one journal line: \(lines.count)")
        #expect(d.notify.wait(timeout: .seconds(5)) { $0.hasPrefix("STATUS=") && $0.contains("auth: 5 refused, 0 expired") } != nil,
                "STATUS= counts every refusal")
        c.expectOpen()
    }

    @Test("anonymous = read: a tokenless client joins and reads, and is refused when it sends; anonymous = none hears nothing")
    func anonymousRead() throws {
        let now = TestKeys.now
        let token = try mintTokens([TestKeys.hs(["sub": "alice", "exp": now + 600])])[0]
        do {
            let d = try AuthDaemon(["auth.required": "yes", "auth.anonymous": "read"]).daemon
            let a = try d.connect(), reader = try d.connect()
            try reader.send(Wire.join(Wire.user("lurker")))
            try a.send(Wire.join(user("alice", token: token)))
            #expect(reader.receiveFrames(2).map(\.wire) == [Wire.join(Wire.user("lurker")), Wire.join(Wire.user("alice"))])
            let hi = Wire.text(Wire.user("alice"), "hi")
            try a.send(hi)
            #expect(reader.receiveFrame()?.wire == hi, "the anonymous reader reads")
            try reader.send(Wire.text(Wire.user("lurker"), "me too"))
            #expect(nextNotice(reader)?.code == "token_required")
            _ = a.receiveFrames(3, timeout: .milliseconds(300))
            a.expectNoFrame(within: .milliseconds(200), "(the reader's text)")
        }
        do {
            let d = try AuthDaemon(["auth.required": "yes"]).daemon
            let a = try d.connect(), nobody = try d.connect()
            try a.send(Wire.join(user("alice", token: token)))
            #expect(a.receiveFrame()?.wire == Wire.join(Wire.user("alice")))
            try a.send(Wire.text(Wire.user("alice"), "hi"))
            nobody.expectNoFrame(within: .milliseconds(300), "(a tokenless client is in no room)")
            try nobody.send(Wire.join(Wire.user("lurker")))
            #expect(nextNotice(nobody)?.code == "token_required")
            nobody.expectOpen()
        }
    }

    @Test("a connection that renews keeps going; one that does not is told token_expired and closed at exp + 25 s")
    func renewalAndExpiry() throws {
        let d = try AuthDaemon().daemon
        let a = try d.connect(), b = try d.connect()
        let now = TestKeys.now
        // exp 22 s ago: inside the 30 s leeway, so they join; exp + 25 s is 2 to 3 s away.
        let t = try mintTokens([TestKeys.hs(["sub": "alice", "exp": now - 22]), TestKeys.hs(["sub": "bob", "exp": now - 22]),
                                TestKeys.hs(["sub": "bob", "exp": now + 3600])])
        try a.send(Wire.join(user("alice", token: t[0])))
        try b.send(Wire.join(user("bob", token: t[1])))
        _ = b.receiveFrames(2, timeout: .seconds(1))
        try b.send(Wire.join(user("bob", token: t[2])))  // the renewal: same room, a fresh token
        let expired = try #require(nextNotice(a, timeout: .seconds(6)), "alice was not told")
        #expect(expired.code == "token_expired")
        a.expectClosed(within: .seconds(2))
        #expect(d.stderr.wait(forLineWith: ["REASON=token_expired", a.address]))
        pause(.milliseconds(1500))
        b.expectOpen()
        try b.send(Wire.text(Wire.user("bob"), "still here"))
        let frames = b.receiveFrames(4, timeout: .seconds(1))
        #expect(frames.map(\.wire).contains(Wire.text(Wire.user("bob"), "still here")), "the renewed connection still sends")
        #expect(notices(frames).isEmpty, "\(notices(frames))")
    }

    @Test("SIGHUP rotates the keys; a bad key file on reload keeps the old keys and says why")
    func keyRotation() throws {
        let a = try AuthDaemon(["auth.required": "yes"], keys: "hs1 HS256 \(TestKeys.secret)\n")
        let d = a.daemon
        let now = TestKeys.now
        let t = try mintTokens([TestKeys.hs(["sub": "alice", "exp": now + 600]),
                                TestKeys.hs(["sub": "bob", "exp": now + 600], kid: "hs2", secret: TestKeys.otherSecret)])
        let c1 = try d.connect()
        try c1.send(Wire.join(user("bob", token: t[1])))
        #expect(nextNotice(c1)?.code == "token_invalid", "hs2 is not a key yet")

        _ = try TestKeys.writeKeyFile(a.keysDir, "hs1 HS256 \(TestKeys.secret)\nhs2 HS256 \(TestKeys.otherSecret)\n")
        d.child.kill(SIGHUP)
        #expect(d.stderr.wait(for: "keys reloaded from \(a.keyPath): hs1 (HS256), hs2 (HS256)"))
        let c2 = try d.connect()
        try c2.send(Wire.join(user("bob", token: t[1])))
        #expect(c2.receiveFrame()?.wire == Wire.join(Wire.user("bob")), "hs2 verifies after the reload")

        _ = try TestKeys.writeKeyFile(a.keysDir, "hs3 HS256 short\n")
        d.child.kill(SIGHUP)
        #expect(d.stderr.wait(forLineWith: ["key file reload failed, keeping the keys in use", "\(a.keyPath):1:", "REASON=key_file_invalid"]),
                "\(d.stderr.current.suffix(1500))")
        let c3 = try d.connect()
        try c3.send(Wire.join(user("alice", token: t[0])))
        #expect(c3.receiveFrame()?.wire == Wire.join(Wire.user("alice")), "the old keys are still in use")
        #expect(!d.stderr.current.contains(TestKeys.secret) && !d.stderr.current.contains(TestKeys.otherSecret), "a key reached the log")
    }

    @Test("the start is refused when others can read the key file, another user owns it, or it is not a key file")
    func badKeyFileAtStart() throws {
        let dir = try TempDirectory()
        let readable = try TestKeys.writeKeyFile(dir, "hs1 HS256 \(TestKeys.secret)\n", name: "readable", mode: 0o644)
        let bad = try TestKeys.writeKeyFile(dir, "hs1 HS256 \(TestKeys.secret)\nhs1 EdDSA \(TestKeys.secret)\n", name: "bad")
        let foreign = try TestKeys.writeKeyFile(dir, "hs1 HS256 \(TestKeys.secret)\n", name: "foreign")
        #expect(chown(foreign, 65534, 65534) == 0)  // nobody: not the user the daemon runs as
        for (path, needle) in [(readable, "mode 644 lets group or others at the keys"), (bad, "\(bad):2: key 'hs1' is listed twice"),
                               (foreign, "owned by uid 65534, not by the service user (uid \(geteuid()))")] {
            let conf = try dir.write("c.conf", "[auth]\nkey_file = \(path)\n")
            let r = try runRoomcastd(["--config", conf, "--check-config"])
            #expect(r.status == 78, "\(r.stderr)")
            #expect(r.stderr.contains(needle), "\(r.stderr)")
        }
    }

    @Test("JSON clients: nickname with token and room; refusals as {\"cmd\":\"notice\"}")
    func jsonClients() throws {
        let d = try AuthDaemon(["auth.required": "yes", "json.listen": "127.0.0.1:0"]).daemon
        let now = TestKeys.now
        let token = try mintTokens([TestKeys.hs(["sub": "alice", "exp": now + 600, "rooms": ["stage"]])])[0]
        let ltb = try d.connect()
        let ltbToken = try mintTokens([TestKeys.hs(["sub": "bob", "exp": now + 600, "rooms": ["stage"]])])[0]
        try ltb.send(Wire.join(user("bob", room: "stage", token: ltbToken)))
        _ = ltb.receiveFrame()
        let j = try JSONTestClient(d)
        try j.send(["cmd": "nickname", "nickname": "mallory", "room": "stage", "token": token])
        let refused = try #require(j.receive())
        #expect(refused["cmd"] as? String == "notice" && refused["code"] as? String == "identity_mismatch", "\(refused)")
        try j.send(["cmd": "nickname", "nickname": "alice", "room": "stage", "token": token])
        let joined = try #require(ltb.receiveFrame())
        #expect(joined.wire == Wire.frame(0, UserInfo(level: 0, name: "alice", iconURL: "", room: "stage").serialized()))
        try j.send(["cmd": "msg", "content": "hi"])
        #expect(ltb.receiveFrame()?.type == 2)
    }

    @Test("roomcast token mints an HS256 token the daemon accepts; roomcast send --token joins a daemon that requires one")
    func commandLineToken() throws {
        let a = try AuthDaemon(["auth.required": "yes"])
        let d = a.daemon
        let minted = try roomcast(["token", "--key-file", a.keyPath, "--kid", "hs1", "--sub", "carol", "--room", "stage", "--ttl", "10min"])
        #expect(minted.status == 0, "\(minted.stderr)")
        let token = minted.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let jws = try CompactJWS(Array(token.utf8))
        let claims = try TokenClaims(json: jws.payload)
        #expect(jws.algorithm == "HS256" && jws.keyID == "hs1" && claims.sub == "carol" && claims.rooms == ["stage"])
        #expect(abs(claims.exp - Int64(TestKeys.now) - 600) <= 2)
        let server = "\(d.host):\(d.port)"
        let refused = try roomcast(["send", "--server", server, "--name", "carol", "--room", "stage", "--timeout", "1s", "text", "hi"])
        #expect(refused.status == 1, "without a token the join is refused: \(refused.stdout) \(refused.stderr)")
        #expect(refused.stderr.contains("refused: token_required"), "send says the daemon's reason: \(refused.stderr)")
        let sent = try roomcast(["send", "--server", server, "--name", "carol", "--room", "stage", "--token", token, "text", "hi"])
        #expect(sent.status == 0, "\(sent.stdout) \(sent.stderr)")
        let ed = try roomcast(["token", "--key-file", a.keyPath, "--kid", "ed1", "--sub", "carol"])
        #expect(ed.status == 1 && ed.stderr.contains("cannot sign"), "\(ed.stderr)")
    }
}

@Suite("Signed joins leave no expiry behind (real roomcastd, issue 28 item 2)", .serialized)
struct AuthExpiryIntegrationTests {
    @Test("2,000 signed joins on reconnecting clients and renewals: roomcast_auth_sessions is back to the live count")
    func expiriesFollowConnections() throws {
        let m = try ModerationDaemon()
        let d = m.daemon
        let tokens = try mintTokens((0..<4).map { TestKeys.hs(["sub": "fan\($0)", "exp": TestKeys.now + 3600, "rooms": ["*"]]) })
        // The ones that stay are in "stage", the others come and go in "hall" (the stayers hear none of them).
        func join(_ c: TestClient, _ i: Int, room: String = "hall") throws {
            try c.send(Wire.join(user("fan\(i % 4)", room: room, token: tokens[i % 4])))
            guard let echo = c.receiveFrame(), echo.type == Wire.join else { throw HarnessError("join \(i) not echoed") }
        }
        // Ten stay connected and renew (join again with a token) as the others come and go.
        let stay = try (0..<10).map { i -> TestClient in
            let c = try d.connect()
            try join(c, i, room: "stage")
            return c
        }
        for i in 0..<2_000 {
            let c = try d.connect(awaitAccept: false)  // the join's echo says it was accepted
            try join(c, i)
            if i % 2 == 0 { c.reset() } else { c.hangUp() }
            if i % 200 == 0 { for (k, s) in stay.enumerated() { try join(s, k, room: "stage") } }
        }
        func sessions() -> UInt64? {
            RefusalMetricsTests.sample(m.api.request("GET", "/metrics")?.body ?? "", "roomcast_auth_sessions")
        }
        var last: UInt64?
        let settled = waitUntil(.seconds(15)) {
            last = sessions()
            return last == UInt64(stay.count)
        }
        #expect(settled, "roomcast_auth_sessions = \(String(describing: last)), \(stay.count) connections hold a session")
        for s in stay { s.expectOpen() }
    }
}
