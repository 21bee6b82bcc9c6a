// What a daemon takes from Redis (issue 28, item 4; docs/cluster.md, "What
// arrives from Redis"), without Redis: each bound of ClusterInput.swift,
// the moderation records' bounds, the origin and counts tables of
// RemoteDaemons, and the reply budget of the hiredis reader.
@preconcurrency import CHiredis
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

@Suite struct ClusterInputTests {
    private func counts(_ entries: [(room: [UInt8], members: UInt32)]) -> [UInt8] {
        var out: [UInt8] = []
        for e in entries {
            withUnsafeBytes(of: UInt16(e.room.count).littleEndian) { out.append(contentsOf: $0) }
            out += e.room
            withUnsafeBytes(of: e.members.littleEndian) { out.append(contentsOf: $0) }
        }
        return out
    }

    private func decode(_ p: [UInt8], maxRoomBytes: Int = 255, maxRooms: Int = ClusterCounts.maxRooms) -> Result<[RoomName: Int], ClusterCounts.DecodeError> {
        p.withUnsafeBytes { ClusterCounts.decode($0, maxRoomBytes: maxRoomBytes, maxRooms: maxRooms) }
    }

    @Test("viewer counts: rooms as the relay takes them, at most maxRooms, members 1 ... 2^20, each room once")
    func countsBounds() throws {
        var good: [UInt8] = []
        ClusterCounts.encode([(room: "lobby", members: 3), (room: "stage", members: 1)], into: &good)
        #expect(try decode(good).get() == ["lobby": 3, "stage": 1])
        #expect(try decode([]).get() == [:])
        for cut in 1..<good.count where cut != 11 { #expect(decode(Array(good[..<cut])) == .failure(.cutShort), "cut at \(cut)") }
        let three = counts([(Array("a".utf8), 1), (Array("b".utf8), 1), (Array("c".utf8), 1)])
        #expect(decode(three, maxRooms: 3).map(\.count) == .success(3))
        #expect(decode(three, maxRooms: 2) == .failure(.tooManyRooms))
        #expect(decode(counts([([], 1)])) == .failure(.badRoom), "an empty room")
        #expect(decode(counts([(Array(repeating: 0x61, count: 256), 1)])) == .failure(.badRoom), "over max_room_bytes")
        #expect(decode(counts([(Array(repeating: 0x61, count: 256), 1)]), maxRoomBytes: 256).map(\.count) == .success(1))
        #expect(decode(counts([([0xC3, 0x28], 1)])) == .failure(.badRoom), "not UTF-8")
        #expect(decode(counts([(Array("a".utf8), 0)])) == .failure(.badCount))
        #expect(decode(counts([(Array("a".utf8), UInt32(ClusterCounts.maxMembers) + 1)])) == .failure(.badCount))
        #expect(decode(counts([(Array("a".utf8), 2), (Array("a".utf8), 2)])) == .failure(.duplicateRoom))
        // The 28 MB attack's shape: millions of 1-byte rooms, refused by the count before any is kept.
        let many = [UInt8](repeating: 0, count: 0) + (0..<(ClusterCounts.maxRooms + 1)).flatMap { _ in [1, 0, 0x61, 1, 0, 0, 0] as [UInt8] }
        #expect(decode(many) == .failure(.tooManyRooms))
    }

    @Test("a daemon with more than maxRooms rooms sends the first maxRooms, so the others take its counts")
    func countsEncodeIsBounded() throws {
        let rooms = (0...ClusterCounts.maxRooms).map { (room: RoomName("r\($0)"), members: 1) }
        var out: [UInt8] = []
        ClusterCounts.encode(rooms, into: &out)
        #expect(try decode(out).get().count == ClusterCounts.maxRooms)
    }

    private let settings = RelaySettings()

    private func check(_ frame: [UInt8], room: RoomName = "live", sub: [UInt8] = [], settings s: RelaySettings? = nil) -> ClusterRefusal? {
        frame.withUnsafeBytes { f in sub.withUnsafeBytes { ClusterFrameCheck.refusal(f, order: .little, room: room, sub: $0, settings: s ?? settings) } }
    }

    @Test("room channels: the frames a relay relays, nothing else (no notice, no heartbeat, no daemon fields, no other room)")
    func frameKinds() {
        let alice = Wire.user("alice", room: "live")
        #expect(check(Wire.join(alice)) == nil)
        #expect(check(Wire.join(Wire.user("alice"))) == nil, "a join of the default room names none")
        #expect(check(Wire.leave(alice)) == nil)
        #expect(check(Wire.text(alice, "hi")) == nil)
        #expect(check(Wire.gift(alice, "rose")) == nil)
        #expect(check(Wire.frame(Wire.opaque, [1, 2, 3])) == nil, "opaque types are relayed unchanged")
        let banned = Notice(code: "banned", text: "banned from live", retryAfterMs: 1000).serialized()
        #expect(check(Wire.frame(Wire.notice, banned)) == .frameType, "no daemon publishes a notice")
        #expect(check(Wire.heartbeatFrame) == .frameType, "heartbeats are never relayed")
        #expect(check(Wire.join(Wire.user("alice", room: "other"))) == .body, "a join relayed in another room than it names")
        let withToken = UserInfo(level: 1, name: "alice", iconURL: "", room: "live", token: "a.b.c")
        #expect(check(Wire.join(withToken)) == .body, "the relay strips the token before relaying")
        #expect(check(Wire.frame(Wire.text, [0xFF, 0xFF])) == .body, "a text the relay would refuse")
        var lax = settings
        lax.validate = false
        #expect(check(Wire.frame(Wire.text, [0xFF, 0xFF]), settings: lax) == nil, "validate = no relays it")
        #expect(check(Wire.text(alice, "hi"), sub: Array(repeating: 0x61, count: 1025)) == .sub)
        #expect(check(Wire.text(alice, "hi"), sub: [0xC3, 0x28]) == .sub)
        #expect(check(Wire.text(alice, "hi"), sub: Array("acct-1".utf8)) == nil)
    }

    private func record(_ field: String, _ value: String) -> ModerationRecord? {
        ModerationRecord(field: Array(field.utf8), value: Array(value.utf8))
    }

    @Test("moderation records: a ban or mute of at most 14 days after it was set, as the API writes them")
    func moderationDurations() {
        let set: Int64 = 1_800_000_000_000
        let max = Int64(ModerationRecord.maxSeconds) * 1000
        #expect(record("ban:live:alice", "\(set + max) \(set) spam") != nil)
        #expect(record("ban:live:alice", "\(set + max + 1) \(set) spam") == nil)
        #expect(record("ban:live:alice", "\(set) \(set) spam") == nil, "a ban that ends when it starts")
        // The ban of the report: until the year 285,000,000.
        #expect(record("ban:live:alice", "8993462400000000000 \(set) x") == nil)
        #expect(record("mute:live:alice", "\(set + 5000) \(set + 9000) !") != nil, "a removal after the entry's end")
        #expect(record("mute:live:alice", "\(Int64.max) 0 !") == nil)
        #expect(record("ban:live:alice", "\(Int64.max) \(Int64.max) x") == nil, "no overflow")
        #expect(ControlMessage(Array("00000000000000ab set ban:live:alice 8993462400000000000 \(set) x".utf8)) == nil)
    }

    @Test("moderation records need this daemon's clock and config: no time ahead of it, no room over max_room_bytes, a UTF-8 sub")
    func moderationNeedsClock() throws {
        let wall: Int64 = 1_800_000_000_000
        let skew = ModerationRecord.maxClockSkewMs
        let ok = try #require(record("ban:live:alice", "\(wall + 60_000) \(wall) x"))
        #expect(ok.refusal(wallMs: wall, maxRoomBytes: 255) == nil)
        let ahead = try #require(record("ban:live:alice", "\(wall + skew + 2000) \(wall + skew + 1000) x"))
        #expect(ahead.refusal(wallMs: wall, maxRoomBytes: 255) != nil, "it would win over every change made here (409)")
        let settingAhead = try #require(record("settings:live", "10 \(wall + skew + 1)"))
        #expect(settingAhead.refusal(wallMs: wall, maxRoomBytes: 255) != nil)
        let longRoom = try #require(record("ban:\(String(repeating: "r", count: 256)):alice", "\(wall + 1000) \(wall) x"))
        #expect(longRoom.refusal(wallMs: wall, maxRoomBytes: 255) != nil)
        let badSub = try #require(record("ban:live:%C3%28", "\(wall + 1000) \(wall) x"))
        #expect(badSub.refusal(wallMs: wall, maxRoomBytes: 255) != nil)
    }

    @Test("origins: a bounded table; a made-up origin with nothing is forgotten, one with members after a minute unheard")
    func originTable() {
        var r = RemoteDaemons()
        var admitted = 0
        for o in 0..<UInt64(RemoteDaemons.maxDaemons) where r.admit(o + 1, nowMs: 1000) { admitted += 1 }
        #expect(admitted == RemoteDaemons.maxDaemons)
        let full = r.admit(999_999, nowMs: 1000), known = r.admit(1, nowMs: 1000)
        #expect(!full, "the table is full")
        #expect(known, "a known daemon still passes")
        let forgotten = r.expireCounts(nowMs: 1001)
        #expect(forgotten.count == RemoteDaemons.maxDaemons, "nothing held: forgotten at once")
        let again = r.admit(999_999, nowMs: 2000)
        #expect(again)
        _ = r.joined(999_999, address: "1.2.3.4:5", room: "live", identity: [], nowMs: 2000)
        #expect(r.expireCounts(nowMs: 2001).isEmpty, "it holds a member")
        #expect(r.unannounced(notSeenSince: 2000).isEmpty)
        #expect(r.unannounced(notSeenSince: 2001) == [999_999])
        r.heard(999_999, nowMs: 3000)
        #expect(r.unannounced(notSeenSince: 5000).isEmpty, "a daemon heard on the daemons channel is found silent by cluster.timeout instead")
        let framed = r.admit(424_242, nowMs: 6000, frame: true)
        #expect(framed && r.expireCounts(nowMs: 6001).isEmpty, "a daemon whose frames were delivered keeps its positions until it departs")
        #expect(r.unannounced(notSeenSince: 6001).contains(424_242))
    }

    @Test("viewer counts over every daemon are bounded: counts that would pass maxCountedRooms are refused, the old ones kept")
    func countedRoomsBound() {
        var r = RemoteDaemons()
        let half = RemoteDaemons.maxCountedRooms / 2
        let a = Dictionary(uniqueKeysWithValues: (0..<half).map { (RoomName("a\($0)"), 1) })
        let b = Dictionary(uniqueKeysWithValues: (0..<half).map { (RoomName("b\($0)"), 1) })
        let first = r.setCounts(1, a, nowMs: 0), second = r.setCounts(2, b, nowMs: 0), third = r.setCounts(3, ["c": 1], nowMs: 0)
        #expect(first && second && !third)
        let fewer = r.setCounts(2, ["b0": 5], nowMs: 0)
        #expect(fewer, "a daemon replacing its own counts by fewer")
        #expect(r.countedRooms == half + 1 && r.viewers["b0"] == 5 && r.viewers["b1"] == nil)
        let now = r.setCounts(3, ["c": 1], nowMs: 0)
        #expect(now)
        _ = r.remove(1)
        #expect(r.countedRooms == 2)
        r.expireCounts(nowMs: RemoteDaemons.countsMaxAgeMs + 1)
        #expect(r.countedRooms == 0 && r.viewers.isEmpty)
    }

    /// Feeds `bytes` to a reader bounded at `max`: the replies it returned
    /// (their types), and whether it stopped over the budget.
    private func read(_ bytes: [UInt8], max: Int) -> (types: [Int32], exceeded: Bool, error: Bool) {
        let budget = UnsafeMutablePointer<roomcast_reply_budget>.allocate(capacity: 1)
        budget.initialize(to: roomcast_reply_budget())
        budget.pointee.max = max
        defer { budget.deallocate() }
        let reader = roomcast_reader_create(budget)!
        defer { redisReaderFree(reader) }
        _ = bytes.withUnsafeBytes { redisReaderFeed(reader, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
        var types: [Int32] = []
        while true {
            var object: UnsafeMutableRawPointer?
            guard redisReaderGetReply(reader, &object) == REDIS_OK else { return (types, budget.pointee.exceeded != 0, true) }
            guard let object else { return (types, false, false) }
            types.append(object.assumingMemoryBound(to: redisReply.self).pointee.type)
            freeReplyObject(object)
        }
    }

    @Test("a reply's total size is bounded with its nested elements: an array of many small strings is refused before it is built")
    func replyBudget() {
        let message = Array("*3\r\n$7\r\nmessage\r\n$4\r\nroom\r\n$5\r\nhello\r\n".utf8)
        let ok = read(message + message + Array(":1\r\n".utf8), max: 1024)
        #expect(ok.types == [REDIS_REPLY_ARRAY, REDIS_REPLY_ARRAY, REDIS_REPLY_INTEGER] && !ok.error, "each reply has its own budget")
        // 10,000 one-byte strings: 40 KB on the wire, far more as objects.
        let wide = Array("*10000\r\n".utf8) + (0..<10_000).flatMap { _ in Array("$1\r\nx\r\n".utf8) }
        let refused = read(wide, max: 64 << 10)
        #expect(refused.error && refused.exceeded && refused.types.isEmpty)
        #expect(read(wide, max: 4 << 20).types == [REDIS_REPLY_ARRAY], "under a larger budget it is a reply")
        let huge = read(Array("*2000000000\r\n".utf8), max: 64 << 20)
        #expect(huge.error && huge.exceeded, "the element count alone is over: no 16 GB calloc")
    }
}
