@preconcurrency import CHiredis
import Glibc
import RoomcastCore
import RoomcastIO

// Cluster.swift owns rooms that span daemons (docs/cluster.md;
// docs/protocol/across-daemons.md §12): the link to Redis pub/sub with
// its two connections, what it publishes (every frame the relay relays,
// through `RelayObserver`), what it subscribes to (the rooms with members
// here), what it delivers (other daemons' frames, through
// `ClusterHost.deliverFromCluster`), and how it survives a Redis that is down,
// slow, restarted, stopped or not Redis at all. Local relay never waits
// for it: it only appends to a connection's output, which is written once
// per loop turn.
//
// This file holds the link's state and lifecycle (start, reload, carry
// over, shutdown); its jobs are in ClusterPublishing.swift (what goes
// out), ClusterSubscriptions.swift (the rooms listened to),
// ClusterReplies.swift (what comes back), ClusterConnections.swift (the
// loop's hooks, reconnects and backoff), ClusterLiveLog.swift (the crash
// path), ClusterMembers.swift, ClusterModeration.swift, ClusterWaits.swift
// and ClusterRefusals.swift; RedisConnection.swift and RedisReplies.swift
// are one connection.

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

/// The daemon's link to the cluster: owned by the server, which it reaches
/// only through `ClusterHost` (ClusterHost.swift: delivery, addresses,
/// moderation, the live log), and which reaches it only through its
/// methods: `relayed` (publish, through `RelayObserver`), `roomOpened` and
/// `roomClosed` (subscribe, unsubscribe), `beforeWait`, `ready`,
/// `runTimers` and `deadline` (the loop's tick), the queries
/// (`figures`, `viewers`, `remoteMembersPage`, ...) and the calls back to
/// the host (events out).
final class ClusterLink: RelayObserver {
    /// Reconnect delays: 50 ms, doubled at each failed attempt, at most 2 s (with ±20 % jitter).
    static let firstRetryMs: UInt64 = 50
    static let maxRetryMs: UInt64 = 2_000
    /// Channels per SUBSCRIBE when resubscribing every room.
    static let subscribeBatch = 1_000

    /// The daemon: everything the link asks of it (ClusterHost.swift).
    unowned let host: any ClusterHost
    let address: RedisAddress
    private(set) var settings: Config.Cluster
    /// The relay's rules: frame types and `max_room_bytes` (`ClusterSettings.relay`).
    private(set) var relaySettings: RelaySettings
    /// The monotonic clock (ms) and the wall clock (ms since the epoch), the daemon's.
    let clock: () -> UInt64
    let wallClock: () -> Int64
    let logger: Logger
    /// The daemon keeps a live log (the crash path): the link writes its
    /// numbering and positions there (`startLiveLog`, ClusterLiveLog.swift).
    private(set) var logsLive = false
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

    var streams: ClusterStreams
    var tracker = ClusterSequenceTracker()
    /// Rooms with members here: what the subscriber should listen to.
    var rooms: Set<RoomName> = []
    /// What the subscriber has asked Redis for since it connected.
    var subscribed: Set<RoomName> = []
    /// Rooms opened or closed since the last flush (the subscriber's work).
    var changedRooms: [RoomName] = []

    var published: UInt64 = 0
    var received: UInt64 = 0
    var dropped: UInt64 = 0
    var gaps: UInt64 = 0
    var late: UInt64 = 0
    /// Messages dropped because their envelope named another room than their channel.
    var misrouted: UInt64 = 0
    /// Messages dropped because their room has no member here any more (in flight when it closed).
    var stale: UInt64 = 0
    /// What was refused from Redis, by reason (ClusterRefusals.swift).
    var refusals = ClusterRefusalCounts()

    /// The next heartbeat to ourselves through Redis, in ms.
    var nextHeartbeatMs: UInt64 = 0
    var heartbeatSeq: UInt64 = 0
    /// When our own heartbeat last came back (or the round trip (re)started), in ms.
    var lastHeardMs: UInt64 = 0
    /// Both connections were ready at least once.
    var everUp = false
    /// When the cluster last went down (nil: it is up, or never was), and
    /// the figures then, for the line that says it is back.
    var downSince: (ms: UInt64, dropped: UInt64, gaps: UInt64)?
    var attemptsWhileDown = 0
    /// A Redis that refuses us, or is not Redis as we speak it, at every
    /// attempt (protected mode, a password or ACL we lack, a proxy): said
    /// once, then once a minute with the count, then once when it works.
    var refusedLog = RateLimitedLog()
    var random: UInt64

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
    var returnByMs: UInt64?
    /// How close to `returnByMs` a return counts as late: the others'
    /// deadlines start when they receive the hand-over, a little after it
    /// was sent, and their loops may read the heartbeat late (ms).
    static let returnSlackMs: UInt64 = 50

    /// Rooms whose stream numbers moved since the live log last had them,
    /// and the last stream id it has (`publisherWillWrite`).
    var streamsToLog: Set<RoomName> = []
    var loggedLastStream: UInt64 = 0

    /// The moderation hash was loaded since the connections last came up (ClusterModeration.swift).
    var moderationLoaded = false
    /// This daemon's members per room go to the others at most every
    /// `countsMinMs` when they changed, and every `countsRefreshMs` anyway
    /// (ms); the others drop counts older than `RemoteDaemons.countsMaxAgeMs`.
    static let countsMinMs: UInt64 = 1_000
    static let countsRefreshMs: UInt64 = 3_000
    var nextCountsMs: UInt64 = 0
    var lastCountsMs: UInt64 = 0
    var countsPayload: [UInt8] = []
    var lastCountsPayload: [UInt8]?

    /// When the link has been up long enough (`cluster.timeout`: every
    /// daemon alive was heard since) to know whether all of them read
    /// envelope version 2 (ms; nil: not up, or settled already).
    var subFormAfterMs: UInt64?
    /// The link has been up for `cluster.timeout` since it last came up.
    var settledForSub = false
    /// Frames go out in envelope version 2, with their sender's sub: only
    /// while every daemon heard reads it (docs/protocol/across-daemons.md §12).
    var sendsSub: Bool { settledForSub && remote.legacyReaders == 0 }
    /// The form last said in the log (`noteEnvelopeForm`).
    var saidSendsSub = false

    /// Idempotency-Key claims sent on the publisher and not yet answered,
    /// oldest first (`head`): the server's tokens (ClusterIdempotency.swift).
    var claimWaits: [UInt64] = []
    var claimWaitsHead = 0
    /// Keyed publishes served from the local cache alone because Redis was
    /// down, refused the claim or did not answer within `cluster.timeout`.
    private(set) var idempotencyFallbacks: UInt64 = 0

    /// A keyed publish was decided by the local cache alone (Redis down,
    /// refusing the claim, or silent for `cluster.timeout`): counted.
    func countIdempotencyFallback() { idempotencyFallbacks &+= 1 }

    /// Reusable buffers: the envelope being published, a frame in the other byte order.
    var envelope: [UInt8] = []
    var converted: [UInt8] = []

    /// - Parameters:
    ///   - host: the daemon (held unowned: it owns the link).
    ///   - clock: ms of the monotonic clock; `wallClock`: ms since the epoch.
    ///   - logsLive: the daemon keeps a live log already (else `startLiveLog`).
    ///   - selector: the loop's selector, which both connections register with.
    ///   - maxMessageBytes: the most a message on the subscriber may hold
    ///     (`maxMessageBytes(_:json:)` of the protocol and JSON settings).
    init(host: any ClusterHost, address: RedisAddress, settings all: ClusterSettings, byteOrder: ByteOrder,
         clock: @escaping () -> UInt64, wallClock: @escaping () -> Int64, logger: Logger, logsLive: Bool,
         selector: Selector<Server.Source>, maxMessageBytes: Int) {
        self.host = host
        self.address = address
        let settings = all.cluster
        self.settings = settings
        relaySettings = all.relay
        self.clock = clock
        self.wallClock = wallClock
        self.logger = logger
        self.logsLive = logsLive
        self.byteOrder = byteOrder
        kind = ClusterEnvelope.Kind(byteOrder)
        origin = Sys.randomSeed()  // never blocks, even at early boot
        random = origin
        channels = ClusterChannels(name: settings.name)
        heartbeatChannel = channels.heartbeat(origin: origin)
        streams = ClusterStreams(channels: channels)
        envelope.reserveCapacity(1024)
        publisher = RedisConnection(role: .publisher, link: self, selector: selector, maxReplyBytes: Self.maxHashReplyBytes)
        subscriber = RedisConnection(role: .subscriber, link: self, selector: selector, maxReplyBytes: maxMessageBytes)
    }

    var nowMs: UInt64 { clock() }
    var connected: Bool { publisher.state == .ready && subscriber.state == .ready }

    /// Whether `room` has members here (what the subscriber listens to).
    func hasMembers(_ room: RoomName) -> Bool { rooms.contains(room) }

    var figures: ClusterFigures {
        ClusterFigures(connected: connected, rooms: subscriber.state == .ready ? subscribed.count : 0, published: published,
                       received: received, dropped: dropped, gaps: gaps, late: late, misrouted: misrouted, stale: stale)
    }

    /// New `timeout`, `restart_grace` and `max_output_bytes` (reload); `redis` and `name` need a restart.
    /// The relay's rules are taken whole.
    func reconfigure(_ all: ClusterSettings) {
        let new = all.cluster
        settings.timeoutMs = new.timeoutMs
        settings.restartGraceMs = new.restartGraceMs
        settings.maxOutputBytes = new.maxOutputBytes
        relaySettings = all.relay
    }

    /// The daemon opened its live log (the crash path): from now on the
    /// link writes its numbering and the positions of frames delivered here.
    func startLiveLog() {
        logsLive = true
        tracker.tracksChanges = true
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

    /// After a crash whose live log had no origin: this process is a new
    /// daemon to the others, so the members restored here are announced
    /// again once the publisher is up (`announceRestoredMembers`).
    func restoredWithNewOrigin() {
        restoredAfterCrash = true
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
}
