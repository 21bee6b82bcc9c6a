// roomcast_frames_refused_total{reason} (docs/api.md "Metrics") against the
// real daemon: each refusal provoked by a real client (tokens from PyJWT,
// bans, mutes and slow mode through the API, bad frames), then GET /metrics
// counts each reason exactly, roomcast_auth_refusals_total is the sum of
// [auth]'s, and promtool still has nothing to say.
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Refusals by reason in GET /metrics (real roomcastd)", .serialized)
struct RefusalMetricsTests {
    /// `name`'s sample in an exposition (`name` with its labels), if present.
    static func sample(_ exposition: String, _ name: String) -> UInt64? {
        exposition.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { UInt64($0.split(separator: " ")[1]) }
    }

    @Test("each refusal of a frame or join is counted under its notice's code, moderation's and [auth]'s alike")
    func everyReasonIsCounted() throws {
        let m = try ModerationDaemon(["auth.required": "yes", "protocol.max_violations": "1000", "limits.frames_per_second": "20"])
        let d = m.daemon
        let now = TestKeys.now
        let tokens = try mintTokens([
            TestKeys.hs(["sub": "alice", "exp": now + 600, "rooms": ["*"]], secret: TestKeys.otherSecret),  // token_invalid
            TestKeys.hs(["sub": "alice", "exp": now - 120, "rooms": ["*"]]),                                // token_expired
            TestKeys.hs(["sub": "alice", "exp": now + 600, "rooms": ["stage"]]),                            // room_forbidden elsewhere
            TestKeys.hs(["sub": "alice", "exp": now + 600, "rooms": ["*"]]),                                // a good one
        ])
        var got: [String: UInt64] = [:]
        /// Sends `frame` from `c` and expects the notice `code`.
        func expectRefused(_ c: TestClient, _ frame: [UInt8], _ code: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
            try c.send(frame)
            let n = nextNotice(c)
            #expect(n?.code == code, "\(String(describing: n))", sourceLocation: sourceLocation)
            got[code, default: 0] += 1
        }

        let anon = try d.connect()
        try expectRefused(anon, Wire.join(user("anon", room: "stage")), "token_required")
        let a = try d.connect()
        try expectRefused(a, Wire.join(user("alice", room: "stage", token: tokens[0])), "token_invalid")
        try expectRefused(a, Wire.join(user("alice", room: "stage", token: tokens[1])), "token_expired")
        try expectRefused(a, Wire.join(user("alice", room: "backstage", token: tokens[2])), "room_forbidden")
        try expectRefused(a, Wire.join(user("mallory", room: "stage", token: tokens[3])), "identity_mismatch")

        let fan = try joinSigned(d, "fan", room: "stage")
        try expectRefused(fan, Wire.gift(user("fan"), "rose"), "not_permitted")  // viewer_may = text

        #expect(m.api.request("PUT", "/v1/rooms/stage/bans/troll", body: #"{"seconds": 600}"#)?.status == 200)
        let troll = try d.connect()
        let trollToken = try moderationToken("troll")
        for _ in 0..<2 { try expectRefused(troll, Wire.join(user("troll", room: "stage", token: trollToken)), "banned") }

        #expect(m.api.request("PUT", "/v1/rooms/stage/mutes/fan", body: #"{"seconds": 600}"#)?.status == 200)
        for i in 0..<3 { try expectRefused(fan, Wire.text(user("fan"), "shout \(i)"), "muted") }

        #expect(m.api.request("PUT", "/v1/rooms/slow/settings", body: #"{"slow_mode_seconds": 30}"#)?.status == 200)
        let chatty = try joinSigned(d, "chatty", room: "slow")
        try chatty.send(Wire.text(user("chatty"), "first"))
        try expectRefused(chatty, Wire.text(user("chatty"), "second"), "slow_mode")

        // The relay's own refusals: no notice (docs/protocol/clients.md §9), so the counts are polled for below.
        let bad = try joinSigned(d, "bad", room: "lobby")
        try bad.send(Wire.frame(Wire.text, [0xFF]))
        try bad.send(Wire.frame(9, []))
        try bad.send(Wire.join(user("bad", room: String(repeating: "r", count: 300), token: try moderationToken("bad"))))
        let flood = try d.connect()
        try flood.sendRaw(Array((0..<60).map { _ in Wire.heartbeatFrame }.joined()))

        let expected: [String: UInt64] = got.merging(["bad_frame": 1, "notice_from_client": 1, "room_too_long": 1]) { $1 }
        let c = try APITestClient(port: try #require(d.apiPort))
        var body = ""
        let settled = waitUntil(.seconds(10)) {
            body = c.request("GET", "/metrics")?.body ?? ""
            return expected.allSatisfy { Self.sample(body, "roomcast_frames_refused_total{reason=\"\($0.key)\"}") == $0.value }
                && (Self.sample(body, "roomcast_frames_refused_total{reason=\"rate_limit\"}") ?? 0) > 0
        }
        #expect(settled, "the counts never matched \(expected):\n\(body)")
        for reason in FrameRefusal.allCases.map(\.label) {
            let value = Self.sample(body, "roomcast_frames_refused_total{reason=\"\(reason)\"}")
            switch reason {
            case "rate_limit": #expect((1...40).contains(value ?? 0), "rate_limit: \(String(describing: value))")
            default: #expect(value == expected[reason] ?? 0, "\(reason): \(String(describing: value))")
            }
        }
        let authReasons = ["token_required", "token_invalid", "token_expired", "room_forbidden", "identity_mismatch", "not_permitted"]
        #expect(Self.sample(body, "roomcast_auth_refusals_total") == authReasons.reduce(0) { $0 + (expected[$1] ?? 0) })
        #expect(body.contains("# TYPE roomcast_frames_refused_total counter\n"))
        #expect(!d.stderr.current.contains(TestKeys.secret) && !d.stderr.current.contains(tokens[3]), "a secret reached the log")

        let check = try promtoolCheck(body)
        #expect(check.status == 0 && check.said.isEmpty, "promtool check metrics: \(check.said)")
    }
}

/// `promtool check metrics` on `exposition`: its status and what it said.
func promtoolCheck(_ exposition: String) throws -> (status: Int32, said: String) {
    guard FileManager.default.isExecutableFile(atPath: MetricsIntegrationTests.promtool) else {
        throw HarnessError("no promtool at \(MetricsIntegrationTests.promtool): run make deps")
    }
    let p = Process()
    p.executableURL = URL(fileURLWithPath: MetricsIntegrationTests.promtool)
    p.arguments = ["check", "metrics"]
    let input = Pipe(), output = Pipe()
    p.standardInput = input
    p.standardOutput = output
    p.standardError = output
    try p.run()
    input.fileHandleForWriting.write(Data(exposition.utf8))
    try input.fileHandleForWriting.close()
    let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    p.waitUntilExit()
    return (p.terminationStatus, said)
}
