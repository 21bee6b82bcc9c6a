@preconcurrency import CHiredis
import Glibc
import RoomcastCore
import RoomcastIO

// ClusterConnections.swift: the loop's hooks into the link (writes, events,
// timers) and the life of its two connections to Redis (Cluster.swift):
// connect, handshake, loss, reconnect with backoff and jitter, up again.
extension ClusterLink {
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
    /// - Parameter roomCounts: this daemon's members per room (the relay's
    ///   `roomCounts`), read only when the counts are due (`publishCounts`).
    func runTimers(now: UInt64, roomCounts: @autoclosure () -> [(room: RoomName, members: Int)]) {
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
        if now >= nextCountsMs { publishCounts(now: now, roomCounts: roomCounts()) }
        expireOverdueReturns(now: now)
    }

    // MARK: - Connections

    func connect(_ c: RedisConnection, nowMs now: UInt64) {
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
    func lose(_ c: RedisConnection, _ reason: String, now: UInt64) {
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
    func failed(_ c: RedisConnection, _ reason: String, now: UInt64, said: Bool = false) {
        c.pendingReset = nil
        if c.role == .publisher { failClaims(reason) }  // ClusterIdempotency.swift: served locally
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
    func wentDown(_ c: RedisConnection, _ reason: String, now: UInt64) {
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
}
