// The listings of other daemons' rooms and members (RemoteListing.swift,
// issue 28 item 3): paged over ordered indexes that RemoteDaemons keeps up
// to date, checked against the sort-and-filter the API did before.
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

@Suite("Remote listing")
struct RemoteListingTests {
    /// A small deterministic generator (xorshift), so a failure repeats.
    struct Rand {
        var s: UInt64
        mutating func next(_ n: Int) -> Int {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17
            return Int(s % UInt64(n))
        }
    }

    static func precedes(_ a: RoomName, _ b: RoomName) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }

    /// Every page of rooms from the merged listing, walking the cursors.
    static func walkRooms(_ relay: Relay, _ remote: RemoteDaemons, limit: Int) -> [[RoomName]] {
        var pages: [[RoomName]] = []
        var after: [UInt8] = []
        while true {
            let got = RemoteListing.merged(relay.roomsPage(after: after, limit: limit),
                                           remote.listing.roomsPage(after: after, limit: limit), limit: limit)
            pages.append(got.rooms)
            guard got.more else { return pages }
            after = got.rooms.last!.bytes
        }
    }

    /// The reference: the union sorted, then filtered after the cursor, then cut.
    static func referenceRooms(_ relay: Relay, _ remote: RemoteDaemons, limit: Int) -> [[RoomName]] {
        var all = Set(remote.viewers.keys)
        for (room, _) in relay.roomCounts { all.insert(room) }
        let sorted = all.sorted(by: precedes)
        var pages: [[RoomName]] = []
        var after: [UInt8] = []
        while true {
            let rest = sorted.filter { after.isEmpty || after.lexicographicallyPrecedes($0.bytes) }
            pages.append(Array(rest.prefix(limit)))
            guard rest.count > limit else { return pages }
            after = pages.last!.last!.bytes
        }
    }

    @Test("rooms here and on other daemons page as the sorted union, under counts that come and go")
    func roomsMatchReference() {
        final class Nobody: FrameSink {
            func broadcast(_ frame: UnsafeRawBufferPointer, from sender: Int, to members: [Int], except: Int) -> Int { 0 }
        }
        var rand = Rand(s: 0x9E37_79B9_7F4A_7C15)
        let names: [RoomName] = (0..<40).map { RoomName("r\($0 % 7)-\($0)") } + [RoomName("é"), RoomName("e\u{301}"), RoomName("Z")]
        var relay = Relay(settings: RelaySettings())
        var remote = RemoteDaemons()
        let sink = Nobody()
        for id in 0..<30 { relay.connect(id) }
        for step in 0..<300 {
            switch rand.next(3) {
            case 0:
                var counts: [RoomName: Int] = [:]
                for _ in 0..<rand.next(6) { counts[names[rand.next(names.count)]] = 1 + rand.next(5) }
                remote.setCounts(UInt64(1 + rand.next(4)), counts, nowMs: UInt64(step))
            case 1:
                let id = rand.next(30)
                let join = UserInfo(level: 1, name: "u\(id)", iconURL: "", room: names[rand.next(names.count)].string).serialized()
                let frame = FrameCodec.encode(type: 0, body: join, byteOrder: .little)
                _ = frame.withUnsafeBytes { relay.receive(from: id, type: 0, frame: $0, sink: sink) }
            default:
                if rand.next(4) == 0 {
                    _ = remote.remove(UInt64(1 + rand.next(4)))
                } else {
                    let id = rand.next(30)
                    relay.forget(id)
                    relay.connect(id)
                }
            }
            for limit in [1, 3, 100] {
                #expect(Self.walkRooms(relay, remote, limit: limit) == Self.referenceRooms(relay, remote, limit: limit), "step \(step), limit \(limit)")
            }
        }
        #expect(remote.listing.rooms.all.map { RoomName(bytes: $0.bytes) } == remote.viewers.keys.sorted(by: Self.precedes))
    }

    @Test("a room's remote members page by daemon and address as the sorted list did, through joins, moves, leaves and departures")
    func membersMatchReference() {
        var rand = Rand(s: 0xD1B5_4A32_D192_ED03)
        let rooms: [RoomName] = ["a", "b", "c"]
        var remote = RemoteDaemons()
        func key(_ origin: UInt64, _ address: String) -> [UInt8] { Array("\(ClusterEnvelope.hex(origin))/\(address)".utf8) }
        for step in 0..<400 {
            let origin = ([1, 2, 0x10, 0xFFFF_FFFF_FFFF_FFF0] as [UInt64])[rand.next(4)]
            let address = "10.0.0.\(rand.next(9)):\(rand.next(3))"
            let room = rooms[rand.next(rooms.count)]
            switch rand.next(10) {
            case 0..<6: _ = remote.joined(origin, address: address, room: room, identity: [UInt8(step & 0xFF)], nowMs: UInt64(step))
            case 6..<8: remote.left(origin, address: address, room: room)
            case 8: remote.roomClosed(room)
            default: _ = remote.remove(origin)
            }
            for r in rooms {
                let sorted = remote.members(in: r)
                for limit in [1, 2, 50] {
                    // Walk every page, and also start after a cursor that is no member's key.
                    for start in [[], Array("0000000000000002/10.0.0.4".utf8)] as [[UInt8]] {
                        var after = start
                        while true {
                            let rest = sorted.filter { after.isEmpty || after.lexicographicallyPrecedes(key($0.origin, $0.address)) }
                            let want = rest.prefix(limit).map { key($0.origin, $0.address) }
                            let got = remote.listing.membersPage(in: r, after: after, limit: limit)
                            #expect(got.keys.map(\.bytes) == want && got.more == (rest.count > limit), "step \(step), room \(r.string)")
                            for k in got.keys { #expect(remote.daemons[k.origin]?.members[k.address]?.room == r) }
                            guard got.more, !got.keys.isEmpty else { break }
                            after = got.keys.last!.bytes
                        }
                    }
                }
            }
        }
    }
}
