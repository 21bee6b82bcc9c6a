// Bans, mutes and slow mode through the API against the real daemon
// (docs/api.md "Moderation", docs/protocol/tokens.md §13), with signed joins from
// PyJWT: a banned sub is removed and refused, a muted one cannot send, a
// viewer in a slow room sends one text per interval; each malformed
// request answered with its status.
import Foundation
import Glibc
import RoomcastCore
import Testing

/// A daemon with the API and (unless `auth` is false) `[auth]` on.
final class ModerationDaemon {
    let dir: TempDirectory
    let daemon: Daemon
    let api: APITestClient

    init(auth: Bool = true, _ settings: [String: String] = [:]) throws {
        dir = try TempDirectory()
        let apiKeys = try dir.write("api.keys", "\(APIIntegrationTests.key)\n")
        chmod(apiKeys, 0o600)
        var s = ["api.listen": "127.0.0.1:0", "api.key_file": apiKeys]
        if auth { s["auth.key_file"] = try TestKeys.writeKeyFile(dir, TestKeys.fileText) }
        daemon = try Daemon(s.merging(settings) { $1 })
        api = try APITestClient(port: try #require(daemon.apiPort))
    }
}

/// A token for `sub` (its name too) in `rooms`, `role` as given.
func moderationToken(_ sub: String, rooms: [String] = ["*"], role: String = "viewer") throws -> String {
    try mintTokens([TestKeys.hs(["sub": sub, "exp": TestKeys.now + 600, "rooms": rooms, "role": role])])[0]
}

/// Connects and joins `room` as `sub` with a token; waits for the join's echo.
func joinSigned(_ d: Daemon, _ sub: String, room: String, role: String = "viewer") throws -> TestClient {
    let c = try d.connect()
    try c.send(Wire.join(user(sub, room: room, token: try moderationToken(sub, role: role))))
    guard let echo = c.receiveFrame(), echo.type == Wire.join else { throw HarnessError("\(sub) did not join \(room)") }
    return c
}

/// Drops what `c` has received so far.
func drain(_ c: TestClient) { while c.receiveFrame(timeout: .milliseconds(150)) != nil {} }

@Suite("Moderation through the API (real roomcastd)", .serialized)
struct ModerationIntegrationTests {
    @Test("a ban removes the sub from its room at once (notice banned, the room gets the leave) and refuses its joins until DELETE or expiry")
    func banKicksAndRefuses() throws {
        let m = try ModerationDaemon()
        let d = m.daemon
        let fan = try joinSigned(d, "fan", room: "stage")
        let troll = try joinSigned(d, "troll", room: "stage")
        drain(fan)
        let put = try #require(m.api.request("PUT", "/v1/rooms/stage/bans/troll", body: #"{"seconds": 600, "reason": "spam links"}"#))
        #expect(put.status == 200, "\(put.body)")
        #expect(put.body.contains(#""sub": "troll""#) && put.body.contains(#""kicked": 1"#) && put.body.contains(#""reason": "spam links""#))
        let notice = try #require(nextNotice(troll))
        #expect(notice.code == "banned")
        #expect((notice.retryAfterMs ?? 0) > 590_000 && (notice.retryAfterMs ?? 0) <= 600_000)
        troll.expectClosed()
        let leave = try #require(fan.receiveFrame())
        #expect(try leave.type == Wire.leave && UserInfo(protobuf: leave.body).name == "troll")

        // Its joins are refused, none counted as a violation (max_violations is 3); other rooms stay open to it.
        let again = try d.connect()
        let token = try moderationToken("troll")
        for _ in 0..<4 {
            try again.send(Wire.join(user("troll", room: "stage", token: token)))
            let n = try #require(nextNotice(again))
            #expect(n.code == "banned" && (n.retryAfterMs ?? 0) > 0)
        }
        again.expectOpen()
        fan.expectNoFrame(within: .milliseconds(300), "a refused join reached the room")
        try again.send(Wire.join(user("troll", room: "backstage", token: token)))
        #expect(again.receiveFrame()?.type == Wire.join, "a ban is per room")

        let list = try #require(m.api.request("GET", "/v1/rooms/stage/bans"))
        #expect(list.status == 200 && list.body.contains(#""bans": [{"sub": "troll""#) && list.body.contains(#""next_cursor": null"#))
        #expect(m.api.request("GET", "/v1/rooms/stage/mutes")?.body.contains(#""mutes": []"#) == true)

        #expect(m.api.request("DELETE", "/v1/rooms/stage/bans/troll")?.status == 200)
        #expect(m.api.request("DELETE", "/v1/rooms/stage/bans/troll")?.status == 404)
        try again.send(Wire.join(user("troll", room: "stage", token: token)))
        #expect(again.receiveFrame()?.type == Wire.join, "joins again once the ban is removed")

        // A short ban runs out by itself.
        #expect(m.api.request("PUT", "/v1/rooms/lobby/bans/troll", body: #"{"seconds": 1}"#)?.status == 200)
        let late = try d.connect()
        try late.send(Wire.join(user("troll", room: "lobby", token: token)))
        #expect(nextNotice(late)?.code == "banned")
        #expect(waitUntil(.seconds(5)) {
            (try? late.send(Wire.join(user("troll", room: "lobby", token: token)))) != nil
                && late.receiveFrame(timeout: .milliseconds(500))?.type == Wire.join
        }, "the ban did not run out")
        #expect(waitUntil(.seconds(5)) { m.api.request("GET", "/v1/rooms/lobby/bans")?.body.contains(#""bans": []"#) == true })
        #expect(!d.stderr.current.contains(token), "a token reached the log")
    }

    @Test("a muted sub stays in its room, its sends are refused with the notice muted and not relayed; joins and heartbeats pass")
    func muteRefusesSends() throws {
        let m = try ModerationDaemon()
        let d = m.daemon
        let fan = try joinSigned(d, "fan", room: "stage")
        let loud = try joinSigned(d, "loud", room: "stage")
        drain(fan)
        #expect(m.api.request("PUT", "/v1/rooms/stage/mutes/loud", body: #"{"seconds": 300}"#)?.status == 200)
        loud.expectOpen()
        fan.expectNoFrame(within: .milliseconds(200), "a mute announced something")
        for i in 0..<4 {
            try loud.send(Wire.text(user("loud"), "shout \(i)"))
            let n = try #require(nextNotice(loud))
            #expect(n.code == "muted" && (n.retryAfterMs ?? 0) > 290_000)
        }
        try loud.send(Wire.frame(Wire.heartbeat, []))
        loud.expectOpen()
        fan.expectNoFrame(within: .milliseconds(300), "a muted text was relayed")
        #expect(m.api.request("GET", "/v1/rooms/stage/mutes")?.body.contains(#""sub": "loud""#) == true)
        #expect(m.api.request("DELETE", "/v1/rooms/stage/mutes/loud")?.status == 200)
        try loud.send(Wire.text(user("loud"), "back"))
        let f = try #require(fan.receiveFrame())
        #expect(try f.type == Wire.text && ChatMessage(protobuf: f.body).text == "back")
    }

    @Test("slow mode: a viewer (token or none) sends one text per interval, refused with slow_mode; moderators and API publishes are exempt")
    func slowMode() throws {
        let m = try ModerationDaemon()
        let d = m.daemon
        #expect(m.api.request("GET", "/v1/rooms/stage/settings")?.body == "{\"room\": \"stage\", \"slow_mode_seconds\": 0}\n")
        let put = try #require(m.api.request("PUT", "/v1/rooms/stage/settings", body: #"{"slow_mode_seconds": 30}"#))
        #expect(put.status == 200 && put.body.contains(#""slow_mode_seconds": 30"#))
        #expect(m.api.request("GET", "/v1/rooms/stage/settings")?.body.contains(#""slow_mode_seconds": 30"#) == true)
        let fan = try joinSigned(d, "fan", room: "stage")
        let viewer = try joinSigned(d, "viewer", room: "stage")
        let mod = try joinSigned(d, "mod", room: "stage", role: "moderator")
        drain(fan)
        drain(viewer)
        try viewer.send(Wire.text(user("viewer"), "first"))
        #expect(try fan.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == "first")
        try viewer.send(Wire.text(user("viewer"), "second"))
        let n = try #require(nextNotice(viewer))
        #expect(n.code == "slow_mode" && (n.retryAfterMs ?? 0) > 20_000 && (n.retryAfterMs ?? 0) <= 30_000)
        for i in 0..<3 { try mod.send(Wire.text(user("mod"), "mod \(i)")) }
        for i in 0..<3 { #expect(try fan.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == "mod \(i)") }
        for i in 0..<2 {
            let p = m.api.request("POST", "/v1/rooms/stage/publish", body: #"{"type": "text", "user": {"name": "system"}, "text": "api \#(i)"}"#)
            #expect(p?.status == 200)
            #expect(try fan.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == "api \(i)")
        }
        viewer.expectOpen()
        #expect(m.api.request("PUT", "/v1/rooms/stage/settings", body: #"{"slow_mode_seconds": 0}"#)?.body.contains(#": 0"#) == true)
        try viewer.send(Wire.text(user("viewer"), "free again"))
        #expect(try fan.receiveFrame(timeout: .seconds(2)).map { try ChatMessage(protobuf: $0.body).text } == "free again")
    }

    @Test("tokenless clients are viewers: slow mode without [auth]; bans and mutes need [auth] (409 auth_off)")
    func slowModeWithoutAuth() throws {
        let m = try ModerationDaemon(auth: false)
        #expect(m.api.request("PUT", "/v1/rooms/lobby/settings", body: #"{"slow_mode_seconds": 3}"#)?.status == 200)
        let a = try m.daemon.connect(), b = try m.daemon.connect()
        try a.send(Wire.text(Wire.user("anon"), "one"))
        #expect(try b.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == "one")
        try a.send(Wire.text(Wire.user("anon"), "two"))
        let n = try #require(nextNotice(a))
        #expect(n.code == "slow_mode" && (n.retryAfterMs ?? 0) <= 3_000)
        b.expectNoFrame(within: .milliseconds(300), "the second text was relayed")
        let ban = try #require(m.api.request("PUT", "/v1/rooms/lobby/bans/x", body: #"{"seconds": 10}"#))
        #expect(ban.status == 409 && ban.body.contains(#""error": "auth_off""#))
        #expect(m.api.request("GET", "/v1/rooms/lobby/mutes")?.status == 409)
    }

    @Test("malformed moderation requests: each its status and {error, message}, nothing changed")
    func malformedRequests() throws {
        let m = try ModerationDaemon()
        let cases: [(String, String, String?, Int, String)] = [
            ("PUT", "/v1/rooms/r/bans/s", "{not json", 400, "bad_json"),
            ("PUT", "/v1/rooms/r/bans/s", "[1]", 400, "bad_json"),
            ("PUT", "/v1/rooms/r/bans/s", #"{"seconds": 0}"#, 422, "bad_ban"),
            ("PUT", "/v1/rooms/r/bans/s", #"{"seconds": 1209601}"#, 422, "bad_ban"),
            ("PUT", "/v1/rooms/r/bans/s", #"{"seconds": 1.5}"#, 422, "bad_ban"),
            ("PUT", "/v1/rooms/r/bans/s", #"{"seconds": "60"}"#, 422, "bad_ban"),
            ("PUT", "/v1/rooms/r/mutes/s", #"{}"#, 422, "bad_mute"),
            ("PUT", "/v1/rooms/r/mutes/s", #"{"seconds": 5, "reason": 7}"#, 422, "bad_mute"),
            ("PUT", "/v1/rooms/r/bans/s", #"{"seconds": 5, "reason": "\#(String(repeating: "x", count: 513))"}"#, 422, "bad_ban"),
            ("PUT", "/v1/rooms/r/bans/%zz", #"{"seconds": 5}"#, 400, "bad_sub"),
            ("PUT", "/v1/rooms/r/bans/%FF", #"{"seconds": 5}"#, 400, "bad_sub"),
            ("PUT", "/v1/rooms/r/bans/", #"{"seconds": 5}"#, 400, "bad_sub"),
            ("PUT", "/v1/rooms/%zz/bans/s", #"{"seconds": 5}"#, 400, "bad_room"),
            ("PUT", "/v1/rooms/\(String(repeating: "r", count: 256))/bans/s", #"{"seconds": 5}"#, 400, "bad_room"),
            ("POST", "/v1/rooms/r/bans/s", #"{"seconds": 5}"#, 405, "method_not_allowed"),
            ("PUT", "/v1/rooms/r/bans", #"{"seconds": 5}"#, 405, "method_not_allowed"),
            ("GET", "/v1/rooms/r/bans/s/x", nil, 404, "not_found"),
            ("DELETE", "/v1/rooms/r/bans/nobody", nil, 404, "not_banned"),
            ("DELETE", "/v1/rooms/r/mutes/nobody", nil, 404, "not_muted"),
            ("GET", "/v1/rooms/r/bans?limit=0", nil, 400, "bad_limit"),
            ("PUT", "/v1/rooms/r/settings", #"{"slow_mode_seconds": 2}"#, 422, "bad_settings"),
            ("PUT", "/v1/rooms/r/settings", #"{"slow_mode_seconds": 121}"#, 422, "bad_settings"),
            ("PUT", "/v1/rooms/r/settings", #"{"slow_mode": 10}"#, 422, "bad_settings"),
            ("PUT", "/v1/rooms/r/settings", "nope", 400, "bad_json"),
            ("DELETE", "/v1/rooms/r/settings", nil, 405, "method_not_allowed"),
        ]
        for (method, path, body, status, code) in cases {
            let a = m.api.request(method, path, body: body)
            #expect(a?.status == status && a?.body.contains(#""error": "\#(code)""#) == true && a?.body.contains(#""message": "#) == true,
                    "\(method) \(path) \(body ?? ""): \(a.map { "\($0.status) \($0.body)" } ?? "no answer")")
        }
        #expect(m.api.request("GET", "/v1/rooms/r/bans")?.body.contains(#""bans": []"#) == true, "a refused PUT changed something")
        #expect(m.api.request("GET", "/v1/rooms/r/settings")?.body.contains(#""slow_mode_seconds": 0"#) == true)
        // The bans list pages by sub.
        for s in ["c", "a", "b"] { #expect(m.api.request("PUT", "/v1/rooms/r/bans/\(s)", body: #"{"seconds": 60}"#)?.status == 200) }
        let p1 = try #require(m.api.request("GET", "/v1/rooms/r/bans?limit=2"))
        #expect(p1.body.contains(#""sub": "a""#) && p1.body.contains(#""sub": "b""#) && p1.body.contains(#""next_cursor": "b""#))
        let p2 = try #require(m.api.request("GET", "/v1/rooms/r/bans?limit=2&cursor=b"))
        #expect(p2.body.contains(#""sub": "c""#) && p2.body.contains(#""next_cursor": null"#))
    }

    @Test("kick by name matches every member of that name, byte for byte: an NFD spelling is another name")
    func kickByNameComparesBytes() throws {
        let m = try ModerationDaemon(auth: false)
        let nfc = "Jos\u{E9}", nfd = "Jose\u{301}"
        let a = try m.daemon.connect(), b = try m.daemon.connect(), c = try m.daemon.connect()
        try a.send(Wire.join(Wire.user(nfc, room: "r")))
        try b.send(Wire.join(Wire.user(nfc, room: "r")))
        try c.send(Wire.join(Wire.user(nfd, room: "r")))
        #expect(waitUntil(.seconds(5)) { m.api.request("GET", "/v1/rooms/r")?.body.contains(#""viewers": 3"#) == true })
        let k = try #require(m.api.request("POST", "/v1/rooms/r/kick", body: "{\"name\": \"\(nfc)\"}"))
        #expect(k.body.contains(#""kicked": 2"#), "\(k.body): Swift's String == would match the NFD spelling too (3)")
        a.expectClosed()
        b.expectClosed()
        c.expectOpen()
    }
}
