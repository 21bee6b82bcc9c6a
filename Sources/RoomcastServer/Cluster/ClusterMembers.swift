import RoomcastCore

// ClusterMembers.swift: the other daemons of the cluster as this daemon
// knows them, so that their users do not stay in rooms here as ghosts when
// a daemon goes away (docs/protocol.md §12, "Leaves"). Each daemon
// publishes its heartbeat on the cluster-wide channel
// `roomcast:NAME:daemons` every quarter of `cluster.timeout`, and a "bye"
// there when it stops; a daemon that says bye, or is not heard for
// `cluster.timeout`, is gone: each of its members that this daemon relayed
// a join for gets the leave a local disconnect gives (its last join body),
// in the room it joined.

/// Per remote daemon (origin): when it was last heard, and its members in
/// rooms with members here, by the address its daemon gave them.
struct RemoteDaemons {
    /// Members tracked over every remote daemon; past it, joins are not
    /// tracked (their leaves on a daemon's departure are not sent), and that
    /// is said once.
    static let maxMembers = 200_000

    struct Member {
        var room: RoomName
        /// The UserInfo body of its last join (docs/protocol.md §4).
        var identity: [UInt8]
    }

    struct Daemon {
        var lastHeardMs: UInt64
        /// It heartbeats on the daemons channel: only such a daemon can be
        /// found silent (one of a version before that channel never is).
        var announces = false
        var members: [String: Member] = [:]
        /// Its members per room, from its last `counts` message, and when that came (ms).
        var counts: [RoomName: Int] = [:]
        var countsAtMs: UInt64 = 0
    }

    /// A daemon's counts not refreshed for this long drop out (ms): each
    /// daemon publishes them at least every `ClusterLink.countsRefreshMs`.
    static let countsMaxAgeMs: UInt64 = 10_000

    private(set) var daemons: [UInt64: Daemon] = [:]
    private(set) var memberCount = 0
    /// Members per room over every other daemon (the sum of their `counts`).
    private(set) var viewers: [RoomName: Int] = [:]

    /// `origin`'s members per room, replacing what it said before.
    mutating func setCounts(_ origin: UInt64, _ counts: [RoomName: Int], nowMs: UInt64) {
        if daemons[origin] == nil { daemons[origin] = Daemon(lastHeardMs: nowMs) }
        subtractCounts(daemons[origin]!.counts)
        for (room, n) in counts { viewers[room, default: 0] += n }
        daemons[origin]!.counts = counts
        daemons[origin]!.countsAtMs = nowMs
    }

    /// Counts older than `countsMaxAgeMs` at `nowMs` drop out of `viewers`.
    mutating func expireCounts(nowMs: UInt64) {
        for (origin, d) in daemons where !d.counts.isEmpty && nowMs &- d.countsAtMs > Self.countsMaxAgeMs {
            subtractCounts(d.counts)
            daemons[origin]!.counts = [:]
        }
    }

    private mutating func subtractCounts(_ counts: [RoomName: Int]) {
        for (room, n) in counts {
            let left = (viewers[room] ?? 0) - n
            viewers[room] = left > 0 ? left : nil
        }
    }

    /// `origin`'s heartbeat on the daemons channel: it is alive.
    mutating func heard(_ origin: UInt64, nowMs: UInt64) {
        daemons[origin, default: Daemon(lastHeardMs: nowMs)].lastHeardMs = nowMs
        daemons[origin]!.announces = true
    }

    /// A join relayed here: `address` of `origin` is in `room` as `identity`.
    /// - Returns: false when it is not tracked (over `maxMembers`).
    mutating func joined(_ origin: UInt64, address: String, room: RoomName, identity: [UInt8], nowMs: UInt64) -> Bool {
        if daemons[origin] == nil { daemons[origin] = Daemon(lastHeardMs: nowMs) }
        if daemons[origin]!.members[address] == nil {
            guard memberCount < Self.maxMembers else { return false }
            memberCount += 1
        }
        daemons[origin]!.members[address] = Member(room: room, identity: identity)
        return true
    }

    /// A leave relayed here for `address` of `origin` in `room`.
    mutating func left(_ origin: UInt64, address: String, room: RoomName) {
        guard daemons[origin]?.members[address]?.room == room else { return }
        daemons[origin]!.members[address] = nil
        memberCount -= 1
    }

    /// `room` has no member here any more: nobody here is owed its leaves.
    mutating func roomClosed(_ room: RoomName) {
        for origin in daemons.keys {
            let before = daemons[origin]!.members.count
            daemons[origin]!.members = daemons[origin]!.members.filter { $0.value.room != room }
            memberCount -= before - daemons[origin]!.members.count
        }
    }

    /// `origin` is gone: its members, forgotten here.
    mutating func remove(_ origin: UInt64) -> [String: Member] {
        guard let d = daemons.removeValue(forKey: origin) else { return [:] }
        memberCount -= d.members.count
        subtractCounts(d.counts)
        return d.members
    }

    /// Whether a daemon other than `origin` has `address` in `room` (the
    /// same connection, restored after a crash by a process with a new origin).
    func has(_ address: String, in room: RoomName, except origin: UInt64) -> Bool {
        daemons.contains { $0.key != origin && $0.value.members[address]?.room == room }
    }

    /// Daemons not heard since `sinceMs`.
    func silent(since sinceMs: UInt64) -> [UInt64] { daemons.filter { $0.value.announces && $0.value.lastHeardMs < sinceMs }.map(\.key) }

    /// After this daemon's own link was down: nobody could be heard, so everyone starts over as heard now.
    mutating func heardAll(nowMs: UInt64) {
        for origin in daemons.keys { daemons[origin]!.lastHeardMs = nowMs }
    }
}

extension ClusterLink {
    /// A frame of `origin` delivered to `room` here: joins and leaves keep
    /// the member list of that daemon (the frame's header in `order`).
    func track(_ frame: UnsafeRawBufferPointer, order: ByteOrder, origin: UInt64, address: String, room: RoomName) {
        guard case .frame(let type, _) = FrameCodec.parse(frame, byteOrder: order, maxFrameBytes: Int.max) else { return }
        let p = server.config.protocol
        if type == p.joinType {
            if !remote.joined(origin, address: address, room: room, identity: Array(frame[FrameCodec.headerSize...]), nowMs: nowMs),
               !remoteOverflowSaid {
                remoteOverflowSaid = true
                logger.warning("cluster: \(RemoteDaemons.maxMembers) members of other daemons tracked; the joins of more are not, "
                               + "and they get no leave here if their daemon goes away", ["REASON": "cluster_members_limit"])
            }
        } else if type == p.leaveType {
            remote.left(origin, address: address, room: room)
        }
    }

    /// `origin` is gone (`why`: it said bye, or it was silent for
    /// `cluster.timeout`): every member of it in a room here gets its leave,
    /// the same frame a local disconnect gives.
    func departed(_ origin: UInt64, _ why: String) {
        let members = remote.remove(origin)
        tracker.forget(origin: origin)
        var leaves = 0
        // A member that another daemon announced since (a crash recovered
        // under a new origin re-announces its restored members) did not leave.
        for (address, m) in members where hasMembers(m.room) && !remote.has(address, in: m.room, except: origin) {
            var frame: [UInt8] = []
            FrameCodec.appendHeader(type: server.config.protocol.leaveType, length: UInt32(m.identity.count), byteOrder: byteOrder, to: &frame)
            frame += m.identity
            _ = frame.withUnsafeBytes { server.deliverFromCluster($0, room: m.room, address: address) }
            leaves += 1
        }
        logger.info("cluster: daemon \(ClusterEnvelope.hex(origin)) \(why); \(plural(leaves, "leave")) for its members sent to the rooms here",
                    ["ORIGIN": ClusterEnvelope.hex(origin), "REASON": "cluster_daemon_gone"])
    }

    /// After a crash recovery (this process has a new origin, the others
    /// will find the old one silent): every restored member that had joined
    /// is announced again with its join, so that the other daemons keep it
    /// (`departed` skips members another origin announced) rather than
    /// sending its leave. Their members see the join twice, with no leave
    /// between (docs/protocol.md §12). Call once the publisher is ready.
    func announceRestoredMembers() {
        guard publisher.state == .ready else { return }
        var frame: [UInt8] = []
        var count = 0
        for id in server.table.ids {
            guard let identity = server.relay.identity(of: id), let room = server.relay.roomName(of: id) else { continue }
            frame.removeAll(keepingCapacity: true)
            FrameCodec.appendHeader(type: server.config.protocol.joinType, length: UInt32(identity.count), byteOrder: byteOrder, to: &frame)
            frame += identity
            frame.withUnsafeBytes { relayed($0, room: room, from: id) }
            count += 1
        }
        logger.info("cluster: announced \(plural(count, "restored member")) to the other daemons after the crash",
                    ["REDIS": address.description])
    }

    /// Every heartbeat: daemons not heard for `cluster.timeout` are gone,
    /// but only while this daemon hears itself (else nobody can be heard).
    func expireSilentDaemons(now: UInt64) {
        guard connected, now &- lastHeardMs < settings.timeoutMs, now > settings.timeoutMs else { return }
        for origin in remote.silent(since: now - settings.timeoutMs) {
            departed(origin, "was not heard for \(formatDuration(ms: settings.timeoutMs))")
        }
    }
}
