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
        // Read and relayed in the hand-over's own loop turn: still in the
        // publisher's output when the turn ends.
        let last = (0..<3).map { Wire.text(au, "last \($0)") }
        for f in last { HandOverTests.send(x.peer, f) }
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
}
