@preconcurrency import CHiredis
import Glibc
import RoomcastCore
import RoomcastIO

// Cluster.swift owns rooms that span daemons (docs/cluster.md;
// docs/protocol/across-daemons.md §12): the link to Redis pub/sub with
// its two connections, what it publishes (every frame the relay relays,
// through `RelayObserver`), what it subscribes to (the rooms with members
// here), what it delivers (other daemons' frames, through
// `Server.deliverFromCluster`), and how it survives a Redis that is down,
// slow, restarted, stopped or not Redis at all. Local relay never waits
// for it: it only appends to a connection's output, which is written once
// per loop turn.

/// What STATUS= and the stats line report about the cluster.
struct ClusterFigures: Equatable {
    /// Both connections are ready.
    var connected: Bool
    /// Rooms subscribed (those with members here), while connected.
    var rooms: Int
    /// Frames published to Redis.
    var published: UInt64
    /// Frames from other daemons delivered here.
    var received: UInt64
    /// Frames not published: Redis down, or its output over `max_output_bytes`.
    var dropped: UInt64
    /// Frames of other daemons that never arrived (sequence gaps).
    var gaps: UInt64
    /// Frames of other daemons dropped as late duplicates.
    var late: UInt64
    /// Messages dropped whose envelope named another room than their channel.
    var misrouted: UInt64 = 0
    /// Messages dropped that arrived for a room with no member here any more.
    var stale: UInt64 = 0

    /// `cluster connected, 3 rooms, 1200 frames out, 2400 in, 0 dropped, 0 gaps`.
    var summary: String {
        "cluster \(connected ? "connected" : "disconnected"), \(plural(rooms, "room")) subscribed, \(published) frames out, "
            + "\(received) in, \(dropped) dropped, \(gaps) gaps"
    }
}

/// The daemon's link to the cluster: owned by the server, which it refers
/// back to (unowned) for the clock, the logger, addresses and delivery.
final class ClusterLink: RelayObserver {
    /// Reconnect delays: 50 ms, doubled at each failed attempt, at most 2 s (with ±20 % jitter).
    static let firstRetryMs: UInt64 = 50
    static let maxRetryMs: UInt64 = 2_000
    /// Channels per SUBSCRIBE when resubscribing every room.
    static let subscribeBatch = 1_000

    unowned let server: Server
    let address: RedisAddress
    private(set) var settings: Config.Cluster
    /// This daemon in the cluster: random, drawn at the first start, and
    /// carried over a restart that keeps the clients (`adopt`) and over a
    /// crash (the live log has it).
    private(set) var origin: UInt64
    let channels: ClusterChannels
    private(set) var heartbeatChannel: [UInt8]
    /// The kind of every frame relayed here (one byte order per daemon).
    let kind: ClusterEnvelope.Kind
    let byteOrder: ByteOrder
    private(set) var publisher: RedisConnection!
    private(set) var subscriber: RedisConnection!

    private var streams: ClusterStreams
    var tracker = ClusterSequenceTracker()
    /// Rooms with members here: what the subscriber should listen to.
    private(set) var rooms: Set<RoomName> = []
    /// What the subscriber has asked Redis for since it connected.
    private var subscribed: Set<RoomName> = []
    /// Rooms opened or closed since the last flush (the subscriber's work).
    private var changedRooms: [RoomName] = []

    private(set) var published: UInt64 = 0
    var received: UInt64 = 0
    private(set) var dropped: UInt64 = 0
    var gaps: UInt64 = 0
    var late: UInt64 = 0
    /// Messages dropped because their envelope named another room than their channel.
    var misrouted: UInt64 = 0
    /// Messages dropped because their room has no member here any more (in flight when it closed).
    var stale: UInt64 = 0
    /// What was refused from Redis, by reason (ClusterRefusals.swift).
    var refusals = ClusterRefusalCounts()

    /// The next heartbeat to ourselves through Redis, in ms.
    private var nextHeartbeatMs: UInt64 = 0
    private var heartbeatSeq: UInt64 = 0
    /// When our own heartbeat last came back (or the round trip (re)started), in ms.
    var lastHeardMs: UInt64 = 0
    /// Both connections were ready at least once.
    private var everUp = false
    /// When the cluster last went down (nil: it is up, or never was), and
    /// the figures then, for the line that says it is back.
    private var downSince: (ms: UInt64, dropped: UInt64, gaps: UInt64)?
    private var attemptsWhileDown = 0
    /// A Redis that refuses us, or is not Redis as we speak it, at every
    /// attempt (protected mode, a password or ACL we lack, a proxy): said
    /// once, then once a minute with the count, then once when it works.
    private var refusedLog = RateLimitedLog()
    private var random: UInt64

    /// The other daemons and their members in rooms here (ClusterMembers.swift).
    var remote = RemoteDaemons()
    var remoteOverflowSaid = false
    /// The connections were restored after a crash (a new origin): their
    /// members are announced again once the link is up (`announceRestoredMembers`).
    var restoredAfterCrash = false
    /// After a hand-over: when the other daemons stop waiting for this one
    /// (ms; `HandOverState.Cluster.returnByMs`). Once the publisher is
    /// ready, a heartbeat tells them it is back; past this (less
    /// `returnSlackMs`) they have sent their leaves, so its members are
    /// announced again.
    private(set) var returnByMs: UInt64?
    /// How close to `returnByMs` a return counts as late: the others'
    /// deadlines start when they receive the hand-over, a little after it
    /// was sent, and their loops may read the heartbeat late (ms).
    static let returnSlackMs: UInt64 = 50

    /// Rooms whose stream numbers moved since the live log last had them,
    /// and the last stream id it has (`publisherWillWrite`).
    private var streamsToLog: Set<RoomName> = []
    private var loggedLastStream: UInt64 = 0

    /// The moderation hash was loaded since the connections last came up (ClusterModeration.swift).
    var moderationLoaded = false
    /// This daemon's members per room go to the others at most every
    /// `countsMinMs` when they changed, and every `countsRefreshMs` anyway
    /// (ms); the others drop counts older than `RemoteDaemons.countsMaxAgeMs`.
    static let countsMinMs: UInt64 = 1_000
    static let countsRefreshMs: UInt64 = 3_000
    private var nextCountsMs: UInt64 = 0
    private var lastCountsMs: UInt64 = 0
    private var countsPayload: [UInt8] = []
    private var lastCountsPayload: [UInt8]?

    /// When the link has been up long enough (`cluster.timeout`: every
    /// daemon alive was heard since) to know whether all of them read
    /// envelope version 2 (ms; nil: not up, or settled already).
    private var subFormAfterMs: UInt64?
    /// The link has been up for `cluster.timeout` since it last came up.
    private(set) var settledForSub = false
    /// Frames go out in envelope version 2, with their sender's sub: only
    /// while every daemon heard reads it (docs/protocol/across-daemons.md §12).
    var sendsSub: Bool { settledForSub && remote.legacyReaders == 0 }
    /// The form last said in the log (`noteEnvelopeForm`).
    private var saidSendsSub = false

    /// Reusable buffers: the envelope being published, a frame in the other byte order.
    private var envelope: [UInt8] = []
    var converted: [UInt8] = []

    init(server: Server, address: RedisAddress, settings: Config.Cluster, byteOrder: ByteOrder) {
        self.server = server
        self.address = address
        self.settings = settings
        self.byteOrder = byteOrder
        kind = ClusterEnvelope.Kind(byteOrder)
        origin = Sys.randomSeed()  // never blocks, even at early boot
        random = origin
        channels = ClusterChannels(name: settings.name)
        heartbeatChannel = channels.heartbeat(origin: origin)
        streams = ClusterStreams(channels: channels)
        envelope.reserveCapacity(1024)
        publisher = RedisConnection(role: .publisher, link: self, selector: server.selector, maxReplyBytes: Self.maxHashReplyBytes)
        subscriber = RedisConnection(role: .subscriber, link: self, selector: server.selector,
                                     maxReplyBytes: Self.maxMessageBytes(server.config.protocol, json: server.config.json))
    }

    var nowMs: UInt64 { server.clock() }
    var logger: Logger { server.logger }
    var connected: Bool { publisher.state == .ready && subscriber.state == .ready }

    /// Whether `room` has members here (what the subscriber listens to).
    func hasMembers(_ room: RoomName) -> Bool { rooms.contains(room) }

    var figures: ClusterFigures {
        ClusterFigures(connected: connected, rooms: subscriber.state == .ready ? subscribed.count : 0, published: published,
                       received: received, dropped: dropped, gaps: gaps, late: late, misrouted: misrouted, stale: stale)
    }

    /// New `timeout`, `restart_grace` and `max_output_bytes` (reload); `redis` and `name` need a restart.
    func reconfigure(_ new: Config.Cluster) {
        settings.timeoutMs = new.timeoutMs
        settings.restartGraceMs = new.restartGraceMs
        settings.maxOutputBytes = new.maxOutputBytes
    }

    /// Before the restore: the previous process's origin and numbering,
    /// so that the other daemons see this daemon go on (frames it relayed
    /// and could not publish count as a gap there) rather than a new one.
    func adopt(_ carried: HandOverState.Cluster) {
        origin = carried.origin
        random = origin
        heartbeatChannel = channels.heartbeat(origin: origin)
        streams.restore(lastID: carried.lastStream, streams: carried.streams.map { (room: $0.room, id: $0.id, seq: $0.seq) })
        tracker.restore(carried.positions)
        returnByMs = carried.returnByMs
    }

    /// What a restart carries over (`HandOverState.cluster`): the origin,
    /// the numbering of this daemon's streams, the positions of the
    /// other daemons' frames delivered here, and when the others stop
    /// waiting: `restart_grace` from now when `shutdown(.handingOver)` can
    /// tell them (the publisher is up), else what an earlier process told
    /// them and this one had not yet answered.
    func carry() -> HandOverState.Cluster {
        let s = streams.snapshot
        var c = HandOverState.Cluster(origin: origin, lastStream: s.lastID,
                                      streams: s.streams.map { HandOverState.Cluster.Stream(room: $0.room, id: $0.id, seq: $0.seq) },
                                      positions: tracker.carried)
        c.returnByMs = publisher.state == .ready ? nowMs + settings.restartGraceMs : returnByMs
        return c
    }

    // MARK: - The crash path (LiveStore.swift)

    /// The records of the whole link for a compacted live log: origin,
    /// every stream, every position.
    func liveSnapshot() -> [UInt8] {
        var out = LiveLog.clusterOrigin(origin, lastStream: streams.lastStreamID)
        for s in streams.snapshot.streams { out += LiveLog.clusterStream(s.room, id: s.id, seq: s.seq) }
        var byRoom: [RoomName: [ClusterSequenceTracker.Carried]] = [:]
        for p in tracker.carried { byRoom[p.room, default: []].append(p) }
        for (room, list) in byRoom { out += LiveLog.clusterPositions(room, list) }
        loggedLastStream = streams.lastStreamID
        streamsToLog.removeAll(keepingCapacity: true)
        _ = tracker.takeChanged()
        return out
    }

    /// Before the publisher sends: the numbers of the frames it is about
    /// to send go into the live log first, so that after a crash no stream
    /// goes on behind a number another daemon has seen (it would drop the
    /// frames as late); numbers drawn and not sent before a crash are
    /// drawn again.
    func publisherWillWrite() {
        guard server.live != nil, !streamsToLog.isEmpty || streams.lastStreamID != loggedLastStream else { return }
        if streams.lastStreamID != loggedLastStream {
            loggedLastStream = streams.lastStreamID
            server.logLive(LiveLog.clusterOrigin(origin, lastStream: loggedLastStream))
        }
        for room in streamsToLog {
            if let s = streams.position(room) { server.logLive(LiveLog.clusterStream(room, id: s.id, seq: s.seq)) }
        }
        streamsToLog.removeAll(keepingCapacity: true)
    }

    /// Once per loop turn: the positions of the rooms that received frames
    /// from other daemons, or forgot some, into the live log.
    func logLivePositions() {
        guard server.live != nil else { return }
        for (room, list) in tracker.takeChanged() { server.logLive(LiveLog.clusterPositions(room, list)) }
    }

    /// The first connects; the loop's timers do the rest.
    func start(nowMs: UInt64) {
        streams.retain(rooms)  // carried streams of rooms nobody came back to
        logger.info("cluster: origin \(ClusterEnvelope.hex(origin)), Redis at \(address), channels "
                    + "roomcast:\(settings.name):room:ROOM", ["REDIS": address.description, "ORIGIN": ClusterEnvelope.hex(origin)])
        downSince = (nowMs, 0, 0)
        connect(publisher, nowMs: nowMs)
        connect(subscriber, nowMs: nowMs)
    }

    /// How this process leaves the cluster.
    enum Departure {
        /// A stop for good: the other daemons send leaves for its members at once.
        case bye
        /// A hand-over to systemd's fd store: a restart, or a stop that
        /// systemd does not tell apart. The others wait `restart_grace`
        /// for the next process (the same origin), then send the leaves.
        case handingOver
    }

    /// At exit: a bye, or a hand-over announced with `restart_grace`, to
    /// the other daemons on the daemons channel; what the publisher holds
    /// written if the socket takes it; then both connections closed.
    func shutdown(_ departure: Departure) {
        if publisher.state == .ready {
            let kind: ClusterEnvelope.Kind = departure == .bye ? .bye : .handingOver
            let grace = departure == .bye ? 0 : settings.restartGraceMs
            ClusterEnvelope.encode(kind: kind, origin: origin, stream: 0, seq: grace, room: RoomName(bytes: []), address: "",
                                   frame: UnsafeRawBufferPointer(start: nil, count: 0), into: &envelope)
            _ = publisher.publish(channels.daemons, envelope, nowMs: nowMs)
        }
        publisher.flush()
        publisher.close()
        subscriber.close()
    }

    // MARK: - The relay's hooks (RelayObserver)

    func roomOpened(_ room: RoomName) {
        rooms.insert(room)
        streams.open(room)
        if subscriber.state == .handshaking || subscriber.state == .ready { changedRooms.append(room) }
    }

    func roomClosed(_ room: RoomName) {
        rooms.remove(room)
        streams.close(room)
        tracker.forget(room: room)
        remote.roomClosed(room)
        if subscriber.state == .handshaking || subscriber.state == .ready { changedRooms.append(room) }
    }

    /// Every frame relayed here goes to Redis once; one that cannot (Redis
    /// down or slow) still takes its number, so the others count the gap.
    func relayed(_ frame: UnsafeRawBufferPointer, room: RoomName, from sender: Int) {
        let next = streams.next(room)
        if server.live != nil { streamsToLog.insert(room) }
        guard publisher.state == .ready else {
            dropped &+= 1
            return
        }
        let pending = publisher.pendingOutput
        guard pending + frame.count <= settings.maxOutputBytes else {
            dropped &+= 1
            logger.peerWarning(reason: "cluster_output_limit", nowMs: nowMs,
                               "cluster: Redis is not taking our output (\(pending) bytes waiting, max_output_bytes "
                               + "\(formatSize(settings.maxOutputBytes))): a frame to \(room) was not published",
                               ["ROOM": room.string, "REDIS": address.description])
            return
        }
        ClusterEnvelope.encode(kind: kind, origin: origin, stream: next.stream, seq: next.seq, room: room,
                               address: server.table.address(of: sender), sub: sendsSub ? sub(of: sender, frame) : nil,
                               frame: frame, into: &envelope)
        if publisher.publish(next.channel, envelope, nowMs: self.nowMs) {
            published &+= 1
        } else {
            dropped &+= 1
        }
    }

    /// The verified sub a frame of `sender` goes out with: the one it
    /// holds, or for the join of a token it is proving now (the relay's
    /// broadcast comes before the connection holds it) that token's; the
    /// leave of its old room in that same turn keeps the old one.
    private func sub(of sender: Int, _ frame: UnsafeRawBufferPointer) -> String {
        if let j = server.joining, j.id == sender,
           case .frame(let type, _) = FrameCodec.parse(frame, byteOrder: byteOrder, maxFrameBytes: Int.max),
           type == server.config.protocol.joinType {
            return j.sub
        }
        return server.table.sub(of: sender)
    }

    // MARK: - The loop's hooks

    /// Before the loop waits: subscription changes of this turn, then one write per connection.
    func beforeWait() {
        if !changedRooms.isEmpty { flushSubscriptions() }
        publisher.flush()
        subscriber.flush()
    }

    /// A selector event for connection `index` (`Server.Source.cluster`).
    func ready(_ index: Int, _ readiness: Readiness) {
        (index == RedisConnection.Role.publisher.rawValue ? publisher : subscriber).ready(readiness)
    }

    /// The earliest time the timers have something to do.
    func deadline() -> UInt64 {
        var d = UInt64.max
        for c in [publisher!, subscriber!] {
            switch c.state {
            case .idle: d = min(d, c.retryAtMs)
            case .connecting, .handshaking: d = min(d, c.sinceMs + settings.timeoutMs)
            case .ready: if let since = c.awaitingSinceMs { d = min(d, since + settings.timeoutMs) }
            }
            if c.pendingReset != nil { d = 0 }
        }
        if publisher.state == .ready {
            d = min(d, nextHeartbeatMs, nextCountsMs)
            if subscriber.state == .ready { d = min(d, lastHeardMs + settings.timeoutMs) }
        }
        if let back = remote.nextReturnMs { d = min(d, back) }
        return d
    }

    /// Reconnects, connect timeouts, heartbeats and the watchdog.
    func runTimers(now: UInt64) {
        let timeout = settings.timeoutMs
        for c in [publisher!, subscriber!] {
            if let reason = c.pendingReset {
                lose(c, reason, now: now)
                continue
            }
            switch c.state {
            case .idle:
                if now >= c.retryAtMs { connect(c, nowMs: now) }
            case .connecting, .handshaking:
                if now &- c.sinceMs >= timeout {
                    lose(c, c.state == .connecting ? "connect did not complete within \(formatDuration(ms: timeout))"
                         : "no answer within \(formatDuration(ms: timeout)) of connecting", now: now)
                }
            case .ready:
                if let since = c.awaitingSinceMs, now &- since >= timeout {
                    lose(c, "no reply for \(formatDuration(ms: timeout)) (Redis stopped?)", now: now)
                }
            }
        }
        // Also while Redis is down: counts nobody refreshes drop out after 10 s.
        for gone in remote.expireCounts(nowMs: now) { tracker.forget(origin: gone) }
        guard publisher.state == .ready else { return }
        if subscriber.state == .ready, now &- lastHeardMs >= timeout {
            lose(subscriber, "our heartbeat did not come back within \(formatDuration(ms: timeout)) (Redis stopped?)", now: now)
        }
        if now >= nextHeartbeatMs {
            sendHeartbeat(now: now)
            expireSilentDaemons(now: now)
            noteEnvelopeForm()
        }
        if now >= nextCountsMs { publishCounts(now: now) }
        expireOverdueReturns(now: now)
    }

    /// This daemon's members per room on the daemons channel, when they
    /// changed since the last time or `countsRefreshMs` passed (the
    /// others' viewer counts are the sum, docs/api.md). O(rooms).
    private func publishCounts(now: UInt64) {
        nextCountsMs = now + Self.countsMinMs
        ClusterCounts.encode(server.relay.roomCounts, into: &countsPayload)
        guard countsPayload != lastCountsPayload || now &- lastCountsMs >= Self.countsRefreshMs else { return }
        guard publisher.pendingOutput + countsPayload.count <= settings.maxOutputBytes else { return }  // the next turn tries again
        countsPayload.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .counts, origin: origin, stream: 0, seq: 0, room: RoomName(bytes: []), address: "", frame: $0, into: &envelope)
        }
        if publisher.publish(channels.daemons, envelope, nowMs: now) {
            lastCountsPayload = countsPayload
            lastCountsMs = now
        }
    }

    /// Says in the log when the form of the frames sent changes (checked
    /// at each heartbeat; the form itself follows `sendsSub` at once): a
    /// rolling upgrade is over when every daemon reads version 2.
    private func noteEnvelopeForm() {
        let now = sendsSub
        guard now != saidSendsSub else { return }
        saidSendsSub = now
        if now {
            logger.info("cluster: every daemon heard reads envelope version 2: frames go out with their sender's sub",
                        ["REASON": "cluster_envelope_v2", "REDIS": address.description])
        } else {
            let old = remote.daemons.filter { !$0.value.readsSub }.keys.sorted().prefix(4).map { ClusterEnvelope.hex($0) }
            logger.info("cluster: frames go out in envelope version 1, without their sender's sub"
                        + (old.isEmpty ? " (Redis was lost)" : ": daemon \(old.joined(separator: ", ")) reads only that"),
                        ["REASON": "cluster_envelope_v1", "REDIS": address.description])
        }
    }

    /// Our heartbeat, to ourselves (the proof Redis relays) and to the others.
    private func sendHeartbeat(now: UInt64) {
        heartbeatSeq &+= 1
        if let after = subFormAfterMs, now >= after {
            subFormAfterMs = nil
            settledForSub = true
        }
        // The versions this daemon reads, where the frame would be: a
        // version 1 decoder takes a heartbeat's frame bytes and ignores them.
        ClusterEnvelope.readableVersions.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .heartbeat, origin: origin, stream: 0, seq: heartbeatSeq, room: RoomName(bytes: []), address: "",
                                   frame: $0, into: &envelope)
        }
        _ = publisher.publish(heartbeatChannel, envelope, nowMs: now)
        _ = publisher.publish(channels.daemons, envelope, nowMs: now)
        nextHeartbeatMs = now + max(1, settings.timeoutMs / 4)
    }

    /// The publisher is up after a hand-over: a heartbeat first, before
    /// any frame, so the others stop waiting; if they stopped already
    /// (later than the `restart_grace` announced), the restored members
    /// are announced again, as after a crash with a new origin.
    private func returnFromHandOver(by: UInt64, now: UInt64) {
        returnByMs = nil
        sendHeartbeat(now: now)
        if now + Self.returnSlackMs >= by {
            logger.warning("cluster: back on Redis " + (now >= by ? "\(now - by) ms after" : "\(by - now) ms before")
                           + " the end of the [cluster] restart_grace the hand-over announced: the other daemons have sent (or may "
                           + "send) leaves for the members here, so they are announced again", ["REASON": "cluster_late_return", "REDIS": address.description])
            announceRestoredMembers(after: "the late return")
        }
    }

    // MARK: - Connections

    private func connect(_ c: RedisConnection, nowMs now: UInt64) {
        c.attempts += 1
        if downSince != nil { attemptsWhileDown += 1 }
        if let reason = c.connect(address, nowMs: now) {
            failed(c, reason, now: now)
        }
    }

    /// connect(2) completed: the handshake starts.
    func redisConnected(_ c: RedisConnection) {
        switch c.role {
        case .publisher:
            c.command([Array("PING".utf8)], .pong)
        case .subscriber:
            // The heartbeat channel first (its confirmation makes the
            // subscriber ready, and keeps the context subscribed while no
            // room is), then every room with members here.
            subscribed = rooms
            changedRooms.removeAll()
            let all = rooms.map { channels.room($0) }
            c.command([Array("SUBSCRIBE".utf8), heartbeatChannel, channels.daemons, channels.control], .subscribe)
            var start = 0
            while start < all.count {
                let end = min(start + Self.subscribeBatch, all.count)
                c.command([Array("SUBSCRIBE".utf8)] + all[start..<end], .subscribe)
                start = end
            }
        }
    }

    /// The connection broke and is closed (`RedisConnection.Loss` says
    /// how); the next attempt is a timer. What answered at the address is
    /// not Redis as we speak it, or refused us: it repeats at every attempt
    /// of both connections until someone fixes it, so it is said once with
    /// what Redis said, then at most once a minute with the count
    /// (`refusedLog`), and once when both connections work again (`becameReady`).
    func redisLost(_ c: RedisConnection, reason: String, connected: Bool, loss: RedisConnection.Loss) {
        let now = nowMs
        if loss != .io {
            let code = loss == .refused ? "cluster_refused" : "cluster_protocol"
            let fields: KeyValuePairs<String, String> = ["REASON": code, "REDIS": address.description, "DETAIL": reason]
            switch refusedLog.occurred(nowMs: now) {
            case .first:
                logger.warning("cluster: \(c.role.name) connection to Redis at \(address) closed: "
                               + (loss == .refused ? "\(reason)" : "what answers there is not Redis as roomcastd speaks it: \(reason)")
                               + "; reconnecting with backoff, local relay goes on", fields)
            case .again(let count, let since):
                logger.warning("cluster: Redis at \(address) still refuses roomcastd: \(plural(count, "more closed connection")) in the last "
                               + "\(formatDuration(ms: since)) (the last: \(reason)); reconnecting with backoff, local relay goes on", fields)
            case .quiet:
                break
            }
        }
        if connected { wentDown(c, reason, now: now) }
        failed(c, reason, now: now, said: loss != .io)
    }

    /// Drops a connection from the loop's side (watchdog, timeouts).
    private func lose(_ c: RedisConnection, _ reason: String, now: UInt64) {
        let wasUp = c.state == .ready || c.state == .handshaking
        c.close()
        if wasUp { wentDown(c, reason, now: now) }
        failed(c, reason, now: now, said: false)
    }

    /// The wait before the next attempt after `failedAttempts` failed ones
    /// in a row (0: the connection was just lost): 50 ms, 100, 200 ... 2 s,
    /// each within ±20 % (`random` picks where), so daemons that lost Redis
    /// together do not all come back in the same millisecond.
    static func retryDelayMs(failedAttempts: Int, random: UInt64) -> UInt64 {
        let base = min(maxRetryMs, firstRetryMs << UInt64(min(max(failedAttempts, 0), 10)))
        return base * (80 + random % 41) / 100
    }

    /// The connection is idle until its next attempt (backoff with jitter).
    /// The backoff starts over only after a connection that stayed up, every
    /// command of its handshake answered, for `cluster.timeout`: a server
    /// that accepts and then refuses or garbles (an ACL without access to
    /// our channels, a proxy) is retried at 50 ms, 100 ms ... 2 s, never
    /// every 50 ms forever.
    private func failed(_ c: RedisConnection, _ reason: String, now: UInt64, said: Bool = false) {
        c.pendingReset = nil
        if let settled = c.settledAtMs, now &- settled >= settings.timeoutMs { c.attempts = 0 }
        c.settledAtMs = nil
        if c.role == .subscriber { subscribed.removeAll(); changedRooms.removeAll() }
        random ^= random << 13; random ^= random >> 7; random ^= random << 17
        let delay = Self.retryDelayMs(failedAttempts: c.attempts, random: random)
        c.retryAtMs = now + delay
        if !everUp && c.attempts == 1 && !said {
            logger.warning("cluster: cannot reach Redis at \(address) (\(c.role.name): \(reason)); retrying, local relay goes on",
                           ["REASON": "cluster_down", "REDIS": address.description, "DETAIL": reason])
        } else {
            logger.debug("cluster: \(c.role.name) connection to Redis at \(address) failed: \(reason); next attempt in \(formatDuration(ms: delay))",
                         ["REDIS": address.description, "DETAIL": reason])
        }
    }

    /// The first of the two connections lost since the cluster was up: one warning.
    private func wentDown(_ c: RedisConnection, _ reason: String, now: UInt64) {
        settledForSub = false  // who is in the cluster is learnt again once it is back
        subFormAfterMs = nil
        guard downSince == nil else { return }
        downSince = (now, dropped, gaps)
        attemptsWhileDown = 0
        logger.warning("cluster: lost Redis at \(address) (\(c.role.name): \(reason)); local relay goes on, frames for other "
                       + "daemons are dropped until it is back", ["REASON": "cluster_down", "REDIS": address.description, "DETAIL": reason])
    }

    /// A connection answered its handshake; the cluster is up when both have.
    func becameReady(_ c: RedisConnection, now: UInt64) {
        c.state = .ready
        lastHeardMs = now  // the heartbeat round trip starts over
        if c.role == .publisher { nextHeartbeatMs = now; nextCountsMs = now; lastCountsPayload = nil }
        if c.role == .publisher, let by = returnByMs { returnFromHandOver(by: by, now: now) }
        if c.role == .publisher && restoredAfterCrash {
            restoredAfterCrash = false
            announceRestoredMembers(after: "the crash")
        }
        guard connected else { return }
        if let over = refusedLog.ended(nowMs: now) {
            logger.notice("cluster: Redis at \(address) accepts roomcastd again, after \(plural(over.count, "closed connection")) over "
                          + "\(formatDuration(ms: over.lastedMs))", ["REASON": "cluster_accepted", "REDIS": address.description])
        }
        guard let down = downSince else { return }
        downSince = nil
        // Subscribed to the control channel now: what changes from here on
        // is heard, what changed before is in the hash (ClusterModeration.swift).
        loadModeration()
        remote.heardAll(nowMs: now)  // nobody could be heard while this daemon was cut off
        subFormAfterMs = now + settings.timeoutMs
        let fields: KeyValuePairs<String, String> = ["REASON": "cluster_up", "REDIS": address.description]
        if !everUp {
            everUp = true
            logger.info("cluster: connected to Redis at \(address); subscribed to \(plural(subscribed.count, "room"))"
                        + (dropped > 0 ? "; \(dropped) frames were not published before" : ""), fields)
        } else {
            logger.notice("cluster: Redis at \(address) is back after \(formatDuration(ms: now - down.ms)) "
                          + "(\(plural(attemptsWhileDown, "connection attempt"))); resubscribed to \(plural(subscribed.count, "room")); "
                          + "\(dropped - down.dropped) frames were not published meanwhile", fields)
        }
    }

    // MARK: - Subscriptions

    /// Sends this turn's subscription changes: one SUBSCRIBE and one
    /// UNSUBSCRIBE at most, for the rooms whose state differs from what
    /// Redis was told (a room opened and closed in one turn costs nothing).
    private func flushSubscriptions() {
        defer { changedRooms.removeAll(keepingCapacity: true) }
        guard subscriber.state == .handshaking || subscriber.state == .ready else { return }
        var subscribe: [[UInt8]] = [Array("SUBSCRIBE".utf8)]
        var unsubscribe: [[UInt8]] = [Array("UNSUBSCRIBE".utf8)]
        for room in changedRooms {
            let want = rooms.contains(room)
            if want && !subscribed.contains(room) {
                subscribed.insert(room)
                subscribe.append(channels.room(room))
            } else if !want && subscribed.contains(room) {
                subscribed.remove(room)
                unsubscribe.append(channels.room(room))
            }
        }
        if unsubscribe.count > 1 { subscriber.command(unsubscribe, .unsubscribe) }
        if subscribe.count > 1 { subscriber.command(subscribe, .subscribe) }
    }
}
