import Glibc
import RoomcastCore
import RoomcastIO

// HandOver.swift owns restarts that keep every client connected (docs/operations.md,
// "Restarts, upgrades and crashes"). Every SIGTERM under a unit with an fd
// store is a hand-over: the process stops accepting and reading, flushes
// what the clients are owed while they take it (`HandOverControl`), and
// then puts every client descriptor into a box (HandOverBox.swift) and
// everything it knows about them into a sealed memfd (`HandOverState`),
// stores both in systemd's fd store and exits 0. What happens next is
// systemd's to decide, not ours to guess: on a restart the next process
// takes them back in `start()`, before READY=1, through the same
// `Server.open` as an accepted client plus the state (room, identity,
// partial input, owed output, heartbeat time left, violations, token
// buckets); on a stop PID 1 empties the store, closing the last copy of
// each socket, and the clients see the close (a FIN once the kernel has
// sent what it holds).
//
// systemd 252 does not tell a service why it stops it, and a hook asking
// PID 1 (ExecStop=) races: while the unit is starting or reloading systemd
// sends SIGTERM without running ExecStop=.
//
// SIGINT, and SIGTERM without an fd store (outside systemd), stop as
// before (Lifecycle.swift).

/// The FDNAME= of what roomcastd keeps in systemd's fd store. A socket
/// unit's FileDescriptorName= must not be one of these.
enum HandOverName {
    /// Read ends of boxes of client descriptors.
    static let box = "box"
    /// The sealed memfd with the `HandOverState`.
    static let state = "state"
    /// The standalone unit's own listeners (`listen-ltb`, `listen-json`):
    /// kept in the store so that the port stays open across restarts.
    /// A `listen_tls` listener's is `listen-ltb-tls`, `listen-json-tls`, `listen-websocket-tls`.
    static func listener(_ dialect: Dialect, tls: Bool = false) -> String { "listen-" + dialect.name + (tls ? "-tls" : "") }

    static func isListener(_ name: String) -> Bool {
        [Dialect.ltb, .json, .webSocket].contains { name == listener($0) || name == listener($0, tls: true) }
    }

    /// The crash path's live box and log (LiveStore.swift), one generation each:
    /// `livebox-<n>`, `livestate-<n>`.
    static let liveBoxPrefix = "livebox-"
    static let liveStatePrefix = "livestate-"

    static func isLive(_ name: String) -> Bool { liveGeneration(name) != nil }

    static func liveGeneration(_ name: String) -> UInt32? {
        for prefix in [liveBoxPrefix, liveStatePrefix] where name.hasPrefix(prefix) { return UInt32(name.dropFirst(prefix.count)) }
        return nil
    }

    static func isStored(_ name: String) -> Bool { name == box || name == state || isListener(name) || isLive(name) }
}

/// Where the daemon is with a hand-over.
struct HandOverControl {
    /// SIGTERM arrived: flush, then hand over at the end of an iteration.
    var pending = false
    /// The flush before the hand-over: when it began, when the owed bytes
    /// last went down and how many there were then, on the monotonic clock
    /// in ms; nil until the first iteration that ended with bytes owed.
    var flush: (startedMs: UInt64, progressMs: UInt64, owed: Int)?
    /// The flush gives up once no client took a byte for this long, in ms:
    /// a client that does not read is not worth every other client's gap
    /// (its owed output is handed over, and kept on a restart).
    var flushIdleMs: UInt64 = 50
    /// The flush gives up after this long in any case, in ms: the drain of a
    /// stop (docs/protocol.md, section 10: up to 5 s).
    var flushLimitMs: UInt64 = Server.drainTimeoutMs
    /// When the process stopped reading, on its monotonic clock, in ms.
    var stoppedReadingMs: UInt64 = 0
    /// Everything is in systemd's hands: exit without closing anything.
    var done = false
    /// Listeners the previous process stored (standalone unit), not yet adopted.
    var storedListeners: [(fd: Int32, name: String)] = []
    /// Listener descriptors this process keeps in systemd's fd store.
    var listenersInStore = 0
    /// Descriptors one box holds here (`HandOverBox.measureCapacity`); 0: not measured.
    var boxCapacity = 0
    /// The highest live box or log generation the previous process left.
    var previousLiveGeneration: UInt32 = 0
    /// How long storing may wait for PID 1 to take the descriptors, in ms:
    /// the only wait of the hand-over, at exit (PID 1 is idle then, waiting
    /// for this process to exit) and at start, before READY=1.
    var timeoutMs: UInt64 = 2_000
    /// The largest hand-over state or live log written or read, in bytes
    /// (`Server.maxStateBytes`; lowered by tests).
    var maxStateBytes = Server.maxStateBytes
}

extension Server {
    /// The largest state accepted from the previous process, in bytes, and
    /// so the largest one written: a state over it would be refused whole.
    static let maxStateBytes = 1 << 30

    /// Whether a SIGTERM may hand the connections over: the unit has an fd
    /// store (`$FDSTORE`), and notifications go out on our own socket,
    /// which can carry descriptors without blocking.
    var canHandOver: Bool { systemd.fdStoreMax > 0 && systemd.channel != nil }

    // MARK: - The old process

    /// SIGTERM with an fd store: no more accepting or reading; the frames
    /// this iteration read are relayed, what is owed is flushed while
    /// clients take it (`handOverDue`), then everything is handed over.
    func beginHandOver() {
        stop.handOverBegan()
        handOver.pending = true
        handOver.stoppedReadingMs = clock()
        closeAPIAll()  // the API's connections are not carried: a backend retries
        for i in listeners.all.indices {
            if let r = listeners.all[i].registration { selector.deregister(r) }
            listeners.all[i].registration = nil
        }
        noticeTLSRestart()  // TLS/TLSRestart.swift: their sessions cannot be handed over
        systemd.notify("STOPPING=1\nSTATUS=Stopping: flushing \(plural(table.count, "client")), then handing them to systemd's fd store")
        logger.info("received SIGTERM: flushing, then handing \(plural(table.count, "connection")) in \(plural(relay.roomCount, "room"))"
                    + " to systemd's fd store (a restart takes them back, a stop closes them)")
    }

    /// At the end of an iteration after `beginHandOver`: whether the flush
    /// is over (nothing owed, no client took a byte for `flushIdleMs`, or
    /// `flushLimitMs` passed). The first time bytes are owed, reading stops
    /// for every connection (epoll interest), so that only writes wake the loop.
    func handOverDue(now: UInt64) -> Bool {
        var owed = 0
        for id in table.ids where table.state(id) != .closing { owed += table.fanout.outboxes[id].pending }
        if owed == 0 { return true }
        guard var flush = handOver.flush else {
            handOver.flush = (now, now, owed)
            for id in table.ids where table.state(id) != .closing { setWriteInterest(id, table.fanout.outboxes[id].pending > 0) }
            return false
        }
        if owed < flush.owed { (flush.progressMs, flush.owed) = (now, owed) }
        handOver.flush = flush
        return now >= flush.startedMs + handOver.flushLimitMs || now >= flush.progressMs + handOver.flushIdleMs
    }

    /// When the flush next needs a look (`handOverDue`), in ms; nil when
    /// there is no flush.
    var handOverFlushDeadline: UInt64? {
        guard handOver.pending, let f = handOver.flush else { return nil }
        return min(f.startedMs + handOver.flushLimitMs, f.progressMs + handOver.flushIdleMs)
    }

    /// Boxes and stores everything (the end of the iteration of `beginHandOver`).
    /// - Returns: true when the connections are in systemd's hands and the
    ///   process may exit; false when that failed and a graceful stop
    ///   began instead (the clients see a close, as on a stop).
    func completeHandOver() -> Bool {
        handOver.pending = false
        cluster?.publishBeforeHandOver()  // what the last turn relayed reaches the other daemons
        let now = clock()
        let tlsClosed = closeTLSForRestart()
        let carried = cluster?.carry()
        let ids = fitStateLimit(table.ids.filter { table.state($0) != .closing },
                                besides: carried.map(HandOverState.clusterBytesBound) ?? 0)
        var state = HandOverState(stoppedReadingMs: handOver.stoppedReadingMs, writer: roomcastVersion)
        state.socketOptions = socketOptions
        state.cluster = carried
        // The live box (LiveStore.swift) already holds every descriptor: a
        // second box would put each client in flight twice, and descriptors
        // in flight count against RLIMIT_NOFILE (10,000 clients in two boxes
        // hit this machine's 20,000 and the store failed with ETOOMANYREFS).
        let liveBox = liveBoxForHandOver(ids)
        if let liveBox { state.boxName = liveBox }
        for id in ids {
            var r = record(of: id, nowMs: now)
            if liveBox != nil { r.key = UInt64(live!.slot(id).serial) }
            state.connections.append(r)
        }
        let owed = state.connections.reduce(0) { $0 + $1.output.count }
        if liveBox == nil, let live, UInt64(live.boxed + ids.count) + Self.reservedDescriptors > descriptorLimit {
            // A box of its own beside the live ones would not fit in flight
            // under RLIMIT_NOFILE: the live boxes go first (PID 1 lets go of
            // them at the barrier; a crash now would lose the clients anyway).
            releaseLiveBoxes()
        }
        var boxes: [Int32] = []
        var stateFD: Int32 = -1
        do throws(SystemError) {
            if liveBox == nil { boxes = try pack(ids.map { (UInt64($0), table.slots[$0]!.fd) }) }
            stateFD = try StateFile.make(state.encode(), name: "roomcast-state")
        } catch {
            boxes.forEach(Sys.close)
            return handOverFailed(error.description)
        }
        defer {
            boxes.forEach(Sys.close)
            Sys.close(stateFD)
        }
        // Room in the store (FileDescriptorStoreMax=) for the state and any
        // box of its own: the live log is of no use to a graceful restore.
        if fdStoreRoom() < 1 + boxes.count, let live, live.logGeneration > 0 {
            let name = "\(HandOverName.liveStatePrefix)\(live.logGeneration)"
            systemd.notify("FDSTOREREMOVE=1\nFDNAME=\(name)")
            live.inStore[name] = nil
        }
        if fdStoreRoom() < 1 + boxes.count {
            return handOverFailed("systemd's fd store (FDSTORE=\(systemd.fdStoreMax)) has no room for \(1 + boxes.count) more descriptors")
        }
        // The state first: a box that arrives without it is still served
        // (fresh state), the reverse would lose the clients.
        if let problem = storeBeforeExit([stateFD], name: HandOverName.state) { return handOverFailed("storing the state: " + problem) }
        if !boxes.isEmpty, let problem = storeBeforeExit(boxes, name: HandOverName.box) { return handOverFailed("storing the box: " + problem) }
        let processed = barrier(timeoutMs: handOver.timeoutMs)
        handOver.done = true
        cluster?.shutdown(.handingOver)  // the others wait restart_grace for the next process (the same daemon)
        let ms = clock() - handOver.stoppedReadingMs
        logger.info("handed \(plural(ids.count, "connection")) in \(plural(relay.roomCount, "room")) to systemd's fd store in \(ms) ms"
                    + " (\(liveBox ?? "a new box")" + (handOver.flush.map { f in "; flushed for \(now - f.startedMs) ms" + (owed > 0 ? ", \(owed) bytes still owed go with the state" : "") } ?? "") + ")"
                    + (processed ? "" : "; PID 1 did not confirm within \(formatDuration(ms: handOver.timeoutMs))")
                    + (tlsClosed > 0 ? "; \(plural(tlsClosed, "TLS client")) closed with close_notify (a TLS session cannot move to another process)" : ""),
                    ["CLIENTS": String(ids.count), "ROOMS": String(relay.roomCount), "TLS_CLOSED": String(tlsClosed)])
        systemd.notify("STATUS=Stopping: \(plural(ids.count, "client")) handed to systemd's fd store")
        return true
    }

    /// Removes the live boxes from the store and closes this process's ends,
    /// and waits (at most `timeoutMs`) until PID 1 has let go of them: their
    /// descriptors are no longer in flight.
    private func releaseLiveBoxes() {
        guard let live else { return }
        var names = ["\(HandOverName.liveBoxPrefix)\(live.boxGeneration)"]
        live.pendingStores.removeAll { p in
            guard p.name.hasPrefix(HandOverName.liveBoxPrefix) else { return false }
            p.fds.forEach(Sys.close)
            names += p.thenRemove  // never sent: the older generations are still stored
            return true
        }
        for name in Set(names) {
            _ = sendWaiting("FDSTOREREMOVE=1\nFDNAME=\(name)", fds: [])
            live.inStore[name] = nil
        }
        for box in live.fullBoxes + (live.box.map { [$0] } ?? []) {
            Sys.close(box.writeEnd)
            Sys.close(box.readEnd)
        }
        (live.fullBoxes, live.box, live.boxed, live.dead) = ([], nil, 0, 0)
        _ = barrier(timeoutMs: handOver.timeoutMs)
        logger.info("removed the live boxes from systemd's fd store before the hand-over: a second copy of every descriptor would not fit in flight under RLIMIT_NOFILE (\(descriptorLimit))")
    }

    /// `ids` less the connections owing the most output, as many as it takes
    /// for the state to stay under `HandOverControl.maxStateBytes` (the
    /// next process refuses a larger one, and every record in it): those
    /// are closed, as slow consumers are (docs/protocol.md §6), and logged.
    /// - Parameter besides: bytes of the state's other records (the cluster's).
    func fitStateLimit(_ ids: [Int], besides: Int = 0) -> [Int] {
        func bytes(_ id: Int) -> Int {
            let c = table.slots[id]!
            return HandOverState.recordBytesBound(address: c.address.utf8.count, room: relay.roomName(of: id)?.bytes.count ?? 0,
                                                  identity: relay.identity(of: id)?.count ?? 0, nickname: c.nickname?.utf8.count ?? 0,
                                                  input: c.input.count, output: table.fanout.outboxes[id].queue.count,
                                                  claims: c.auth?.claims.json.count ?? 0,
                                                  webSocketMessage: c.webSocket.map { 1 + $0.decoder.message.count } ?? 0)
        }
        let limit = handOver.maxStateBytes - besides
            - HandOverState.globalsBytesBound(writer: roomcastVersion.utf8.count + 64 + socketOptions.utf8.count)
        var total = ids.reduce(0) { $0 + bytes($1) }
        guard total > limit else { return ids }
        var left = Set<Int>()
        for id in ids.sorted(by: { table.fanout.outboxes[$0].queue.count > table.fanout.outboxes[$1].queue.count }) where total > limit {
            total -= bytes(id)
            left.insert(id)
        }
        let owed = left.reduce(0) { $0 + table.fanout.outboxes[$1].queue.count }
        logger.error("the hand-over state would pass \(formatSize(handOver.maxStateBytes)): closing the \(plural(left.count, "connection"))"
                     + " owing the most output (\(formatSize(owed)) in all) instead of handing them over", ["REASON": "handover_state_too_large"])
        for id in left { Sys.shutdownBoth(table.slots[id]!.fd) }  // copies in the live box or PID 1's store live on
        return ids.filter { !left.contains($0) }
    }

    /// The options `Socket.configureClient` sets from the config: the next
    /// process sets them again only if they differ (a setsockopt(2) per
    /// option and client is most of a restore's time otherwise).
    var socketOptions: String {
        "nodelay sndbuf=\(Socket.clientSendBuffer) ltb-timeout=\(config.heartbeat.timeoutMs) json-keepalive=\(config.json.tcpKeepaliveMs)"
    }

    /// What the next process needs to know about connection `id`.
    func record(of id: Int, nowMs now: UInt64) -> HandOverState.Record {
        let c = table.slots[id]!
        var r = HandOverState.Record(key: UInt64(id))
        r.dialect = switch c.dialect { case .json: .json; case .webSocket: .webSocket; case .ltb: .ltb }
        r.peerAddress = c.address
        r.room = relay.roomName(of: id)
        r.identity = relay.identity(of: id)
        r.nickname = c.nickname
        r.input = c.input
        // At the end of a pass every batch range was written or copied
        // into the queue (`Fanout.endPass`): the queue is all that is owed.
        r.output = table.fanout.outboxes[id].queue.withReadableBytes { Array($0) }
        r.tornBytes = UInt64(min(table.fanout.outboxes[id].torn, r.output.count))
        r.softLimitElapsedMs = table.fanout.outboxes[id].softSinceMs.map { UInt32(clamping: now >= $0 ? now - $0 : 0) }
        (r.heartbeatRemainingMs, r.partialFrameRemainingMs) = heartbeats.remaining(id, c.dialect, nowMs: now)
        r.violations = UInt32(clamping: relay.violations(of: id))
        r.frameMilliTokens = c.frameBucket.map { var b = $0; return Int64(b.milliTokens(nowMs: now)) }
        r.byteMilliTokens = c.byteBucket.map { var b = $0; return Int64(b.milliTokens(nowMs: now)) }
        r.draining = table.state(id) == .draining
        r.authClaims = c.auth?.claims
        if let session = c.webSocket {
            var ws = HandOverState.WebSocket()
            ws.upgraded = session.isOpen
            ws.subprotocol = session.subprotocol
            ws.echo = session.echo
            ws.decoder = session.decoder.carried
            ws.upgradeRemainingMs = session.isOpen ? nil : heartbeats.upgradeRemaining(id, nowMs: now)
            ws.nextPingMs = webSocketPings.remainingMs(nowMs: now)
            r.webSocket = ws
        }
        return r
    }

    /// Puts every descriptor in boxes: one, unless a box fills up (each
    /// holds thousands), then another.
    /// - Returns: the boxes' read ends (their write ends are closed).
    /// Keys are connection ids, u32 as earlier releases read them.
    private func pack(_ entries: [(key: UInt64, fd: Int32)]) throws(SystemError) -> [Int32] {
        var readEnds: [Int32] = []
        var rest = entries[...]
        while !rest.isEmpty {
            let box: HandOverBox
            do { box = try HandOverBox.make() } catch {
                readEnds.forEach(Sys.close)
                throw error
            }
            let (n, error) = box.put(rest, wideKeys: false)
            box.seal()
            readEnds.append(box.readEnd)
            if error != nil || n == 0 {
                readEnds.forEach(Sys.close)
                throw error ?? SystemError("hand-over box", errno: EAGAIN)
            }
            rest = rest.dropFirst(n)
        }
        return readEnds
    }

    /// FDSTORE=1 of `fds` as `name` with FDPOLL=0 (PID 1 would drop a box
    /// whose write end closed: measured with systemd 252).
    /// - Returns: nil when sent, else what went wrong.
    func storeBeforeExit(_ fds: [Int32], name: String) -> String? {
        sendWaiting("FDSTORE=1\nFDNAME=\(name)\nFDPOLL=0", fds: fds)
    }

    /// One notification carrying `fds`, retried every ms while PID 1's queue
    /// is full, for at most `HandOverControl.timeoutMs`: a bounded wait, only
    /// at exit and at start (before READY=1).
    /// - Returns: nil when sent, else what went wrong.
    private func sendWaiting(_ state: String, fds: [Int32]) -> String? {
        guard let channel = systemd.channel else { return "no notify socket" }
        let deadline = monotonicMilliseconds() + handOver.timeoutMs
        while true {
            switch channel.send(state, fds: fds) {
            case .sent: return nil
            case .failed: return SystemError("sendmsg to the notify socket", errno: errno).description
            case .wouldBlock:
                if monotonicMilliseconds() >= deadline { return "PID 1 did not read its notify socket for \(formatDuration(ms: handOver.timeoutMs))" }
                usleep(1_000)
            }
        }
    }

    /// BARRIER=1 (sd_notify_barrier(3)): waits until PID 1 has handled every
    /// notification sent before, so that the stores are done when this
    /// process exits. At most `timeoutMs`.
    private func barrier(timeoutMs: UInt64) -> Bool {
        var p: [Int32] = [-1, -1]
        guard pipe(&p) == 0 else { return false }
        defer { Sys.close(p[0]) }
        let problem = sendWaiting("BARRIER=1", fds: [p[1]])
        Sys.close(p[1])
        guard problem == nil else { return false }
        // PID 1 closes its copy of the write end once it got here: POLLHUP.
        // (Sys.call retries an EINTR with the whole timeout: a bound, still.)
        var pfd = pollfd(fd: p[0], events: 0, revents: 0)
        guard case .done(let n)? = try? Sys.call("poll", { poll(&pfd, 1, Int32(clamping: timeoutMs)) }), n > 0 else { return false }
        return pfd.revents & Int16(POLLHUP) != 0
    }

    /// The hand-over could not complete: stop gracefully instead.
    private func handOverFailed(_ why: String) -> Bool {
        logger.error("cannot hand the connections over: \(why); stopping and closing them instead",
                     ["REASON": "handover_failed", "DETAIL": why])
        stop.handOverFailed()
        beginStop(signal: SIGTERM)
        return false
    }

    // MARK: - Listeners of the standalone unit

    /// A listener the previous process stored (standalone unit) if one is
    /// bound to `address`: adopted, so the port never closed.
    func adoptStoredListener(_ address: ListenAddress, _ dialect: Dialect, tls: Bool = false) -> Int32? {
        guard let i = handOver.storedListeners.firstIndex(where: {
            $0.name == HandOverName.listener(dialect, tls: tls) && Socket.localAddress($0.fd) == address.description
        }) else { return nil }
        return handOver.storedListeners.remove(at: i).fd
    }

    /// With an fd store and listeners of its own (standalone unit): keeps
    /// them in the store, so that clients connecting during a restart or a
    /// crash wait in the backlog instead of being refused. Stored listeners
    /// the config no longer names are closed and removed.
    func keepListenersInStore() {
        let storedNames = Set(handOver.storedListeners.map(\.name))
        handOver.storedListeners.forEach { Sys.close($0.fd) }
        handOver.storedListeners = []
        handOver.listenersInStore = 0
        guard canHandOver, systemd.listenFDs.isEmpty else { return }
        for (dialect, tls) in [(Dialect.ltb, false), (.json, false), (.webSocket, false), (.ltb, true), (.json, true), (.webSocket, true)] {
            let name = HandOverName.listener(dialect, tls: tls)
            let fds = listeners.all.filter { $0.dialect == dialect && $0.tls == tls }.map(\.fd)
            // TLS kinds only when in use now or before: every notification
            // waits in PID 1's queue (a datagram socket's, of 10 by default).
            if tls && fds.isEmpty && !storedNames.contains(name) { continue }
            systemd.notify("FDSTOREREMOVE=1\nFDNAME=\(name)")
            if !fds.isEmpty, fds.count > systemd.fdStoreMax - handOver.listenersInStore {
                logger.warning("no room in systemd's fd store (FDSTORE=\(systemd.fdStoreMax)) for the \(name) listener: the port closes during restarts",
                               ["REASON": "fdstore_budget"])
            } else if !fds.isEmpty, let problem = storeBeforeExit(fds, name: name) {
                logger.warning("could not keep the \(name) listener in systemd's fd store (\(problem)): the port closes during restarts",
                               ["REASON": "handover_failed"])
            } else if !fds.isEmpty {
                handOver.listenersInStore += fds.count
            }
        }
    }
}

extension Heartbeats {
    /// The time `id` has left before its deadlines, in ms, for a hand-over:
    /// its heartbeat (nil: no deadline) and, for a JSON client in the
    /// middle of a frame, that frame's.
    func remaining(_ id: Int, _ dialect: Dialect, nowMs: UInt64) -> (heartbeat: UInt32?, partialFrame: UInt32?) {
        func left(_ t: LivenessTracker) -> UInt32? {
            guard t.timeoutMs > 0, let last = t.lastActive(of: id) else { return nil }
            let deadline = last &+ t.timeoutMs
            return UInt32(clamping: deadline > nowMs ? deadline - nowMs : 0)
        }
        return (left(dialect == .json ? json : ltb), dialect == .json ? left(jsonPartial) : nil)
    }

    /// The time a WebSocket upgrade of `id` has left, in ms; nil: not upgrading.
    func upgradeRemaining(_ id: Int, nowMs: UInt64) -> UInt32? {
        guard let last = webSocketUpgrade.lastActive(of: id) else { return nil }
        let deadline = last &+ webSocketUpgrade.timeoutMs
        return UInt32(clamping: deadline > nowMs ? deadline - nowMs : 0)
    }

    /// A handed-over WebSocket connection that was still upgrading: its
    /// upgrade deadline is `remainingMs` from now.
    mutating func restoreUpgrade(_ id: Int, remainingMs: UInt32, nowMs: UInt64) {
        let deadline = nowMs &+ UInt64(remainingMs)
        webSocketUpgrade.track(id, nowMs: deadline > webSocketUpgrade.timeoutMs ? deadline - webSocketUpgrade.timeoutMs : 0)
    }

    /// A handed-over connection, which `Server.open` tracked from now: its
    /// deadlines become `nowMs` plus the time they had left.
    mutating func restore(_ id: Int, _ dialect: Dialect, heartbeatMs: UInt32?, partialFrameMs: UInt32?, hasPartialFrame: Bool, nowMs: UInt64) {
        /// The last sign of life that puts the deadline `remaining` ms from now.
        func since(_ remaining: UInt32, _ timeoutMs: UInt64) -> UInt64 {
            let deadline = nowMs &+ UInt64(remaining)
            return deadline > timeoutMs ? deadline - timeoutMs : 0
        }
        if let ms = heartbeatMs {
            if dialect == .json { json.track(id, nowMs: since(ms, json.timeoutMs)) } else { ltb.track(id, nowMs: since(ms, ltb.timeoutMs)) }
        }
        if dialect == .json && hasPartialFrame {
            jsonPartial.track(id, nowMs: partialFrameMs.map { since($0, jsonPartial.timeoutMs) } ?? nowMs)
        }
    }
}
