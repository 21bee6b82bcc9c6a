import Glibc
import RoomcastCore
import RoomcastIO

// HandOver.swift owns restarts that keep every client connected (docs/operations/restarts.md,
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
// before (Lifecycle.swift). What each connection's record holds is
// HandOverRecords.swift's; the notifications to PID 1 (FDSTORE=1,
// BARRIER=1) and the standalone unit's stored listeners HandOverStore.swift's.

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

    /// The `[api] listen` listeners (TCP and Unix sockets alike), kept in
    /// the store by every unit with one, so that a backend's requests during
    /// a restart wait in the backlog instead of being refused.
    static let apiListener = "listen-api"

    static func isListener(_ name: String) -> Bool {
        name == apiListener || [Dialect.ltb, .json, .webSocket].contains { name == listener($0) || name == listener($0, tls: true) }
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
    /// stop (docs/protocol/clients.md, section 10: up to 5 s).
    var flushLimitMs: UInt64 = Server.drainTimeoutMs
    /// When the process stopped reading, on its monotonic clock, in ms.
    var stoppedReadingMs: UInt64 = 0
    /// Everything is in systemd's hands: exit without closing anything.
    var done = false
    /// How this process started: `fresh`, `handover` (a restart that kept
    /// the connections) or `crash` (recovered from the live box), and the
    /// connections it took over then (GET /metrics).
    var startedFrom = "fresh"
    var restoredConnections = 0
    /// Hand-overs made by this process's predecessors since the daemon last
    /// started fresh or recovered from a crash (carried in the state).
    var handOvers: UInt64 = 0
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
        let claims = api.claims.count
        cluster?.publishBeforeHandOver()  // what the last turn relayed reaches the other daemons
        // Idempotency-Key claims answered meanwhile relayed their publishes:
        // out of this pass's batch into the outboxes that are carried.
        if api.claims.count < claims { reapAndFlush(now: clock()) }
        let now = clock()
        let tlsClosed = closeTLSForRestart()
        let carried = cluster?.carry()
        let moderated = moderation.records
        let streams = relay.streams
        let keys = api.idempotency.carried(now: now)  // Idempotency-Keys go on (record 0x4901)
        let ids = fitStateLimit(table.ids.filter { table.state($0) != .closing },
                                besides: (carried.map(HandOverState.clusterBytesBound) ?? 0) + HandOverState.moderationBytesBound(moderated)
                                    + HandOverState.roomsBytesBound(streams) + HandOverState.idempotencyBytesBound(keys))
        var state = HandOverState(stoppedReadingMs: handOver.stoppedReadingMs, writer: roomcastVersion)
        state.socketOptions = socketOptions
        state.cluster = carried
        state.moderation = moderated
        state.rooms = streams
        state.idempotency = keys
        state.handOvers = handOver.handOvers &+ 1
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

    /// The hand-over could not complete: stop gracefully instead.
    private func handOverFailed(_ why: String) -> Bool {
        logger.error("cannot hand the connections over: \(why); stopping and closing them instead",
                     ["REASON": "handover_failed", "DETAIL": why])
        stop.handOverFailed()
        beginStop(signal: SIGTERM)
        return false
    }
}
