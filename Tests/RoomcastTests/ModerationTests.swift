// Bans, mutes and slow mode as state (ModerationBook) and as text in Redis
// and on the control channel (ModerationWire), with both clocks passed in.
import RoomcastCore
import Testing
@testable import RoomcastServer

@Suite struct ModerationWireTests {
    let key = ModerationKey(.ban, room: RoomName("live 42"), sub: Array("user:1 é".utf8))

    @Test func recordsRoundTripAsReadableText() throws {
        let ban = ModerationRecord.entry(key, untilMs: 1_764_650_000_000, setMs: 1_764_640_000_000, reason: "spam links: 3 times")
        #expect(ban.field == "ban:live%2042:user%3A1%20%C3%A9")
        #expect(ban.value == "1764650000000 1764640000000 spam%20links%3A%203%20times")
        #expect(ModerationRecord(field: Array(ban.field.utf8), value: Array(ban.value.utf8)) == ban)
        let slow = ModerationRecord.settings(RoomName("a:b"), slowModeSeconds: 10, setMs: 5)
        #expect(slow.field == "settings:a%3Ab" && slow.value == "10 5")
        #expect(ModerationRecord(field: Array(slow.field.utf8), value: Array(slow.value.utf8)) == slow)
        let empty = ModerationRecord.entry(ModerationKey(.mute, room: "r", sub: [0x61]), untilMs: 2, setMs: 1, reason: "")
        #expect(ModerationRecord(field: Array(empty.field.utf8), value: Array(empty.value.utf8)) == empty)
        // A removal keeps its field until the entry would have expired; a reason "!" is no removal.
        let gone = ModerationRecord.removed(key, untilMs: 9, setMs: 8)
        #expect(gone.value == "9 8 !" && ModerationRecord(field: Array(gone.field.utf8), value: Array(gone.value.utf8)) == gone)
        let bang = ModerationRecord.entry(key, untilMs: 9, setMs: 8, reason: "!")
        #expect(bang.value == "9 8 %21" && ModerationRecord(field: Array(bang.field.utf8), value: Array(bang.value.utf8)) == bang)
    }

    @Test func foreignFieldsAndValuesAreRefused() {
        for (f, v) in [("kick:r:s", "1 1 x"), ("ban:r", "1 1 x"), ("ban:r:s:t", "1 1 x"), ("ban::s", "1 1 x"), ("ban:r:", "1 1 x"),
                       ("ban:r:s", "1 1"), ("ban:r:s", "x 1 r"), ("ban:r:s", "1 1 a b"), ("ban:r%2:s", "1 1 x"), ("ban:r s:s", "1 1 x"),
                       ("settings:r", "10"), ("settings:r", "-1 1"), ("settings:", "10 1"), ("", "")] {
            #expect(ModerationRecord(field: Array(f.utf8), value: Array(v.utf8)) == nil, "\(f) -> \(v)")
        }
    }

    @Test func controlMessagesRoundTrip() throws {
        let ops: [ControlMessage.Operation] = [
            .set(.entry(key, untilMs: 9, setMs: 8, reason: "r")),
            .set(.settings("lobby", slowModeSeconds: 3, setMs: 1)),
            .set(.removed(key, untilMs: 9, setMs: 77)),
            .kick("live 42", bySub: true, value: Array("u 1".utf8)),
            .kick("live 42", bySub: false, value: Array("bob".utf8)),
        ]
        for op in ops {
            let m = ControlMessage(origin: 0xDEAD_BEEF_0000_0001, op)
            #expect(ControlMessage(m.encoded) == m)
        }
        #expect(String(decoding: ControlMessage(origin: 1, .kick("r", bySub: false, value: [0x62])).encoded, as: UTF8.self)
                == "0000000000000001 kick r name b")
        for bad in ["", "1 set ban:r:s 1 1 x", "000000000000000g set ban:r:s 1 1 x", "0000000000000001 nuke r",
                    "0000000000000001 kick r who b", "0000000000000001 kick r sub ", "0000000000000001 del ban:r:s 1"] {
            #expect(ControlMessage(Array(bad.utf8)) == nil, "\(bad)")
        }
    }
}

extension ModerationWireTests {
    /// Found by FuzzModerationWire: records no daemon writes, outside
    /// docs/api.md's bounds, were taken from Redis and the control channel.
    /// A slow mode of 2^63 - 1 s trapped the daemon at its room's next text.
    @Test func recordsOutsideTheAPIsBoundsAreNotOurs() {
        let tooLong = String(repeating: "x", count: ModerationRecord.maxReasonBytes + 1)
        let longSub = String(repeating: "s", count: ModerationField.maxSubBytes + 1)
        for (f, v) in [("settings:lobbyz", "1 1764624000000"), ("settings:r", "2 1"), ("settings:r", "121 1"),
                       ("settings:r", "9223372036854775807 1"), ("settings:r", "10 -1"),
                       ("ban:r:s", "-1 1 x"), ("ban:r:s", "1 -9223372036854775808 x"), ("mute:r:s", "1 -5 !"),
                       ("ban:r:s", "1001 1 \(tooLong)"), ("ban:r:\(longSub)", "1001 1 x"),
                       // Issue 28: a ban of over 14 days (the API's cap), one that ends as it starts.
                       ("ban:r:s", "1209600002 1 x"), ("ban:r:s", "1 1 x"), ("mute:r:s", "8993462400000000000 1 !")] {
            #expect(ModerationRecord(field: Array(f.utf8), value: Array(v.utf8)) == nil, "\(f) -> \(v.prefix(40))")
        }
        #expect(ControlMessage(Array("00000000000000ab set settings:stage 18446744073709552 1".utf8)) == nil)
        // The bounds themselves are ours.
        for (f, v) in [("settings:r", "0 0"), ("settings:r", "3 1"), ("settings:r", "120 1"),
                       ("ban:r:s", "1000 0 \(String(repeating: "x", count: ModerationRecord.maxReasonBytes))"),
                       ("ban:r:\(String(repeating: "s", count: ModerationField.maxSubBytes))", "1001 1 x"),
                       ("ban:r:s", "1209600001 1 x"), ("mute:r:s", "1 5 !")] {
            #expect(ModerationRecord(field: Array(f.utf8), value: Array(v.utf8)) != nil, "\(f) -> \(v.prefix(40))")
        }
    }

    /// FuzzModerationWire's seeds (Tests/Fuzz/make-corpus.py) are what the
    /// daemons write: each decodes and re-encodes to its own bytes.
    @Test func theFuzzSeedsAreRealMessages() throws {
        var dir = "\(#filePath)".split(separator: "/", omittingEmptySubsequences: false)
        dir.removeLast()
        let corpus = dir.joined(separator: "/") + "/../Fuzz/corpus/FuzzModerationWire/"
        func seed(_ name: String) throws -> [UInt8] {
            Array(try String(contentsOfFile: corpus + name, encoding: .utf8).utf8)
        }
        for name in ["control-ban", "control-mute", "control-removed", "control-settings", "control-kick-sub", "control-kick-name"] {
            let bytes = try seed(name)
            #expect(ControlMessage(bytes)?.encoded == bytes, "\(name)")
        }
        for name in ["hash-ban", "hash-mute-bang", "hash-removed", "hash-settings", "hash-settings-off"] {
            let parts = try seed(name).split(separator: 0x0A, maxSplits: 1)
            let r = ModerationRecord(field: parts[0], value: parts[1])
            #expect(r.map { Array($0.field.utf8) + [0x0A] + Array($0.value.utf8) } == Array(parts.joined(separator: [0x0A])), "\(name)")
        }
        let foreign = try seed("hash-foreign").split(separator: 0x0A, maxSplits: 1)
        #expect(ModerationRecord(field: foreign[0], value: foreign[1]) == nil)
    }
}

@Suite struct ModerationBookTests {
    static func entry(_ kind: ModerationKind = .ban, room: String = "r", sub: String = "s", until: Int64, set: Int64 = 1) -> ModerationBook.Entry {
        .init(key: ModerationKey(kind, room: RoomName(room), sub: Array(sub.utf8)), untilMs: until, setMs: set, reason: "")
    }

    @Test func inForceUntilItsWallClockInstantThenForgotten() throws {
        var book = ModerationBook(nowMs: 0)
        let e = Self.entry(until: 10_500)
        try book.set(e, nowMs: 0, wallMs: 500)
        #expect(book.active(e.key, wallMs: 10_499) == e)
        #expect(book.active(e.key, wallMs: 10_500) == nil, "not past its until_ms")
        #expect(book.active(ModerationKey(.mute, room: "r", sub: Array("s".utf8)), wallMs: 600) == nil, "a ban is no mute")
        #expect(book.popExpired(nowMs: 9_000, wallMs: 9_500).isEmpty)
        #expect(book.nextTimeout(fromMs: 9_000) != nil)
        // The monotonic clock says 10 s, the wall clock lags: not yet.
        #expect(book.popExpired(nowMs: 11_000, wallMs: 10_400).isEmpty)
        #expect(book.count == 1)
        #expect(book.popExpired(nowMs: 12_000, wallMs: 11_600) == [e])
        #expect(book.count == 0 && book.nextTimeout(fromMs: 12_000) == nil)
    }

    @Test func theLaterSettingWinsInEitherOrder() throws {
        var a = ModerationBook(nowMs: 0), b = ModerationBook(nowMs: 0)
        let first = Self.entry(until: 5_000, set: 10), second = Self.entry(until: 9_000, set: 20)
        try a.set(first, nowMs: 0, wallMs: 0); try a.set(second, nowMs: 0, wallMs: 0)
        try b.set(second, nowMs: 0, wallMs: 0)
        #expect(throws: ModerationBook.Refusal.stale) { try b.set(first, nowMs: 0, wallMs: 0) }
        #expect(a.active(first.key, wallMs: 0) == second && b.active(first.key, wallMs: 0) == second)
        // A removal at 30 is not undone by a set from before it (a late load).
        #expect(a.remove(first.key, setMs: 30, wallMs: 0) == second)
        #expect(throws: ModerationBook.Refusal.stale) { try a.set(second, nowMs: 0, wallMs: 0) }
        try a.set(Self.entry(until: 9_000, set: 31), nowMs: 0, wallMs: 0)
        #expect(a.count == 1)
    }

    @Test func boundedPerRoomAndInAll() throws {
        var book = ModerationBook(nowMs: 0)
        for i in 0..<ModerationBook.maxPerRoom { try book.set(Self.entry(sub: "u\(i)", until: 1_000_000), nowMs: 0, wallMs: 0) }
        #expect(throws: ModerationBook.Refusal.full("\(ModerationBook.maxPerRoom) bans and mutes in the room")) {
            try book.set(Self.entry(sub: "one-more", until: 1_000_000), nowMs: 0, wallMs: 0)
        }
        try book.set(Self.entry(sub: "u7", until: 2_000_000, set: 2), nowMs: 0, wallMs: 0)  // a replacement takes no room
        try book.set(Self.entry(room: "other", sub: "one-more", until: 1_000_000), nowMs: 0, wallMs: 0)
        book.remove(Self.entry(sub: "u0", until: 0).key, setMs: 5, wallMs: 0)
        try book.set(Self.entry(sub: "one-more", until: 1_000_000), nowMs: 0, wallMs: 0)
        #expect(book.count == ModerationBook.maxPerRoom + 1)
    }

    @Test func listsInForceBySubBytes() throws {
        var book = ModerationBook(nowMs: 0)
        for (sub, until) in [("c", 100), ("a", 100), ("b", 5)] { try book.set(Self.entry(sub: sub, until: Int64(until)), nowMs: 0, wallMs: 0) }
        try book.set(Self.entry(.mute, sub: "m", until: 100), nowMs: 0, wallMs: 0)
        #expect(book.list(.ban, room: "r", wallMs: 10).map { String(decoding: $0.key.sub, as: UTF8.self) } == ["a", "c"])
        #expect(book.list(.mute, room: "r", wallMs: 10).count == 1 && book.list(.ban, room: "x", wallMs: 10).isEmpty)
    }

    @Test func slowModeSetOffAndOrdered() throws {
        var book = ModerationBook(nowMs: 0)
        try book.setSlowMode("r", seconds: 10, setMs: 5, wallMs: 5)
        #expect(book.slowModeSeconds("r") == 10 && book.slowModeSeconds("x") == 0)
        #expect(throws: ModerationBook.Refusal.stale) { try book.setSlowMode("r", seconds: 30, setMs: 4, wallMs: 5) }
        try book.setSlowMode("r", seconds: 0, setMs: 6, wallMs: 6)
        #expect(book.slowModeSeconds("r") == 0)
        #expect(throws: ModerationBook.Refusal.stale) { try book.setSlowMode("r", seconds: 30, setMs: 5, wallMs: 6) }
    }

    @Test func aLoadTakesTheLaterAndGivesBackWhatRedisLost() throws {
        var book = ModerationBook(nowMs: 0)
        let removedElsewhere = Self.entry(sub: "old", until: 100_000, set: 10)
        let lost = Self.entry(sub: "lost", until: 100_000, set: 10)          // Redis restarted without it
        let newerHere = Self.entry(sub: "newer", until: 200_000, set: 60)    // the hash has an older one
        try book.set(removedElsewhere, nowMs: 0, wallMs: 0)
        try book.set(lost, nowMs: 0, wallMs: 0)
        try book.set(newerHere, nowMs: 0, wallMs: 0)
        try book.setSlowMode("slow-here", seconds: 5, setMs: 10, wallMs: 0)
        let remote = Self.entry(sub: "remote", until: 100_000, set: 20)
        let expired = Self.entry(sub: "expired", until: 40, set: 20)
        let hash: [ModerationRecord] = [remote.record, expired.record, .removed(removedElsewhere.key, untilMs: 100_000, setMs: 30),
                                        Self.entry(sub: "newer", until: 100_000, set: 50).record,
                                        .settings("slow", slowModeSeconds: 7, setMs: 20)]
        let (taken, gone, missing) = book.load(hash, nowMs: 0, wallMs: 50)
        #expect(taken == [remote.record, .settings("slow", slowModeSeconds: 7, setMs: 20)])
        #expect(gone == [expired.record])
        #expect(Set(missing.map(\.field)) == [lost.key.field, newerHere.key.field, "settings:slow-here"])
        #expect(book.active(removedElsewhere.key, wallMs: 50) == nil, "a removal while cut off reached us")
        #expect(book.active(lost.key, wallMs: 50) == lost && book.active(newerHere.key, wallMs: 50) == newerHere)
        #expect(book.active(remote.key, wallMs: 50) == remote)
        #expect(book.slowModeSeconds("slow-here") == 5 && book.slowModeSeconds("slow") == 7)
    }
}
