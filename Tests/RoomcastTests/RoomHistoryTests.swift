// Recent lines on join (docs/protocol/positions.md §4): what a room keeps, within
// `[rooms] history` frames and `history_bytes`, and what a joining member
// gets: its join echo, the notice `history` with the count, then the frames
// oldest first, before anything live.
import Testing
@testable import RoomcastCore

@Suite("Recent lines on join ([rooms] history)")
struct RoomHistoryTests {
    typealias R = RelayTests

    static func settings(_ frames: Int, bytes: Int = 262_144) -> RelaySettings {
        var s = RelaySettings()
        s.historyFrames = frames
        s.historyBytes = bytes
        return s
    }

    /// The notice in `frame` without its position (nil: not a notice).
    static func notice(_ frame: [UInt8]) throws -> Notice? {
        var n = try positioned(frame)
        n?.position = nil
        return n
    }

    /// The notice in `frame`, position included (nil: not a notice).
    static func positioned(_ frame: [UInt8]) throws -> Notice? {
        guard frame[4] == 9 else { return nil }
        return try Notice(protobuf: Array(frame[6...]))
    }

    static func gift(_ name: String) -> [UInt8] {
        R.frame(3, GiftMessage(user: R.user(name), giftname: "rose", giftURL: "https://x/rose.png", giftcount: 1).serialized())
    }

    @Test("the ring keeps the newest N frames and at most history_bytes; a frame over the bound alone is not kept")
    func ringBounds() {
        var h = RoomHistory()
        for i in 0..<200 {
            let f = R.text("a", "line \(i)")
            f.withUnsafeBytes { h.append($0, seq: Int64(i + 1), maxFrames: 50, maxBytes: 1 << 20) }
        }
        #expect(h.count == 50)
        #expect(Array(h.all) == (150..<200).map { R.text("a", "line \($0)") })
        #expect(h.bytes == h.all.reduce(0) { $0 + $1.count })
        let size = R.text("a", "line 100").count
        h.trim(maxFrames: 50, maxBytes: size * 10)
        #expect(h.count == 10 && Array(h.all) == (190..<200).map { R.text("a", "line \($0)") }, "the oldest go first")
        let big = [UInt8](repeating: 1, count: size * 11)
        big.withUnsafeBytes { h.append($0, seq: 201, maxFrames: 50, maxBytes: size * 10) }
        #expect(h.count == 10, "a frame over history_bytes is not kept, and drops nothing")
        #expect(h.frames(after: 195, last: 200).map(Array.init) == (195..<200).map { R.text("a", "line \($0)") })
        #expect(h.frames(after: 200, last: 200)?.isEmpty == true, "nothing missed")
        #expect(h.frames(after: 189, last: 200) == nil, "line 190 (seq 190) was dropped")
        #expect(h.frames(after: 199, last: 201) == nil, "seq 201 was never kept: a hole")
        #expect(h.frames(after: 201, last: 200) == nil && h.frames(after: -1, last: 200) == nil, "a position the room never had")
        #expect(h.numbered.map(\.seq) == Array(191...200))
    }

    @Test("join after 200 lines with history = 50: the join echo, the notice history (50), the last 50 in order, then live")
    func joinGetsTheLastLines() throws {
        var relay = Relay(settings: Self.settings(50))
        let sink = RecordingSink()
        relay.connect(0)
        _ = R.send(&relay, 0, R.frame(0, R.user("streamer", room: "live").serialized()), sink)
        let lines = (0..<200).map { R.text("streamer", "line \($0)") }
        for (i, f) in lines.enumerated() {
            _ = R.send(&relay, 0, f, sink)
            if i == 120 { _ = R.send(&relay, 0, Self.gift("streamer"), sink) }
            if i == 130 { _ = R.send(&relay, 0, R.frame(100, [1, 2, 3]), sink) }  // opaque: never kept
        }
        relay.connect(1)
        sink.reset()
        let join = R.frame(0, R.user("viewer", room: "live").serialized())
        _ = R.send(&relay, 1, join, sink)
        let got = sink.frames(to: 1)
        #expect(got.first == join, "the join echo first")
        #expect(try Self.notice(got[1]) == Notice(code: "history", count: 50))
        #expect(Array(got[2...]) == Array(lines[150...]), "the last 50 texts, oldest first (the gift was older)")
        #expect(sink.frames(to: 0) == [join], "the others hear the join only")
        sink.reset()
        let live = R.text("streamer", "live")
        _ = R.send(&relay, 0, live, sink)
        #expect(sink.frames(to: 1) == [live], "then live")
    }

    @Test("an empty room's history: the notice with count 0; a join repeating the room replays nothing; off: no notice")
    func emptyRepeatAndOff() throws {
        var relay = Relay(settings: Self.settings(10))
        let sink = RecordingSink()
        relay.connect(0)
        let join = R.frame(0, R.user("a", room: "r").serialized())
        _ = R.send(&relay, 0, join, sink)
        #expect(try Self.notice(sink.frames(to: 0)[1]) == Notice(code: "history", count: 0))
        _ = R.send(&relay, 0, R.text("a", "x"), sink)
        sink.reset()
        _ = R.send(&relay, 0, R.frame(0, R.user("a2", room: "r").serialized()), sink)
        #expect(sink.frames(to: 0).count == 1, "a new name in the same room: the join echo only")

        var off = Relay(settings: RelaySettings())
        let s2 = RecordingSink()
        off.connect(0)
        _ = R.send(&off, 0, join, s2)
        _ = R.send(&off, 0, R.text("a", "x"), s2)
        off.connect(1)
        s2.reset()
        _ = R.send(&off, 1, R.frame(0, R.user("b", room: "r").serialized()), s2)
        #expect(s2.frames(to: 1) == [R.frame(0, R.user("b", room: "r").serialized())], "history = 0: nothing but the join echo")
    }

    @Test("the first join into the default room replays it; API publishes and other daemons' frames are kept; gifts too")
    func defaultRoomPublishAndDeliver() throws {
        var relay = Relay(settings: Self.settings(10))
        let sink = RecordingSink()
        relay.connect(0)
        let published = R.text("service", "pinned")
        _ = published.withUnsafeBytes { relay.publish($0, type: 2, toRoom: RoomName("lobby"), sink: sink) }
        let remote = Self.gift("far")
        _ = remote.withUnsafeBytes { relay.deliver($0, toRoom: RoomName("lobby"), sink: sink) }
        relay.connect(1)
        sink.reset()
        let join = R.frame(0, R.user("b").serialized())
        _ = R.send(&relay, 1, join, sink)
        let got = sink.frames(to: 1)
        #expect(got.count == 4)
        #expect(try Self.notice(got[1]) == Notice(code: "history", count: 2))
        #expect(Array(got[2...]) == [published, remote])
    }

    @Test("a reload that lowers history trims what rooms hold; 0 empties them; the last member leaving ends a room's history")
    func reloadAndRoomEnd() throws {
        var relay = Relay(settings: Self.settings(10))
        let sink = RecordingSink()
        relay.connect(0)
        _ = R.send(&relay, 0, R.frame(0, R.user("a", room: "r").serialized()), sink)
        for i in 0..<10 { _ = R.send(&relay, 0, R.text("a", "\(i)"), sink) }
        relay.reconfigure(Self.settings(3))
        #expect(Array(relay.history(of: RoomName("r"))) == (7..<10).map { R.text("a", "\($0)") })
        relay.reconfigure(Self.settings(0))
        #expect(relay.history(of: RoomName("r")).isEmpty)
        relay.reconfigure(Self.settings(5))
        _ = R.send(&relay, 0, R.text("a", "kept"), sink)
        _ = relay.disconnect(0, sink: sink)
        relay.connect(1)
        sink.reset()
        _ = R.send(&relay, 1, R.frame(0, R.user("b", room: "r").serialized()), sink)
        #expect(try Self.notice(sink.frames(to: 1)[1]) == Notice(code: "history", count: 0), "a new room: nothing held")
    }

    @Test("[rooms] history and history_bytes: defaults, bounds, file and line on a bad value")
    func configKeys() throws {
        let c = try Config.parse("[rooms]\nhistory = 50\nhistory_bytes = 64K\n", file: "t.conf")
        #expect(c.rooms.history == 50 && c.rooms.historyBytes == 65_536)
        #expect(RelaySettings(c).historyFrames == 50 && RelaySettings(c).historyBytes == 65_536)
        let d = try Config.parse("", file: "t.conf")
        #expect(d.rooms.history == 0 && d.rooms.historyBytes == 262_144)
        #expect(throws: ConfigError.self) { try Config.parse("[rooms]\nhistory = 10001\n", file: "t.conf") }
        #expect(throws: ConfigError.self) { try Config.parse("[rooms]\nhistory_bytes = 100\n", file: "t.conf") }
    }
}
