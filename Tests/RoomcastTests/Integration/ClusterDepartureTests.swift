// A daemon that hands its clients over (under systemd every SIGTERM: a
// restart and a stop look the same to it) tells the other daemons on the
// daemons channel that it is back within `[cluster] restart_grace`. Server
// A (in this process, on a fake fd store, as HandOverTests) hands over; the
// other daemon is a real roomcastd on a real redis-server. No next process
// (`systemctl stop`): the other daemon's members hear A's users leave
// within restart_grace, long before `cluster.timeout`. A next process
// within it (`systemctl restart`): no leave, no join again, no ghost. One
// that comes back later: the leaves, then its members announced again.
import Foundation
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("A daemon that hands over tells the others (restart_grace)", .serialized)
struct ClusterDepartureTests {
    /// The other daemon with bob in r1, and A with alice in r1, both seen there.
    static func setUp(_ redis: RedisServer, name: String, otherTimeout: String, a aSettings: String)
        throws -> (other: Daemon, bob: TestClient, a: HandOverTests.Node, alice: Int32, sections: String) {
        let other = try clusterDaemon(redis, name: name, ["cluster.timeout": otherTimeout])
        let bob = try other.connect()
        try bob.send(Wire.join(Wire.user("bob", room: "r1")))
        #expect(bob.receiveFrame()?.wire == Wire.join(Wire.user("bob", room: "r1")))
        let sections = HandOverTests.config + "[cluster]\nredis = \(redis.address)\nname = \(name)\n" + aSettings
        let a = try HandOverTests.Node(sections, clock: HandOverTests.ManualClock())
        ClusterHandOverTests.run(a, 5) { a.server.cluster?.connected == true }
        let x = a.connect()
        HandOverTests.send(x.peer, HandOverTests.join("alice", room: "r1"))
        ClusterHandOverTests.run(a, 5) { redis.subscribers("roomcast:\(name):room:r1") == 2 }
        #expect(bob.receiveFrame()?.wire == HandOverTests.join("alice", room: "r1"), "alice's join reached the other daemon")
        ClusterHandOverTests.run(a, 0.3)  // A's heartbeats heard on the daemons channel
        return (other, bob, a, x.peer, sections)
    }

    /// A hands over, ticked until done; nothing takes its clients yet.
    static func handOver(_ a: HandOverTests.Node) throws {
        a.notify.update()
        a.server.handOver.flushIdleMs = 0
        a.server.beginHandOver()
        for _ in 0..<3 where !a.server.handOver.done { try a.tick() }
        #expect(a.server.handOver.done)
        a.notify.update()
    }

    /// Alice's leave: her join's body (HandOverTests.join) as a leave.
    static let aliceLeave = Wire.leave(UserInfo(level: 1, name: "alice", iconURL: "a", room: "r1"))

    @Test("a hand-over that no process takes back (systemctl stop): the other daemon's members hear the leave within restart_grace, not cluster.timeout")
    func stopUnderSystemdSendsTheLeavesWithinTheGrace() throws {
        let redis = try RedisServer()
        // cluster.timeout 10s at the other daemon: silence alone would take 10 s.
        let s = try Self.setUp(redis, name: "stop", otherTimeout: "10s", a: "timeout = 10s\nrestart_grace = 500ms\n")
        let started = monotonicMs()
        try Self.handOver(s.a)
        let leave = s.bob.receiveFrame(timeout: .seconds(4))
        let ms = monotonicMs() - started
        #expect(leave?.wire == Self.aliceLeave, "alice's leave, as for a local disconnect (after \(ms) ms)")
        #expect(ms >= 450 && ms < 5_000, "within restart_grace (500 ms) and slack, far from cluster.timeout (10 s): \(ms) ms")
        print("hand-over, no next process: the other daemon's member got the leave \(ms) ms after it (restart_grace 500 ms)")
        #expect(s.other.stderr.line(with: ["handed its clients over", "within 500ms"]) != nil, "\(s.other.stderr.current.suffix(1500))")
        #expect(s.other.stderr.line(with: ["handed over and was not heard again within 500ms (stopped); 1 leave"]) != nil,
                "\(s.other.stderr.current.suffix(1500))")
        s.bob.expectNoFrame(within: .milliseconds(300), "one leave")
        close(s.alice)
    }

    @Test("a hand-over taken back within restart_grace (systemctl restart): no leave, no join again, for longer than cluster.timeout; then leaves work")
    func restartWithinTheGraceSendsNothing() throws {
        let redis = try RedisServer()
        // 3 s each, not 1 s: B heartbeats every 750 ms, so only a stall of
        // the test process over 2 s (not one of 1 s on a loaded machine under
        // ASan, as CI saw) makes the other daemon find A's origin silent.
        let s = try Self.setUp(redis, name: "restart", otherTimeout: "3s", a: "timeout = 3s\nrestart_grace = 3s\n")
        try Self.handOver(s.a)
        let b = try HandOverTests.Node(s.sections, clock: s.a.clock, stored: s.a.notify.passed)
        let link = try #require(b.server.cluster)
        #expect(link.connected && link.origin == s.a.server.cluster!.origin)
        // Past restart_grace and cluster.timeout: B's heartbeats keep A's origin alive there.
        ClusterHandOverTests.run(b, 4)
        #expect(s.bob.receiveFrames(1, timeout: .milliseconds(300)).isEmpty, "no leave and no join again for alice")
        let back = s.other.stderr.line(with: ["is back", "ms after its hand-over"])
        #expect(back != nil, "\(s.other.stderr.current.suffix(1500))")
        print("hand-over taken back: \(back ?? "-")")
        #expect(!b.log.contains("announced"), "no join again: \(b.log)")
        #expect(s.other.stderr.line(with: ["was not heard"]) == nil && s.other.stderr.line(with: ["cluster_daemon_gone"]) == nil)
        // No ghost: alice's own leave still reaches bob through B.
        close(s.alice)
        ClusterHandOverTests.run(b, 0.5)
        #expect(s.bob.receiveFrame(timeout: .seconds(3))?.wire == Self.aliceLeave, "alice's leave when she goes")
    }

    @Test("a next process later than restart_grace: the other daemon sent the leave; the restored member is announced again (its join)")
    func lateReturnAnnouncesTheMembersAgain() throws {
        let redis = try RedisServer()
        let s = try Self.setUp(redis, name: "late", otherTimeout: "10s", a: "timeout = 10s\nrestart_grace = 300ms\n")
        let started = monotonicMs()
        try Self.handOver(s.a)
        #expect(s.bob.receiveFrame(timeout: .seconds(4))?.wire == Self.aliceLeave, "the leave, restart_grace after the hand-over")
        s.a.clock.nowMs += UInt64(monotonicMs() - started)  // the real time that passed, on A's and B's clock
        let b = try HandOverTests.Node(s.sections, clock: s.a.clock, stored: s.a.notify.passed)
        #expect(b.server.cluster?.connected == true)
        ClusterHandOverTests.run(b, 0.5)
        #expect(s.bob.receiveFrame(timeout: .seconds(3))?.wire == HandOverTests.join("alice", room: "r1"), "alice is in r1 again for bob")
        let log = b.log
        #expect(log.contains("ms after the end of the [cluster] restart_grace the hand-over announced"), "\(log)")
        #expect(log.contains("announced 1 restored member to the other daemons after the late return"), "\(log)")
        s.bob.expectNoFrame(within: .milliseconds(300), "nothing else")
        close(s.alice)
    }
}

@Suite("The other daemons awaited back from a hand-over (RemoteDaemons)")
struct RemoteDaemonsReturnTests {
    @Test("awaited until heard; silence does not count meanwhile; overdue once the grace has passed; a second hand-over moves the deadline")
    func returns() {
        var r = RemoteDaemons()
        r.heard(7, nowMs: 1_000)
        r.handingOver(7, graceMs: 500, nowMs: 2_000)
        #expect(r.nextReturnMs == 2_500)
        #expect(r.silent(since: 10_000).isEmpty, "awaited: its own deadline decides, not cluster.timeout")
        #expect(r.overdue(nowMs: 2_499).isEmpty)
        r.handingOver(7, graceMs: 500, nowMs: 2_200)  // restarted again while starting
        #expect(r.nextReturnMs == 2_700)
        #expect(r.overdue(nowMs: 2_600).isEmpty)
        let late = r.overdue(nowMs: 2_700)
        #expect(late.map(\.origin) == [7] && late.first?.awaited == RemoteDaemons.Return(sinceMs: 2_000, byMs: 2_700))
        #expect(r.nextReturnMs == nil && r.overdue(nowMs: 9_000).isEmpty, "once")

        r.handingOver(8, graceMs: 1_000, nowMs: 3_000)
        #expect(r.heard(8, nowMs: 3_200) == RemoteDaemons.Return(sinceMs: 3_000, byMs: 4_000), "back: 200 ms after its hand-over")
        #expect(r.nextReturnMs == nil && r.heard(8, nowMs: 3_300) == nil)

        r.handingOver(9, graceMs: 1_000, nowMs: 5_000)
        r.heardAll(nowMs: 5_100)  // this daemon's own link was down: the heartbeat may have been missed
        #expect(r.nextReturnMs == nil && r.silent(since: 5_050).isEmpty && r.silent(since: 5_200).contains(9))
        r.handingOver(10, graceMs: 1_000, nowMs: 6_000)
        _ = r.remove(10)
        #expect(r.nextReturnMs == nil, "gone (a bye): no longer awaited")
    }
}
