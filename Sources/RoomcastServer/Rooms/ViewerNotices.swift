import RoomcastCore

// ViewerNotices.swift: viewer counts (members here plus those the other
// daemons of the cluster report, Cluster/ClusterMembers.swift), and the
// notice `viewers` that tells a room its count every `[rooms] counts`
// when it changed (docs/protocol/notices.md §13): one sweep over the rooms, no
// timer per room.

extension Server {
    /// Viewers of `room` over the cluster: members here plus the other
    /// daemons' last counts (at most `RemoteDaemons.countsMaxAgeMs` old).
    func viewers(of room: RoomName) -> Int {
        relay.memberCount(of: room) + (cluster?.remoteViewers(in: room) ?? 0)
    }

    /// `[rooms] counts` (re)armed at start and on reload.
    func scheduleViewerCounts(now: UInt64) {
        viewerCounts.schedule(intervalMs: config.rooms.countsMs, nowMs: now)
    }

    /// The sweep when due: each room with members here whose count changed
    /// since its last notice gets `viewers` with the count in `count`.
    func sweepViewerCountsIfDue(now: UInt64) {
        guard now >= viewerCounts.nextMs, !stopping else { return }
        let counts = relay.roomCounts.map { (room: $0.room, viewers: $0.members + (cluster?.remoteViewers(in: $0.room) ?? 0)) }
        for (room, n) in viewerCounts.sweep(counts, nowMs: now) {
            let body = Notice(code: "viewers", count: Int64(n)).serialized()
            let frame = FrameCodec.encode(type: config.protocol.noticeType, body: body, byteOrder: config.protocol.byteOrder)
            _ = frame.withUnsafeBytes { relay.deliver($0, toRoom: room, sink: table.fanout) }
        }
    }
}
