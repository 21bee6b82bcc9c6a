import RoomcastCore

// ClusterMembers.swift: the other daemons of the cluster as this daemon
// knows them, so that their users do not stay in rooms here as ghosts when
// a daemon goes away (docs/protocol/across-daemons.md §12, "Leaves"). Each daemon
// publishes its heartbeat on the cluster-wide channel
// `roomcast:NAME:daemons` every quarter of `cluster.timeout`, a "bye"
// there when it stops outside systemd, and "handing over, back within G"
// at every hand-over (under systemd every SIGTERM: a restart and a stop
// look the same to the daemon). A daemon that says bye, is not heard again
// within the G it announced, or is not heard for `cluster.timeout`, is
// gone: each of its members that this daemon relayed a join for gets the
// leave a local disconnect gives (its last join body), in the room it
// joined.

/// Per remote daemon (origin): when it was last heard, and its members in
/// rooms with members here, by the address its daemon gave them.
struct RemoteDaemons {
    /// Members tracked over every remote daemon; past it, joins are not
    /// tracked (their leaves on a daemon's departure are not sent), and that
    /// is said once.
    static let maxMembers = 200_000
    /// Other daemons known at most (origins): a message from one more is
    /// refused (`ClusterRefusal.origins`) until one is forgotten. Each
    /// daemon draws its origin at random, so a made-up one costs nothing to
    /// send; the table's expiry (`silent`, `unannounced`, `expireCounts`)
    /// frees what a forger fills.
    static let maxDaemons = 256
    /// (room, daemon) pairs of viewer counts held at most, over every
    /// daemon: counts that would hold more are refused (`countsLimit`).
    static let maxCountedRooms = 200_000
    /// A daemon never heard on the daemons channel (every daemon of this
    /// release and the one before heartbeats there) is forgotten when it
    /// sent nothing for this long (ms), its members sent their leaves.
    static let unannouncedMaxAgeMs: UInt64 = 60_000

    struct Member {
        var room: RoomName
        /// The UserInfo body of its last join (docs/protocol/rooms.md §4).
        var identity: [UInt8]
        /// The verified sub its daemon sent with that join (docs/protocol/across-daemons.md
        /// §12, envelope version 2); nil: none, or its daemon sent version 1.
        var sub: String? = nil
    }

    struct Daemon {
        var lastHeardMs: UInt64
        /// When any message of it last arrived (ms).
        var lastSeenMs: UInt64 = 0
        /// A frame of it was delivered here: it has positions in the
        /// sequence tracker, so only a departure forgets it.
        var sentFrames = false
        /// It heartbeats on the daemons channel: only such a daemon can be
        /// found silent (one of a version before that channel never is).
        var announces = false
        /// Its heartbeats advertise envelope version 2 (the sender's sub):
        /// a daemon not heard yet, or one of an older release, reads only 1.
        var readsSub = false
        var members: [String: Member] = [:]
        /// Its members per room, from its last `counts` message, and when that came (ms).
        var counts: [RoomName: Int] = [:]
        var countsAtMs: UInt64 = 0
    }

    /// A daemon's counts not refreshed for this long drop out (ms): each
    /// daemon publishes them at least every `ClusterLink.countsRefreshMs`.
    static let countsMaxAgeMs: UInt64 = 10_000

    /// A daemon that handed its clients over and is not heard since: when
    /// it said so and when it is gone unless heard (ms, this daemon's clock).
    struct Return: Equatable {
        var sinceMs: UInt64
        var byMs: UInt64
    }

    private(set) var daemons: [UInt64: Daemon] = [:]
    /// Daemons known that do not read envelope version 2: while any is,
    /// frames go out in version 1 (`ClusterLink.sendsSub`).
    private(set) var legacyReaders = 0
    private(set) var memberCount = 0
    /// Members per room over every other daemon (the sum of their `counts`).
    private(set) var viewers: [RoomName: Int] = [:]
    /// (room, daemon) pairs in the daemons' `counts`, for `maxCountedRooms`.
    private(set) var countedRooms = 0
    /// The daemons awaited back from a hand-over (a few at most: one per
    /// daemon restarting now).
    private(set) var returning: [UInt64: Return] = [:]
    /// `viewers`' rooms and the members tracked, in order (RemoteListing.swift).
    private(set) var listing = RemoteListing()

    /// Whether a message of `origin` may be taken: it is known, or fewer
    /// than `maxDaemons` are (it is then known from now on). Every message
    /// of another daemon passes here first; it is seen now. `frame`: a
    /// frame to be delivered (its positions are kept until it departs).
    mutating func admit(_ origin: UInt64, nowMs: UInt64, frame: Bool = false) -> Bool {
        if daemons[origin] == nil {
            guard daemons.count < Self.maxDaemons else { return false }
            ensure(origin, nowMs: nowMs)
        }
        daemons[origin]!.lastSeenMs = nowMs
        if frame { daemons[origin]!.sentFrames = true }
        return true
    }

    /// `origin`'s members per room, replacing what it said before.
    /// - Returns: false (nothing changed) when they would make more than
    ///   `maxCountedRooms` pairs over every daemon.
    @discardableResult
    mutating func setCounts(_ origin: UInt64, _ counts: [RoomName: Int], nowMs: UInt64) -> Bool {
        ensure(origin, nowMs: nowMs)
        let before = daemons[origin]!.counts.count
        guard countedRooms - before + counts.count <= Self.maxCountedRooms else { return false }
        // The listing changes only for rooms that come or go: a refresh of
        // the same rooms (every few seconds) costs it nothing.
        for room in counts.keys where viewers[room] == nil { listing.counted(room, true) }
        subtractCounts(daemons[origin]!.counts, unlist: false)
        for (room, n) in counts { viewers[room, default: 0] += n }
        for room in daemons[origin]!.counts.keys where viewers[room] == nil { listing.counted(room, false) }
        countedRooms += counts.count - before
        daemons[origin]!.counts = counts
        daemons[origin]!.countsAtMs = nowMs
        return true
    }

    /// Counts older than `countsMaxAgeMs` at `nowMs` drop out of `viewers`;
    /// a daemon left with nothing (never heard on the daemons channel, no
    /// members tracked, no counts: what a message arriving after its bye
    /// leaves) is forgotten, so that it does not hold the cluster to
    /// envelope version 1 forever.
    /// - Returns: the daemons forgotten (their positions go too).
    @discardableResult
    mutating func expireCounts(nowMs: UInt64) -> [UInt64] {
        for (origin, d) in daemons where !d.counts.isEmpty && nowMs &- d.countsAtMs > Self.countsMaxAgeMs {
            subtractCounts(d.counts)
            countedRooms -= d.counts.count
            daemons[origin]!.counts = [:]
        }
        var forgotten: [UInt64] = []
        for (origin, d) in daemons where !d.announces && !d.sentFrames && d.members.isEmpty && d.counts.isEmpty && returning[origin] == nil {
            daemons[origin] = nil
            if !d.readsSub { legacyReaders -= 1 }
            forgotten.append(origin)
        }
        return forgotten
    }

    private mutating func subtractCounts(_ counts: [RoomName: Int], unlist: Bool = true) {
        for (room, n) in counts {
            let left = (viewers[room] ?? 0) - n
            if unlist, left <= 0, viewers[room] != nil { listing.counted(room, false) }
            viewers[room] = left > 0 ? left : nil
        }
    }

    /// A daemon first known now (a heartbeat, a frame, its counts): it
    /// reads only version 1 until a heartbeat of it says otherwise.
    private mutating func ensure(_ origin: UInt64, nowMs: UInt64) {
        guard daemons[origin] == nil else { return }
        daemons[origin] = Daemon(lastHeardMs: nowMs)
        legacyReaders += 1
    }

    /// `origin`'s heartbeat on the daemons channel: it is alive, and reads
    /// envelope version 2 when `readsSub` (its advertisement, which may
    /// change: a daemon downgraded under the same origin stops reading it).
    /// - Returns: the hand-over it came back from, if it was awaited.
    @discardableResult
    mutating func heard(_ origin: UInt64, readsSub: Bool = false, nowMs: UInt64) -> Return? {
        ensure(origin, nowMs: nowMs)
        daemons[origin]!.lastHeardMs = nowMs
        daemons[origin]!.announces = true
        if daemons[origin]!.readsSub != readsSub {
            daemons[origin]!.readsSub = readsSub
            legacyReaders += readsSub ? -1 : 1
        }
        return returning.isEmpty ? nil : returning.removeValue(forKey: origin)
    }

    /// `origin` handed its clients over and is back within `graceMs` (a
    /// restart), or gone (a stop). A second hand-over before it is heard
    /// (a restart while the restarted process starts) moves the deadline.
    mutating func handingOver(_ origin: UInt64, graceMs: UInt64, nowMs: UInt64) {
        ensure(origin, nowMs: nowMs)
        daemons[origin]!.lastHeardMs = nowMs
        daemons[origin]!.announces = true
        returning[origin] = Return(sinceMs: returning[origin]?.sinceMs ?? nowMs, byMs: nowMs + graceMs)
    }

    /// The earliest return deadline (ms), if a daemon is awaited.
    var nextReturnMs: UInt64? { returning.isEmpty ? nil : returning.values.lazy.map(\.byMs).min() }

    /// Daemons awaited back whose deadline has passed at `nowMs`, no longer awaited.
    mutating func overdue(nowMs: UInt64) -> [(origin: UInt64, awaited: Return)] {
        let late = returning.filter { $0.value.byMs <= nowMs }
        for origin in late.keys { returning[origin] = nil }
        return late.map { (origin: $0.key, awaited: $0.value) }
    }

    /// A join relayed here: `address` of `origin` is in `room` as
    /// `identity`, with the verified `sub` its envelope carried (nil: none).
    /// - Returns: false when it is not tracked (over `maxMembers`).
    mutating func joined(_ origin: UInt64, address: String, room: RoomName, identity: [UInt8], sub: String? = nil, nowMs: UInt64) -> Bool {
        ensure(origin, nowMs: nowMs)
        if daemons[origin]!.members[address] == nil {
            guard memberCount < Self.maxMembers else { return false }
            memberCount += 1
        }
        listing.moved(origin, address, from: daemons[origin]!.members[address]?.room, to: room)
        daemons[origin]!.members[address] = Member(room: room, identity: identity, sub: sub)
        return true
    }

    /// A leave relayed here for `address` of `origin` in `room`.
    mutating func left(_ origin: UInt64, address: String, room: RoomName) {
        guard daemons[origin]?.members[address]?.room == room else { return }
        daemons[origin]!.members[address] = nil
        listing.moved(origin, address, from: room, to: nil)
        memberCount -= 1
    }

    /// `room` has no member here any more: nobody here is owed its leaves.
    mutating func roomClosed(_ room: RoomName) {
        listing.closed(room)
        for origin in daemons.keys {
            let before = daemons[origin]!.members.count
            daemons[origin]!.members = daemons[origin]!.members.filter { $0.value.room != room }
            memberCount -= before - daemons[origin]!.members.count
        }
    }

    /// `origin` is gone: its members, forgotten here.
    mutating func remove(_ origin: UInt64) -> [String: Member] {
        returning[origin] = nil
        guard let d = daemons.removeValue(forKey: origin) else { return [:] }
        if !d.readsSub { legacyReaders -= 1 }
        for (address, m) in d.members { listing.moved(origin, address, from: m.room, to: nil) }
        memberCount -= d.members.count
        subtractCounts(d.counts)
        countedRooms -= d.counts.count
        return d.members
    }

    /// The members of other daemons tracked in `room` (those in rooms with
    /// members here), ordered by daemon and address. O(members tracked).
    func members(in room: RoomName) -> [(origin: UInt64, address: String, member: Member)] {
        var out: [(origin: UInt64, address: String, member: Member)] = []
        for (origin, d) in daemons {
            for (address, m) in d.members where m.room == room { out.append((origin, address, m)) }
        }
        return out.sorted { $0.origin != $1.origin ? $0.origin < $1.origin : Array($0.address.utf8).lexicographicallyPrecedes(Array($1.address.utf8)) }
    }

    /// Whether a daemon other than `origin` has `address` in `room` (the
    /// same connection, restored after a crash by a process with a new origin).
    func has(_ address: String, in room: RoomName, except origin: UInt64) -> Bool {
        daemons.contains { $0.key != origin && $0.value.members[address]?.room == room }
    }

    /// Daemons not heard since `sinceMs`, except those awaited back from a
    /// hand-over (their own deadline decides, and a restart may take
    /// longer than `cluster.timeout`).
    func silent(since sinceMs: UInt64) -> [UInt64] {
        daemons.filter { $0.value.announces && $0.value.lastHeardMs < sinceMs && returning[$0.key] == nil }.map(\.key)
    }

    /// Daemons never heard on the daemons channel that sent nothing since
    /// `sinceMs` (`unannouncedMaxAgeMs` ago): a made-up origin's joins.
    func unannounced(notSeenSince sinceMs: UInt64) -> [UInt64] {
        daemons.filter { !$0.value.announces && $0.value.lastSeenMs < sinceMs && returning[$0.key] == nil }.map(\.key)
    }

    /// After this daemon's own link was down: nobody could be heard, so
    /// everyone starts over as heard now (a daemon awaited back included:
    /// its heartbeat may have been missed, so it is found silent after
    /// `cluster.timeout` if it is really gone).
    mutating func heardAll(nowMs: UInt64) {
        for origin in daemons.keys { daemons[origin]!.lastHeardMs = nowMs; daemons[origin]!.lastSeenMs = nowMs }
        returning.removeAll()
    }
}

extension ClusterLink {
    /// A frame of `origin` delivered to `room` here: joins and leaves keep
    /// the member list of that daemon (the frame's header in `order`).
    func track(_ frame: UnsafeRawBufferPointer, order: ByteOrder, origin: UInt64, address: String, sub: UnsafeRawBufferPointer,
               room: RoomName) {
        guard case .frame(let type, _) = FrameCodec.parse(frame, byteOrder: order, maxFrameBytes: Int.max) else { return }
        let p = relaySettings
        if type == p.joinType {
            let verified = sub.isEmpty ? nil : String(decoding: sub, as: UTF8.self)
            if !remote.joined(origin, address: address, room: room, identity: Array(frame[FrameCodec.headerSize...]), sub: verified,
                              nowMs: nowMs),
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
            FrameCodec.appendHeader(type: relaySettings.leaveType, length: UInt32(m.identity.count), byteOrder: byteOrder, to: &frame)
            frame += m.identity
            _ = frame.withUnsafeBytes { host.deliverFromCluster($0, room: m.room, address: address) }
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
    /// between (docs/protocol/across-daemons.md §12). Also after a hand-over whose next
    /// process came back later than it announced (the others sent leaves).
    /// Call once the publisher is ready; `after` names the cause in the log.
    func announceRestoredMembers(after cause: String) {
        guard publisher.state == .ready else { return }
        var frame: [UInt8] = []
        var count = 0
        for (id, room, identity) in host.clusterMembers() {
            frame.removeAll(keepingCapacity: true)
            FrameCodec.appendHeader(type: relaySettings.joinType, length: UInt32(identity.count), byteOrder: byteOrder, to: &frame)
            frame += identity
            frame.withUnsafeBytes { relayed($0, room: room, from: id) }
            count += 1
        }
        logger.info("cluster: announced \(plural(count, "restored member")) to the other daemons after \(cause)",
                    ["REDIS": address.description])
    }

    /// Every heartbeat: daemons not heard for `cluster.timeout` are gone,
    /// but only while this daemon hears itself (else nobody can be heard).
    func expireSilentDaemons(now: UInt64) {
        guard connected, now &- lastHeardMs < settings.timeoutMs, now > settings.timeoutMs else { return }
        for origin in remote.silent(since: now - settings.timeoutMs) {
            departed(origin, "was not heard for \(formatDuration(ms: settings.timeoutMs))")
        }
        guard now > RemoteDaemons.unannouncedMaxAgeMs else { return }
        for origin in remote.unannounced(notSeenSince: now - RemoteDaemons.unannouncedMaxAgeMs) {
            departed(origin, "was never heard on the daemons channel and sent nothing for \(formatDuration(ms: RemoteDaemons.unannouncedMaxAgeMs))")
        }
    }

    /// At each return deadline: a daemon that handed over and was not
    /// heard again within the time it announced stopped (`systemctl stop`),
    /// so its members leave here. Only while this daemon hears itself.
    func expireOverdueReturns(now: UInt64) {
        guard let next = remote.nextReturnMs, now >= next, connected, now &- lastHeardMs < settings.timeoutMs else { return }
        for (origin, awaited) in remote.overdue(nowMs: now) {
            departed(origin, "handed over and was not heard again within \(formatDuration(ms: awaited.byMs - awaited.sinceMs)) (stopped)")
        }
    }

    /// A hand-over announced on the daemons channel (`graceMs`: the time
    /// it said it is back within, bounded by what a config may say).
    func handingOver(_ origin: UInt64, graceMs: UInt64) {
        let grace = min(max(graceMs, 1), 60_000)
        remote.handingOver(origin, graceMs: grace, nowMs: nowMs)
        logger.info("cluster: daemon \(ClusterEnvelope.hex(origin)) handed its clients over (a restart, or a stop); "
                    + "its members leave here unless it is heard again within \(formatDuration(ms: grace))",
                    ["ORIGIN": ClusterEnvelope.hex(origin), "REASON": "cluster_daemon_handing_over"])
    }

    /// A heartbeat of `origin` on the daemons channel (`advert`: the
    /// envelope versions it reads, its frame bytes).
    func heardDaemon(_ origin: UInt64, advert: UnsafeRawBufferPointer) {
        let now = nowMs
        let readsSub = ClusterEnvelope.reads(ClusterEnvelope.versionWithSub, advert: advert)
        guard let back = remote.heard(origin, readsSub: readsSub, nowMs: now) else { return }
        logger.info("cluster: daemon \(ClusterEnvelope.hex(origin)) is back \(now - back.sinceMs) ms after its hand-over (a restart)",
                    ["ORIGIN": ClusterEnvelope.hex(origin), "REASON": "cluster_daemon_back", "GAP_MS": String(now - back.sinceMs)])
    }
}
