// Whatever answers at the Redis address costs the cluster link only, never
// the daemon: replies nobody asked for, replies of the wrong shape, bytes
// that are no RESP, a close mid-reply, a SUBSCRIBE refused by an ACL. The
// link closes the connection, says why, and reconnects with its backoff;
// local relay goes on; once a real Redis answers there, it works.
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Cluster over a misbehaving Redis", .serialized)
struct ClusterRobustnessTests {
    @Test("extra replies, wrong shapes, garbage, a close mid-reply: the daemon stays up, relays locally, reconnects, and works once Redis is real",
          arguments: FakeRedis.Behaviour.allCases)
    func misbehavingRedis(_ behaviour: FakeRedis.Behaviour) throws {
        let fake = try FakeRedis(behaviour)
        let port = fake.port
        let a = try Daemon(["cluster.redis": fake.address, "cluster.name": "odd"])
        let x = try a.connect(), y = try a.connect()
        // Reconnects go on: several connections, each broken by the fake's answers.
        #expect(waitUntil(.seconds(10)) { fake.connections >= 6 }, "\(fake.connections) connections; \(fake.commands)")
        #expect(a.child.process.isRunning, "roomcastd exited with \(a.child.waitForExit(timeout: .seconds(1)).map(String.init) ?? "?")")
        try x.send(Wire.text(Wire.user("x"), "local"))
        #expect(y.receiveFrame()?.wire == Wire.text(Wire.user("x"), "local"), "local relay goes on")
        #expect(a.stderr.line(with: ["cluster:", "REASON=cluster_protocol"]) != nil, "the daemon says what went wrong:\n\(a.stderr.current.suffix(2000))")

        fake.stop()
        let redis = try RedisServer(port: port)
        #expect(redis.waitForSubscribers("roomcast:odd:room:lobby", 1, timeout: .seconds(10)), "it reconnects to the real Redis")
        let b = try clusterDaemon(redis, name: "odd")
        let z = try b.connect()
        #expect(redis.waitForSubscribers("roomcast:odd:room:lobby", 2))
        // a's publisher may still be waiting for its next attempt (backoff up to 2 s).
        var across: [UInt8]?
        for n in 0..<20 where across == nil {
            try x.send(Wire.text(Wire.user("x"), "across \(n)"))
            across = z.receiveFrame(timeout: .milliseconds(250))?.wire
        }
        #expect(across != nil, "and relays across daemons: \(a.stderr.current.suffix(2000))")
        #expect(a.child.process.isRunning)
    }
}

/// The envelope another daemon (`origin`) would publish for `frame` to `room`.
func clusterEnvelope(origin: UInt64, stream: UInt64 = 1, seq: UInt64, room: String, _ frame: [UInt8]) -> [UInt8] {
    var out: [UInt8] = []
    frame.withUnsafeBytes {
        ClusterEnvelope.encode(kind: .littleEndianFrame, origin: origin, stream: stream, seq: seq, room: RoomName(room),
                               address: "203.0.113.9:4242", frame: $0, into: &out)
    }
    return out
}

/// Lines of `text` holding every one of `needles`.
func lines(_ text: String, with needles: [String]) -> Int {
    text.split(separator: "\n").filter { line in needles.allSatisfy { line.contains($0) } }.count
}

@Suite("Cluster messages and their rooms", .serialized)
struct ClusterMessageRoomTests {
    @Test("a SUBSCRIBE refused by Redis (an ACL without the room channels: -NOPERM) backs off to 2 s and is said once, not retried every 50 ms")
    func subscribeRefused() throws {
        // The default user may use the heartbeat channels only.
        let redis = try RedisServer(arguments: ["--user", "default", "on", "nopass", "~*", "&roomcast:acl:hb:*", "+@all"])
        let a = try Daemon(["cluster.redis": redis.address, "cluster.name": "acl"])
        let x = try a.connect(), y = try a.connect()  // in the lobby: a.SUBSCRIBEs its channel, and Redis refuses
        #expect(a.stderr.wait(forLineWith: ["WARNING", "Redis refused SUBSCRIBE: NOPERM", "REASON=cluster_refused"], timeout: .seconds(5)),
                "\(a.stderr.current.suffix(3000))")
        let before = lines(a.stderr.current, with: ["subscriber connection to Redis at", "failed"])
        Thread.sleep(forTimeInterval: 4)
        let attempts = lines(a.stderr.current, with: ["subscriber connection to Redis at", "failed"]) - before
        // 50 ms forever is about 80 attempts in 4 s; the backoff (100 ms doubling to 2 s) a handful.
        #expect(attempts >= 1 && attempts <= 8, "\(attempts) subscriber attempts in 4 s")
        #expect(lines(a.stderr.current, with: ["REASON=cluster_refused"]) == 1, "said once")
        // Up before the lobby's channel was asked for, down once then; never up again, so no flapping.
        #expect(lines(a.stderr.current, with: ["WARNING", "cluster: lost Redis"]) <= 1)
        #expect(lines(a.stderr.current, with: ["is back after"]) == 0, "it does not flap")
        try x.send(Wire.text(Wire.user("x"), "local"))
        #expect(y.receiveFrame()?.wire == Wire.text(Wire.user("x"), "local"), "local relay goes on")
        #expect(a.child.process.isRunning)
    }

    @Test("the room of a cluster message is its channel's: an envelope naming another room is dropped and counted")
    func roomFromChannel() throws {
        let redis = try RedisServer()
        let a = try clusterDaemon(redis, name: "mis", ["log.stats_interval": "1s"])
        let x = try a.connect(), y = try a.connect()
        let yu = Wire.user("y", room: "stage")
        try y.send(Wire.join(yu))
        #expect(y.receiveFrame()?.wire == Wire.join(yu))
        #expect(redis.waitForSubscribers("roomcast:mis:room:lobby", 1) && redis.waitForSubscribers("roomcast:mis:room:stage", 1))
        let far = Wire.user("far", room: "stage")
        let publisher = try RedisPublisher(redis)
        let lobby = Array("roomcast:mis:room:lobby".utf8)
        // On the lobby's channel, an envelope that names the stage.
        try publisher.publish(lobby, clusterEnvelope(origin: 77, seq: 1, room: "stage", Wire.text(far, "injected")))
        try publisher.publish(lobby, clusterEnvelope(origin: 77, seq: 2, room: "lobby", Wire.text(far, "to the lobby")))
        #expect(x.receiveFrame()?.wire == Wire.text(far, "to the lobby"), "the lobby gets its own frame, and only it")
        y.expectNoFrame(within: .milliseconds(300), "nothing reaches the stage through the lobby's channel")
        #expect(a.stderr.wait(forLineWith: ["cluster:", "whose envelope names another room", "REASON=cluster_bad_message"]))
        #expect(a.stderr.wait(forLineWith: ["0 stale, 1 misrouted"]), "the stats count it")
    }

    @Test("messages in flight for a room that closed here create no state: no false cluster_gap when it reopens")
    func inFlightForClosedRoom() throws {
        let redis = try RedisServer()
        let a = try clusterDaemon(redis, name: "stale", ["log.stats_interval": "1s"])
        let channel = "roomcast:stale:room:side"
        let m = try a.connect()
        let mu = Wire.user("m", room: "side"), far = Wire.user("far", room: "side")
        try m.send(Wire.join(mu))
        #expect(m.receiveFrame()?.wire == Wire.join(mu))
        #expect(redis.waitForSubscribers(channel, 1))
        let publisher = try RedisPublisher(redis)
        // a stopped: Redis queues 100 frames of another daemon for it (2 MB,
        // more than a reads in a loop turn), then m's socket closes. When a
        // runs again, the room closes at the end of its first turn, and the
        // rest of the frames, in flight, arrive after it.
        a.child.kill(SIGSTOP)
        let body = String(repeating: "z", count: 20_000)
        for seq in 1...100 {
            #expect(try publisher.publish(Array(channel.utf8), clusterEnvelope(origin: 99, seq: UInt64(seq), room: "side", Wire.text(far, "\(seq) \(body)"))) == 1)
        }
        m.reset()
        Thread.sleep(forTimeInterval: 0.1)
        a.child.kill(SIGCONT)
        #expect(redis.waitForSubscribers(channel, 0))
        #expect(waitUntil(.seconds(5)) {
            guard let stats = a.stderr.current.split(separator: "\n").last(where: { $0.contains(" stale, ") }) else { return false }
            return !stats.contains(", 0 stale, ")
        }, "a dropped the frames that arrived after the room closed, counted: \(a.stderr.current.suffix(1500))")
        // The room reopens; the other daemon's next frame is its 110th (it
        // sent 101 ... 109 while nobody here listened): not lost to anyone here.
        let n = try a.connect()
        let nu = Wire.user("n", room: "side")
        try n.send(Wire.join(nu))
        #expect(n.receiveFrame()?.wire == Wire.join(nu))
        #expect(redis.waitForSubscribers(channel, 1))
        try publisher.publish(Array(channel.utf8), clusterEnvelope(origin: 99, seq: 110, room: "side", Wire.text(far, "new")))
        #expect(n.receiveFrame()?.wire == Wire.text(far, "new"))
        Thread.sleep(forTimeInterval: 0.2)
        #expect(a.stderr.line(with: ["cluster_gap"]) == nil, "no gap: \(a.stderr.line(with: ["cluster_gap"]) ?? "")")
    }
}
