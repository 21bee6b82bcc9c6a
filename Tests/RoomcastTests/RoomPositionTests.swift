// Positions and resume (docs/protocol/positions.md §4): room sequence numbers and
// epochs, the notice `position` once per room per pass, a rejoin "since
// epoch E seq S" getting exactly the frames after S or `history_lost`, the
// join relayed without fields 6-8, and the hand-over state carrying it all.
import Testing
@testable import RoomcastCore

@Suite("Positions and resume (room seq and epoch)")
struct RoomPositionTests {
    typealias R = RelayTests
    typealias H = RoomHistoryTests

    static func join(_ name: String, room: String = "live", positions: Bool? = nil, since: RoomPosition? = nil) -> [UInt8] {
        var u = R.user(name, room: room)
        u.positions = positions
        u.since = since
        return R.frame(0, u.serialized())
    }

    /// A relay with `history`, a streamer (0) in room "live" and `lines` texts from it.
    static func room(history: Int = 50, lines: Int) -> (Relay, RecordingSink) {
        var relay = Relay(settings: H.settings(history))
        let sink = RecordingSink()
        relay.connect(0)
        _ = R.send(&relay, 0, join("streamer"), sink)
        for i in 0..<lines { _ = R.send(&relay, 0, R.text("streamer", "line \(i)"), sink) }
        sink.reset()
        return (relay, sink)
    }

    @Test("UserInfo fields 6-8 and Notice fields 5-6 round-trip; a join is relayed without them (fields 1-4 as sent)")
    func wire() throws {
        let u = UserInfo(level: 1, name: "a", iconURL: "i", room: "r", token: "t", positions: true, since: RoomPosition(epoch: "00ff00ff00ff00ff", seq: 42))
        #expect(try UserInfo(protobuf: u.serialized()) == u)
        #expect(u.serialized().count == u.serializedSize)
        let n = Notice(code: "position", position: RoomPosition(epoch: "0123456789abcdef", seq: 7))
        #expect(try Notice(protobuf: n.serialized()) == n)
        let relayed = u.serialized().withUnsafeBytes { UserInfo.removingDaemonFields($0) }
        #expect(relayed == UserInfo(level: 1, name: "a", iconURL: "i", room: "r").serialized())
        // since_seq absent: 0; since_epoch absent: no resume.
        var w = ProtoWriter(capacity: 32)
        UserInfo(level: 1, name: "a", iconURL: "i").write(to: &w)
        w.writeString(7, "e")
        #expect(try UserInfo(protobuf: w.bytes).since == RoomPosition(epoch: "e", seq: 0))
        var x = ProtoWriter(capacity: 32)
        UserInfo(level: 1, name: "a", iconURL: "i").write(to: &x)
        x.writeTag(8, .varint); x.writeVarint(5)
        #expect(try UserInfo(protobuf: x.bytes).since == nil)
        #expect(RoomPosition.newEpoch().count == 16 && RoomPosition.newEpoch() != RoomPosition.newEpoch())
        #expect(RoomPosition.newEpoch().allSatisfy { "0123456789abcdef".contains($0) })
    }

    @Test("texts and gifts are numbered from 1 per room; joins, leaves and opaque types are not; a new room draws a new epoch")
    func numbering() throws {
        var (relay, sink) = Self.room(lines: 3)
        let p = try #require(relay.position(of: RoomName("live")))
        #expect(p.seq == 3 && p.epoch.count == 16)
        _ = R.send(&relay, 0, H.gift("streamer"), sink)
        _ = R.send(&relay, 0, R.frame(100, [1]), sink)
        relay.connect(1)
        _ = R.send(&relay, 1, Self.join("v"), sink)
        #expect(relay.position(of: RoomName("live")) == RoomPosition(epoch: p.epoch, seq: 4))
        _ = R.send(&relay, 1, Self.join("v", room: "other"), sink)
        _ = R.send(&relay, 1, R.text("v", "x"), sink)
        #expect(relay.position(of: RoomName("other"))?.seq == 1)
        #expect(relay.position(of: RoomName("other"))?.epoch != p.epoch)
        _ = relay.disconnect(0, sink: sink)
        relay.connect(0)
        _ = R.send(&relay, 0, Self.join("streamer"), sink)
        #expect(relay.position(of: RoomName("live"))?.seq == 0, "the room ended with its last member: a new stream")
        #expect(relay.position(of: RoomName("live"))?.epoch != p.epoch)
    }

    @Test("a member asking positions gets the notice position after the join, and once per room per pass after its frames; others never")
    func positionNotices() throws {
        var (relay, sink) = Self.room(lines: 2)
        relay.connect(1)
        relay.connect(2)
        let j = Self.join("p", positions: true)
        _ = R.send(&relay, 1, j, sink)
        _ = R.send(&relay, 2, Self.join("q"), sink)
        let epoch = relay.position(of: RoomName("live"))!.epoch
        let first = sink.frames(to: 1)
        #expect(first.first == R.frame(0, R.user("p", room: "live").serialized()), "the join echo without field 6")
        #expect(try H.positioned(first[1]) == Notice(code: "history", count: 2, position: RoomPosition(epoch: epoch, seq: 2)))
        #expect(try H.positioned(first[4]) == Notice(code: "position", position: RoomPosition(epoch: epoch, seq: 2)))
        #expect(first.count == 6 && first[5] == Self.join("q"), "then q's join")
        sink.reset()
        for i in 0..<3 { _ = R.send(&relay, 0, R.text("streamer", "more \(i)"), sink) }
        #expect(relay.positionsDue)
        relay.sendPositions(sink: sink)
        #expect(!relay.positionsDue)
        let got = sink.frames(to: 1)
        #expect(got.count == 4 && got[..<3].allSatisfy { $0[4] == 2 })
        #expect(try H.positioned(got[3]) == Notice(code: "position", position: RoomPosition(epoch: epoch, seq: 5)))
        #expect(sink.frames(to: 2).count == 3 && sink.frames(to: 0).count == 3, "no notice for members that did not ask")
        sink.reset()
        relay.sendPositions(sink: sink)
        _ = R.send(&relay, 0, R.frame(0, R.user("streamer", room: "live").serialized()), sink)
        relay.sendPositions(sink: sink)
        #expect(sink.frames(to: 1).count == 1, "a pass without texts or gifts: no notice (the join echo only)")
        // A join without field 6 turns them off.
        _ = R.send(&relay, 1, Self.join("p"), sink)
        _ = R.send(&relay, 0, R.text("streamer", "x"), sink)
        #expect(!relay.positionsDue)
    }

    @Test("a rejoin since E/S gets exactly the frames after S; another epoch or frames no longer held: history_lost, then the recent lines")
    func resume() throws {
        var (relay, sink) = Self.room(history: 50, lines: 120)
        let epoch = relay.position(of: RoomName("live"))!.epoch
        relay.connect(1)
        _ = R.send(&relay, 1, Self.join("v", positions: true, since: RoomPosition(epoch: epoch, seq: 100)), sink)
        var got = sink.frames(to: 1)
        #expect(try H.positioned(got[1]) == Notice(code: "history", count: 20, position: RoomPosition(epoch: epoch, seq: 120)))
        #expect(Array(got[2..<22]) == (100..<120).map { R.text("streamer", "line \($0)") }, "lines 101-120 (seq), exactly once")
        #expect(try H.notice(got[22])?.code == "position" && got.count == 23)

        sink.reset()
        relay.connect(2)
        _ = R.send(&relay, 2, Self.join("w", since: RoomPosition(epoch: epoch, seq: 120)), sink)
        got = sink.frames(to: 2)
        #expect(got.count == 2)
        #expect(try H.notice(got[1]) == Notice(code: "history", count: 0), "nothing missed")

        for (n, since) in [("x", RoomPosition(epoch: epoch, seq: 60)), ("y", RoomPosition(epoch: "ffffffffffffffff", seq: 110)),
                           ("z", RoomPosition(epoch: epoch, seq: 121))] {
            sink.reset()
            relay.connect(3)
            _ = R.send(&relay, 3, Self.join(n, since: since), sink)
            got = sink.frames(to: 3)
            #expect(try H.positioned(got[1]) == Notice(code: "history_lost", position: RoomPosition(epoch: epoch, seq: 120)), "\(since)")
            #expect(try H.notice(got[2]) == Notice(code: "history", count: 50))
            #expect(Array(got[3...]) == (70..<120).map { R.text("streamer", "line \($0)") })
            _ = relay.disconnect(3, sink: sink)
        }

        // History off: a resume with nothing missed works, anything else is lost.
        var (off, s2) = Self.room(history: 0, lines: 5)
        let e2 = off.position(of: RoomName("live"))!.epoch
        off.connect(1)
        _ = R.send(&off, 1, Self.join("v", since: RoomPosition(epoch: e2, seq: 5)), s2)
        #expect(try s2.frames(to: 1).dropFirst().map { try H.notice($0)! } == [Notice(code: "history", count: 0)])
        s2.reset()
        off.connect(2)
        _ = R.send(&off, 2, Self.join("w", since: RoomPosition(epoch: e2, seq: 4)), s2)
        #expect(try s2.frames(to: 2).dropFirst().map { try H.notice($0)!.code } == ["history_lost"])
    }

    @Test("a restart carries positions: streams, the positions flag, and adopt() with this process's bounds")
    func handOver() throws {
        var (relay, sink) = Self.room(history: 50, lines: 30)
        relay.connect(1)
        _ = R.send(&relay, 1, Self.join("v", positions: true), sink)
        let streams = relay.streams
        #expect(streams.count == 1 && streams[0].position.seq == 30 && streams[0].history.map(\.seq) == Array(1...30))
        var state = HandOverState()
        state.rooms = streams
        var rec = HandOverState.Record(key: 1)
        rec.positions = relay.wantsPositions(1)
        state.connections = [rec]
        let back = try HandOverState.decode(state.encode())
        #expect(back == state && back.connections[0].positions)
        #expect(state.encode().count <= HandOverState.roomsBytesBound(streams) + 400)

        var next = Relay(settings: H.settings(10))
        let s2 = RecordingSink()
        next.connect(5)
        next.restore(5, room: RoomName("live"), identity: R.user("v", room: "live").serialized(), violations: 0, positions: true)
        back.rooms.forEach { next.adopt($0) }
        #expect(next.position(of: RoomName("live")) == streams[0].position)
        #expect(next.history(of: RoomName("live")).count == 10, "trimmed to this process's history")
        next.adopt(RoomStream(room: RoomName("empty"), position: RoomPosition(epoch: "e", seq: 1), history: []))
        #expect(next.position(of: RoomName("empty")) == nil, "a room without members is not made")
        next.connect(6)
        _ = R.send(&next, 6, Self.join("w", since: RoomPosition(epoch: streams[0].position.epoch, seq: 25)), s2)
        #expect(Array(s2.frames(to: 6)[2...]) == (25..<30).map { R.text("streamer", "line \($0)") })
        _ = R.send(&next, 6, R.text("w", "after"), s2)
        #expect(next.position(of: RoomName("live"))?.seq == 31 && next.positionsDue, "numbering goes on; the restored member asked for positions")
        #expect(throws: HandOverState.DecodeError.self) {
            var bad = HandOverState()
            bad.rooms = [RoomStream(room: RoomName("r"), position: RoomPosition(epoch: "", seq: 1), history: [])]
            _ = try HandOverState.decode(bad.encode())
        }
    }
}
