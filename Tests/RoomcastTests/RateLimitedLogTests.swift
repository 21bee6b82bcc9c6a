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

    @Test("per key: each address said once a minute on its own clock; a table full of addresses said this minute says no new one, and forgets the old ones")
    func perKeyOncePerMinuteBounded() {
        var logs = RateLimitedLogs<String>(intervalMs: 60_000, capacity: 3)
        func say(_ key: String, _ nowMs: UInt64) -> Bool { logs.mayLog(key, nowMs: nowMs) }
        #expect(say("a", 1_000))
        #expect(!say("a", 60_999), "said less than a minute ago")
        #expect(say("b", 30_000), "another address has its own minute")
        #expect(say("a", 61_000))
        #expect(!say("b", 61_000))
        #expect(say("c", 62_000))
        #expect(!say("d", 62_000), "full of addresses said this minute: a new one is not said")
        #expect(logs.count == 3, "nor remembered")
        #expect(say("d", 95_000), "b was said over a minute ago: forgotten, room for d")
        #expect(logs.count == 3)
        #expect(say("b", 122_000), "a and c are over a minute old: forgotten when a new address needs the room")
    }
}
