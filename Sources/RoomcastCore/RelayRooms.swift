// What the relay's rooms hold, as the server and the API read them: counts,
// members, and the listing pages over its ordered indexes (OrderedIndex.swift).

extension Relay {
    /// Number of rooms with at least one member.
    public var roomCount: Int { roomIndex.count }

    /// Members of `room` (0 when it does not exist).
    public func memberCount(of room: RoomName) -> Int {
        roomIndex[room].map { rooms[$0].members.count } ?? 0
    }

    /// Members of the room named by the bytes of `room` (0 when it does not exist).
    public func memberCount(of room: String) -> Int {
        memberCount(of: RoomName(room))
    }

    /// Every room with members and its member count, in no fixed order
    /// (the API sorts; docs/api.md). O(rooms).
    public var roomCounts: [(room: RoomName, members: Int)] {
        roomIndex.map { ($0.key, rooms[$0.value].members.count) }
    }

    /// The connections in `room` (empty when it does not exist).
    public func members(of room: RoomName) -> [Int] {
        roomIndex[room].map { rooms[$0].members } ?? []
    }

    /// At most `limit` rooms with members whose names follow `after` by
    /// their bytes (empty: from the first), and whether more follow
    /// (docs/api.md's cursor). O(log rooms + limit).
    public func roomsPage(after: [UInt8], limit: Int) -> (rooms: [RoomName], more: Bool) {
        let got = roomOrder.page(after: ByteKey(after), inclusive: after.isEmpty, limit: limit)
        return (got.keys.map { RoomName(bytes: $0.bytes) }, got.more)
    }

    /// At most `limit` connections of `room` with ids above `after`,
    /// ascending, and whether more follow. O(log memberships + limit).
    public func membersPage(of room: RoomName, after: Int, limit: Int) -> (ids: [Int], more: Bool) {
        guard let r = roomIndex[room], after < 0xFFFF_FFFF else { return ([], false) }
        let from = r << 32 | max(0, after + 1)
        let got = memberOrder.page(after: from, inclusive: true, limit: limit, stop: { $0 >> 32 != r })
        return (got.keys.map { $0 & 0xFFFF_FFFF }, got.more)
    }
}
