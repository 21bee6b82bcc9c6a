// Viewer counts against the real daemon (docs/protocol/notices.md §13, notice
// `viewers`; docs/api.md): folded notices to LTB and JSON members,
// `announce_joins = no`, and counts summed across two daemons on a real
// redis-server, in the notices and in the API, dropping a daemon that goes.
import Foundation
import Glibc
import RoomcastCore
import Testing

extension TestClient {
    /// The `viewers` notices received within `within`, in order (other frames are skipped).
    func viewerCounts(within: Duration) -> [Int64] {
        let deadline = monotonicMs() + Int64(within.ms)
        var counts: [Int64] = []
        while case let left = deadline - monotonicMs(), left > 0, let f = receiveFrame(timeout: .milliseconds(left)) {
            if f.type == 9, let n = try? Notice(protobuf: f.body), n.code == "viewers" { counts.append(n.count ?? -1) }
        }
        return counts
    }

    /// Waits (up to `timeout`) for a `viewers` notice with `count`.
    func awaitViewers(_ count: Int64, timeout: Duration = .seconds(10)) -> Bool {
        framesBefore(viewers: count, timeout: timeout) != nil
    }

    /// The frames other than `viewers` notices received before a `viewers`
    /// notice with `count` (nil: none within `timeout`).
    func framesBefore(viewers count: Int64, timeout: Duration = .seconds(10)) -> [Frame]? {
        let deadline = monotonicMs() + Int64(timeout.ms)
        var others: [Frame] = []
        while case let left = deadline - monotonicMs(), left > 0, let f = receiveFrame(timeout: .milliseconds(left)) {
            if f.type == 9, let n = try? Notice(protobuf: f.body), n.code == "viewers" {
                if n.count == count { return others }
            } else {
                others.append(f)
            }
        }
        return nil
    }
}

@Suite("Viewer counts", .serialized)
struct ViewerCountIntegrationTests {
    static func join(_ c: TestClient, _ name: String, room: String = "live") throws {
        try c.send(Wire.join(Wire.user(name, room: room)))
    }

    @Test("a room's members get its count, folded to one notice per interval however many join")
    func foldedNotices() throws {
        let d = try Daemon(["rooms.counts": "1", "json.listen": "127.0.0.1:0"])
        let clients = try (0..<3).map { _ in try d.connect() }
        let json = try JSONTestClient(d)
        for (i, c) in clients.enumerated() { try Self.join(c, "u\(i)") }
        try json.send(["cmd": "nickname", "nickname": "j", "room": "live"])
        for c in clients { #expect(c.awaitViewers(4), "\(c.address) did not get viewers 4") }
        // Nothing changed: no more notices.
        #expect(clients[0].viewerCounts(within: .milliseconds(2_500)).isEmpty)
        // Ten joins and leaves of one client within an interval fold into one notice of the count then.
        let flapper = try d.connect()
        for i in 0..<10 {
            try Self.join(flapper, "f\(i)")
            try flapper.send(Wire.leave(Wire.user("f\(i)")))
        }
        try Self.join(flapper, "f")
        let seen = clients[1].viewerCounts(within: .milliseconds(3_500))
        #expect(seen == [5], "one notice of the new count, not one per join: \(seen)")
        var jsonNotice: [String: Any]?
        let deadline = monotonicMs() + 5_000
        while jsonNotice == nil, monotonicMs() < deadline, let m = json.receive(timeout: .seconds(5)) {
            if m["cmd"] as? String == "notice", m["code"] as? String == "viewers", (m["count"] as? Int) == 5 { jsonNotice = m }
        }
        #expect(jsonNotice != nil, "a JSON member gets {\"cmd\":\"notice\",\"code\":\"viewers\",\"count\":5}")
        flapper.reset()
        #expect(clients[2].awaitViewers(4))
    }

    @Test("announce_joins = no: members hear no joins or leaves of others, and see counts instead")
    func announceJoinsOff() throws {
        let d = try Daemon(["rooms.counts": "1", "rooms.announce_joins": "no"])
        let a = try d.connect(), b = try d.connect()
        try Self.join(a, "a")
        try Self.join(b, "b")
        let beforeTwo = a.framesBefore(viewers: 2)
        #expect(beforeTwo?.map(\.wire) == [Wire.join(Wire.user("a", room: "live"))], "only its own join came back (echo), not b's")
        #expect(b.framesBefore(viewers: 2)?.map(\.wire) == [Wire.join(Wire.user("b", room: "live"))])
        b.reset()
        #expect(a.framesBefore(viewers: 1)?.isEmpty == true, "no leave for b, only the count")
        let t = Wire.text(Wire.user("a"), "still here")
        try a.send(t)
        let frames = a.receiveFrames(1)
        #expect(frames.map(\.wire) == [t], "texts are relayed as always; nothing else arrived")
    }

    @Test("counts are the sum over two daemons on a real Redis, in notices and the API; a gone daemon's drop out")
    func acrossDaemons() throws {
        let redis = try RedisServer()
        let dir = try TempDirectory()
        let keys = try dir.write("api.keys", "k-0123456789abcdef\n")
        chmod(keys, 0o600)
        let settings = ["rooms.counts": "1", "api.listen": "127.0.0.1:0", "api.key_file": keys]
        let a = try clusterDaemon(redis, name: "counts", settings)
        let b = try clusterDaemon(redis, name: "counts", settings)
        let onA = try (0..<2).map { _ in try a.connect() }
        let onB = try b.connect()
        for (i, c) in onA.enumerated() { try Self.join(c, "a\(i)") }
        try Self.join(onB, "b0")
        let start = monotonicMs()
        #expect(onA[0].awaitViewers(3) && onA[1].awaitViewers(3), "members on A see 2 + 1")
        #expect(onB.awaitViewers(3), "the member on B sees 1 + 2")
        #expect(monotonicMs() - start < 10_000, "counts within 10 s")
        let apiA = try APITestClient(port: try #require(a.apiPort)), apiB = try APITestClient(port: try #require(b.apiPort))
        for api in [apiA, apiB] {
            #expect(waitUntil(.seconds(10)) { api.request("GET", "/v1/rooms/live?limit=10")?.body.contains(#""viewers": 3"#) == true })
            #expect(api.request("GET", "/v1/rooms")?.body.contains(#"{"room": "live", "viewers": 3}"#) == true)
        }
        // A room with members only on B is listed by A with B's count.
        let other = try b.connect()
        try Self.join(other, "solo", room: "elsewhere")
        #expect(waitUntil(.seconds(10)) { apiA.request("GET", "/v1/rooms")?.body.contains(#"{"room": "elsewhere", "viewers": 1}"#) == true })
        // B dies without a bye: A drops its counts once it is silent for cluster.timeout.
        b.child.kill(SIGKILL)
        #expect(onA[0].awaitViewers(2, timeout: .seconds(15)), "B's member dropped out of A's count")
        #expect(waitUntil(.seconds(10)) { apiA.request("GET", "/v1/rooms/live")?.body.contains(#""viewers": 2"#) == true })
        #expect(apiA.request("GET", "/v1/rooms")?.body.contains("elsewhere") == false)
    }
}
