// The cluster's wire without Redis: channel names, the envelope,
// the sending side's numbering and the receiving side's late/gap rules, and
// the relay's hooks (rooms opened and closed, frames relayed, remote frames
// delivered).
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

@Suite struct ClusterWireTests {
    @Test func channelNames() {
        let c = ClusterChannels(name: "eu.1")
        #expect(c.room("lobby") == Array("roomcast:eu.1:room:lobby".utf8))
        #expect(c.room("é \u{0}x") == Array("roomcast:eu.1:room:".utf8) + [0xC3, 0xA9, 0x20, 0x00, 0x78])
        #expect(c.heartbeat(origin: 0x3fa2) == Array("roomcast:eu.1:hb:0000000000003fa2".utf8))
    }

    @Test func envelopeRoundTrip() throws {
        let frame = FrameCodec.encode(type: 2, body: [1, 2, 3, 0, 0xff], byteOrder: .little)
        var out: [UInt8] = [9, 9, 9]
        frame.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .littleEndianFrame, origin: 0x0102030405060708, stream: 7, seq: 1 << 40,
                                   room: "lobby", address: "127.0.0.1:5", frame: $0, into: &out)
        }
        #expect(out.count == ClusterEnvelope.fixedSize + 5 + 11 + frame.count)
        #expect(Array(out[0..<5]) == [1, 1, 5, 0, 11])
        try out.withUnsafeBytes { p in
            let v = try ClusterEnvelope.decode(p).get()
            #expect(v.kind == .littleEndianFrame)
            #expect(v.origin == 0x0102030405060708 && v.stream == 7 && v.seq == 1 << 40)
            #expect(Array(v.room) == Array("lobby".utf8))
            #expect(Array(v.address) == Array("127.0.0.1:5".utf8))
            #expect(Array(v.frame) == frame)
        }
    }

    @Test func malformedEnvelopes() {
        let frame = FrameCodec.encode(type: 2, body: [1, 2, 3], byteOrder: .big)
        var good: [UInt8] = []
        frame.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .bigEndianFrame, origin: 1, stream: 1, seq: 1, room: "a", address: "", frame: $0, into: &good)
        }
        func decode(_ b: [UInt8]) -> ClusterEnvelope.DecodeError? {
            b.withUnsafeBytes { if case .failure(let e) = ClusterEnvelope.decode($0) { e } else { nil } }
        }
        #expect(decode(good) == nil)
        #expect(decode(Array(good.prefix(20))) == .tooShort)
        #expect(decode(Array(good.dropLast())) == .badFrame, "a body shorter than its header says")
        #expect(decode(good + [0]) == .badFrame, "bytes after the frame")
        var v3 = good; v3[0] = 3
        #expect(decode(v3) == .unknownVersion(3))
        var k9 = good; k9[1] = 9
        #expect(decode(k9) == .unknownKind(9))
        var le = good; le[1] = 1  // a big-endian header read as little-endian
        #expect(decode(le) == .badFrame)
        var longRoom = good; longRoom[2] = 200
        #expect(decode(longRoom) == .tooShort)
    }

    @Test func headerConversion() {
        let body: [UInt8] = Array(repeating: 7, count: 300)
        let big = FrameCodec.encode(type: 0x0102, body: body, byteOrder: .big)
        var out: [UInt8] = []
        big.withUnsafeBytes { ClusterEnvelope.convertHeader($0, from: .big, to: .little, into: &out) }
        #expect(out == FrameCodec.encode(type: 0x0102, body: body, byteOrder: .little))
    }

    @Test func streamsNumberFramesPerRoomRun() {
        var s = ClusterStreams(channels: ClusterChannels(name: "t"))
        s.open("a")
        s.open("b")
        #expect(s.next("a").seq == 1 && s.next("a").seq == 2)
        let b = s.next("b")
        #expect(b.seq == 1 && b.channel == Array("roomcast:t:room:b".utf8))
        let aStream = s.next("a").stream
        s.close("a")
        // The last member's leave, after the room closed here: a stream of its own.
        let leave = s.next("a")
        #expect(leave.seq == 1 && leave.stream > aStream)
        s.open("a")
        let reopened = s.next("a")
        #expect(reopened.seq == 1 && reopened.stream > leave.stream)
        #expect(s.count == 2)
    }

    @Test func trackerDropsLateFramesAndCountsGaps() {
        var t = ClusterSequenceTracker()
        #expect(t.check(room: "r", origin: 1, stream: 5, seq: 40) == .deliver(missed: 0), "the first frame heard starts the count")
        #expect(t.check(room: "r", origin: 1, stream: 5, seq: 41) == .deliver(missed: 0))
        #expect(t.check(room: "r", origin: 1, stream: 5, seq: 41) == .late, "a duplicate")
        #expect(t.check(room: "r", origin: 1, stream: 5, seq: 45) == .deliver(missed: 3))
        #expect(t.check(room: "r", origin: 1, stream: 5, seq: 43) == .late, "behind the last delivered: dropped, order kept")
        #expect(t.check(room: "r", origin: 1, stream: 4, seq: 99) == .late, "an older run of the room")
        #expect(t.check(room: "r", origin: 1, stream: 6, seq: 1) == .deliver(missed: 0), "the room's next run")
        #expect(t.check(room: "r", origin: 1, stream: 8, seq: 3) == .deliver(missed: 2))
        // Other origins and rooms are counted apart.
        #expect(t.check(room: "r", origin: 2, stream: 1, seq: 9) == .deliver(missed: 0))
        #expect(t.check(room: "s", origin: 1, stream: 1, seq: 1) == .deliver(missed: 0))
        #expect(t.count == 3)
        t.forget(room: "r")
        #expect(t.count == 1)
        #expect(t.check(room: "r", origin: 1, stream: 8, seq: 10) == .deliver(missed: 0), "not listening meanwhile is no loss")
    }
}

/// Records what the relay tells its observer.
final class RecordingObserver: RelayObserver {
    var events: [String] = []
    var frames: [(room: String, sender: Int, frame: [UInt8])] = []
    func roomOpened(_ room: RoomName) { events.append("open \(room)") }
    func roomClosed(_ room: RoomName) { events.append("close \(room)") }
    func relayed(_ frame: UnsafeRawBufferPointer, room: RoomName, from sender: Int) {
        events.append("relay \(room) \(sender)")
        frames.append((room.string, sender, Array(frame)))
    }
}

@Suite struct RelayObserverTests {
    @Test("every relayed frame is reported once with its room, leaves of the last member and synthesized leaves included")
    func framesAndRooms() {
        var relay = Relay(settings: RelaySettings(echo: false))
        let observer = RecordingObserver()
        relay.observer = observer
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        #expect(observer.events == ["open lobby"])
        let alice = RelayTests.user("alice", room: "r")
        let join = RelayTests.frame(0, alice.serialized())
        _ = RelayTests.send(&relay, 0, join, sink)
        #expect(observer.events == ["open lobby", "open r", "relay r 0"])
        #expect(observer.frames.last?.frame == join)
        _ = RelayTests.send(&relay, 0, RelayTests.frame(8, []), sink)  // heartbeat: never relayed
        _ = RelayTests.send(&relay, 0, RelayTests.frame(42, [1]), sink)  // opaque, alone in the room, echo off
        #expect(observer.events.last == "relay r 0")
        #expect(observer.frames.count == 2)
        // The last member disconnects: the room closes, then its synthesized leave is reported.
        relay.disconnect(0, sink: sink)
        #expect(Array(observer.events.suffix(2)) == ["close r", "relay r 0"])
        #expect(observer.frames.last?.frame == RelayTests.frame(1, alice.serialized()))
        // A leave from a client in no room is relayed nowhere and not reported.
        _ = RelayTests.send(&relay, 1, RelayTests.frame(1, RelayTests.user("bob").serialized()), sink)
        #expect(Array(observer.events.suffix(2)) == ["close lobby", "relay lobby 1"], "bob's leave emptied the lobby")
        let before = observer.events.count
        _ = RelayTests.send(&relay, 1, RelayTests.frame(1, RelayTests.user("bob").serialized()), sink)
        #expect(observer.events.count == before)
    }

    @Test("a remote frame reaches every member here, echo rules aside, and is not reported back")
    func remoteDelivery() {
        var relay = Relay(settings: RelaySettings(echo: false))
        let observer = RecordingObserver()
        relay.observer = observer
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        let t = RelayTests.text("zoe", "from afar")
        let n = t.withUnsafeBytes { relay.deliver($0, toRoom: "lobby", sink: sink) }
        #expect(n == 2)
        #expect(sink.frames(to: 0) == [t] && sink.frames(to: 1) == [t])
        #expect(t.withUnsafeBytes { relay.deliver($0, toRoom: "elsewhere", sink: sink) } == 0)
        #expect(observer.frames.isEmpty)
    }
}

@Suite struct ClusterBackoffTests {
    /// A lost connection retries after about 50 ms, and each failed attempt
    /// doubles the wait up to 2 s. (The first version waited 50 ms twice: it
    /// counted the attempt being scheduled as failed already.)
    @Test func doublesFrom50msTo2s() {
        let middle: UInt64 = 20  // 80 + 20 = 100 %: no jitter
        #expect((0...7).map { ClusterLink.retryDelayMs(failedAttempts: $0, random: middle) } == [50, 100, 200, 400, 800, 1600, 2000, 2000])
        #expect(ClusterLink.retryDelayMs(failedAttempts: 1_000, random: middle) == 2000)
    }

    @Test func jitterStaysWithin20Percent() {
        for r in [0, 1, 40, 41, 12_345_678_901, UInt64.max] as [UInt64] {
            let d = ClusterLink.retryDelayMs(failedAttempts: 3, random: r)
            #expect(d >= 320 && d <= 480, "\(d)")
        }
    }
}

@Suite struct ClusterLifeCycleWireTests {
    @Test("a restart's numbering: carried streams go on, new ones come after the last, rooms nobody came back to are dropped")
    func streamsCarryOver() {
        var a = ClusterStreams(channels: ClusterChannels(name: "t"))
        a.open("r1")
        a.open("r2")
        _ = a.next("r1"); _ = a.next("r1"); _ = a.next("r2")
        let s = a.snapshot
        var b = ClusterStreams(channels: ClusterChannels(name: "t"))
        b.restore(lastID: s.lastID, streams: s.streams)
        b.open("r1")  // the restore reopens the room: its stream goes on
        b.retain(["r1"])
        let n = b.next("r1")
        #expect(n.stream == 1 && n.seq == 3, "r1 goes on at 3 in stream 1")
        #expect(b.count == 1, "r2 was dropped")
        b.open("r3")
        #expect(b.next("r3").stream == 3, "a new stream is numbered after the previous process's last")
    }

    @Test("a departed origin is forgotten in every room; others stay")
    func trackerForgetsAnOrigin() {
        var t = ClusterSequenceTracker()
        _ = t.check(room: "a", origin: 1, stream: 1, seq: 5)
        _ = t.check(room: "b", origin: 1, stream: 1, seq: 5)
        _ = t.check(room: "a", origin: 2, stream: 1, seq: 5)
        t.forget(origin: 1)
        #expect(t.count == 1)
        #expect(t.check(room: "a", origin: 1, stream: 1, seq: 9) == .deliver(missed: 0), "starts over: no gap counted")
        #expect(t.check(room: "a", origin: 2, stream: 1, seq: 9) == .deliver(missed: 3))
    }

    @Test("a bye envelope and the daemons channel")
    func byeEnvelope() throws {
        #expect(ClusterChannels(name: "x").daemons == Array("roomcast:x:daemons".utf8))
        var out: [UInt8] = []
        ClusterEnvelope.encode(kind: .bye, origin: 42, stream: 0, seq: 0, room: RoomName(bytes: []), address: "",
                               frame: UnsafeRawBufferPointer(start: nil, count: 0), into: &out)
        #expect(out[1] == 3)
        let view = try out.withUnsafeBytes { try ClusterEnvelope.decode($0).get() }
        #expect(view.kind == .bye && view.origin == 42)
    }

    @Test("a hand-over envelope carries the grace in seq, with no room and no frame")
    func handingOverEnvelope() throws {
        var out: [UInt8] = []
        ClusterEnvelope.encode(kind: .handingOver, origin: 42, stream: 0, seq: 1_500, room: RoomName(bytes: []), address: "",
                               frame: UnsafeRawBufferPointer(start: nil, count: 0), into: &out)
        #expect(out[1] == 5 && out.count == ClusterEnvelope.fixedSize)
        let view = try out.withUnsafeBytes { try ClusterEnvelope.decode($0).get() }
        #expect(view.kind == .handingOver && view.origin == 42 && view.seq == 1_500 && view.frame.isEmpty)
    }
}
