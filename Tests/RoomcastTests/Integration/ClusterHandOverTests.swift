// The cluster across a restart that keeps the clients: server A (in this
// process, on a fake fd store, as HandOverTests) hands over to server B,
// both linked to a real redis-server, with a real roomcastd as the other
// daemon. B is subscribed to every restored room before its start returns
// (READY=1), goes on with A's origin and numbering, and the frames A relayed
// in its last loop turn reach the other daemon.
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

    @Test("after a crash (a new origin): restored members are announced again, and the old origin's silence sends no leave for them")
    func crashKeepsMembersElsewhere() throws {
        let redis = try RedisServer()
        let other = try clusterDaemon(redis, name: "crash", ["cluster.timeout": "1s"])
        let bob = try other.connect()
        let bu = Wire.user("bob", room: "r1")
        try bob.send(Wire.join(bu))
        #expect(bob.receiveFrame()?.wire == Wire.join(bu))

        let sections = HandOverTests.config + "[cluster]\nredis = \(redis.address)\nname = crash\ntimeout = 1s\n"
        let clock = HandOverTests.ManualClock()
        /// Ticks `node` for `seconds`, its manual clock following the real one (heartbeats go on).
        func run(_ node: HandOverTests.Node, _ seconds: Double, until done: () -> Bool = { false }) {
            let start = monotonicMs(), base = clock.nowMs
            while monotonicMs() - start < Int64(seconds * 1000) && !done() {
                clock.nowMs = base + UInt64(monotonicMs() - start)
                _ = try? node.tick()
                usleep(2_000)
            }
        }
        let a = try HandOverTests.Node(sections, clock: clock)
        run(a, 5) { a.server.cluster?.connected == true }
        let x = a.connect()
        let alice = HandOverTests.join("alice", room: "r1")
        HandOverTests.send(x.peer, alice)
        run(a, 5) { redis.subscribers("roomcast:crash:room:r1") == 2 }
        #expect(bob.receiveFrame()?.wire == alice)
        run(a, 0.3)  // heard on the daemons channel: a is a daemon that can go silent
        let oldOrigin = a.server.cluster!.origin

        // The crash: A is never ticked again (its heartbeats stop); B takes its live box and log.
        a.notify.update()
        let b = try HandOverTests.Node(sections, clock: clock, stored: a.notify.passed)
        #expect(b.server.cluster!.origin != oldOrigin)
        #expect(b.server.cluster!.connected, "restored rooms subscribed before READY=1 after a crash too")
        run(b, 2.5)
        #expect(bob.receiveFrames(2, timeout: .milliseconds(500)).map(\.wire) == [alice], "alice's join again, and no leave")
        #expect(other.stderr.wait(forLineWith: ["cluster: daemon \(ClusterEnvelope.hex(oldOrigin)) was not heard for 1s; 0 leaves"]),
                "\(other.stderr.current.suffix(1500))")
        close(x.peer)
    }
}
