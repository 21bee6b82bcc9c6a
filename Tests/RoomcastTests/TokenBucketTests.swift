import Testing
@testable import RoomcastCore

/// `#expect` cannot call a mutating method on a local directly.
private func take(_ b: inout TokenBucket, _ n: Int, nowMs: UInt64) -> Bool { b.take(n, nowMs: nowMs) }

/// Per-connection rate limits with an injected clock.
@Suite struct TokenBucketTests {
    @Test func burstThenRate() {
        var b = TokenBucket(rate: 10, burst: 5, nowMs: 1_000)
        for i in 0..<5 { #expect(take(&b, 1, nowMs: 1_000), "token \(i) of the burst") }
        #expect(!take(&b, 1, nowMs: 1_000), "burst spent")
        #expect(!take(&b, 1, nowMs: 1_099), "0.99 tokens after 99 ms")
        #expect(take(&b, 1, nowMs: 1_100), "one token per 100 ms")
        #expect(!take(&b, 1, nowMs: 1_100))
        // Never more than the burst, however long the pause.
        #expect(take(&b, 5, nowMs: 100_000_000))
        #expect(!take(&b, 1, nowMs: 100_000_000))
    }

    @Test func largeTakesAndHostileValues() {
        var b = TokenBucket(rate: 1_000_000, burst: 65_542, nowMs: 0)
        #expect(take(&b, 65_542, nowMs: 0))
        #expect(!take(&b, 65_542, nowMs: 1), "1 ms refills 1000 bytes only")
        #expect(take(&b, 65_542, nowMs: 70))
        #expect(!take(&b, Int.max, nowMs: 1_000_000), "no overflow trap")
        var huge = TokenBucket(rate: 1 << 40, burst: 1 << 40, nowMs: 0)
        #expect(take(&huge, 1 << 40, nowMs: UInt64.max), "no overflow on refill either")
        #expect(take(&b, 65_542, nowMs: 1_000_000))
        #expect(!take(&b, 1, nowMs: 10), "time going backwards adds nothing")
    }
}
