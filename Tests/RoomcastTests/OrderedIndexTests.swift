import Testing
@testable import RoomcastCore

/// OrderedIndex against a reference (sort and filter a plain set) over
/// random inserts and removes, across block splits and merges; pages by
/// cursor as the API's listings walk them (issue 28 item 3).
@Suite struct OrderedIndexTests {
    struct Rng {
        var s: UInt64
        mutating func next(_ n: Int) -> Int {
            s = s &* 6364136223846793005 &+ 1442695040888963407
            return Int((s >> 33) % UInt64(n))
        }
    }

    /// Walks every page of `index` (`limit` keys each) as a client would.
    static func walk<K: Comparable>(_ index: OrderedIndex<K>, limit: Int, include: (K) -> Bool = { _ in true }) -> [K] {
        var out: [K] = []
        var cursor: K?
        while true {
            let page = index.page(after: cursor, limit: limit, include: include)
            out += page.keys
            guard page.more else { return out }
            cursor = page.keys.last!
        }
    }

    @Test(arguments: [1, 3, 100])
    func randomAgainstReference(seed: Int) {
        var rng = Rng(s: UInt64(seed))
        var index = OrderedIndex<Int>()
        var reference = Set<Int>()
        for step in 0..<20_000 {
            let k = rng.next(5_000)
            if rng.next(3) == 0 {
                #expect(index.remove(k) == (reference.remove(k) != nil))
            } else {
                #expect(index.insert(k) == reference.insert(k).inserted)
            }
            if step % 2_000 == 0 {
                let sorted = reference.sorted()
                #expect(index.all == sorted)
                #expect(index.count == sorted.count)
                let after = rng.next(5_000), limit = 1 + rng.next(300)
                let page = index.page(after: after, limit: limit)
                let expected = sorted.filter { $0 > after }
                #expect(page.keys == Array(expected.prefix(limit)))
                #expect(page.more == (expected.count > limit))
                #expect(index.contains(after) == reference.contains(after))
            }
        }
        #expect(Self.walk(index, limit: 7) == reference.sorted())
        #expect(Self.walk(index, limit: 1000, include: { $0 % 3 == 0 }) == reference.sorted().filter { $0 % 3 == 0 })
        for k in reference { index.remove(k) }
        #expect(index.count == 0 && index.all.isEmpty && index.page(after: nil, limit: 10).keys.isEmpty)
    }

    /// Byte keys order as the cursors compare (lexicographicallyPrecedes),
    /// and a prefix scan stops where `stop` says.
    @Test func byteKeysAndStop() {
        var index = OrderedIndex<ByteKey>()
        let names = ["b", "a", "ab", "", "\u{e9}", "B", "a\u{0}", "zz"].map { ByteKey(Array($0.utf8)) }
        for n in names { index.insert(n) }
        #expect(index.all == names.sorted { $0.bytes.lexicographicallyPrecedes($1.bytes) })
        let fromA = index.page(after: ByteKey(Array("a".utf8)), inclusive: true, limit: 100, stop: { $0.bytes.first != UInt8(ascii: "a") })
        #expect(fromA.keys.map { String(decoding: $0.bytes, as: UTF8.self) } == ["a", "a\u{0}", "ab"] && !fromA.more)
        #expect(index.page(after: nil, limit: 2).more)
    }

    /// Ascending and descending inserts (the worst cases of a block split) keep the order.
    @Test func monotoneInserts() {
        var up = OrderedIndex<Int>(), down = OrderedIndex<Int>()
        for k in 0..<5_000 { up.insert(k); down.insert(5_000 - k) }
        #expect(up.all == Array(0..<5_000) && down.all == Array(1...5_000))
        #expect(up.page(after: 4_997, limit: 5).keys == [4_998, 4_999])
    }
}

/// The relay's listings (GET /v1/rooms and /v1/rooms/{room}) page its
/// ordered indexes: against sort-and-filter of `roomCounts` and
/// `members(of:)` over random joins, moves and disconnects.
@Suite struct RelayListingPageTests {
    @Test func pagesMatchSortAndFilter() {
        var relay = Relay(settings: RelaySettings())
        let sink = RecordingSink()
        var rng = OrderedIndexTests.Rng(s: 7)
        var connected = Set<Int>()
        for step in 0..<4_000 {
            let id = rng.next(300)
            if connected.contains(id) && rng.next(4) == 0 {
                _ = relay.disconnect(id, sink: sink)
                connected.remove(id)
            } else {
                if !connected.contains(id) { relay.connect(id); connected.insert(id) }
                let join = RelayTests.frame(0, RelayTests.user("u\(id)", room: "room\(rng.next(40))").serialized())
                _ = RelayTests.send(&relay, id, join, sink)
            }
            sink.reset()
            guard step % 97 == 0 else { continue }
            let names = relay.roomCounts.map(\.room.bytes).sorted { $0.lexicographicallyPrecedes($1) }
            let after = rng.next(2) == 0 ? [] : Array("room\(rng.next(40))".utf8)
            let limit = 1 + rng.next(10)
            let expected = names.filter { after.isEmpty || after.lexicographicallyPrecedes($0) }
            let page = relay.roomsPage(after: after, limit: limit)
            #expect(page.rooms.map(\.bytes) == Array(expected.prefix(limit)))
            #expect(page.more == (expected.count > limit))
            for room in relay.roomCounts.map(\.room) {
                let cursor = rng.next(3) == 0 ? -1 : rng.next(300)
                let ids = relay.members(of: room).sorted().filter { $0 > cursor }
                let got = relay.membersPage(of: room, after: cursor, limit: limit)
                #expect(got.ids == Array(ids.prefix(limit)) && got.more == (ids.count > limit), "\(room)")
            }
        }
        #expect(relay.membersPage(of: "room1", after: Int.max, limit: 5).ids.isEmpty)
        #expect(relay.membersPage(of: "nowhere", after: -1, limit: 5).ids.isEmpty)
    }
}
