import Testing
@testable import RoomcastCore

/// Eviction with an injected clock (docs/protocol/rooms.md §5): never early, within
/// timeout + tick, refreshed by any frame, off when the timeout is 0.
@Suite struct LivenessTests {
    /// Advances a fake clock tick by tick and returns when each id was evicted.
    static func run(_ t: inout LivenessTracker, from start: UInt64, to end: UInt64, step: UInt64,
                    touches: [UInt64: [Int]] = [:]) -> [Int: UInt64] {
        var evictedAt: [Int: UInt64] = [:]
        var now = start
        var out: [Int] = []
        while now <= end {
            for id in touches[now] ?? [] { t.touch(id, nowMs: now) }
            out.removeAll()
            t.expire(nowMs: now, into: &out)
            for id in out where evictedAt[id] == nil {
                evictedAt[id] = now
                t.untrack(id)
            }
            now += step
        }
        return evictedAt
    }

    @Test func silentClientEvictedWithinTimeoutPlusTick() {
        var t = LivenessTracker(timeoutMs: 30_000, tickMs: 100, nowMs: 1_000)
        t.track(0, nowMs: 1_000)
        t.track(1, nowMs: 1_050)
        let at = Self.run(&t, from: 1_000, to: 40_000, step: 10)
        for (id, start) in [(0, UInt64(1_000)), (1, 1_050)] {
            let when = try! #require(at[id])
            #expect(when >= start + 30_000, "evicted early")
            #expect(when <= start + 30_000 + 100, "evicted late")
        }
    }

    @Test func anyFrameRefreshes() {
        var t = LivenessTracker(timeoutMs: 1_000, tickMs: 50, nowMs: 0)
        t.track(7, nowMs: 0)
        // Frames at 900 and 1800 keep it alive; silence afterwards evicts at ~2800.
        let at = Self.run(&t, from: 0, to: 5_000, step: 10, touches: [900: [7], 1_800: [7]])
        let when = try! #require(at[7])
        #expect(when >= 2_800 && when <= 2_850)
    }

    @Test func timeoutsLongerThanOneTurnAreNotEarly() {
        // 10 ms tick and a 30 s timeout: far more than one turn of the wheel.
        var t = LivenessTracker(timeoutMs: 30_000, tickMs: 10, nowMs: 0)
        t.track(3, nowMs: 5)
        let at = Self.run(&t, from: 0, to: 31_000, step: 7)
        let when = try! #require(at[3])
        #expect(when >= 30_005 && when <= 30_005 + 10 + 7)
    }

    @Test func untrackedIsNeverEvictedAndZeroDisables() {
        var t = LivenessTracker(timeoutMs: 100, tickMs: 10, nowMs: 0)
        t.track(0, nowMs: 0)
        t.track(1, nowMs: 0)
        t.untrack(1)
        #expect(Self.run(&t, from: 0, to: 500, step: 10).keys.sorted() == [0])

        var off = LivenessTracker(timeoutMs: 0, tickMs: 10, nowMs: 0)
        off.track(0, nowMs: 0)
        #expect(Self.run(&off, from: 0, to: 100_000, step: 1_000).isEmpty)
        #expect(off.nextTimeout(fromMs: 0) == nil)
    }

    @Test func reconfigureKeepsLastActivity() {
        var t = LivenessTracker(timeoutMs: 10_000, tickMs: 100, nowMs: 0)
        t.track(0, nowMs: 0)
        t.touch(0, nowMs: 500)
        t.reconfigure(timeoutMs: 1_000, tickMs: 50, nowMs: 600)
        let at = Self.run(&t, from: 600, to: 3_000, step: 10)
        let when = try! #require(at[0])
        #expect(when >= 1_500 && when <= 1_560)
    }

    /// Refreshing is a field update: a million touches leave the wheel alone.
    @Test func refreshDoesNotTouchTheWheel() {
        var t = LivenessTracker(timeoutMs: 1_000, tickMs: 10, nowMs: 0)
        for id in 0..<1_000 { t.track(id, nowMs: 0) }
        for i in 0..<1_000_000 { t.touch(i % 1_000, nowMs: 500) }
        #expect(t.count == 1_000)
        var out: [Int] = []
        t.expire(nowMs: 1_000, into: &out)
        #expect(out.isEmpty)
        t.expire(nowMs: 1_510, into: &out)
        #expect(out.count == 1_000)
    }
}
