// RateLimitedLog.swift: the log of a condition that repeats until someone
// fixes it (a Redis that refuses every connection attempt: protected mode,
// a password or an ACL the daemon lacks; issue 28, item 11): said once when
// it starts, with what was said; then at most once per interval, with how
// many times it happened since; and once when it is over. Pure: the caller
// passes the clock and writes the lines, so any subsystem can adopt it for
// its own condition (one value per condition).

/// The state of one repeating condition's log lines.
struct RateLimitedLog: Equatable {
    /// What the caller should log for an occurrence.
    enum Say: Equatable {
        /// The first occurrence since the condition began: say it in full.
        case first
        /// `count` occurrences (this one included) since the condition was
        /// last said, `sinceMs` ago: say they go on, with the count.
        case again(count: Int, sinceMs: UInt64)
        /// Nothing: it was said less than `intervalMs` ago (counted).
        case quiet
    }

    /// The least time between two lines of one condition, in ms (a minute by default).
    let intervalMs: UInt64
    /// The condition is on: occurred, and not ended since.
    private(set) var active = false
    /// Occurrences since it began.
    private(set) var total = 0
    /// When it began and was last said, in ms.
    private(set) var beganMs: UInt64 = 0
    /// When it was last said, in ms.
    private(set) var saidMs: UInt64 = 0
    /// Occurrences since it was last said (not said themselves).
    private var unsaid = 0

    init(intervalMs: UInt64 = 60_000) {
        self.intervalMs = intervalMs
    }

    /// One more occurrence at `nowMs` (a monotonic clock, ms).
    mutating func occurred(nowMs: UInt64) -> Say {
        total += 1
        guard active else {
            active = true
            total = 1
            beganMs = nowMs
            saidMs = nowMs
            unsaid = 0
            return .first
        }
        unsaid += 1
        guard nowMs &- saidMs >= intervalMs else { return .quiet }
        defer { saidMs = nowMs; unsaid = 0 }
        return .again(count: unsaid, sinceMs: nowMs &- saidMs)
    }

    /// The condition is over at `nowMs` (what failed works): the
    /// occurrences since it began and how long it lasted, to say once;
    /// nil when it was not on (nothing to say).
    mutating func ended(nowMs: UInt64) -> (count: Int, lastedMs: UInt64)? {
        guard active else { return nil }
        active = false
        return (total, nowMs &- beganMs)
    }
}

/// The log lines of one condition for each of many keys (a peer's address):
/// each key limited as one `RateLimitedLog` (said, then at most once per
/// `intervalMs`), at most `capacity` keys remembered so that a scan from
/// many addresses costs bounded memory. When the table is full of keys said
/// within the interval, a new key is not said (nor remembered) until some
/// of them are older: the journal then hears from the first `capacity`
/// addresses a minute. Used by the `[auth]`, moderation and `proxy_from`
/// refusals (docs/protocol/notices.md, docs/operations/network.md).
struct RateLimitedLogs<Key: Hashable> {
    /// The least time between two lines of one key, in ms.
    let intervalMs: UInt64
    /// Keys remembered, at most.
    let capacity: Int
    private var logs: [Key: RateLimitedLog] = [:]

    init(intervalMs: UInt64 = 60_000, capacity: Int = 4_096) {
        self.intervalMs = intervalMs
        self.capacity = capacity
    }

    /// Keys remembered now.
    var count: Int { logs.count }

    /// Whether an occurrence of `key` at `nowMs` (a monotonic clock, ms) is
    /// to be logged: its first, and then one at least `intervalMs` after the
    /// one last logged; the others are counted in its `RateLimitedLog`.
    mutating func mayLog(_ key: Key, nowMs: UInt64) -> Bool {
        if logs[key] == nil && logs.count >= capacity {
            // Keys said longer than an interval ago would be said again anyway: forgotten.
            logs = logs.filter { nowMs &- $0.value.saidMs < intervalMs }
            if logs.count >= capacity { return false }
        }
        return logs[key, default: RateLimitedLog(intervalMs: intervalMs)].occurred(nowMs: nowMs) != .quiet
    }
}
