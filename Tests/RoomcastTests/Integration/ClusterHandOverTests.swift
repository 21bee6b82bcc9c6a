// The cluster across a restart that keeps the clients: server A (in this
// process, on a fake fd store, as HandOverTests) hands over to server B,
// both linked to a real redis-server, with a real roomcastd as the other
// daemon. B is subscribed to every restored room before its start returns
// (READY=1), goes on with A's origin and numbering, and the frames A relayed
// in its last loop turn reach the other daemon; the positions of the other
// daemons' frames carry over too. A crash keeps the origin and numbering
// through the live log.
import Foundation
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("Cluster across a hand-over", .serialized)
struct ClusterHandOverTests {
    @Test("restored rooms are subscribed before READY=1, the origin and numbering carry over, the last turn's frames are published")
    func restartKeepsTheCluster() throws {
        let redis = try RedisServer()
        let other = try clusterDaemon(redis, name: "ho")
        let bob = try other.connect()
        let bu = Wire.user("bob", room: "r1")
        try bob.send(Wire.join(bu))
        #expect(bob.receiveFrame()?.wire == Wire.join(bu))

        let sections = HandOverTests.config + "[cluster]\nredis = \(redis.address)\nname = ho\n"
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(sections, clock: clock)
        #expect(waitUntil(.seconds(5)) { _ = try? a.tick(); return a.server.cluster?.connected == true })
        let x = a.connect()
        let alice = HandOverTests.join("alice", room: "r1")
        HandOverTests.send(x.peer, alice)
        #expect(waitUntil(.seconds(5)) { _ = try? a.tick(); return redis.subscribers("roomcast:ho:room:r1") == 2 })
        #expect(bob.receiveFrame()?.wire == alice)
        let origin = a.server.cluster!.origin
        let au = UserInfo(level: 1, name: "alice", iconURL: "a", room: "r1")
        // Read and relayed in the last loop turn before the hand-over: still
        // in the publisher's output when that turn ends. (The SIGTERM's own
        // turn reads nothing more: what clients send from then on stays in
        // the kernel for the next process, which publishes it.)
        let last = (0..<3).map { Wire.text(au, "last \($0)") }
        let published = a.server.cluster!.published
        for f in last { HandOverTests.send(x.peer, f) }
        #expect(waitUntil(.seconds(5)) { _ = try? a.tick(); return a.server.cluster!.published == published + 3 })
        let b = try HandOverTests.handOver(a, sections: sections)
        #expect(bob.receiveFrames(3).map(\.wire) == last, "the last turn's frames were published before the hand-over")

        let link = try #require(b.server.cluster)
        #expect(link.connected && link.figures.rooms == 1, "subscribed to the restored room when start returned (READY=1)")
        #expect(b.log.contains("cluster: subscribed to 1 restored room before READY=1"), "\(b.log)")
        #expect(redis.waitForSubscribers("roomcast:ho:room:r1", 2), "the other daemon and B; A's subscription is gone")
        #expect(link.origin == origin, "the same daemon to the others")
        #expect(link.carry().streams == a.server.cluster!.carry().streams, "each room's stream goes on where A stopped")

        // Both ways through B.
        _ = HandOverTests.drain(x.peer)
        try bob.send(Wire.text(bu, "to alice"))
        #expect(bob.receiveFrame()?.wire == Wire.text(bu, "to alice"), "bob's echo")
        var got: [UInt8] = []
        #expect(waitUntil(.seconds(5)) {
            _ = try? b.tick()
            got += HandOverTests.drain(x.peer) ?? []
            return HandOverTests.frames(got).contains { $0.1 == Array(Wire.text(bu, "to alice")[6...]) }
        }, "bob's frame reaches alice through B")
        HandOverTests.send(x.peer, Wire.text(au, "after"))
        for _ in 0..<20 { _ = try? b.tick() }
        #expect(bob.receiveFrame()?.wire == Wire.text(au, "after"))
        #expect(other.stderr.line(with: ["cluster_gap"]) == nil)
        close(x.peer)
    }

    /// Ticks `node` for `seconds`, its manual clock following the real one (heartbeats go on).
    static func run(_ node: HandOverTests.Node, _ seconds: Double, until done: () -> Bool = { false }) {
        let start = monotonicMs(), base = node.clock.nowMs
        while monotonicMs() - start < Int64(seconds * 1000) && !done() {
            node.clock.nowMs = base + UInt64(monotonicMs() - start)
            _ = try? node.tick()
            usleep(2_000)
        }
    }

    /// Frames `bob` (on the other daemon) sends while no process of this
    /// daemon listens, after A is gone from Redis. Returns once Redis has
    /// passed the last one on: bob's echo alone does not say the other
    /// daemon's PUBLISH left its buffer, and a next process subscribing
    /// first would receive it (CI saw 1 gap counted of 2).
    static func sendWhileAway(_ redis: RedisServer, channel: String, _ bob: TestClient, _ frames: [[UInt8]]) throws {
        #expect(redis.waitForSubscribers(channel, 1), "only the other daemon listens")
        let watcher = try RedisPublisher(redis)
        try watcher.watch(channel)
        #expect(watcher.waitFor(Array("psubscribe".utf8)), "the watcher subscribed")
        for f in frames {
            try bob.send(f)
            #expect(bob.receiveFrame()?.wire == f, "bob's echo: the other daemon published it")
        }
        #expect(watcher.waitFor(frames.last!), "Redis passed the last frame on")
    }

    @Test("a restart carries the positions of the other daemons' frames: what they published during the gap counts as missed")
    func restartCountsTheGap() throws {
        let redis = try RedisServer()
        // Generous cluster.timeout and restart_grace: this test is about the
        // gap count, and A is ticked only now and then (no heartbeats between),
        // so under a loaded machine (ASan, parallel suites) the short defaults
        // made the other daemon send alice's leave mid-test.
        let other = try clusterDaemon(redis, name: "gap", ["cluster.timeout": "30s"])
        let bob = try other.connect()
        let bu = Wire.user("bob", room: "r1")
        try bob.send(Wire.join(bu))
        #expect(bob.receiveFrame()?.wire == Wire.join(bu))
        let sections = HandOverTests.config + "[cluster]\nredis = \(redis.address)\nname = gap\ntimeout = 30s\nrestart_grace = 30s\n"
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(sections, clock: clock)
        Self.run(a, 5) { a.server.cluster?.connected == true }
        let x = a.connect()
        HandOverTests.send(x.peer, HandOverTests.join("alice", room: "r1"))
        Self.run(a, 5) { redis.subscribers("roomcast:gap:room:r1") == 2 }
        #expect(bob.receiveFrame()?.wire == HandOverTests.join("alice", room: "r1"))
        try bob.send(Wire.text(bu, "before"))
        #expect(bob.receiveFrame()?.wire == Wire.text(bu, "before"))
        Self.run(a, 5) { a.server.cluster!.received >= 1 }
        #expect(a.server.cluster!.tracker.count == 1, "bob's daemon has a position in r1")

        a.notify.update()
        a.server.handOver.flushIdleMs = 0
        a.server.beginHandOver()
        for _ in 0..<3 where !a.server.handOver.done { try a.tick() }
        #expect(a.server.handOver.done)
        try Self.sendWhileAway(redis, channel: "roomcast:gap:room:r1", bob, [Wire.text(bu, "gap 1"), Wire.text(bu, "gap 2")])
        a.notify.update()
        let b = try HandOverTests.Node(sections, clock: clock, stored: a.notify.passed)
        let link = try #require(b.server.cluster)
        #expect(link.tracker.count == 1, "the position carried over")
        try bob.send(Wire.text(bu, "after"))
        #expect(bob.receiveFrame()?.wire == Wire.text(bu, "after"))
        Self.run(b, 5) { link.received >= 1 }
        #expect(link.gaps == 2, "the 2 frames published while no process listened are counted: \(link.gaps) gaps")
        #expect(b.log.contains("cluster: 2 frames from daemon"), "\(b.log)")
        close(x.peer)
    }

    @Test("after a crash: the same origin and numbering (the live log has them), no join again and no leave elsewhere; the other daemons' frames missed meanwhile are counted")
    func crashKeepsTheOrigin() throws {
        let redis = try RedisServer()
        // cluster.timeout = 3s: the manual clock moves only while the test ticks A or B.
        let other = try clusterDaemon(redis, name: "crash", ["cluster.timeout": "3s"])
        let bob = try other.connect()
        let bu = Wire.user("bob", room: "r1")
        try bob.send(Wire.join(bu))
        #expect(bob.receiveFrame()?.wire == Wire.join(bu))

        let sections = HandOverTests.config + "[cluster]\nredis = \(redis.address)\nname = crash\ntimeout = 3s\n"
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(sections, clock: clock)
        Self.run(a, 5) { a.server.cluster?.connected == true }
        let x = a.connect()
        let alice = HandOverTests.join("alice", room: "r1")
        HandOverTests.send(x.peer, alice)
        Self.run(a, 5) { redis.subscribers("roomcast:crash:room:r1") == 2 }
        #expect(bob.receiveFrame()?.wire == alice)
        let au = UserInfo(level: 1, name: "alice", iconURL: "a", room: "r1")
        for i in 0..<3 { HandOverTests.send(x.peer, Wire.text(au, "before \(i)")) }
        Self.run(a, 5) { a.server.cluster!.published >= 4 && a.server.cluster!.publisher.pendingOutput == 0 }
        #expect(bob.receiveFrames(3).map(\.wire) == (0..<3).map { Wire.text(au, "before \($0)") })
        try bob.send(Wire.text(bu, "to alice"))
        #expect(bob.receiveFrame()?.wire == Wire.text(bu, "to alice"))
        Self.run(a, 5) { a.server.cluster!.received >= 1 }
        Self.run(a, 0.3)  // heard on the daemons channel: a is a daemon that can go silent
        let oldOrigin = a.server.cluster!.origin

        // The crash: A is never ticked again and its Redis connections close
        // (the kernel closes a killed process's sockets); B takes its live box and log.
        a.server.cluster!.publisher.close()
        a.server.cluster!.subscriber.close()
        try Self.sendWhileAway(redis, channel: "roomcast:crash:room:r1", bob, [Wire.text(bu, "gap 1"), Wire.text(bu, "gap 2"), Wire.text(bu, "gap 3")])
        a.notify.update()
        let b = try HandOverTests.Node(sections, clock: clock, stored: a.notify.passed)
        let link = try #require(b.server.cluster)
        #expect(link.origin == oldOrigin, "the same daemon to the others after a crash")
        #expect(link.connected, "restored rooms subscribed before READY=1 after a crash too")
        #expect(!b.log.contains("announced"), "no join again: the others still have alice under this origin")
        // Alice's next frame goes on in her room's stream: the other daemon
        // delivers it (a stream behind what it saw would be dropped as late).
        HandOverTests.send(x.peer, Wire.text(au, "after"))
        Self.run(b, 5) { link.published >= 1 && link.publisher.pendingOutput == 0 }
        #expect(bob.receiveFrame()?.wire == Wire.text(au, "after"), "delivered by the other daemon")
        try bob.send(Wire.text(bu, "after"))
        #expect(bob.receiveFrame()?.wire == Wire.text(bu, "after"))
        Self.run(b, 5) { link.received >= 1 }
        #expect(link.gaps == 3, "the 3 frames bob sent during the crash are counted: \(link.gaps)")
        // Longer than cluster.timeout: B's heartbeats keep the origin alive at the other daemon.
        Self.run(b, 3.5)
        #expect(bob.receiveFrames(1, timeout: .milliseconds(300)).isEmpty, "no join again, no leave for alice")
        #expect(other.stderr.line(with: ["was not heard"]) == nil, "\(other.stderr.current.suffix(1500))")
        #expect(other.stderr.line(with: ["cluster_gap"]) == nil, "nothing A sent was lost: \(other.stderr.current.suffix(1500))")
        close(x.peer)
    }
}
