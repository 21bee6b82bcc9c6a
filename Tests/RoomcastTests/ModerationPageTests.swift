// Bans and mutes paged over ModerationBook's ordered index (issue 28 item
// 3): every page against sort-and-filter of the entries in force, over
// random sets, removals and expiries in several rooms.
import RoomcastCore
import Testing
@testable import RoomcastServer

@Suite struct ModerationPageTests {
    @Test func pagesMatchSortAndFilter() throws {
        var book = ModerationBook(nowMs: 0)
        var rng = OrderedIndexTests.Rng(s: 11)
        var set: Int64 = 1
        for step in 0..<3_000 {
            let kind: ModerationKind = rng.next(2) == 0 ? .ban : .mute
            let room = "r\(rng.next(4))", sub = "s\(rng.next(200))"
            set += 1
            if rng.next(4) == 0 {
                book.remove(ModerationKey(kind, room: RoomName(room), sub: Array(sub.utf8)), setMs: set, wallMs: 0)
            } else {
                try? book.set(ModerationBookTests.entry(kind, room: room, sub: sub, until: Int64(1 + rng.next(1_000)), set: set), nowMs: 0, wallMs: 0)
            }
            guard step % 61 == 0 else { continue }
            let wall = Int64(rng.next(1_000))
            let qKind: ModerationKind = rng.next(2) == 0 ? .ban : .mute
            let qRoom = RoomName("r\(rng.next(4))")
            // The reference: every record held (the book's hash table, not its index), filtered and sorted.
            let all = book.records.compactMap { r -> [UInt8]? in
                guard case .entry(let k, let until, _, _) = r, k.kind == qKind, k.room == qRoom, until > wall else { return nil }
                return k.sub
            }.sorted { $0.lexicographicallyPrecedes($1) }
            #expect(book.list(qKind, room: qRoom, wallMs: wall).map(\.key.sub) == all)
            let after = rng.next(3) == 0 ? [] : Array("s\(rng.next(200))".utf8)
            let limit = 1 + rng.next(20)
            let expected = all.filter { after.isEmpty || after.lexicographicallyPrecedes($0) }
            let page = book.page(qKind, room: qRoom, after: after, limit: limit, wallMs: wall)
            #expect(page.entries.map(\.key.sub) == Array(expected.prefix(limit)))
            #expect(page.more == (expected.count > limit))
            #expect(page.entries.allSatisfy { $0.key.kind == qKind && $0.key.room == qRoom && $0.untilMs > wall })
        }
    }
}
