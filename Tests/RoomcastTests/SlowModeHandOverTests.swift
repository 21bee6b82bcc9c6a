// Slow mode across a restart (issue 28 item 9): each viewer's last text
// time is carried in the hand-over state (`lastTextMs`, CLOCK_MONOTONIC, the
// same clock in the next process), so a viewer that posted just before the
// restart is refused with slow_mode just after it. In-process, with
// HandOverTests' servers, fake fd store and manual clock.
import Glibc
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

@Suite("Slow mode across a hand-over")
struct SlowModeHandOverTests {
    static func text(_ name: String, room: String, _ text: String) -> [UInt8] {
        FrameCodec.encode(type: 2, body: ChatMessage(user: UserInfo(level: 1, name: name, iconURL: "a", room: room), text: text).serialized(),
                          byteOrder: .little)
    }

    /// The notices among the frames readable on `fd` now.
    static func notices(_ fd: Int32) -> [Notice] {
        HandOverTests.frames(HandOverTests.drain(fd) ?? []).filter { $0.0 == 9 }.compactMap { try? Notice(protobuf: $0.1) }
    }

    @Test("a viewer posts, the daemon restarts, it posts again within the interval: refused with slow_mode; after the interval it may")
    func lastTextTimeCarriesOver() throws {
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(HandOverTests.config, clock: clock)
        let wall = wallClockMilliseconds()
        try a.server.moderation.setSlowMode(RoomName("r1"), seconds: 30, setMs: wall, wallMs: wall)
        let x = a.connect()
        HandOverTests.send(x.peer, HandOverTests.join("alice", room: "r1"))
        try a.tick()
        HandOverTests.send(x.peer, Self.text("alice", room: "r1", "before"))
        try a.tick()
        #expect(Self.notices(x.peer).isEmpty, "the first text is relayed")
        clock.nowMs += 2_000

        let b = try HandOverTests.handOver(a)
        try b.tick()
        _ = HandOverTests.drain(x.peer)
        clock.nowMs += 3_000
        HandOverTests.send(x.peer, Self.text("alice", room: "r1", "right after the restart"))
        try b.tick()
        let refused = Self.notices(x.peer)
        #expect(refused.map(\.code) == ["slow_mode"], "\(refused)")
        #expect((refused.first?.retryAfterMs ?? 0) > 20_000, "about 25 s left of 30: \(refused)")

        clock.nowMs += 30_000
        HandOverTests.send(x.peer, Self.text("alice", room: "r1", "after the interval"))
        try b.tick()
        #expect(Self.notices(x.peer).isEmpty, "one text per interval, not none")
    }

    @Test("the field round-trips; a record without it (an older writer) leaves no last text time")
    func fieldRoundTrips() throws {
        var state = HandOverState(stoppedReadingMs: 9, writer: "t")
        var r = HandOverState.Record(key: 1)
        r.lastTextMs = 123_456_789
        state.connections = [r, HandOverState.Record(key: 2)]
        let back = try HandOverState.decode(state.encode())
        #expect(back.connections.map(\.lastTextMs) == [123_456_789, nil])
    }
}
