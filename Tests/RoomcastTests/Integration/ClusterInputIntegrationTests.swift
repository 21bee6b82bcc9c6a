// What arrives from Redis is input (issue 28, item 4; docs/cluster.md,
// "What arrives from Redis"): whoever may PUBLISH on a cluster's channels
// gets from the daemon only what a daemon of ours could have sent. Each
// test publishes what the issue showed getting through, on a real
// redis-server, and checks that the daemon refuses it: counted in
// roomcast_cluster_refused_total, logged, never delivered or stored.
import Foundation
import Glibc
import RoomcastCore
import Testing

/// A daemon with the API (metrics, moderation) and signed joins in cluster `name`.
private func inputDaemon(_ redis: RedisServer, name: String) throws -> ModerationDaemon {
    try moderationClusterDaemon(redis, name: name)
}

/// `roomcast_cluster_refused_total{reason="REASON"}` of the daemon's /metrics.
private func refused(_ m: ModerationDaemon, _ reason: String) -> Int? {
    guard let body = m.api.request("GET", "/metrics")?.body else { return nil }
    let prefix = "roomcast_cluster_refused_total{reason=\"\(reason)\"} "
    return body.split(separator: "\n").first { $0.hasPrefix(prefix) }.flatMap { Int($0.dropFirst(prefix.count)) }
}

/// The envelope of `kind` another daemon would publish on the daemons channel.
private func daemonsEnvelope(_ kind: ClusterEnvelope.Kind, origin: UInt64, _ payload: [UInt8]) -> [UInt8] {
    var out: [UInt8] = []
    payload.withUnsafeBytes {
        ClusterEnvelope.encode(kind: kind, origin: origin, stream: 0, seq: 0, room: RoomName(bytes: []), address: "", frame: $0, into: &out)
    }
    return out
}

@Suite("What arrives from Redis is input (real redis-server)", .serialized)
struct ClusterInputIntegrationTests {
    @Test("a forged notice `banned` published on a room channel reaches nobody; a text of the same origin still does")
    func forgedNotice() throws {
        let redis = try RedisServer()
        let m = try inputDaemon(redis, name: "forge")
        let alice = try joinSigned(m.daemon, "alice", room: "stage")
        #expect(redis.waitForSubscribers("roomcast:forge:room:stage", 1))
        let channel = Array("roomcast:forge:room:stage".utf8)
        let publisher = try RedisPublisher(redis)
        let notice = Notice(code: "banned", text: "banned from stage", retryAfterMs: 3_600_000).serialized()
        try publisher.publish(channel, clusterEnvelope(origin: 0xbad, seq: 1, room: "stage", Wire.frame(Wire.notice, notice)))
        try publisher.publish(channel, clusterEnvelope(origin: 0xbad, seq: 2, room: "stage", Wire.heartbeatFrame))
        let far = Wire.user("far", room: "stage")
        try publisher.publish(channel, clusterEnvelope(origin: 0xbad, seq: 3, room: "stage", Wire.text(far, "after")))
        #expect(alice.receiveFrame()?.wire == Wire.text(far, "after"), "the notice or the heartbeat was delivered")
        #expect(m.daemon.stderr.wait(forLineWith: ["refused from Redis", "frame_type", "REASON=cluster_input_frame_type"]))
        #expect(refused(m, "frame_type") == 2)
        #expect(m.daemon.child.process.isRunning)
    }

    @Test("a ban until the year 285,000,000 (control channel or hash) is not taken: not listed, the sub joins, PUT and DELETE work")
    func farFutureBan() throws {
        let redis = try RedisServer()
        let wall = Int64(Date().timeIntervalSince1970 * 1000)
        // In the hash before the daemon starts (a daemon loads it at connect): never taken, never written back.
        _ = redis.cli(["HSET", "roomcast:far:moderation", "ban:stage:bob", "8993462400000000000 \(wall) forever"])
        let m = try inputDaemon(redis, name: "far")
        #expect(m.daemon.stderr.wait(for: "cluster: moderation loaded from Redis: 0 bans and mutes", timeout: .seconds(10)))
        #expect(redis.waitForSubscribers("roomcast:far:control", 1))
        _ = redis.cli(["PUBLISH", "roomcast:far:control", "00000000000000ab set ban:stage:alice 8993462400000000000 \(wall) forever"])
        // Set a day ahead of this daemon's clock: it would answer 409 to every change made here.
        _ = redis.cli(["PUBLISH", "roomcast:far:control", "00000000000000ab set ban:stage:carol \(wall + 90_000_000) \(wall + 86_400_000) later"])
        #expect(m.daemon.stderr.wait(forLineWith: ["refused from Redis", "REASON=cluster_input_control"]))
        #expect(m.daemon.stderr.wait(forLineWith: ["refused from Redis", "ahead of this daemon's clock", "REASON=cluster_input_moderation"]))
        let list = try #require(m.api.request("GET", "/v1/rooms/stage/bans"))
        #expect(list.status == 200 && list.body.contains(#""bans": []"#), "\(list.body)")
        _ = try joinSigned(m.daemon, "alice", room: "stage")
        _ = try joinSigned(m.daemon, "bob", room: "stage")
        _ = try joinSigned(m.daemon, "carol", room: "stage")
        #expect(m.api.request("DELETE", "/v1/rooms/stage/bans/alice")?.status == 404, "nothing to remove")
        for sub in ["alice", "carol"] {
            #expect(m.api.request("PUT", "/v1/rooms/stage/bans/\(sub)", body: #"{"seconds": 60}"#)?.status == 200, "PUT of \(sub)")
            #expect(m.api.request("DELETE", "/v1/rooms/stage/bans/\(sub)")?.status == 200, "DELETE of \(sub)")
        }
        #expect(redis.cli(["HGET", "roomcast:far:moderation", "ban:stage:bob"])?.hasPrefix("8993462400000000000 ") == true,
                "the daemon wrote over a field it did not take")
        #expect(refused(m, "control") == 1 && refused(m, "moderation") == 2, "the hash's field and carol's record")
    }

    @Test("viewer counts from a made-up origin: 28 MB of rooms is refused at the reply cap, 100,001 rooms by their count; RSS stays bounded")
    func hugeViewerCounts() throws {
        let redis = try RedisServer()
        let m = try inputDaemon(redis, name: "big")
        let alice = try joinSigned(m.daemon, "alice", room: "stage")
        _ = alice
        #expect(redis.waitForSubscribers("roomcast:big:daemons", 1))
        let pid = m.daemon.child.process.processIdentifier
        let before = try #require(ProcStats.rssKiB(pid))
        let publisher = try RedisPublisher(redis)
        let daemons = Array("roomcast:big:daemons".utf8)
        // 2.8 M distinct rooms of 4 printable bytes: the message of the report.
        var huge: [UInt8] = []
        huge.reserveCapacity(28 << 20)
        var n = 0
        while huge.count < 28 << 20 {
            huge += [4, 0, UInt8(0x21 + n % 94), UInt8(0x21 + (n / 94) % 94), UInt8(0x21 + (n / 8836) % 94), UInt8(0x21 + (n / 830_584) % 94),
                     1, 0, 0, 0]
            n += 1
        }
        try publisher.publish(daemons, daemonsEnvelope(.counts, origin: 0xfeed, huge))
        #expect(m.daemon.stderr.wait(forLineWith: ["refused from Redis", "REASON=cluster_input_reply_size"], timeout: .seconds(10)))
        // Under the cap, but more rooms than a daemon sends (each room once).
        var many: [UInt8] = []
        for i in 0...ClusterCounts.maxRooms {
            let name = Array(String(i, radix: 36).utf8)
            many += [UInt8(name.count), 0] + name + [1, 0, 0, 0]
        }
        #expect(redis.waitForSubscribers("roomcast:big:daemons", 1, timeout: .seconds(10)), "the subscriber is back")
        try publisher.publish(daemons, daemonsEnvelope(.counts, origin: 0xfeed, many))
        #expect(m.daemon.stderr.wait(forLineWith: ["refused from Redis", "tooManyRooms", "REASON=cluster_input_counts"]))
        let after = try #require(ProcStats.rssKiB(pid))
        print("hugeViewerCounts: RSS \(before) KiB before, \(after) KiB after")
        // The report: 17 MB -> 245 MB. The reply cap holds the unparsed
        // bytes to about 26 MB (100,000 rooms of max_room_bytes).
        #expect(after - before < (64 << 10) * rssBoundFactor, "RSS grew from \(before) KiB to \(after) KiB")
        let rooms = try #require(m.api.request("GET", "/v1/rooms?limit=5"))
        #expect(rooms.body.contains(#""room": "stage""#) && !rooms.body.contains(#""room": "a"#), "\(rooms.body)")
        #expect(refused(m, "reply_size") == 1 && refused(m, "counts") == 1)
        #expect(m.daemon.child.process.isRunning)
    }
}

@Suite("A Redis that keeps refusing (real redis-server)", .serialized)
struct ClusterRefusingRedisTests {
    @Test("requirepass the daemon lacks: said once with what Redis said, not per attempt; once when it works again")
    func refusedOnceThenAccepted() throws {
        let redis = try RedisServer(arguments: ["--requirepass", "s3cret-pass"])
        let a = try Daemon(["cluster.redis": redis.address, "cluster.name": "pw"])
        #expect(a.stderr.wait(forLineWith: ["WARNING", "NOAUTH", "REASON=cluster_refused"], timeout: .seconds(5)), "\(a.stderr.current.suffix(2000))")
        Thread.sleep(forTimeInterval: 5)
        let text = a.stderr.current
        // Before: 13 warnings in 6 s, then one every 2 s per connection.
        #expect(lines(text, with: ["WARNING"]) == 1, "\(text.split(separator: "\n").filter { $0.contains("WARNING") }.joined(separator: "\n"))")
        #expect(lines(text, with: ["s3cret-pass"]) == 0, "the password is never logged")
        _ = redis.cli(["-a", "s3cret-pass", "--no-auth-warning", "CONFIG", "SET", "requirepass", ""])
        #expect(a.stderr.wait(forLineWith: ["accepts roomcastd again, after", "REASON=cluster_accepted"], timeout: .seconds(10)),
                "\(a.stderr.current.suffix(2000))")
        #expect(a.stderr.wait(forLineWith: ["cluster: connected to Redis at"], timeout: .seconds(5)))
        Thread.sleep(forTimeInterval: 0.5)
        #expect(lines(a.stderr.current, with: ["accepts roomcastd again"]) == 1)
        #expect(lines(a.stderr.current, with: ["WARNING"]) == 1, "nothing more was said")
    }
}
