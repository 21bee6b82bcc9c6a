/// A token bucket for per-connection rate limits (`[limits]
/// frames_per_second`, `bytes_per_second`): `rate` tokens per second, at most
/// `burst` saved up. Time is passed in (ms on the caller's monotonic clock);
/// integer arithmetic in milli-tokens, so nothing drifts or traps.
public struct TokenBucket: Equatable, Sendable {
    /// Tokens added per second (> 0).
    public let rate: Int
    /// Largest number of tokens held (> 0).
    public let burst: Int
    private var milliTokens: Int
    private var lastMs: UInt64

    /// A full bucket at `nowMs`.
    public init(rate: Int, burst: Int, nowMs: UInt64) {
        precondition(rate > 0 && burst > 0)
        self.rate = rate
        self.burst = burst
        self.milliTokens = burst.multipliedReportingOverflow(by: 1000).overflow ? Int.max : burst * 1000
        self.lastMs = nowMs
    }

    /// A bucket holding `milliTokens` (at most the burst) at `nowMs`: a
    /// connection's rate-limit state carried over a restart.
    public init(rate: Int, burst: Int, milliTokens: Int, nowMs: UInt64) {
        self.init(rate: rate, burst: burst, nowMs: nowMs)
        self.milliTokens = max(0, min(self.milliTokens, milliTokens))
    }

    /// The tokens held at `nowMs`, in thousandths of a token (refilled up to then).
    public mutating func milliTokens(nowMs: UInt64) -> Int {
        _ = take(0, nowMs: nowMs)
        return milliTokens
    }

    /// Takes `n` tokens if the bucket holds them; returns false (taking
    /// nothing) otherwise. O(1).
    public mutating func take(_ n: Int, nowMs: UInt64) -> Bool {
        if nowMs > lastMs {
            let elapsed = Int(min(nowMs - lastMs, 86_400_000))
            let (refill, overflow) = rate.multipliedReportingOverflow(by: elapsed)  // ms × tokens/s = milli-tokens
            let cap = burst.multipliedReportingOverflow(by: 1000).overflow ? Int.max : burst * 1000
            milliTokens = overflow ? cap : min(cap, milliTokens.addingReportingOverflow(refill).overflow ? cap : milliTokens + refill)
            lastMs = nowMs
        }
        let (cost, overflow) = n.multipliedReportingOverflow(by: 1000)
        guard !overflow, cost <= milliTokens else { return false }
        milliTokens -= cost
        return true
    }
}
