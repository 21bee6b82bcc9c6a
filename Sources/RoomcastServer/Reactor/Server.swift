import Glibc
import RoomcastCore
import RoomcastIO

/// The reactor: one thread, one level-triggered epoll selector, every
/// descriptor of the daemon on it (listeners, clients, the signalfd).
///
/// One iteration (`runOnce`): wait for readiness (never past the next
/// timer: heartbeat wheels, watchdog, status, drains), accept and read with
/// bounded work per descriptor while the relay queues frames into output
/// queues, then run the timers, reap the connections marked for close
/// (announcing their leave), and flush every output queue with one write
/// per connection. Nothing is freed inside its own callback (redis's
/// `freeClientAsync`).
///
/// This file is the loop and its dispatch only. The rest of the class lives
/// in one file per concept: `Listeners.swift` (accept, admission),
/// `Input.swift` (reads, frame loop, rate limits, violations),
/// `JSONBridge.swift` (the JSON dialect), `Output.swift` (flush, write
/// interest, slow consumers), `ConnectionLifecycle.swift` (open, EOF,
/// drain, leave, eviction, reap), `Lifecycle.swift` (signals, reload,
/// stop), `Cluster.swift` and `RedisConnection.swift` (rooms that span
/// daemons, over Redis). A subsystem's state lives in its own type beside
/// the code that changes it (`ConnectionTable`, `Relay`, `Heartbeats`,
/// `StatusReporter`, `LoopClock`, `OutputWatch`, `StopState`,
/// `HandOverControl`, `ClusterLink` ...); `Server` holds them.
public final class Server {
    /// How the daemon was started (command line and environment).
    public struct Options {
        /// The config file (re-read on SIGHUP); nil: built-in defaults only.
        public var configPath: String?
        /// `--listen` addresses that replace `[server] listen`.
        public var listenOverride: [ListenAddress]
        public init(configPath: String?, listenOverride: [ListenAddress] = []) {
            self.configPath = configPath
            self.listenOverride = listenOverride
        }
    }

    /// What a registration in the selector stands for.
    enum Source {
        case connection(Int)
        case listener(Int)
        /// A connection that owes its PROXY header (ProxyHeaders.swift).
        case proxyHeader(Int)
        /// A connection in its TLS handshake (TLS/TLSHandshakes.swift).
        case tlsHandshake(Int)
        case signal
        /// A Redis connection of the cluster (`RedisConnection.Role`).
        case cluster(Int)
        /// A listener of the backend's API (API/APIServer.swift).
        case apiListener(Int)
        /// A connection to the backend's API.
        case apiConnection(Int)
    }

    /// Descriptors the daemon holds besides its clients: stdio, epoll,
    /// signalfd, listeners, the journal and notify sockets, with room to spare.
    static let reservedDescriptors: UInt64 = 32
    /// The longest wait for readiness, in ms.
    static let maxWaitMs: UInt64 = 60_000

    var config: Config
    let options: Options
    let systemd: Systemd
    let logger: Logger
    let clock: () -> UInt64
    /// Wall-clock ms since the epoch: tokens' `exp` and `nbf` (Auth/AuthGate.swift).
    let wallClock: () -> Int64
    let selector: Selector<Source>
    let signalFD: Int32

    var listeners = Listeners()
    let table: ConnectionTable
    var relay: Relay
    var heartbeats: Heartbeats
    var status = StatusReporter()
    /// Signed joins (`[auth]`, Auth/AuthGate.swift): keys, expiries, counters.
    var auth = AuthGate()
    /// The backend's HTTP API (`[api]`, API/APIServer.swift): off without listeners.
    var api = APIServer()
    /// Time spent in epoll_wait(2) and in the rest of each iteration (LoopClock.swift).
    var loop = LoopClock()
    /// Rooms that span daemons (`[cluster]`); nil when it is off.
    var cluster: ClusterLink?
    /// The read buffer: whole frames are relayed straight from it (Input.swift).
    var scratch: [UInt8]
    /// Tests only: called with the connection id before each whole frame
    /// read is handled (what a crash at that moment would leave).
    var beforeFrame: ((Int) -> Void)?
    /// Slow consumers, drains and the buffer sweep (OutputWatch.swift).
    let watch = OutputWatch()
    /// When the WebSocket members are next pinged (WebSocketServer.swift).
    var webSocketPings = WebSocketPings()

    /// The graceful stop or the hand-over's (Lifecycle.swift).
    var stop = StopState()
    /// A stop or a hand-over began (`StopState.stopping`): no accepting, no reading.
    var stopping: Bool { stop.stopping }
    /// The soft RLIMIT_NOFILE after raising it to the hard limit, in descriptors.
    var descriptorLimit: UInt64 = .max
    /// A restart that keeps the connections (HandOver.swift).
    var handOver = HandOverControl()
    /// What a crash must not lose, in systemd's fd store (LiveStore.swift).
    var live: LiveStore?
    /// The chat page's files (`[websocket] page`, PageDirectory.swift); nil: no page.
    var page: PageFiles?
    /// `listen_tls`: the context, handshakes, counters (TLS/).
    var tls = TLSState()
    /// Bans, mutes and slow mode (Moderation/), and the last change's wall-clock stamp (ms).
    var moderation: ModerationBook
    var lastModerationStamp: Int64 = 0
    /// `[rooms] counts`: what each room was last told (Rooms/ViewerNotices.swift).
    var viewerCounts = ViewerCountSweep()

    /// - Parameters:
    ///   - signalFD: a signalfd for SIGTERM, SIGINT and SIGHUP, blocked by the
    ///     caller (or -1: no signals, for tests that call `beginStop`).
    ///   - clock: monotonic milliseconds; injectable for tests.
    ///   - keys: `[auth] key_file` as read at start (`Server.loadKeys`); nil: none.
    ///   - wallClock: ms since the epoch, for tokens' `exp` and `nbf`; injectable for tests.
    ///   - page: the chat page's files as read at start (`Server.loadPage`); nil: none.
    ///   - apiKeys: `[api] key_file` as read at start (`Server.loadAPIKeys`); nil: none.
    ///   - tls: `[tls]` as loaded at start (`Server.loadTLS`); nil: no `listen_tls`.
    /// - Throws: `SystemError` from epoll_create1(2).
    public init(config: Config, options: Options, systemd: Systemd, logger: Logger, signalFD: Int32,
                clock: @escaping () -> UInt64 = monotonicMilliseconds, keys: AuthKeys? = nil,
                wallClock: @escaping () -> Int64 = wallClockMilliseconds, page: PageFiles? = nil,
                apiKeys: APIKeySet? = nil, tls: TLSContext? = nil) throws(SystemError) {
        self.tls.context = tls
        self.config = config
        self.page = page
        self.api.keys = apiKeys.map(\.keys)
        self.wallClock = wallClock
        self.auth.keys = keys
        self.options = options
        self.systemd = systemd
        self.logger = logger
        self.clock = clock
        self.signalFD = signalFD
        self.selector = try Selector()
        let settings = RelaySettings(config)
        let fanout = Fanout(outputHardBytes: config.limits.outputHardBytes, relaySettings: settings)
        fanout.jsonMaxFrameBytes = config.json.maxFrameBytes
        fanout.shedsText = config.limits.shed == .text
        fanout.shedAfterMs = config.limits.effectiveShedAfterMs
        fanout.clock = clock
        self.table = ConnectionTable(fanout: fanout)
        self.table.countPerIP = config.server.maxClientsPerIP > 0
        self.relay = Relay(settings: settings)
        self.heartbeats = Heartbeats(config, nowMs: clock())
        self.moderation = ModerationBook(nowMs: clock())
        self.scratch = [UInt8](repeating: 0, count: Self.readSize)
    }

    // MARK: - Start and run

    /// Binds (or adopts) the listeners, reports READY=1 and runs the event
    /// loop until SIGTERM/SIGINT and the graceful stop complete.
    /// - Returns: the process exit status (0 after a graceful stop).
    /// - Throws: `SystemError` when a listener cannot be set up or epoll fails.
    public func run() throws(SystemError) -> Int32 {
        try start()
        while try runOnce() {}
        if handOver.done { return 0 }  // the connections are in systemd's fd store
        finishStop()
        return 0
    }

    /// Everything before the first iteration: descriptor limit, listeners,
    /// signals, the schedules, READY=1.
    /// - Throws: `SystemError` when a listener cannot be set up.
    func start() throws(SystemError) {
        descriptorLimit = Sys.raiseDescriptorLimit()
        checkDescriptorLimit()
        handOver.storedListeners = systemd.storedFDs.filter { HandOverName.isListener($0.name) }
        try openListeners()
        try openAPI()
        keepListenersInStore()
        checkHandOverBudget()
        makeCluster()  // before the restore, so that the link learns of every restored room
        let restored = restoreHandedOver()
        startLiveStore()
        if signalFD >= 0 { _ = try selector.register(signalFD, .signal) }
        startCluster(now: clock(), restored: restored != nil)
        let now = clock()
        scheduleViewerCounts(now: now)
        status.start(nowMs: now, watchdogUsec: systemd.watchdogUsec, statsIntervalMs: config.log.statsIntervalMs)
        if status.watchdogIntervalMs > 0 {
            logger.info("watchdog enabled: pinging every \(formatDuration(ms: status.watchdogIntervalMs))")
        }
        systemd.notify("READY=1\nSTATUS=" + (restored.map { $0 + "; " } ?? "") + status.statusLine(nowMs: now, figures))
        logger.info("roomcastd ready", ["LISTEN": listeners.addresses])
    }

    /// One iteration of the loop.
    /// - Parameter maxWaitMs: the longest wait for readiness (tests pass 0).
    /// - Returns: false when the graceful stop is complete.
    /// - Throws: `SystemError` from epoll_wait(2).
    func runOnce(maxWaitMs: UInt64 = maxWaitMs) throws(SystemError) -> Bool {
        if !api.again.isEmpty { answerAPIAgain() }  // requests read already wake no epoll; one batch a turn each
        let timeout = min(waitTimeout(now: clock()), maxWaitMs)
        cluster?.beforeWait()  // what this turn published or subscribed: one write per Redis connection
        let waitStartUs = Sys.monotonicUsec()
        defer { loop.iterationEnded() }
        try selector.wait(timeoutMs: Int32(timeout)) { source, readiness in
            loop.waitEnded(startedUs: waitStartUs)
            switch source {
            case .connection(let id): connectionReady(id, readiness)
            case .listener(let index): acceptConnections(index)
            case .proxyHeader(let slot): readProxyHeader(slot)
            case .tlsHandshake(let slot): continueHandshake(slot)
            case .signal: readSignals()
            case .cluster(let index): cluster?.ready(index, readiness)
            case .apiListener(let index): acceptAPI(index)
            case .apiConnection(let id): apiReady(id, readiness)
            }
        }
        loop.waitEnded(startedUs: waitStartUs)
        if !tls.readAgain.isEmpty { readTLSAgain() }  // bytes inside OpenSSL wake no epoll
        let now = clock()
        runTimers(now: now)
        if relay.positionsDue { relay.sendPositions(sink: table.fanout) }  // after this pass's frames (docs/protocol/positions.md §4)
        reapAndFlush(now: now)
        systemd.flushPending()  // notifications that found PID 1's queue full (never blocks)
        logger.flushPending()  // log output journald or stderr did not take (never blocks)
        if live != nil { liveEndOfIteration() }  // new connections into the live box (never blocks)
        if handOver.pending {
            if !handOverDue(now: now) { return true }  // still flushing
            if completeHandOver() { return false }
        }
        return !stop.finished(nowMs: now, clients: table.count)
    }

    /// Milliseconds until the earliest timer (at most `maxWaitMs`).
    /// How long the next epoll_wait may sleep, in ms: until the earliest
    /// deadline of any subsystem, at most `maxWaitMs`.
    func waitTimeout(now: UInt64) -> UInt64 {
        var deadline = min(status.deadline(clients: table.count), watch.nextSweepMs, viewerCounts.nextMs)
        if listeners.all.contains(where: { $0.dialect == .webSocket }) { deadline = min(deadline, webSocketPings.nextMs) }
        if let resume = listeners.pausedUntil { deadline = min(deadline, resume) }
        if listeners.pending.count > 0, let due = listeners.pending.nextDeadline() { deadline = min(deadline, due) }
        if tls.pending.count > 0, let due = tls.pending.nextDeadline() { deadline = min(deadline, due) }
        if !tls.readAgain.isEmpty { deadline = now }
        if !api.again.isEmpty { deadline = now }
        if let end = stop.gracefulDeadlineMs { deadline = min(deadline, end) }
        if let flush = handOverFlushDeadline { deadline = min(deadline, flush) }
        if let cluster { deadline = min(deadline, cluster.deadline()) }
        if let due = api.nextDeadline { deadline = min(deadline, due) }
        if watch.hasDeadlines || systemd.hasPending || logger.owed {
            deadline = min(deadline, now + config.heartbeat.tickMs)
        }
        var ms = deadline > now ? deadline - now : 0
        if let wheel = heartbeats.nextTimeout(fromMs: now) { ms = min(ms, wheel) }
        if let expiry = moderation.nextTimeout(fromMs: now) { ms = min(ms, expiry) }
        if let expiry = auth.nextTimeout(fromMs: now) { ms = min(ms, expiry) }
        return min(ms, Self.maxWaitMs)
    }

    private func connectionReady(_ id: Int, _ readiness: Readiness) {
        guard let state = table.state(id) else { return }
        if state == .open && !handOver.pending && (readiness.contains(.readable) || readiness.contains(.hangup)) {
            readFrames(id)
        } else if readiness.contains(.hangup) {
            table.close(id, "connection reset while draining")
            return
        }
        if readiness.contains(.writable), table.state(id) != .closing {
            if table.slots[id]!.tlsReadWantsWrite { resumeTLSRead(id) }
            flush(id, now: clock())
        }
    }

    /// The timers, after each wait: evictions, slow consumers, drains, the
    /// accept retry, the watchdog, STATUS, stats and the buffer sweep.
    private func runTimers(now: UInt64) {
        // Evicted after the walk: evicting a WebSocket untracks it, which
        // must not touch `heartbeats` while `expire` is still mutating it.
        var expired: [(Int, String)] = []
        heartbeats.expire(nowMs: now) { id, reason in expired.append((id, reason)) }
        for (id, reason) in expired { evict(id, reason) }
        if auth.sessionCount > 0 { expireTokens(now: now) }
        if moderation.count > 0 { expireModeration(now: now) }
        if !watch.overSoft.isEmpty { checkSoftLimits(now: now) }
        if !watch.draining.isEmpty { checkDrainDeadlines(now: now) }
        resumeAcceptingIfDue(now: now)
        if listeners.pending.count > 0 { expireProxyHeaders(now: now) }
        if tls.pending.count > 0 { expireHandshakes(now: now) }
        cluster?.runTimers(now: now, roomCounts: self.relay.roomCounts)
        if api.count > 0 { expireAPI(now: now) }
        if status.watchdogDue(nowMs: now) { systemd.notify("WATCHDOG=1") }
        if let line = status.statusDue(nowMs: now, figures) {
            systemd.notify("STATUS=" + line)
            logger.flushSuppressed(nowMs: now)
        }
        if let stats = status.statsDue(nowMs: now, figures) {
            logger.info(stats.message, ["CLIENTS": String(stats.clients), "ROOMS": String(stats.rooms)])
        }
        sweepIdleBuffersIfDue(now: now)
        pingWebSocketsIfDue(now: now)
        sweepViewerCountsIfDue(now: now)
    }

    /// What STATUS= and the stats line report.
    var figures: StatusReporter.Figures {
        .init(clients: table.count, rooms: relay.roomCount, deliveries: table.fanout.deliveries, stopping: stopping,
              cluster: cluster?.figures, authRefusals: auth.active(config) ? auth.refusals : nil, tokensExpired: auth.expired,
              tls: tls.context != nil ? tls.summary : nil)
    }

    /// Warns when `server.max_clients` cannot be reached under the
    /// descriptor limit (systemd's `LimitNOFILE=`): accepting would pause
    /// for lack of descriptors (EMFILE) before the configured limit refuses anyone.
    func checkDescriptorLimit() {
        let wanted = UInt64(config.server.maxClients) + Self.reservedDescriptors
        guard wanted > descriptorLimit else { return }
        let reachable = descriptorLimit > Self.reservedDescriptors ? descriptorLimit - Self.reservedDescriptors : 0
        logger.warning("server.max_clients = \(config.server.maxClients) needs about \(wanted) descriptors, but RLIMIT_NOFILE "
                       + "allows \(descriptorLimit): accepting pauses near \(reachable) clients; raise LimitNOFILE= (ulimit -Hn) or lower max_clients",
                       ["REASON": "descriptor_limit"])
    }
}
