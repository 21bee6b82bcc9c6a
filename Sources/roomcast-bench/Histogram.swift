import Glibc

/// Log-linear latency histogram in nanoseconds (HdrHistogram's idea): exact
/// below 64 ns, then 64 sub-buckets per power of two (under 1.6 % error).
/// Fixed storage, no allocation per sample: one increment per delivery.
struct Histogram {
    private static let subBits = 6
    private static let subCount = 1 << subBits
    private static let bucketCount = (64 - subBits + 1) * subCount
    private let counts: UnsafeMutablePointer<UInt64>
    private(set) var total: UInt64 = 0
    private(set) var maxValue: UInt64 = 0
    private(set) var sum: Double = 0

    init() {
        counts = .allocate(capacity: Self.bucketCount)
        counts.initialize(repeating: 0, count: Self.bucketCount)
    }

    /// Frees the storage; the histogram must not be used afterwards. The
    /// generator keeps its histograms for the whole run; tests release theirs.
    func release() {
        counts.deallocate()
    }

    @inline(__always)
    private static func index(_ v: UInt64) -> Int {
        if v < UInt64(subCount) { return Int(v) }
        let k = 63 - v.leadingZeroBitCount           // >= subBits
        let sub = Int(truncatingIfNeeded: v >> UInt64(k - subBits)) & (subCount - 1)
        return (k - subBits + 1) * subCount + sub
    }

    /// Upper edge of a bucket (the value reported for a percentile in it).
    private static func upperValue(_ i: Int) -> UInt64 {
        if i < subCount { return UInt64(i) }
        let k = i / subCount + subBits - 1
        let sub = UInt64(i % subCount)
        let base = UInt64(1) << UInt64(k)
        let width = UInt64(1) << UInt64(k - subBits)
        return base + sub * width + (width - 1)
    }

    @inline(__always)
    mutating func record(_ v: UInt64) {
        counts[Self.index(v)] &+= 1
        total &+= 1
        sum += Double(v)
        if v > maxValue { maxValue = v }
    }

    /// The value below which `p` (0...1) of the samples fall; 0 when empty.
    func percentile(_ p: Double) -> UInt64 {
        guard total > 0 else { return 0 }
        let rank = max(1, UInt64((Double(total) * p).rounded(.up)))
        var seen: UInt64 = 0
        for i in 0..<Self.bucketCount {
            seen &+= counts[i]
            if seen >= rank { return min(Self.upperValue(i), maxValue) }
        }
        return maxValue
    }

    var mean: Double { total == 0 ? 0 : sum / Double(total) }

    /// Latency summary in microseconds.
    func summary() -> LatencySummary {
        LatencySummary(samples: total, p50: us(percentile(0.50)), p90: us(percentile(0.90)), p99: us(percentile(0.99)),
                       p999: us(percentile(0.999)), max: us(maxValue), mean: mean / 1000)
    }

    private func us(_ ns: UInt64) -> Double { Double(ns) / 1000 }
}

struct LatencySummary {
    var samples: UInt64
    var p50: Double, p90: Double, p99: Double, p999: Double, max: Double, mean: Double
}

/// CLOCK_MONOTONIC in nanoseconds (the clock carried in frame bodies).
@inline(__always)
func monotonicNs() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}
