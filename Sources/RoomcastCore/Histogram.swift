// A fixed-bucket histogram of durations, for GET /metrics (Prometheus
// histograms: cumulative `_bucket{le}` counts, `_sum`, `_count`).

/// Durations in µs counted into fixed upper bounds. O(buckets) per record
/// (11 compares), no allocation after init.
public struct DurationHistogram: Equatable, Sendable {
    /// Upper bounds in µs: 10 µs ... 10 s.
    public static let boundsUs: [UInt64] = [10, 50, 100, 500, 1_000, 5_000, 10_000, 50_000, 100_000, 1_000_000, 10_000_000]
    /// Per bucket (not cumulative); the last counts what is over every bound.
    public private(set) var counts = [UInt64](repeating: 0, count: boundsUs.count + 1)
    /// Sum of every duration recorded, µs.
    public private(set) var sumUs: UInt64 = 0
    public private(set) var count: UInt64 = 0

    public init() {}

    public mutating func record(_ us: UInt64) {
        var i = 0
        while i < Self.boundsUs.count && us > Self.boundsUs[i] { i += 1 }
        counts[i] &+= 1
        sumUs &+= us
        count &+= 1
    }

    /// The exposition lines of `name` (without `# HELP`/`# TYPE`), bounds in seconds.
    public func exposition(_ name: String) -> String {
        var out = ""
        var cumulative: UInt64 = 0
        for (i, bound) in Self.boundsUs.enumerated() {
            cumulative &+= counts[i]
            out += "\(name)_bucket{le=\"\(seconds(bound))\"} \(cumulative)\n"
        }
        out += "\(name)_bucket{le=\"+Inf\"} \(count)\n\(name)_sum \(seconds(sumUs))\n\(name)_count \(count)\n"
        return out
    }

    private func seconds(_ us: UInt64) -> String {
        let whole = us / 1_000_000, frac = us % 1_000_000
        if frac == 0 { return "\(whole)" }
        var f = String(frac)
        f = String(repeating: "0", count: 6 - f.count) + f
        while f.hasSuffix("0") { f.removeLast() }
        return "\(whole).\(f)"
    }
}
