import CShim
import Glibc
import RoomcastCore
import RoomcastIO

/// The reactor: one thread, one level-triggered epoll selector, every
/// descriptor of the daemon on it (listeners, clients, the signalfd).
///
/// One iteration: wait for readiness (the timeout never exceeds the next
/// timer: heartbeat wheel, watchdog, status), accept and read with bounded
/// work per descriptor, let the relay queue frames into output buffers, then
/// run the timers, reap the connections marked for close (announcing their
/// leave), and flush every output buffer with one write per connection.
/// Nothing is freed inside its own callback (redis `freeClientAsync`).
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

    // Per-wakeup work bounds (STYLE.md habit 7).
    static let acceptsPerWakeup = 64
    static let readSize = 64 * 1024
    static let readsPerWakeup = 4
    /// Time allowed to flush owed output after EOF or on stop, in ms.
    static let drainTimeoutMs: UInt64 = 5_000
    /// How often drained output buffers of connections that got nothing
    /// since the last sweep are freed, in ms.
    static let bufferSweepMs: UInt64 = 1_000
    /// Freed output buffer bytes after which a sweep calls malloc_trim(3).
    static let trimAfterFreedBytes = 1 << 20
    /// Output buffer capacity a drained connection keeps, in bytes.
    static let retainedOutputBytes = 16 * 1024
    /// Retry delay while accepting is paused for lack of descriptors, in ms.
    static let acceptRetryMs: UInt64 = 100
    /// How often STATUS= is refreshed, in ms.
    static let statusIntervalMs: UInt64 = 2_000
    /// Descriptors the daemon holds besides its clients: stdio, epoll,
    /// signalfd, listeners, the journal and notify sockets, with room to spare.
    static let reservedDescriptors: UInt64 = 32

    private enum Kind: UInt64 { case connection = 0, listener = 1, signal = 2 }
    private static func token(_ kind: Kind, _ index: Int, generation: UInt32 = 0) -> UInt64 {
        kind.rawValue << 60 | UInt64(generation & 0x0FFF_FFFF) << 32 | UInt64(UInt32(truncatingIfNeeded: index))
    }

    private struct Listener {
        var fd: Int32
        var address: String
        var dialect: Dialect
        var registered = false
    }

    private var config: Config
    private let options: Options
    private let systemd: Systemd
    private let logger: Logger
    private let clock: () -> UInt64
    private let selector: Selector
    private let signalFD: Int32

    private var listeners: [Listener] = []
    private let table: ConnectionTable
    private var relay: Relay
    /// Heartbeat deadlines of LTB clients (`[heartbeat] timeout`) and of
    /// JSON clients (`[json] heartbeat_timeout`, off by default).
    private var liveness: LivenessTracker
    private var jsonLiveness: LivenessTracker
    /// JSON clients in the middle of a frame, from its first byte: even where
    /// silence is allowed (`[json] heartbeat_timeout = 0`), a frame must
    /// complete within `[heartbeat] timeout` (slowloris, PROTOCOL.md §5).
    private var jsonPartial: LivenessTracker
    private var scratch: [UInt8]
    private var expired: [Int] = []
    private var overSoft: [Int] = []
    private var draining: [Int] = []

    private var stopping = false
    private var stopDeadlineMs: UInt64 = 0
    private var acceptPausedUntil: UInt64?
    private var acceptPauseEpisode = false
    /// The soft RLIMIT_NOFILE after raising it to the hard limit, in descriptors.
    private var descriptorLimit: UInt64 = .max

    private var nextWatchdogMs: UInt64 = .max
    private var watchdogIntervalMs: UInt64 = 0
    private var nextStatusMs: UInt64 = 0
    private var nextStatsMs: UInt64 = .max
    private var nextSweepMs: UInt64 = 0

    // Counters.
    private var framesIn: UInt64 = 0
    private var evictions: UInt64 = 0
    private var lastStatus = (ms: UInt64(0), framesIn: UInt64(0), deliveries: UInt64(0))
    private var statusClients = 0
    private var lastStats = (ms: UInt64(0), framesIn: UInt64(0), deliveries: UInt64(0), evictions: UInt64(0))

    /// - Parameters:
    ///   - signalFD: a signalfd for SIGTERM, SIGINT and SIGHUP, blocked by the caller.
    ///   - clock: monotonic milliseconds; injectable for tests.
    public init(config: Config, options: Options, systemd: Systemd, logger: Logger, signalFD: Int32,
                clock: @escaping () -> UInt64 = monotonicMilliseconds) throws(SystemError) {
        self.config = config
        self.options = options
        self.systemd = systemd
        self.logger = logger
        self.clock = clock
        self.signalFD = signalFD
        self.selector = try Selector()
        let settings = RelaySettings(config)
        self.table = ConnectionTable(outputHardBytes: config.limits.outputHardBytes, relaySettings: settings)
        self.relay = Relay(settings: settings)
        self.table.countPerIP = config.server.maxClientsPerIP > 0
        self.table.jsonMaxFrameBytes = config.json.maxFrameBytes
        let now = clock()
        self.liveness = LivenessTracker(timeoutMs: config.heartbeat.timeoutMs, tickMs: config.heartbeat.tickMs, nowMs: now)
        self.jsonLiveness = LivenessTracker(timeoutMs: config.json.heartbeatTimeoutMs, tickMs: config.heartbeat.tickMs, nowMs: now)
        self.jsonPartial = LivenessTracker(timeoutMs: config.heartbeat.timeoutMs, tickMs: config.heartbeat.tickMs, nowMs: now)
        self.scratch = [UInt8](repeating: 0, count: Self.readSize)
    }

    /// Warns when `server.max_clients` cannot be reached under the
    /// descriptor limit (systemd's `LimitNOFILE=`): accepting would pause
    /// for lack of descriptors (EMFILE) before the configured limit refuses anyone.
    private func checkDescriptorLimit() {
        let wanted = UInt64(config.server.maxClients) + Self.reservedDescriptors
        guard wanted > descriptorLimit else { return }
        let reachable = descriptorLimit > Self.reservedDescriptors ? descriptorLimit - Self.reservedDescriptors : 0
        logger.warning("server.max_clients = \(config.server.maxClients) needs about \(wanted) descriptors, but RLIMIT_NOFILE "
                       + "allows \(descriptorLimit): accepting pauses near \(reachable) clients; raise LimitNOFILE= (ulimit -Hn) or lower max_clients",
                       ["REASON": "descriptor_limit"])
    }

    /// The addresses the config asks for (command line first).
    private var wantedListen: [ListenAddress] {
        options.listenOverride.isEmpty ? config.server.listen : options.listenOverride
    }

    // MARK: - Start and run

    /// Binds (or adopts) the listeners, reports READY=1 and runs the event
    /// loop until SIGTERM/SIGINT and the graceful stop complete.
    /// - Returns: the process exit status (0 after a graceful stop).
    /// - Throws: `SystemError` when a listener cannot be set up or epoll fails.
    public func run() throws(SystemError) -> Int32 {
        descriptorLimit = Sys.raiseDescriptorLimit()
        checkDescriptorLimit()
        try openListeners()
        try selector.register(signalFD, token: Self.token(.signal, 0))
        let now = clock()
        if let usec = systemd.watchdogUsec {
            // Ping from this loop, every third of the interval: sd_watchdog_enabled(3)
            // asks for half, and at exactly half a loop a few ms late already
            // stretches a gap past it; a third leaves a sixth of WATCHDOG_USEC as margin.
            watchdogIntervalMs = max(1, usec / 3_000)
            nextWatchdogMs = now
            logger.info("watchdog enabled: pinging every \(formatDuration(ms: watchdogIntervalMs))")
        }
        scheduleStats(now: now)
        lastStatus = (now, 0, 0)
        lastStats = (now, 0, 0, 0)
        systemd.notify("READY=1\nSTATUS=" + statusLine(now: now))
        logger.info("roomcastd ready", ["LISTEN": listeners.map(\.address).joined(separator: " ")])
        nextStatusMs = now + Self.statusIntervalMs

        while true {
            let timeout = computeTimeout(now: clock())
            try selector.wait(timeoutMs: timeout) { token, readiness in
                self.dispatch(token, readiness)
            }
            let now = clock()
            runTimers(now: now)
            reapAndFlush(now: now)
            if stopping && (table.count == 0 || now >= stopDeadlineMs) { break }
        }
        finishStop()
        return 0
    }

    private func openListeners() throws(SystemError) {
        if !systemd.listenFDs.isEmpty {
            for (fd, name) in systemd.listenFDs {
                guard Systemd.isListeningInetSocket(fd) else {
                    logger.warning("ignoring descriptor \(fd) (\(name)) from systemd: not a listening TCP socket")
                    continue
                }
                // Sockets passed by systemd are blocking unless NonBlocking=yes (notes/systemd.md §2).
                try Sys.setNonBlocking(fd)
                // FileDescriptorName=json in the .socket unit selects seed 002's dialect.
                listeners.append(Listener(fd: fd, address: Socket.localAddress(fd), dialect: name == "json" ? .json : .ltb))
            }
            logger.info("using \(listeners.count) listening socket(s) from systemd; [server] listen is not used",
                        ["LISTEN": listeners.map(\.address).joined(separator: " ")])
        } else {
            for (addresses, dialect) in [(wantedListen, Dialect.ltb), (config.json.listen, .json)] {
                for address in addresses {
                    let fd = try Socket.listen(on: address)
                    listeners.append(Listener(fd: fd, address: Socket.localAddress(fd), dialect: dialect))
                }
            }
        }
        guard !listeners.isEmpty else { throw SystemError("listen: no usable listening socket", errno: EINVAL) }
        for i in listeners.indices {
            try selector.register(listeners[i].fd, token: Self.token(.listener, i))
            listeners[i].registered = true
            let protocolName = listeners[i].dialect == .json ? "json" : "ltb"
            logger.info("listening on \(listeners[i].address) (\(protocolName))", ["LISTEN": listeners[i].address, "PROTOCOL": protocolName])
        }
    }

    private func computeTimeout(now: UInt64) -> Int32 {
        var deadline = nextStatusMs
        deadline = min(deadline, nextWatchdogMs, nextStatsMs, nextSweepMs)
        if let resume = acceptPausedUntil { deadline = min(deadline, resume) }
        if table.count != statusClients { deadline = min(deadline, lastStatus.ms + 1_000) }
        if stopping { deadline = min(deadline, stopDeadlineMs) }
        if !overSoft.isEmpty || !draining.isEmpty { deadline = min(deadline, now + config.heartbeat.tickMs) }
        var ms = deadline > now ? deadline - now : 0
        if let wheel = liveness.nextTimeout(fromMs: now) { ms = min(ms, wheel) }
        if let wheel = jsonLiveness.nextTimeout(fromMs: now) { ms = min(ms, wheel) }
        if let wheel = jsonPartial.nextTimeout(fromMs: now) { ms = min(ms, wheel) }
        return Int32(min(ms, 60_000))
    }

    // MARK: - Events

    private func dispatch(_ token: UInt64, _ readiness: Readiness) {
        let index = Int(token & 0xFFFF_FFFF)
        switch Kind(rawValue: token >> 60) {
        case .connection:
            // Drop events for a slot that was reused (STYLE.md habit 2).
            guard index < table.slots.count, let generation = table.slots[index]?.generation,
                  UInt64(generation & 0x0FFF_FFFF) == (token >> 32) & 0x0FFF_FFFF else { return }
            connectionReady(index, readiness)
        case .listener:
            acceptConnections(index)
        case .signal:
            readSignals()
        case nil:
            break
        }
    }

    private func connectionReady(_ id: Int, _ readiness: Readiness) {
        guard let state = table.slots[id]?.state else { return }
        if state == .open && readiness.contains(.readable) || state == .open && readiness.contains(.hangup) {
            readFrames(id)
        } else if readiness.contains(.hangup) {
            table.markClosing(id, reason: "connection reset while draining")
            return
        }
        if readiness.contains(.writable), table.slots[id]?.state != .closing {
            flush(id, now: clock())
        }
    }

    private func acceptConnections(_ index: Int) {
        guard !stopping, acceptPausedUntil == nil else { return }
        let lfd = listeners[index].fd
        let now = clock()
        for _ in 0..<Self.acceptsPerWakeup {
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let fd = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    cshim_accept4(lfd, $0, &length, Int32(SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue))
                }
            }
            if fd < 0 {
                let e = errno
                switch e {
                case EAGAIN, EWOULDBLOCK:
                    return
                case EINTR, ECONNABORTED, EPROTO, EPERM:
                    continue
                case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                    pauseAccepting(now: now, errno: e)
                    return
                default:
                    logger.error("accept on \(listeners[index].address) failed", ["REASON": "accept_failed", "DETAIL": SystemError("accept4", errno: e).description])
                    return
                }
            }
            if acceptPauseEpisode {
                acceptPauseEpisode = false
                logger.notice("accepting connections again (\(table.count) clients)")
            }
            let address = Socket.format(storage)
            if table.count >= config.server.maxClients {
                Sys.close(fd)
                logger.peerWarning(reason: "max_clients", nowMs: now,
                                   "refused \(address): server.max_clients (\(config.server.maxClients)) reached",
                                   ["CLIENT_ADDR": address])
                continue
            }
            let perIP = config.server.maxClientsPerIP
            if perIP > 0, case let ip = Connection.ip(of: address), table.perIP[ip, default: 0] >= perIP {
                Sys.close(fd)
                logger.peerWarning(reason: "max_clients_per_ip", nowMs: now,
                                   "refused \(address): server.max_clients_per_ip (\(perIP)) reached for \(ip)",
                                   ["CLIENT_ADDR": address])
                continue
            }
            _ = Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
            _ = Sys.setOption(fd, SOL_SOCKET, SO_SNDBUF, Socket.clientSendBuffer)
            let dialect = listeners[index].dialect
            if dialect == .json { Socket.enableKeepalive(fd, idleMs: config.json.tcpKeepaliveMs) }
            let id = table.add(fd: fd, dialect: dialect, address: address)
            do throws(SystemError) {
                try selector.register(fd, token: Self.token(.connection, id, generation: table.slots[id]!.generation))
            } catch {
                logger.error("cannot watch \(address)", ["CLIENT_ADDR": address, "REASON": "epoll_failed", "DETAIL": error.description])
                Sys.close(fd)
                table.remove(id)
                continue
            }
            resetRateLimits(id, now: now)
            relay.connect(id)
            if dialect == .json { jsonLiveness.track(id, nowMs: now) } else { liveness.track(id, nowMs: now) }
            logger.debug("client connected", ["CLIENT_ADDR": address, "ROOM": config.server.defaultRoom])
        }
    }

    /// Out of descriptors: stop watching the listeners (a level-triggered
    /// listener would wake the loop forever) and retry on a timer; logged
    /// once per episode.
    private func pauseAccepting(now: UInt64, errno e: Int32) {
        acceptPausedUntil = now + Self.acceptRetryMs
        for i in listeners.indices where listeners[i].registered {
            selector.deregister(listeners[i].fd)
            listeners[i].registered = false
        }
        if !acceptPauseEpisode {
            acceptPauseEpisode = true
            logger.warning("out of file descriptors: accepting paused, retrying every \(formatDuration(ms: Self.acceptRetryMs)) (\(table.count) clients)",
                           ["REASON": "out_of_descriptors", "DETAIL": SystemError("accept4", errno: e).description])
        }
    }

    private func resumeAccepting() {
        acceptPausedUntil = nil
        for i in listeners.indices where !listeners[i].registered {
            do {
                try selector.register(listeners[i].fd, token: Self.token(.listener, i))
                listeners[i].registered = true
            } catch {
                logger.error("cannot watch listener \(listeners[i].address)", ["REASON": "epoll_failed", "DETAIL": error.description])
            }
        }
    }

    // MARK: - Reading and relaying

    private func readFrames(_ id: Int) {
        let fd = table.slots[id]!.fd
        for _ in 0..<Self.readsPerWakeup {
            guard table.slots[id]?.state == .open else { return }
            let result = scratch.withUnsafeMutableBytes { Sys.read(fd, $0.baseAddress!, $0.count) }
            switch result {
            case .done(let n):
                consume(id, count: n)
                if n < Self.readSize { return }
            case .wouldBlock:
                return
            case .endOfFile:
                peerClosed(id)
                return
            case .failed(let e):
                table.markClosing(id, reason: SystemError("read", errno: e).description)
                return
            }
        }
    }

    /// Handles `count` freshly read bytes in `scratch`. Whole frames are
    /// relayed straight from the read buffer; only a trailing partial frame
    /// is copied into the connection's own input buffer.
    private func consume(_ id: Int, count n: Int) {
        var input: [UInt8] = []
        swap(&input, &table.slots[id]!.input)
        let now = clock()
        let wasPartial = !input.isEmpty
        var completed = false
        if input.isEmpty {
            let used = scratch.withUnsafeBytes { processFrames(id, UnsafeRawBufferPointer(rebasing: $0[0..<n]), now: now) }
            if used < n { input.append(contentsOf: scratch[used..<n]) }
        } else {
            input.append(contentsOf: scratch[0..<n])
            let used = input.withUnsafeBytes { processFrames(id, $0, now: now) }
            completed = used > 0
            if used == input.count {
                input = []
            } else if used > 0 {
                input.removeSubrange(0..<used)
            }
        }
        guard table.slots[id]?.state == .open else { return }
        if table.slots[id]!.dialect == .json {
            // The clock of a partial frame starts at its first byte.
            if input.isEmpty { jsonPartial.untrack(id) } else if !wasPartial || completed { jsonPartial.track(id, nowMs: now) }
        }
        swap(&input, &table.slots[id]!.input)
    }

    /// Relays every whole frame at the start of `bytes`; returns the bytes used.
    private func processFrames(_ id: Int, _ bytes: UnsafeRawBufferPointer, now: UInt64) -> Int {
        if table.slots[id]!.dialect == .json { return processJSONFrames(id, bytes, now: now) }
        var offset = 0
        let order = config.protocol.byteOrder
        let limit = config.protocol.maxFrameBytes
        while offset < bytes.count {
            let rest = UnsafeRawBufferPointer(rebasing: bytes[offset...])
            switch FrameCodec.parse(rest, byteOrder: order, maxFrameBytes: limit) {
            case .needMore:
                return offset
            case .tooLarge(let claimed):
                frameTooLarge(id, claimed: claimed, limit: limit, now: now)
                return bytes.count
            case .frame(let type, let length):
                let size = FrameCodec.headerSize + length
                let frame = UnsafeRawBufferPointer(rebasing: rest[0..<size])
                offset += size
                framesIn &+= 1
                liveness.touch(id, nowMs: now)
                guard withinRateLimits(id, bytes: size, type: type, now: now) else {
                    guard table.slots[id]!.state == .open else { return bytes.count }
                    continue
                }
                let event = relay.receive(from: id, type: type, frame: frame, sink: table)
                if case .rejected = event { handleRejected(id, event, type: type, now: now) }
                else if logger.enabled(.debug) { logRelayEvent(id, event) }
                guard table.slots[id]!.state == .open else { return bytes.count }
            }
        }
        return offset
    }

    /// Takes one frame of `bytes` (header included) from the connection's
    /// token buckets. A frame over `frames_per_second` or `bytes_per_second`
    /// is dropped and counts as a violation.
    private func withinRateLimits(_ id: Int, bytes: Int, type: UInt16?, now: UInt64) -> Bool {
        var exceeded: String?
        if table.slots[id]!.frameBucket != nil, !table.slots[id]!.frameBucket!.take(1, nowMs: now) {
            exceeded = "limits.frames_per_second (\(config.limits.framesPerSecond))"
        } else if table.slots[id]!.byteBucket != nil, !table.slots[id]!.byteBucket!.take(bytes, nowMs: now) {
            exceeded = "limits.bytes_per_second (\(formatSize(config.limits.bytesPerSecond)))"
        }
        guard let exceeded else { return true }
        handleRejected(id, relay.reject(id, reason: "rate limit: over \(exceeded)", code: .rateLimit), type: type, now: now)
        return false
    }

    /// Fresh token buckets with the current `[limits]` rates (on accept, and
    /// for everyone on reload).
    private func resetRateLimits(_ id: Int, now: UInt64) {
        let l = config.limits
        table.slots[id]!.frameBucket = l.framesPerSecond > 0
            ? TokenBucket(rate: l.framesPerSecond, burst: l.framesBurst > 0 ? l.framesBurst : l.framesPerSecond, nowMs: now) : nil
        table.slots[id]!.byteBucket = l.bytesPerSecond > 0
            ? TokenBucket(rate: l.bytesPerSecond, burst: l.bytesBurst > 0 ? l.bytesBurst : l.bytesPerSecond, nowMs: now) : nil
    }

    /// A header claimed more than the limit: the stream cannot be trusted any
    /// further, so only this client is closed (PROTOCOL.md §1).
    private func frameTooLarge(_ id: Int, claimed: UInt32, limit: Int, now: UInt64) {
        let address = table.slots[id]!.address
        logger.peerWarning(reason: "frame_too_large", nowMs: now,
                           "\(address): frame length \(claimed) exceeds max_frame_bytes (\(limit)); closing",
                           ["CLIENT_ADDR": address, "LENGTH": String(claimed)])
        table.markClosing(id, reason: "frame length \(claimed) exceeds max_frame_bytes \(limit)")
    }

    /// Seed 002's JSON frames (PROTOCOL.md §7): each command becomes the LTB
    /// frame it stands for and goes through the same relay, so both dialects
    /// share rooms; JSON recipients get it translated back by the table.
    private func processJSONFrames(_ id: Int, _ bytes: UnsafeRawBufferPointer, now: UInt64) -> Int {
        var offset = 0
        let limit = config.json.maxFrameBytes
        while offset < bytes.count {
            let rest = UnsafeRawBufferPointer(rebasing: bytes[offset...])
            switch JSONFrameCodec.parse(rest, maxFrameBytes: limit) {
            case .needMore:
                return offset
            case .tooLarge(let claimed):
                frameTooLarge(id, claimed: claimed, limit: limit, now: now)
                return bytes.count
            case .frame(_, let length):
                let body = UnsafeRawBufferPointer(rebasing: rest[JSONFrameCodec.headerSize..<JSONFrameCodec.headerSize + length])
                offset += JSONFrameCodec.headerSize + length
                framesIn &+= 1
                jsonLiveness.touch(id, nowMs: now)
                if withinRateLimits(id, bytes: JSONFrameCodec.headerSize + length, type: nil, now: now) {
                    handleJSONCommand(id, body, now: now)
                }
                guard table.slots[id]!.state == .open else { return bytes.count }
            }
        }
        return offset
    }

    private func handleJSONCommand(_ id: Int, _ body: UnsafeRawBufferPointer, now: UInt64) {
        let s = relay.settings
        let type: UInt16
        let frame: [UInt8]
        switch JSONDialect.decode(body) {
        case .failure(let error):
            handleRejected(id, relay.reject(id, reason: "json: \(error.reason)"), type: nil, now: now)
            return
        case .success(.nickname(let name)):
            type = s.joinType
            frame = JSONDialect.ltbFrame(type: type, nickname: name, settings: s)
            guard reachesEveryone(id, frame, now: now) else { return }
            table.slots[id]!.nickname = name
        case .success(.msg(let content)):
            type = s.textType
            frame = JSONDialect.ltbFrame(type: type, nickname: table.slots[id]!.nickname ?? "", text: content, settings: s)
            guard reachesEveryone(id, frame, now: now) else { return }
        case .success(.leave):
            // Like seed 002's server: a leave before any nickname announces nothing.
            guard let name = table.slots[id]!.nickname else { return }
            table.slots[id]!.nickname = nil
            type = s.leaveType
            frame = JSONDialect.ltbFrame(type: type, nickname: name, settings: s)
        case .success(.unknown(let cmd)):
            logger.debug("ignoring unknown JSON command '\(clipForLog(cmd))'", ["CLIENT_ADDR": table.slots[id]!.address])
            return
        }
        let event = frame.withUnsafeBytes { relay.receive(from: id, type: type, frame: $0, sink: table) }
        if case .rejected = event { handleRejected(id, event, type: nil, now: now); return }
        if case .left(room: .some, _) = event, s.echo {
            // PROTOCOL.md §7 (seed 002's server): the leave goes to every client
            // including the sender, which the relay has already taken out of the room.
            _ = frame.withUnsafeBytes { table.broadcast($0, from: id, to: [id], except: -1) }
        }
        if logger.enabled(.debug) { logRelayEvent(id, event) }
    }

    /// Whether the frame a JSON command stands for can reach every client:
    /// its LTB form within `protocol.max_frame_bytes` (PROTOCOL.md §1) and
    /// its JSON broadcast within `json.max_frame_bytes`. Each command was
    /// within the JSON limit, but nickname and content together, or the
    /// added `from`/`addr`, can pass either. If not, the command is dropped
    /// as a violation, so its sender hears why instead of nobody hearing it.
    private func reachesEveryone(_ id: Int, _ frame: [UInt8], now: UInt64) -> Bool {
        let ltb = frame.count - FrameCodec.headerSize
        let json = frame.withUnsafeBytes {
            JSONDialect.translate($0, settings: relay.settings, senderAddress: table.slots[id]!.address)
        }.map { $0.count - JSONFrameCodec.headerSize } ?? 0
        let problem: String
        if ltb > config.protocol.maxFrameBytes {
            problem = "the frame for LTB clients would be \(ltb) bytes, over protocol.max_frame_bytes (\(formatSize(config.protocol.maxFrameBytes)))"
        } else if json > config.json.maxFrameBytes {
            problem = "its JSON broadcast would be \(json) bytes, over json.max_frame_bytes (\(formatSize(config.json.maxFrameBytes)))"
        } else {
            return true
        }
        handleRejected(id, relay.reject(id, reason: "json: " + problem, code: .frameTooLarge), type: nil, now: now)
        return false
    }

    /// Logs a dropped frame and closes its sender at `max_violations`.
    /// `type` is nil for JSON bodies; the event's code is the log's REASON.
    private func handleRejected(_ id: Int, _ event: RelayEvent, type: UInt16?, now: UInt64) {
        guard case .rejected(let reason, let violations, let disconnect, let kind) = event else { return }
        let code = kind.rawValue
        let address = table.slots[id]!.address
        let max = config.protocol.maxViolations
        let what = (code == "bad_frame" ? "bad " : "") + (type.map { "frame of type \($0)" } ?? "JSON frame")
        logger.peerWarning(reason: code, nowMs: now,
                           "\(address): dropped \(what): \(reason) (violation \(violations) of \(max))",
                           ["CLIENT_ADDR": address, "DETAIL": reason, "FRAME_TYPE": type.map(String.init) ?? "json", "ROOM": relay.room(of: id) ?? ""])
        if disconnect {
            table.markClosing(id, reason: "\(violations) bad frames (protocol.max_violations = \(max))")
        }
    }

    private func logRelayEvent(_ id: Int, _ event: RelayEvent) {
        let address = table.slots[id]!.address
        switch event {
        case .joined(let name, let room, let n):
            let (name, room) = (clipForLog(name), clipForLog(room))
            logger.debug("\(name) joined \(room) (\(n) recipients)", ["CLIENT_ADDR": address, "ROOM": room, "USER_NAME": name])
        case .left(let room, let n):
            let room = room.map { clipForLog($0) }
            logger.debug("client left \(room ?? "no room") (\(n) recipients)", ["CLIENT_ADDR": address, "ROOM": room ?? ""])
        default:
            break
        }
    }

    /// The peer sent EOF: it leaves its room now, and what it is already owed
    /// is flushed (up to `drainTimeoutMs`) before the socket is closed.
    private func peerClosed(_ id: Int) {
        if let c = table.slots[id], !c.input.isEmpty {
            // A FIN in the middle of a frame is a client bug (a dropped network
            // gives a reset or a timeout): say what was lost.
            logger.peerWarning(reason: "truncated_frame", nowMs: clock(),
                               "\(c.address): closed the connection with \(c.input.count) bytes of an incomplete frame; dropped",
                               ["CLIENT_ADDR": c.address, "LENGTH": String(c.input.count), "ROOM": relay.room(of: id) ?? ""])
        }
        depart(id)
        untrackLiveness(id)
        if table.outboxes[id].pending == 0 {
            table.markClosing(id, reason: "closed by peer")
            return
        }
        startDraining(id, now: clock())
    }

    private func untrackLiveness(_ id: Int) {
        liveness.untrack(id)
        jsonLiveness.untrack(id)
        jsonPartial.untrack(id)
    }

    private func startDraining(_ id: Int, now: UInt64) {
        table.slots[id]!.state = .draining
        table.slots[id]!.drainDeadlineMs = now + Self.drainTimeoutMs
        table.slots[id]!.input = []
        draining.append(id)
        let c = table.slots[id]!
        try? selector.modify(c.fd, token: Self.token(.connection, id, generation: c.generation), readable: false, writable: true)
        table.slots[id]!.writeArmed = true
    }

    /// Tells the relay the connection is gone (synthesized leave, §4), once.
    private func depart(_ id: Int) {
        guard !table.slots[id]!.departed else { return }
        table.slots[id]!.departed = true
        let (room, n) = relay.disconnect(id, sink: table)
        if let room, n > 0 {
            logger.debug("announced leave of \(table.slots[id]!.address) to \(room) (\(n) recipients)",
                         ["CLIENT_ADDR": table.slots[id]!.address, "ROOM": room])
        }
    }

    // MARK: - Output

    /// Writes what `id` is owed with one send(2); arms EPOLLOUT only when the
    /// kernel refused bytes, disarms it when the queue drains.
    private func flush(_ id: Int, now: UInt64) {
        guard table.slots[id] != nil, table.slots[id]!.state != .closing else { return }
        table.outboxes[id].queued = false
        guard table.outboxes[id].pending > 0 else { return }
        let fd = table.slots[id]!.fd
        var failed: Int32 = 0
        var pending = table.outboxes[id].pending
        while pending > 0 {
            let r = table.outboxes[id].queue.withReadableBytes { Sys.send(fd, $0.baseAddress!, $0.count) }
            guard case .done(let n) = r else {
                if case .failed(let e) = r { failed = e }
                break
            }
            // A drained queue keeps a small buffer for the next iteration (no
            // malloc per broadcast in steady state) and gives large ones back.
            table.outboxes[id].queue.consume(n, keepCapacity: Self.retainedOutputBytes)
            pending -= n
        }
        if failed != 0 {
            table.markClosing(id, reason: SystemError("send", errno: failed).description)
            return
        }
        let armed = table.slots[id]!.writeArmed
        if pending == 0 {
            table.retainDrainedBuffer(id)
            table.slots[id]!.softSinceMs = nil
            if table.slots[id]!.state == .draining {
                table.markClosing(id, reason: stopping ? "daemon stopping" : "closed by peer")
            } else if armed {
                setWriteInterest(id, false)
            }
            return
        }
        if !armed { setWriteInterest(id, true) }
        if pending <= config.limits.outputSoftBytes {
            table.slots[id]!.softSinceMs = nil
        } else if table.slots[id]!.softSinceMs == nil {
            table.slots[id]!.softSinceMs = now
            overSoft.append(id)
        }
    }

    private func setWriteInterest(_ id: Int, _ on: Bool) {
        let c = table.slots[id]!
        do {
            try selector.modify(c.fd, token: Self.token(.connection, id, generation: c.generation),
                                readable: c.state == .open, writable: on)
            table.slots[id]!.writeArmed = on
        } catch {
            table.markClosing(id, reason: error.description)
        }
    }

    /// Reaps connections marked for close and flushes queued output, until
    /// neither produces more work (a reap may queue leave frames; a failed
    /// write may mark another close). Terminates: connections only go away.
    private func reapAndFlush(now: UInt64) {
        while !table.closeList.isEmpty || !table.flushList.isEmpty {
            while let id = table.closeList.popLast() { reap(id) }
            let list = table.flushList
            table.flushList.removeAll(keepingCapacity: true)
            for id in list { flush(id, now: now) }
        }
        for skip in table.skips {
            switch skip.kind {
            case .overOutputLimit:
                logger.peerWarning(reason: "frame_over_output_limit", nowMs: now,
                                   "\(skip.address): a \(skip.bytes)-byte frame (as this client's dialect encodes it) exceeds "
                                   + "output_hard_bytes (\(formatSize(config.limits.outputHardBytes))) on its own; not delivered to this client",
                                   ["CLIENT_ADDR": skip.address, "LENGTH": String(skip.bytes)])
            case .overJSONLimit:
                logger.peerWarning(reason: "frame_over_json_limit", nowMs: now,
                                   "\(skip.address): a frame whose JSON form is \(skip.bytes) bytes, over json.max_frame_bytes "
                                   + "(\(formatSize(config.json.maxFrameBytes))), was not delivered to JSON clients",
                                   ["CLIENT_ADDR": skip.address, "LENGTH": String(skip.bytes)])
            }
        }
        table.skips.removeAll()
    }

    private func reap(_ id: Int) {
        guard let c = table.slots[id] else { return }
        if c.closeWarns {
            logger.peerWarning(reason: "output_hard_limit", nowMs: clock(), "\(c.address): closing: \(c.closeReason)",
                               ["CLIENT_ADDR": c.address, "ROOM": relay.room(of: id) ?? ""])
        }
        depart(id)
        untrackLiveness(id)
        selector.deregister(c.fd)
        Sys.close(c.fd)
        table.remove(id)
        logger.debug("client disconnected: \(c.closeReason)", ["CLIENT_ADDR": c.address, "DETAIL": c.closeReason])
    }

    // MARK: - Timers

    private func runTimers(now: UInt64) {
        /// Closes the connections in `expired` (they stay tracked until reaped).
        func evictExpired(_ why: @autoclosure () -> String) {
            for id in expired {
                guard let c = table.slots[id], c.state == .open else { continue }
                evictions &+= 1
                let reason = why()
                logger.debug("evicting \(c.address): \(reason)", ["CLIENT_ADDR": c.address, "REASON": "heartbeat_timeout", "ROOM": relay.room(of: id) ?? ""])
                table.markClosing(id, reason: reason)
            }
            expired.removeAll(keepingCapacity: true)
        }
        liveness.expire(nowMs: now, into: &expired)
        evictExpired("heartbeat timeout: no frame for \(formatDuration(ms: liveness.timeoutMs))")
        jsonLiveness.expire(nowMs: now, into: &expired)
        evictExpired("heartbeat timeout: no frame for \(formatDuration(ms: jsonLiveness.timeoutMs))")
        jsonPartial.expire(nowMs: now, into: &expired)
        evictExpired("heartbeat timeout: a JSON frame incomplete for \(formatDuration(ms: jsonPartial.timeoutMs))")
        if !overSoft.isEmpty { checkSoftLimits(now: now) }
        if !draining.isEmpty {
            draining.removeAll { id in
                guard let c = table.slots[id], c.state == .draining else { return true }
                if now >= c.drainDeadlineMs {
                    table.markClosing(id, reason: "drain timeout with \(table.outboxes[id].pending) bytes unsent")
                    return true
                }
                return false
            }
        }
        if let resume = acceptPausedUntil, now >= resume {
            resumeAccepting()
            for i in listeners.indices { acceptConnections(i) }
        }
        if now >= nextWatchdogMs {
            systemd.notify("WATCHDOG=1")
            nextWatchdogMs = now + watchdogIntervalMs
        }
        // STATUS= every statusIntervalMs, and at most once a second sooner when
        // the number of clients changed, so `systemctl status` is never stale.
        if now >= nextStatusMs || (table.count != statusClients && now >= lastStatus.ms + 1_000) {
            systemd.notify("STATUS=" + statusLine(now: now))
            nextStatusMs = now + Self.statusIntervalMs
            logger.flushSuppressed(nowMs: now)
        }
        if now >= nextStatsMs { logStats(now: now) }
        if now >= nextSweepMs {
            // After a burst (a reconnect storm's joins, say) hand the freed
            // buffers back to the kernel, so idle connections cost no RSS.
            if table.sweepIdleBuffers() >= Self.trimAfterFreedBytes { _ = cshim_malloc_trim() }
            nextSweepMs = now + Self.bufferSweepMs
        }
    }

    /// PROTOCOL.md §6: above `output_soft_bytes` for `output_soft_seconds` → closed.
    private func checkSoftLimits(now: UInt64) {
        let soft = config.limits.outputSoftBytes
        let window = config.limits.outputSoftMs
        overSoft.removeAll { id in
            guard let c = table.slots[id], c.state != .closing, let since = c.softSinceMs else { return true }
            let pending = table.outboxes[id].pending
            if pending <= soft {
                table.slots[id]!.softSinceMs = nil
                return true
            }
            guard now &- since >= window else { return false }
            logger.peerWarning(reason: "output_soft_limit", nowMs: now,
                               "\(c.address): slow consumer, \(pending) bytes pending for \(formatDuration(ms: now - since)); closing",
                               ["CLIENT_ADDR": c.address, "ROOM": relay.room(of: id) ?? ""])
            table.markClosing(id, reason: "slow consumer: output above output_soft_bytes (\(formatSize(soft))) for \(formatDuration(ms: window))")
            return true
        }
    }

    private func statusLine(now: UInt64) -> String {
        let seconds = Double(max(now &- lastStatus.ms, 1)) / 1000
        let inRate = Double(framesIn &- lastStatus.framesIn) / seconds
        let outRate = Double(table.deliveries &- lastStatus.deliveries) / seconds
        lastStatus = (now, framesIn, table.deliveries)
        statusClients = table.count
        if stopping { return "Stopping: flushing \(plural(table.count, "client"))" }
        return "\(plural(table.count, "client")), \(plural(relay.roomCount, "room")), \(Int(inRate.rounded())) frames/s in, "
            + "\(Int(outRate.rounded())) frames/s out, \(evictions) evicted"
    }

    private func plural(_ n: Int, _ noun: String) -> String { n == 1 ? "1 \(noun)" : "\(n) \(noun)s" }

    private func scheduleStats(now: UInt64) {
        let interval = config.log.statsIntervalMs
        nextStatsMs = interval == 0 ? .max : now + interval
    }

    private func logStats(now: UInt64) {
        let seconds = Double(max(now &- lastStats.ms, 1)) / 1000
        let fin = framesIn &- lastStats.framesIn
        let fout = table.deliveries &- lastStats.deliveries
        logger.info("stats: \(table.count) clients, \(relay.roomCount) rooms, \(fin) frames in (\(Int((Double(fin) / seconds).rounded()))/s), "
                    + "\(fout) frames out (\(Int((Double(fout) / seconds).rounded()))/s), \(evictions &- lastStats.evictions) evicted",
                    ["CLIENTS": String(table.count), "ROOMS": String(relay.roomCount)])
        lastStats = (now, framesIn, table.deliveries, evictions)
        scheduleStats(now: now)
    }

    // MARK: - Signals: reload and stop

    private func readSignals() {
        while true {
            let sig = cshim_read_signal(signalFD)
            if sig <= 0 { return }
            switch sig {
            case SIGHUP: reload()
            case SIGTERM, SIGINT: beginStop(signal: sig)
            default: break
            }
        }
    }

    /// SIGHUP: re-read the config file. Timeouts, limits, echo, validation and
    /// the log level apply at once to connected clients; listen addresses and
    /// the byte order need a restart; an invalid file keeps the old config.
    private func reload() {
        systemd.notify("RELOADING=1\nMONOTONIC_USEC=\(Sys.monotonicUsec())")
        guard let path = options.configPath else {
            logger.notice("SIGHUP: no config file to reload (started without --config)")
            systemd.notify("READY=1")
            return
        }
        let new: Config
        do {
            new = try Config.load(path: path)
        } catch {
            logger.error("reload failed, keeping the running configuration: \(error)", ["REASON": "reload_failed", "DETAIL": error.description, "CONFIG_FILE": path])
            systemd.notify("READY=1\nSTATUS=reload failed: \(error.description); " + statusLine(now: clock()))
            return
        }
        var applied = new
        if options.listenOverride.isEmpty && new.server.listen != config.server.listen && systemd.listenFDs.isEmpty {
            logger.warning("server.listen changed in \(path); restart roomcastd to apply it", ["CONFIG_FILE": path])
        }
        applied.server.listen = config.server.listen
        applied.json.listen = config.json.listen
        if new.json.listen != config.json.listen && systemd.listenFDs.isEmpty {
            logger.warning("json.listen changed in \(path); restart roomcastd to apply it", ["CONFIG_FILE": path])
        }
        if new.protocol.byteOrder != config.protocol.byteOrder {
            logger.warning("protocol.byte_order changed in \(path); restart roomcastd to apply it", ["CONFIG_FILE": path])
            applied.protocol.byteOrder = config.protocol.byteOrder
        }
        if new.log.target != config.log.target {
            logger.warning("log.target changed in \(path); restart roomcastd to apply it", ["CONFIG_FILE": path])
            applied.log.target = config.log.target
        }
        let now = clock()
        let old = config
        config = applied
        relay.reconfigure(RelaySettings(applied))
        table.relaySettings = relay.settings
        liveness.reconfigure(timeoutMs: applied.heartbeat.timeoutMs, tickMs: applied.heartbeat.tickMs, nowMs: now)
        jsonLiveness.reconfigure(timeoutMs: applied.json.heartbeatTimeoutMs, tickMs: applied.heartbeat.tickMs, nowMs: now)
        jsonPartial.reconfigure(timeoutMs: applied.heartbeat.timeoutMs, tickMs: applied.heartbeat.tickMs, nowMs: now)
        table.outputHardBytes = applied.limits.outputHardBytes
        table.jsonMaxFrameBytes = applied.json.maxFrameBytes
        table.countPerIP = applied.server.maxClientsPerIP > 0
        if applied.limits != old.limits {
            for id in table.slots.indices where table.slots[id] != nil { resetRateLimits(id, now: now) }
        }
        logger.level = applied.log.level
        if applied.log.statsIntervalMs != old.log.statsIntervalMs { scheduleStats(now: now) }
        if applied.server.maxClients != old.server.maxClients { checkDescriptorLimit() }
        logger.info("configuration reloaded from \(path)", ["CONFIG_FILE": path])
        systemd.notify("READY=1\nSTATUS=" + statusLine(now: now))
    }

    /// SIGTERM/SIGINT: STOPPING=1, stop accepting and reading, flush what
    /// every client is owed (up to `drainTimeoutMs`), close, exit 0.
    private func beginStop(signal: Int32) {
        guard !stopping else { return }
        stopping = true
        let now = clock()
        stopDeadlineMs = now + Self.drainTimeoutMs
        systemd.notify("STOPPING=1\nSTATUS=Stopping: flushing \(plural(table.count, "client"))")
        logger.info("received \(signal == SIGTERM ? "SIGTERM" : "SIGINT"), stopping: flushing \(plural(table.count, "client"))")
        for i in listeners.indices {
            if listeners[i].registered { selector.deregister(listeners[i].fd) }
            Sys.close(listeners[i].fd)
        }
        listeners.removeAll()
        acceptPausedUntil = nil
        for id in table.slots.indices {
            guard let c = table.slots[id], c.state == .open else { continue }
            // Everybody is leaving: no synthesized leaves to a room about to close.
            table.slots[id]!.departed = true
            if table.outboxes[id].pending == 0 {
                table.markClosing(id, reason: "daemon stopping")
            } else {
                startDraining(id, now: now)
            }
        }
    }

    private func finishStop() {
        for id in table.slots.indices {
            guard let c = table.slots[id] else { continue }
            if c.state != .closing { table.markClosing(id, reason: "daemon stopping (drain timeout)") }
        }
        while let id = table.closeList.popLast() {
            if let c = table.slots[id] {
                table.slots[id]!.departed = true
                selector.deregister(c.fd)
                Sys.close(c.fd)
                table.remove(id)
            }
        }
        logger.flushSuppressed(nowMs: clock(), final: true)
        logger.info("stopped")
    }
}

extension RelaySettings {
    /// The relay rules of a config.
    public init(_ config: Config) {
        self.init(byteOrder: config.protocol.byteOrder, joinType: config.protocol.joinType, leaveType: config.protocol.leaveType,
                  heartbeatType: config.protocol.heartbeatType, echo: config.protocol.echo, validate: config.protocol.validate,
                  maxViolations: config.protocol.maxViolations, defaultRoom: config.server.defaultRoom,
                  maxRoomBytes: config.protocol.maxRoomBytes)
    }
}
