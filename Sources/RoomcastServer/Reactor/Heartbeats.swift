import RoomcastCore

/// Every heartbeat deadline of the daemon (docs/protocol/rooms.md §5), behind one
/// type: three liveness trackers on hashed timing wheels.
///
/// - `ltb`: LTB clients, `[heartbeat] timeout` of silence.
/// - `json`: JSON clients, `[json] heartbeat_timeout` (off by default: JSON
///   clients send no heartbeats).
/// - `jsonPartial`: JSON clients in the middle of a frame, from its first
///   byte: even where silence is allowed, a frame must complete within
///   `[heartbeat] timeout` (slowloris).
/// - `webSocketUpgrade`: WebSocket connections whose HTTP upgrade is not
///   complete, `upgradeTimeoutMs` from accept. Once upgraded they are on
///   `ltb`: any frame (a pong included) is proof of life within
///   `[heartbeat] timeout` (docs/protocol/websocket.md §15).
///
/// It owns deadlines only: it never closes anything; `expire` tells the
/// caller whom to evict and why. All times are ms on the server's clock.
struct Heartbeats {
    var ltb: LivenessTracker
    var json: LivenessTracker
    var jsonPartial: LivenessTracker
    var webSocketUpgrade: LivenessTracker
    /// How long a WebSocket upgrade may take from accept, in ms (docs/protocol/websocket.md §15).
    static let upgradeTimeoutMs: UInt64 = 5_000
    private var expired: [Int] = []

    init(_ config: Config, nowMs: UInt64) {
        ltb = LivenessTracker(timeoutMs: config.heartbeat.timeoutMs, tickMs: config.heartbeat.tickMs, nowMs: nowMs)
        json = LivenessTracker(timeoutMs: config.json.heartbeatTimeoutMs, tickMs: config.heartbeat.tickMs, nowMs: nowMs)
        jsonPartial = LivenessTracker(timeoutMs: config.heartbeat.timeoutMs, tickMs: config.heartbeat.tickMs, nowMs: nowMs)
        webSocketUpgrade = LivenessTracker(timeoutMs: Self.upgradeTimeoutMs, tickMs: config.heartbeat.tickMs, nowMs: nowMs)
    }

    /// New timeouts and tick after a reload; every deadline is recomputed
    /// from the connection's last proof of life.
    mutating func reconfigure(_ config: Config, nowMs: UInt64) {
        ltb.reconfigure(timeoutMs: config.heartbeat.timeoutMs, tickMs: config.heartbeat.tickMs, nowMs: nowMs)
        json.reconfigure(timeoutMs: config.json.heartbeatTimeoutMs, tickMs: config.heartbeat.tickMs, nowMs: nowMs)
        jsonPartial.reconfigure(timeoutMs: config.heartbeat.timeoutMs, tickMs: config.heartbeat.tickMs, nowMs: nowMs)
        webSocketUpgrade.reconfigure(timeoutMs: Self.upgradeTimeoutMs, tickMs: config.heartbeat.tickMs, nowMs: nowMs)
    }

    /// A new connection: its silence is counted from now.
    mutating func track(_ id: Int, _ dialect: Dialect, nowMs: UInt64) {
        switch dialect {
        case .json: json.track(id, nowMs: nowMs)
        case .ltb: ltb.track(id, nowMs: nowMs)
        case .webSocket: webSocketUpgrade.track(id, nowMs: nowMs)
        }
    }

    /// A WebSocket upgrade completed: from now on its silence is counted
    /// against `[heartbeat] timeout`.
    mutating func webSocketUpgraded(_ id: Int, nowMs: UInt64) {
        webSocketUpgrade.untrack(id)
        ltb.track(id, nowMs: nowMs)
    }

    /// A complete frame from `id`: proof of life. O(1).
    @inline(__always)
    mutating func touch(_ id: Int, _ dialect: Dialect, nowMs: UInt64) {
        if dialect == .json { json.touch(id, nowMs: nowMs) } else { ltb.touch(id, nowMs: nowMs) }
    }

    /// After a read from a JSON client: a partial frame's clock starts at its
    /// first byte, and restarts when a frame completed and another began.
    mutating func jsonInput(_ id: Int, partial: Bool, startedNow: Bool, nowMs: UInt64) {
        if !partial { jsonPartial.untrack(id) } else if startedNow { jsonPartial.track(id, nowMs: nowMs) }
    }

    /// The connection is gone, or no longer reads.
    mutating func untrack(_ id: Int) {
        ltb.untrack(id)
        json.untrack(id)
        jsonPartial.untrack(id)
        webSocketUpgrade.untrack(id)
    }

    /// Milliseconds until the next possible eviction, nil when none is due.
    func nextTimeout(fromMs nowMs: UInt64) -> UInt64? {
        let timeouts = (ltb.nextTimeout(fromMs: nowMs), json.nextTimeout(fromMs: nowMs), jsonPartial.nextTimeout(fromMs: nowMs))
        var next = timeouts.0
        if let t = timeouts.1 { next = min(next ?? t, t) }
        if let t = timeouts.2 { next = min(next ?? t, t) }
        if let t = webSocketUpgrade.nextTimeout(fromMs: nowMs) { next = min(next ?? t, t) }
        return next
    }

    /// Moves time to `nowMs` and calls `evict` for every connection whose
    /// deadline passed, with the reason. They stay tracked until untracked.
    mutating func expire(nowMs: UInt64, _ evict: (Int, String) -> Void) {
        ltb.expire(nowMs: nowMs, into: &expired)
        report("heartbeat timeout: no frame for", ltb.timeoutMs, evict)
        json.expire(nowMs: nowMs, into: &expired)
        report("heartbeat timeout: no frame for", json.timeoutMs, evict)
        jsonPartial.expire(nowMs: nowMs, into: &expired)
        report("heartbeat timeout: a JSON frame incomplete for", jsonPartial.timeoutMs, evict)
        webSocketUpgrade.expire(nowMs: nowMs, into: &expired)
        report("WebSocket upgrade not complete within", webSocketUpgrade.timeoutMs, evict)
    }

    /// Hands the expired ids to `evict` with "`what` <timeout>".
    private mutating func report(_ what: String, _ timeoutMs: UInt64, _ evict: (Int, String) -> Void) {
        guard !expired.isEmpty else { return }
        let why = "\(what) \(formatDuration(ms: timeoutMs))"
        for id in expired { evict(id, why) }
        expired.removeAll(keepingCapacity: true)
    }
}
