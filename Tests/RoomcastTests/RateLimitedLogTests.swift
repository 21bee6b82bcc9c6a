// RateLimitedLog (issue 28, item 11): a repeating condition is said once,
// then at most once per interval with the count, then once when it ends.
// The clock is the caller's, so this runs in no time.
import Testing
@testable import RoomcastServer

@Suite struct RateLimitedLogTests {
    @Test("once, then once a minute with the count of the occurrences since, then once at the end; a new condition starts over")
    func oncePerMinuteWithCount() {
        var log = RateLimitedLog()
        #expect(log.ended(nowMs: 0) == nil, "nothing to say before it occurred")
        #expect(log.occurred(nowMs: 1_000) == .first)
        var quiet = 0
        for t in stride(from: UInt64(1_500), to: 61_000, by: 500) where log.occurred(nowMs: t) == .quiet { quiet += 1 }
        #expect(quiet == 119, "every attempt in the first minute is counted, not said")
        #expect(log.occurred(nowMs: 61_000) == .again(count: 120, sinceMs: 60_000))
        #expect(log.occurred(nowMs: 62_000) == .quiet)
        #expect(log.occurred(nowMs: 130_000) == .again(count: 2, sinceMs: 69_000))
        let over = log.ended(nowMs: 131_000)
        #expect(over?.count == 123 && over?.lastedMs == 130_000)
        #expect(log.ended(nowMs: 132_000) == nil, "said once")
        #expect(log.occurred(nowMs: 133_000) == .first, "a new refusal is said at once")
    }
}
