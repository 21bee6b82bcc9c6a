/// Heartbeat deadlines for every connection (docs/protocol/rooms.md §5): any complete
/// frame is proof of life; a connection silent for `timeoutMs` is evicted,
/// within `timeoutMs + tickMs`.
///
/// Refreshing is a field update (the time of the last frame), O(1) with no
/// list operations: the wheel keeps each connection's *first* deadline, and
/// when it fires an active connection is simply re-armed at
/// `lastActive + timeout` (lazy refresh). Eviction work is therefore
/// proportional to the deadlines that expire, never to the number of
/// connections. All times are milliseconds on the caller's monotonic clock.
public struct LivenessTracker {
    /// Silence after which a connection is evicted, in ms; 0 disables eviction.
    public private(set) var timeoutMs: UInt64
    private var wheel: TimingWheel
    private var lastActive: [UInt64] = []
    private var tracked: [Bool] = []

    /// - Parameters:
    ///   - timeoutMs: `heartbeat.timeout` in ms (0 = off).
    ///   - tickMs: `heartbeat.tick`, the wheel's resolution in ms (> 0).
    ///   - nowMs: the current time.
    public init(timeoutMs: UInt64, tickMs: UInt64, nowMs: UInt64) {
        self.timeoutMs = timeoutMs
        self.wheel = TimingWheel(tickMs: tickMs, slotCount: Self.slots(timeoutMs: timeoutMs, tickMs: tickMs), startMs: nowMs)
    }

    /// One turn of the wheel covers the timeout when it can, within 64..4096 slots.
    private static func slots(timeoutMs: UInt64, tickMs: UInt64) -> Int {
        let needed = timeoutMs / max(tickMs, 1) + 1
        return Int(min(max(needed, 64), 4096))
    }

    /// Number of connections being watched.
    public var count: Int { wheel.count }

    /// Starts watching connection `id` (its first deadline is `now + timeout`).
    public mutating func track(_ id: Int, nowMs: UInt64) {
        if id >= tracked.count {
            let grow = id + 1 - tracked.count
            tracked.append(contentsOf: repeatElement(false, count: grow))
            lastActive.append(contentsOf: repeatElement(0, count: grow))
        }
        tracked[id] = true
        lastActive[id] = nowMs
        if timeoutMs > 0 { wheel.schedule(id, at: nowMs &+ timeoutMs) }
    }

    /// Records proof of life for `id`. O(1): a field update.
    @inline(__always)
    public mutating func touch(_ id: Int, nowMs: UInt64) {
        lastActive[id] = nowMs
    }

    /// When `id` last proved it is alive, in ms; nil when it is not watched.
    public func lastActive(of id: Int) -> UInt64? {
        id < tracked.count && tracked[id] ? lastActive[id] : nil
    }

    /// Stops watching `id`.
    public mutating func untrack(_ id: Int) {
        guard id < tracked.count, tracked[id] else { return }
        tracked[id] = false
        wheel.cancel(id)
    }

    /// Moves time to `nowMs` and appends to `evicted` every watched
    /// connection silent for at least `timeoutMs`. Those stay watched until
    /// the caller untracks them (it closes them).
    public mutating func expire(nowMs: UInt64, into evicted: inout [Int]) {
        wheel.advance(to: nowMs)
        while let id = wheel.popExpired() {
            guard tracked[id] else { continue }
            let deadline = lastActive[id] &+ timeoutMs
            if deadline <= nowMs {
                evicted.append(id)
            } else {
                wheel.schedule(id, at: deadline)
            }
        }
    }

    /// Milliseconds until the next possible eviction, or nil when none is due.
    public func nextTimeout(fromMs nowMs: UInt64) -> UInt64? {
        timeoutMs == 0 ? nil : wheel.nextTimeout(from: nowMs)
    }

    /// Applies a new timeout and tick (reload) to every watched connection,
    /// keeping each one's time of last activity.
    public mutating func reconfigure(timeoutMs: UInt64, tickMs: UInt64, nowMs: UInt64) {
        guard timeoutMs != self.timeoutMs || tickMs != wheel.tickMs else { return }
        self.timeoutMs = timeoutMs
        wheel = TimingWheel(tickMs: tickMs, slotCount: Self.slots(timeoutMs: timeoutMs, tickMs: tickMs), startMs: nowMs)
        guard timeoutMs > 0 else { return }
        for id in tracked.indices where tracked[id] {
            wheel.schedule(id, at: lastActive[id] &+ timeoutMs)
        }
    }
}
