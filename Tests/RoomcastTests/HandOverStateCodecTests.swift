// The generic codec of the hand-over state on a record kind of its own: a
// table that gains a row (a newer writer) and the table without it (an older
// reader) read each other's bytes, the new field skipped by one and
// defaulted by the other; nested and repeated records go through the same walk.
import Testing
@testable import RoomcastCore

@Suite("Hand-over state: the table-driven codec")
struct HandOverStateCodecTests {
    struct Item: Equatable, Sendable {
        var n: UInt32 = 0
    }

    struct Toy: Equatable, Sendable {
        var id: UInt64 = 0
        var name = ""
        var note: String? = nil
        var items: [Item] = []
        var added: UInt64 = 0  // the field only the newer table carries
    }

    typealias Kind = HandOverState.RecordKind

    static let item = Kind<Item>(blank: Item(), fields: [.field(1, .u32("n"), { $0.n }, { $0.n = $1 })])

    static let older: [HandOverState.Field<Toy>] = [
        .field(1, .u64("id"), { $0.id }, { $0.id = $1 }),
        .field(2, .text("name"), { $0.name }, { $0.name = $1 }, omit: ""),
        .optional(3, .text("note"), { $0.note }, { $0.note = $1 }),
        .repeated(4, item.coder, { $0.items }, { $0.items.append($1) }),
    ]
    static let v1 = Kind<Toy>(blank: Toy(), required: [1], missing: "no id", fields: older)
    // Carrying a new field: one row.
    static let v2 = Kind<Toy>(blank: Toy(), required: [1], missing: "no id", fields: older + [
        .field(0x7001, .u64("added"), { $0.added }, { $0.added = $1 }, omit: 0),
    ])

    static func bytes(_ kind: Kind<Toy>, _ toy: Toy) -> [UInt8] {
        var w = HandOverState.Writer()
        kind.writeFields(toy, &w)
        return w.bytes
    }

    static func read(_ kind: Kind<Toy>, _ bytes: [UInt8]) throws(HandOverState.DecodeError) -> Toy {
        let result = bytes.withUnsafeBytes { raw in Result { () throws(HandOverState.DecodeError) in try kind.read(raw) } }
        return try result.get()
    }

    static let toy = Toy(id: 7, name: "t", note: "n", items: [Item(n: 1), Item(n: 2)], added: 99)

    @Test("a row added to a table: the older table skips its field, the newer one defaults it")
    func newerAndOlderTables() throws {
        var old = Self.toy
        old.added = 0
        #expect(try Self.read(Self.v1, Self.bytes(Self.v2, Self.toy)) == old, "the older reader skips the new field")
        #expect(try Self.read(Self.v2, Self.bytes(Self.v1, Self.toy)) == old, "the newer reader defaults it")
        #expect(try Self.read(Self.v2, Self.bytes(Self.v2, Self.toy)) == Self.toy)
        #expect(Self.bytes(Self.v2, old) == Self.bytes(Self.v1, old), "a field at its default is left out: the older bytes")
    }

    @Test("rows write in table order; omit and optional leave records out; lists write one record each")
    func bytesInTableOrder() {
        let empty = Toy(id: 1)
        #expect(Self.bytes(Self.v2, empty) == TLV.u64(1, 1))
        #expect(Self.bytes(Self.v2, Self.toy) == TLV.u64(1, 7) + TLV.text(2, "t") + TLV.text(3, "n")
                + TLV.record(4, TLV.u32(1, 1)) + TLV.record(4, TLV.u32(1, 2)) + TLV.u64(0x7001, 99))
    }

    @Test("a required tag missing, a field that does not read, a record cut off: each refused")
    func refusals() {
        func error(_ bytes: [UInt8]) -> HandOverState.DecodeError? {
            do { _ = try Self.read(Self.v2, bytes); return nil } catch { return error }
        }
        #expect(error(TLV.text(2, "x")) == .damaged("no id"))
        #expect(error(TLV.u64(1, 1) + TLV.u32(0x7001, 5)) == .damaged("added: 4 bytes, expected 8"))
        #expect(error(TLV.u64(1, 1) + TLV.record(4, TLV.u64(1, 5))) == .damaged("n: 8 bytes, expected 4"))
        #expect(error(TLV.u64(1, 1) + [4, 0, 9]) == .damaged("a record header cut off at byte 14"))
        #expect(error(TLV.u64(1, 1) + TLV.record(0x7777, [0xFF])) == nil, "an unknown tag is skipped")
    }
}
