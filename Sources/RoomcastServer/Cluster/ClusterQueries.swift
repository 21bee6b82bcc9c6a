import RoomcastCore

// ClusterQueries.swift: what the daemon asks of the cluster link (the API's
// listings and counts, the metrics): each a method that returns what is
// needed, so that the link's state changes only through its own methods.
extension ClusterLink {
    /// Members of other daemons in `room`, by their counts (0: none known).
    func remoteViewers(in room: RoomName) -> Int { remote.viewers[room] ?? 0 }

    /// A page of the rooms other daemons count members in, `limit` after
    /// `after` (RemoteListing.swift; O(log rooms + limit)); nil when no
    /// other daemon counts any (the listing is the local one alone).
    func remoteRoomsPage(after: [UInt8], limit: Int) -> (rooms: [RoomName], more: Bool)? {
        remote.viewers.isEmpty ? nil : remote.listing.roomsPage(after: after, limit: limit)
    }

    /// A page of the members of other daemons tracked in `room`, `limit`
    /// after `after` (`DAEMON/ADDR` bytes, RemoteListing.swift): each with
    /// its daemon, address, member and key; `more` when a next page has some.
    func remoteMembersPage(in room: RoomName, after: [UInt8], limit: Int)
        -> (members: [(origin: UInt64, address: String, member: RemoteDaemons.Member, key: [UInt8])], more: Bool, lastKey: [UInt8]?) {
        let got = remote.listing.membersPage(in: room, after: after, limit: limit)
        let page = got.keys.compactMap { k in
            remote.daemons[k.origin]?.members[k.address].map { (origin: k.origin, address: k.address, member: $0, key: k.bytes) }
        }
        return (page, got.more, got.keys.last?.bytes)
    }

    /// How many other daemons this one knows of (heard, or holding members here).
    var daemonsKnown: Int { remote.daemons.count }

    /// What was refused from Redis for `reason` since the start (ClusterRefusals.swift).
    func refused(_ reason: ClusterRefusal) -> UInt64 { refusals[reason] }
}
