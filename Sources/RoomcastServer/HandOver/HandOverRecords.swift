import Glibc
import RoomcastCore
import RoomcastIO

// HandOverRecords.swift: what a hand-over writes about each connection
// (`HandOverState.Record`, read back by HandOverRestore.swift), the state's
// size bound (`fitStateLimit`), and the deadlines it carries as time left.

extension Server {
    /// `ids` less the connections owing the most output, as many as it takes
    /// for the state to stay under `HandOverControl.maxStateBytes` (the
    /// next process refuses a larger one, and every record in it): those
    /// are closed, as slow consumers are (docs/protocol/rooms.md §6), and logged.
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
        r.positions = relay.wantsPositions(id)
        r.textsShed = UInt32(clamping: table.fanout.shedding[id] ?? 0)
        r.lastTextMs = c.lastTextMs  // CLOCK_MONOTONIC: the next process reads the same clock
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
