import RoomcastCore

// RemoteListing.swift: the rooms and members of the other daemons of the
// cluster kept in order for the API's listings (docs/api.md: `GET /v1/rooms`
// and the `remote_members` of `GET /v1/rooms/{room}`), so that a page costs
// O(log n + limit) rather than a sort of everything (issue 28 item 3).
// RemoteDaemons (ClusterMembers.swift) tells it of every change.

/// A member of another daemon in one room's listing, ordered by `bytes`
/// (`DAEMON/ADDR`, the API's `remote_cursor`): the daemon's origin in 16
/// lowercase hex digits, so the order is by origin, then by address bytes.
struct RemoteMemberKey: Comparable {
    var bytes: [UInt8]
    var origin: UInt64
    var address: String

    init(origin: UInt64, address: String) {
        self.bytes = Array("\(ClusterEnvelope.hex(origin))/\(address)".utf8)
        self.origin = origin
        self.address = address
    }

    /// A cursor: only `bytes` take part in comparisons.
    init(cursor: [UInt8]) {
        bytes = cursor
        origin = 0
        address = ""
    }

    static func < (a: RemoteMemberKey, b: RemoteMemberKey) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }
    static func == (a: RemoteMemberKey, b: RemoteMemberKey) -> Bool { a.bytes == b.bytes }
}

/// The keys of `RemoteDaemons.viewers` by their bytes, and per room the
/// members tracked there by `RemoteMemberKey`.
struct RemoteListing {
    private(set) var rooms = OrderedIndex<ByteKey>()
    private(set) var members: [RoomName: OrderedIndex<RemoteMemberKey>] = [:]

    /// `room` entered (or left) `RemoteDaemons.viewers`.
    mutating func counted(_ room: RoomName, _ present: Bool) {
        if present { rooms.insert(ByteKey(room.bytes)) } else { rooms.remove(ByteKey(room.bytes)) }
    }

    /// `address` of `origin` is now tracked in `room` (nil: in none);
    /// `old`: the room it was tracked in before (nil: none).
    mutating func moved(_ origin: UInt64, _ address: String, from old: RoomName?, to room: RoomName?) {
        guard old != room else { return }
        let key = RemoteMemberKey(origin: origin, address: address)
        if let old, members[old] != nil {
            members[old]!.remove(key)
            if members[old]!.count == 0 { members[old] = nil }
        }
        if let room { members[room, default: OrderedIndex()].insert(key) }
    }

    /// No member of another daemon is tracked in `room` any more.
    mutating func closed(_ room: RoomName) { members[room] = nil }

    /// At most `limit` rooms after `after` by their bytes (empty: from the
    /// first), and whether more follow. O(log rooms + limit).
    func roomsPage(after: [UInt8], limit: Int) -> (rooms: [RoomName], more: Bool) {
        let got = rooms.page(after: after.isEmpty ? nil : ByteKey(after), limit: limit)
        return (got.keys.map { RoomName(bytes: $0.bytes) }, got.more)
    }

    /// At most `limit` members of `room` whose key follows `after` (empty:
    /// from the first), and whether more follow. O(log members + limit).
    func membersPage(in room: RoomName, after: [UInt8], limit: Int) -> (keys: [RemoteMemberKey], more: Bool) {
        guard let index = members[room] else { return ([], false) }
        let got = index.page(after: after.isEmpty ? nil : RemoteMemberKey(cursor: after), limit: limit)
        return (got.keys, got.more)
    }

    /// Two pages of at most `limit` rooms after the same cursor (the
    /// relay's and the other daemons'), as one page of their union: the
    /// first `limit` names of both, each once, and whether more follow.
    /// O(limit).
    static func merged(_ a: (rooms: [RoomName], more: Bool), _ b: (rooms: [RoomName], more: Bool), limit: Int) -> (rooms: [RoomName], more: Bool) {
        var out: [RoomName] = []
        out.reserveCapacity(min(limit, a.rooms.count + b.rooms.count))
        var i = 0, j = 0
        while out.count < limit && (i < a.rooms.count || j < b.rooms.count) {
            if j == b.rooms.count || (i < a.rooms.count && a.rooms[i].bytes.lexicographicallyPrecedes(b.rooms[j].bytes)) {
                out.append(a.rooms[i]); i += 1
            } else if i == a.rooms.count || b.rooms[j].bytes.lexicographicallyPrecedes(a.rooms[i].bytes) {
                out.append(b.rooms[j]); j += 1
            } else {
                out.append(a.rooms[i]); i += 1; j += 1
            }
        }
        return (out, a.more || b.more || i < a.rooms.count || j < b.rooms.count)
    }
}
