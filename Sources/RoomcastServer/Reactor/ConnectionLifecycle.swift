import RoomcastCore
import RoomcastIO

// ConnectionLifecycle.swift owns a connection's life from its first
// registration to its reap: open (after admission), EOF, drain, leave
// (the synthesized leave of docs/protocol/rooms.md §4), eviction and the reap
// that closes the descriptor. States change only through
// `ConnectionTable.transition`; descriptors are closed only in `reap` and
// at the end of a stop (Lifecycle.swift).

extension Server {
    /// Time allowed to flush owed output after EOF or on stop, in ms.
    static let drainTimeoutMs: UInt64 = 5_000

    /// Takes an admitted socket into the table, the selector, the relay (the
    /// default room, docs/protocol/rooms.md §4) and the heartbeat wheels.
    /// - Returns: the connection id, or nil if epoll refused the descriptor
    ///   (then it is closed).
    @discardableResult
    /// - Parameter tls: its OpenSSL session after the handshake (TLS/); the
    ///   connection owns it from now on (freed at release). Nil: plain TCP.
    func open(fd: Int32, dialect: Dialect, address: String, now: UInt64, tls ssl: OpaquePointer? = nil) -> Int? {
        let id = table.add(fd: fd, dialect: dialect, address: address)
        do {
            table.fanout.outboxes[id].registration = try selector.register(fd, .connection(id))
        } catch {
            logger.error("cannot watch \(address)", ["CLIENT_ADDR": address, "REASON": "epoll_failed", "DETAIL": error.description])
            Sys.close(fd)
            table.remove(id)
            return nil
        }
        if let ssl { adoptTLS(id, ssl) }
        resetRateLimits(id, now: now)
        if dialect == .webSocket {
            // Joins the default room once upgraded (WebSocketServer.swift), not before.
            table.slots[id]!.webSocket = WebSocketSession(decoder: WebSocketDecoder(maxMessageBytes: config.webSocket.maxMessageBytes))
        } else {
            relay.connect(id)
        }
        heartbeats.track(id, dialect, nowMs: now)
        liveOpened(id)
        logger.debug("client connected", ["CLIENT_ADDR": address, "ROOM": config.server.defaultRoom])
        return id
    }

    /// The peer sent EOF: it leaves its room now, and what it is already owed
    /// is flushed (up to `drainTimeoutMs`) before the socket is closed.
    func peerClosed(_ id: Int) {
        let c = table.slots[id]!
        if !c.input.isEmpty {
            // A FIN in the middle of a frame is a client bug (a dropped network
            // gives a reset or a timeout): say what was lost.
            logger.peerWarning(reason: "truncated_frame", nowMs: clock(),
                               "\(c.address): closed the connection with \(c.input.count) bytes of an incomplete frame; dropped",
                               ["CLIENT_ADDR": c.address, "LENGTH": String(c.input.count), "ROOM": relay.room(of: id) ?? ""])
        }
        depart(id)
        heartbeats.untrack(id)
        if table.fanout.outboxes[id].pending == 0 {
            table.close(id, "closed by peer")
        } else {
            startDraining(id, now: clock())
        }
    }

    /// Stops reading `id` and flushes what it is owed until the drain deadline.
    func startDraining(_ id: Int, now: UInt64) {
        table.transition(id, to: .draining)
        table.slots[id]!.drainDeadlineMs = now + Self.drainTimeoutMs
        table.slots[id]!.input = []
        watch.draining.append(id)
        setWriteInterest(id, true)
    }

    /// Closes draining connections whose deadline passed.
    func checkDrainDeadlines(now: UInt64) {
        watch.draining.removeAll { id in
            guard table.state(id) == .draining else { return true }
            guard now >= table.slots[id]!.drainDeadlineMs else { return false }
            table.close(id, "drain timeout with \(table.fanout.outboxes[id].pending) bytes unsent")
            return true
        }
    }

    /// Tells the relay the connection is gone: its room hears the
    /// synthesized leave (docs/protocol/rooms.md §4). The relay forgets a
    /// connection once, so a second call does nothing.
    func depart(_ id: Int) {
        let (room, n) = relay.disconnect(id, sink: table.fanout)
        if let room, n > 0 {
            logger.debug("announced leave of \(table.address(of: id)) to \(room) (\(n) recipients)",
                         ["CLIENT_ADDR": table.address(of: id), "ROOM": room])
        }
    }

    /// A heartbeat deadline passed (Heartbeats.swift): closed if still open.
    /// An upgraded WebSocket gets a close frame with 1011 first, an upgrade
    /// still under way a 408 answer (docs/protocol/websocket.md §15), each flushed
    /// within the drain timeout.
    func evict(_ id: Int, _ reason: String) {
        table.slots[id]?.disconnectReason = .heartbeatTimeout
        guard table.isOpen(id) else { return }
        status.evictions &+= 1
        let address = table.address(of: id)
        logger.debug("evicting \(address): \(reason)", ["CLIENT_ADDR": address, "REASON": "heartbeat_timeout", "ROOM": relay.room(of: id) ?? ""])
        switch table.slots[id]!.webSocket?.phase {
        case .open?: closeWebSocket(id, .internalError, reason)
        case .upgrading?: answerAndEnd(id, HTTPError(408, reason))
        default: table.close(id, reason)
        }
    }

    /// The end of a connection marked for close: leave announced (if it had
    /// not left yet), deadlines dropped, descriptor closed, slot freed.
    func reap(_ id: Int) {
        guard let c = table.slots[id] else { return }
        let reason = c.closeReason ?? CloseReason(text: "closed")
        status.disconnects[(c.disconnectReason ?? DisconnectReason.classify(reason.text, warning: reason.warning)).rawValue] &+= 1
        if let code = reason.warning {
            logger.peerWarning(reason: code, nowMs: clock(), "\(c.address): closing: \(reason.text)",
                               ["CLIENT_ADDR": c.address, "ROOM": relay.room(of: id) ?? ""])
        }
        depart(id)
        heartbeats.untrack(id)
        release(id)
        logger.debug("client disconnected: \(reason.text)", ["CLIENT_ADDR": c.address, "DETAIL": reason.text])
    }

    /// Deregisters and closes the descriptor of `id` and frees its slot.
    func release(_ id: Int) {
        guard let c = table.slots[id] else { return }
        auth.forget(id)  // its token's expiry goes with it (the slot is reused)
        if let r = table.fanout.outboxes[id].registration { selector.deregister(r) }
        if let ssl = c.tls {
            releaseTLS(id, ssl)  // close_notify, then the socket
        } else {
            liveClosing(id, fd: c.fd)  // shutdown(2) first while the live box holds a copy
            Sys.close(c.fd)
        }
        table.remove(id)
    }
}
