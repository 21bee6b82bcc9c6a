import Glibc
import RoomcastCore
import RoomcastIO

// HandOverRestore.swift: the new process's side of a restart hand-over
// (HandOver.swift has the old process's): what the store passed in is
// taken back, connections re-opened with their state, before READY=1.
extension Server {
    // MARK: - The new process

    /// At start, before READY=1: takes back the connections the previous
    /// process left in the fd store, handed over (`state` and its box) or,
    /// after a crash, in its live box and log (LiveStore.swift), and empties
    /// the store of them.
    /// - Returns: "restored N connections in M rooms in T ms" for STATUS=,
    ///   or nil when there was nothing.
    func restoreHandedOver() -> String? {
        var stored = systemd.storedFDs.filter { !HandOverName.isListener($0.name) }
        guard !stored.isEmpty else { return nil }
        let started = clock()
        let names = Set(stored.map(\.name))
        for name in names {
            if let g = HandOverName.liveGeneration(name) { handOver.previousLiveGeneration = max(handOver.previousLiveGeneration, g) }
        }
        let summary: String
        let previous = readHandOverState(stored)
        stored.removeAll { $0.name == HandOverName.state }
        if previous != nil || names.contains(HandOverName.box) {
            summary = restoreGraceful(previous, &stored, started: started)
            handOver.startedFrom = "handover"
            handOver.handOvers = max(previous?.handOvers ?? 0, 1)  // a writer before the count: at least this one
            closeCopies(stored)  // live boxes and logs: copies of what was handed over, and closed ones
        } else {
            // A crash, or a hand-over whose state is unusable and whose box
            // is the live one: the live log is the best there is.
            summary = restoreAfterCrash(stored, started: started, after: names.contains(HandOverName.state) ? "a restart" : "a crash")
            handOver.startedFrom = "crash"
        }
        // PID 1 still holds its copies: let them go.
        for name in names.sorted() { systemd.notify("FDSTOREREMOVE=1\nFDNAME=\(name)") }
        handOver.restoredConnections = table.count
        return summary
    }

    /// The newest hand-over state in `stored` that reads; nil (logged) when
    /// there is none or it is damaged or of an unknown version. Closes them.
    private func readHandOverState(_ stored: [(fd: Int32, name: String)]) -> HandOverState? {
        var previous: HandOverState?
        var problem: (reason: String, text: String)?
        for s in stored where s.name == HandOverName.state {
            do throws(SystemError) {
                let bytes = try StateFile.read(s.fd, limit: handOver.maxStateBytes)
                do throws(HandOverState.DecodeError) {
                    let state = try HandOverState.decode(bytes)
                    if state.stoppedReadingMs >= previous?.stoppedReadingMs ?? 0 { previous = state }
                } catch {
                    problem = (error.reason, error.description)
                }
            } catch {
                problem = ("handover_state_unreadable", error.description)
            }
            Sys.close(s.fd)
        }
        if let problem, previous == nil {
            logger.warning("\(problem.text): the handed-over connections get the state the live log has, or fresh state",
                           ["REASON": problem.reason])
        }
        return previous
    }

    /// A hand-over: the box the state names (or `box`, with fresh state
    /// when there is no state). Takes what it used out of `stored`.
    private func restoreGraceful(_ previous: HandOverState?, _ stored: inout [(fd: Int32, name: String)], started: UInt64) -> String {
        if previous == nil {
            logger.warning("a hand-over box came without its state: serving its connections with fresh state (rooms, identities and owed output are lost)",
                           ["REASON": "handover_state_missing"])
        }
        var records: [UInt64: HandOverState.Record] = [:]
        records.reserveCapacity(previous?.connections.count ?? 0)
        for r in previous?.connections ?? [] { records[r.key] = r }
        // The box: the connections themselves. A live box also holds closed
        // connections (no record: closed here); a box of its own holds only
        // connections to serve (no record: fresh state). Without a state,
        // the live boxes are not trusted (their closed entries are not known).
        let boxName = previous?.boxName ?? HandOverName.box
        let live = boxName != HandOverName.box
        var entries: [HandOverBox.Entry] = []
        for b in stored where b.name == boxName {
            let (found, trouble) = HandOverBox.drain(b.fd)
            entries += found
            if let trouble {
                logger.warning("hand-over box damaged: \(trouble); serving its connections with fresh state", ["REASON": "handover_box_damaged", "DETAIL": trouble])
            }
        }
        stored.removeAll { $0.name == boxName }

        // The cluster link goes on as the same daemon (before the rooms reopen).
        if let carried = previous?.cluster { cluster?.adopt(carried) }
        let now = clock()
        // Bans, mutes and slow mode go on (with a cluster, Redis's copy is loaded over them at connect).
        for r in previous?.moderation ?? [] { try? moderation.apply(r, nowMs: now, wallMs: wallClock()) }
        // Idempotency-Keys go on with the time each had left: a retry gets the first reply.
        api.idempotency.restore(previous?.idempotency ?? [], now: now)
        let configure = previous?.socketOptions != socketOptions
        var restored = 0, fresh = 0, closed = 0
        for e in entries {
            let record = e.key.flatMap { records.removeValue(forKey: $0) }
            if record == nil && live && e.key != nil {
                Sys.close(e.fd)  // closed before the hand-over: the live box kept a copy
                closed += 1
                continue
            }
            guard restoreConnection(fd: e.fd, record, now: now, configure: configure || record == nil) != nil else { continue }
            restored += 1
            if record == nil { fresh += 1 }
        }
        // Rooms go on with their epoch, numbers and recent lines (docs/protocol/positions.md §4).
        for stream in previous?.rooms ?? [] { relay.adopt(stream) }
        if fresh > 0 && previous != nil {
            logger.warning("\(plural(fresh, "handed-over connection")) had no state: served as new connections", ["REASON": "handover_state_missing"])
        }
        if !records.isEmpty {
            logger.warning("\(plural(records.count, "connection")) in the hand-over state came without a descriptor (FileDescriptorStoreMax= too low?): lost",
                           ["REASON": "handover_descriptor_missing"])
        }
        let done = clock()
        let summary = "restored \(plural(restored, "connection")) in \(plural(relay.roomCount, "room")) in \(done - started) ms"
        // The gap: the old process stopped reading at `stoppedReadingMs` on
        // the same (system-wide monotonic) clock.
        let gapMs = previous.flatMap { p in p.stoppedReadingMs > 0 && done >= p.stoppedReadingMs ? done - p.stoppedReadingMs : nil }
        let gap = gapMs.map { " (\($0) ms after the previous process, \(previous!.writer), stopped reading)" } ?? ""
        logger.info(summary + gap, ["CLIENTS": String(restored), "ROOMS": String(relay.roomCount), "RESTORE_MS": String(done - started),
                                    "GAP_MS": gapMs.map(String.init) ?? ""])
        if closed > 0 { logger.debug("closed \(plural(closed, "descriptor")) of connections closed before the hand-over") }
        return summary
    }

    /// One handed-over connection back in the table: `Server.open`, as for
    /// an accepted client, then the state it had (`record`; nil: fresh
    /// state, as a new client).
    /// - Returns: its new id, or nil when it could not be watched (closed).
    @discardableResult
    func restoreConnection(fd: Int32, _ r: HandOverState.Record?, now: UInt64, configure: Bool = true) -> Int? {
        let dialect: Dialect = r.map { switch $0.dialect { case .json: .json; case .webSocket: .webSocket; case .ltb: .ltb } }
            ?? dialectOfListener(for: fd)
        let address = r?.peerAddress ?? SocketAddress.of(fd, peer: true)?.text ?? "?"
        // Options live on the socket and travelled with it: set again only
        // when the config changed them across the restart.
        if configure { Socket.configureClient(fd, dialect: dialect, config: config) }
        guard let id = open(fd: fd, dialect: dialect, address: address, now: now) else { return nil }
        guard let r else { return id }
        if let ws = r.webSocket { restoreWebSocket(id, ws, now: now) }
        if r.webSocket.map({ $0.upgraded && !$0.echo }) ?? true {
            relay.restore(id, room: r.room, identity: r.identity, violations: Int(r.violations), positions: r.positions)
        }
        table.slots[id]!.nickname = r.nickname
        table.slots[id]!.input = r.input
        // Slow mode's interval goes on (a time ahead of this clock is taken as now: never a free post).
        if let last = r.lastTextMs { table.slots[id]!.lastTextMs = min(last, now) }
        if let claims = r.authClaims { restoreSession(id, claims, now: now) }
        if let t = r.frameMilliTokens, let b = table.slots[id]!.frameBucket {
            table.slots[id]!.frameBucket = TokenBucket(rate: b.rate, burst: b.burst, milliTokens: Int(clamping: t), nowMs: now)
        }
        if let t = r.byteMilliTokens, let b = table.slots[id]!.byteBucket {
            table.slots[id]!.byteBucket = TokenBucket(rate: b.rate, burst: b.burst, milliTokens: Int(clamping: t), nowMs: now)
        }
        heartbeats.restore(id, dialect, heartbeatMs: r.heartbeatRemainingMs, partialFrameMs: r.partialFrameRemainingMs,
                           hasPartialFrame: !r.input.isEmpty, nowMs: now)
        if !r.output.isEmpty {
            r.output.withUnsafeBytes { table.fanout.outboxes[id].queue.append($0) }
            // The rest of a frame the peer got part of: the crash path logs
            // it, and the torn-frame walk (Fanout) starts after it.
            table.fanout.outboxes[id].torn = Int(clamping: min(r.tornBytes, UInt64(r.output.count)))
            setWriteInterest(id, true)  // armed while the queue holds a backlog (Output.swift)
        }
        if let elapsed = r.softLimitElapsedMs, !r.output.isEmpty {
            // The slow-consumer clock goes on where it was (docs/protocol/rooms.md §6).
            table.fanout.outboxes[id].softSinceMs = now &- min(UInt64(elapsed), now)
            watch.overSoft.append(id)
            table.fanout.someoneSlow = true
        }
        if r.textsShed > 0 { table.fanout.restoreShedding(id, count: Int(r.textsShed)) }
        if r.draining {
            // It had sent EOF and left its room: only its owed output remains.
            relay.forget(id)
            heartbeats.untrack(id)
            if r.output.isEmpty { table.close(id, "closed by peer") } else { startDraining(id, now: now) }
        }
        return id
    }

    /// A WebSocket connection's protocol state back (docs/protocol/websocket.md §15):
    /// the phase, subprotocol and decoder it had, so that its unconsumed
    /// bytes (`input`) go on where they were; once upgraded, its silence is
    /// counted as before the restart (`Heartbeats.restore`), and pings go on
    /// at the interval they kept.
    private func restoreWebSocket(_ id: Int, _ ws: HandOverState.WebSocket, now: UInt64) {
        table.slots[id]!.webSocket = WebSocketSession(
            phase: ws.upgraded ? .open : .upgrading(HTTPRequestParser()),  // a fresh parser rescans the same bytes
            subprotocol: ws.subprotocol, echo: ws.echo,
            decoder: WebSocketDecoder(maxMessageBytes: config.webSocket.maxMessageBytes, carried: ws.decoder))
        if ws.upgraded {
            // `open` counted an upgrade from now: it is done, so its silence is
            // watched from now as any upgraded connection's (`restore` then puts
            // back the deadline it had left, if there was one; with
            // `heartbeat.timeout = 0` there is none, and the connection must
            // still be tracked for its proof of life to have a slot).
            heartbeats.webSocketUpgraded(id, nowMs: now)
            table.fanout.outboxes[id].webSocketFramed = true  // its torn frame is kept (Fanout.keepTornOnly)
            if !ws.echo {
                table.fanout.outboxes[id].webSocketForm = ws.subprotocol
                relay.connect(id)  // `open` leaves an upgrading connection out of the relay; `relay.restore` puts it in its room
            }
        } else if let ms = ws.upgradeRemainingMs {
            heartbeats.restoreUpgrade(id, remainingMs: ms, nowMs: now)
        }
        if let ms = ws.nextPingMs {
            webSocketPings.restore(dueMs: now + UInt64(ms), nowMs: now)
        }
    }

    /// The dialect of the listener a connection came through (by local
    /// port), for a connection handed over without its state.
    private func dialectOfListener(for fd: Int32) -> Dialect {
        func port(_ address: String) -> Substring { address[(address.lastIndex(of: ":").map { address.index(after: $0) } ?? address.startIndex)...] }
        let local = port(Socket.localAddress(fd))
        return listeners.all.first { port($0.address) == local }?.dialect ?? .ltb
    }

}
