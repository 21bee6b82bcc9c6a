import Testing
@testable import RoomcastCore

// Tests for TimingWheel (docs/protocol/rooms.md §5). Time is injected: nothing sleeps.

/// The deadline rounded up to the tick boundary at which it fires.
private func roundUp(_ deadline: UInt64, _ tick: UInt64) -> UInt64 {
    (deadline + tick - 1) / tick * tick
}

/// Advances and pops everything due, without touching the wheel in between.
private func advance(_ wheel: inout TimingWheel, to now: UInt64) -> Set<Int> {
    wheel.advance(to: now)
    var fired: Set<Int> = []
    while let id = wheel.popExpired() {
        #expect(fired.insert(id).inserted, "id \(id) reported twice")
    }
    return fired
}

@Suite struct TimingWheelTests {

    @Test func firesAtRoundedDeadlineNeverBefore() {
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        w.schedule(1, at: 30)  // on a boundary
        w.schedule(2, at: 31)  // rounds up to 40
        #expect(w.count == 2)
        #expect(w.deadline(of: 2) == 31)
        #expect(advance(&w, to: 29).isEmpty)
        #expect(advance(&w, to: 30) == [1])
        #expect(advance(&w, to: 31).isEmpty)  // deadline reached, boundary not yet
        #expect(advance(&w, to: 39).isEmpty)
        #expect(w.isScheduled(2))
        #expect(advance(&w, to: 40) == [2])
        #expect(w.count == 0)
        #expect(!w.isScheduled(1) && !w.isScheduled(2))
        #expect(w.deadline(of: 1) == nil)
        #expect(advance(&w, to: 1000).isEmpty)
    }

    @Test func startInTheMiddleOfATick() {
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 12_345)
        w.schedule(1, at: 12_347)  // rounds up to 12_350
        w.schedule(2, at: 12_000)  // already past: reported by the next advance
        #expect(w.nextTimeout(from: 12_345) == 0)
        #expect(advance(&w, to: 12_345) == [2])
        #expect(w.nextTimeout(from: 12_345) == 5)
        #expect(advance(&w, to: 12_349).isEmpty)
        #expect(advance(&w, to: 12_350) == [1])
    }

    @Test func refreshReplacesTheDeadline() {
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        w.schedule(1, at: 100)
        #expect(advance(&w, to: 95).isEmpty)
        w.schedule(1, at: 180)  // same bucket (tick 18 % 8 == tick 10 % 8): a field update
        #expect(w.count == 1)
        #expect(w.deadline(of: 1) == 180)
        #expect(advance(&w, to: 100).isEmpty)
        #expect(advance(&w, to: 179).isEmpty)
        #expect(advance(&w, to: 180) == [1])

        w.schedule(2, at: 300)
        w.schedule(2, at: 250)  // earlier, other bucket
        #expect(advance(&w, to: 249).isEmpty)
        #expect(advance(&w, to: 250) == [2])

        // Lazy refresh: many refreshes of a live id, it never fires while refreshed.
        w.schedule(3, at: 280)
        var now: UInt64 = 250
        for _ in 0..<100 {
            now += 7
            w.schedule(3, at: now + 30)
            #expect(advance(&w, to: now).isEmpty)
        }
        #expect(w.count == 1)
        #expect(advance(&w, to: now + 30) == [3])
    }

    @Test func cancel() {
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        w.cancel(5)       // never scheduled: no-op
        w.cancel(-1)      // out of range: no-op
        w.cancel(1 << 40)
        w.schedule(1, at: 50)
        w.schedule(2, at: 50)
        w.schedule(3, at: 50)
        w.cancel(2)
        w.cancel(2)
        #expect(w.count == 2)
        #expect(!w.isScheduled(2))
        #expect(advance(&w, to: 50) == [1, 3])
        // Cancel an id that is overdue (scheduled in the past).
        w.schedule(4, at: 10)
        w.cancel(4)
        #expect(w.nextTimeout(from: 50) == nil)
        #expect(advance(&w, to: 60).isEmpty)
        #expect(w.count == 0)
    }

    @Test func idsReusedAfterExpiryAndCancel() {
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        w.schedule(7, at: 20)
        #expect(advance(&w, to: 20) == [7])
        w.schedule(7, at: 40)  // reused slot after expiry
        #expect(advance(&w, to: 30).isEmpty)
        #expect(advance(&w, to: 40) == [7])
        w.schedule(7, at: 100)
        w.cancel(7)
        w.schedule(7, at: 60)  // reused after cancel
        #expect(advance(&w, to: 60) == [7])
        #expect(advance(&w, to: 200).isEmpty)
        // Growth to a large id keeps smaller ones intact.
        w.schedule(3, at: 300)
        w.schedule(1_000_000, at: 300)
        #expect(w.isScheduled(3) && w.isScheduled(1_000_000))
        #expect(!w.isScheduled(999_999))
        #expect(advance(&w, to: 300) == [3, 1_000_000])
    }

    @Test func deadlinesOfSeveralTurns() {
        // One turn is 8 * 10 = 80 ms; 1000 ms is 12.5 turns away.
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        w.schedule(1, at: 1000)
        w.schedule(2, at: 995)   // rounds up to 1000 too
        w.schedule(3, at: 1001)  // rounds up to 1010
        w.schedule(4, at: 40)    // same bucket as 1000 (tick 4 and tick 100, % 8)
        var now: UInt64 = 0
        var fired: [UInt64: Set<Int>] = [:]
        while now < 1100 {
            now += 10
            let ids = advance(&w, to: now)
            if !ids.isEmpty { fired[now] = ids }
        }
        #expect(fired == [40: [4], 1000: [1, 2], 1010: [3]])

        // Jumps: straight to just before, then to the deadline.
        var v = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        v.schedule(1, at: 1000)
        #expect(advance(&v, to: 999).isEmpty)
        #expect(advance(&v, to: 1000) == [1])
        // A jump past it.
        v.schedule(2, at: 2000)
        #expect(advance(&v, to: 1995).isEmpty)
        #expect(advance(&v, to: 2005) == [2])
    }

    @Test func bigTimeJumpsVisitEachBucketOnce() {
        var w = TimingWheel(tickMs: 10, slotCount: 16, startMs: 0)
        var rng = SeededGenerator(state: 7)
        var expected: [Int: UInt64] = [:]
        for id in 0..<1000 {
            let d = rng.next() % 100_000
            w.schedule(id, at: d)
            expected[id] = d
        }
        let visited = w.bucketsVisited
        let examined = w.entriesExamined
        // 50_000 ms = 5000 ticks = 312 turns: each bucket visited once.
        let fired = advance(&w, to: 50_000)
        #expect(w.bucketsVisited - visited == 16)
        #expect(w.entriesExamined - examined == 1000)
        #expect(fired == Set(expected.filter { roundUp($0.value, 10) <= 50_000 }.keys))
        let rest = advance(&w, to: 10_000_000)
        #expect(fired.union(rest) == Set(expected.keys))
        #expect(fired.isDisjoint(with: rest))
        #expect(w.count == 0)
    }

    @Test func timeGoingBackwardsIsIgnored() {
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        #expect(advance(&w, to: 500).isEmpty)
        w.schedule(1, at: 600)
        #expect(advance(&w, to: 300).isEmpty)
        // Conservative: the bucket of tick 60 is first met as tick 52's.
        #expect(w.nextTimeout(from: 300) == 220)
        #expect(advance(&w, to: 599).isEmpty)
        #expect(advance(&w, to: 550).isEmpty)
        #expect(advance(&w, to: 600) == [1])
        // The wheel's time stays at its maximum: a deadline before it is due,
        // and reported by the next advance even if that one goes backwards.
        w.schedule(2, at: 400)
        #expect(advance(&w, to: 100) == [2])
        w.schedule(3, at: 605)  // rounds up to 610, after the wheel's time
        #expect(advance(&w, to: 100).isEmpty)
        #expect(advance(&w, to: 610) == [3])
    }

    @Test func expiryHandlerMayMutateTheWheel() {
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        for id in 1...4 { w.schedule(id, at: 50) }
        w.advance(to: 50)
        #expect(w.count == 4)  // due but not yet popped: still scheduled
        let first = w.popExpired()!
        #expect(!w.isScheduled(first))
        #expect(w.count == 3)
        // Re-arm the popped id into the future: not reported again now.
        w.schedule(first, at: 80)
        // Cancel one due id, push another to the future, one into the past.
        let others = [1, 2, 3, 4].filter { $0 != first }
        w.cancel(others[0])
        w.schedule(others[1], at: 90)
        w.schedule(others[2], at: 20)  // already due: reported by the next advance
        #expect(w.popExpired() == nil)
        #expect(w.count == 3)
        #expect(advance(&w, to: 50) == [others[2]])
        #expect(advance(&w, to: 79).isEmpty)
        #expect(advance(&w, to: 80) == [first])
        #expect(advance(&w, to: 90) == [others[1]])
        #expect(w.count == 0)
    }

    @Test func nextTimeout() {
        var w = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        #expect(w.nextTimeout(from: 0) == nil)
        w.schedule(1, at: 25)
        #expect(w.nextTimeout(from: 0) == 30)
        #expect(w.nextTimeout(from: 7) == 23)
        #expect(w.nextTimeout(from: 30) == 0)  // late caller: wake now
        #expect(w.nextTimeout(from: 45) == 0)
        w.schedule(2, at: 12)
        #expect(w.nextTimeout(from: 0) == 20)
        w.advance(to: 20)
        #expect(w.nextTimeout(from: 20) == 0)  // popped nothing yet: due now
        #expect(w.popExpired() == 2)
        #expect(w.nextTimeout(from: 20) == 10)
        w.cancel(1)
        #expect(w.nextTimeout(from: 20) == nil)

        // Beyond one turn the answer is conservative (earlier), never later,
        // and following it like an epoll loop fires exactly on time.
        var v = TimingWheel(tickMs: 10, slotCount: 8, startMs: 0)
        v.schedule(9, at: 1000)
        var now: UInt64 = 0
        var wakeups = 0
        var firedAt: UInt64?
        while firedAt == nil, let timeout = v.nextTimeout(from: now) {
            #expect(timeout > 0)  // never a busy loop
            #expect(now + timeout <= 1000)
            now += timeout
            wakeups += 1
            if advance(&v, to: now) == [9] { firedAt = now }
        }
        #expect(firedAt == 1000)
        #expect(wakeups <= 1000 / 80 + 1)
        #expect(v.nextTimeout(from: now) == nil)
    }

    @Test func hundredThousandIds() {
        let tick: UInt64 = 100
        var w = TimingWheel(tickMs: tick, slotCount: 512, startMs: 1_000)
        var rng = SeededGenerator(state: 42)
        let n = 100_000
        var deadlines = [UInt64](repeating: 0, count: n)
        for id in 0..<n {
            deadlines[id] = 1_000 + 30_000 + rng.next() % 150_000  // up to ~3.5 turns
            w.schedule(id, at: deadlines[id])
        }
        #expect(w.count == n)
        var firedCount = 0
        var seen = [Bool](repeating: false, count: n)
        var previous: UInt64 = 1_000
        var now: UInt64 = 1_000
        while now < 200_000 {
            now += 1 + rng.next() % 250
            w.advance(to: now)
            while let id = w.popExpired() {
                let rounded = roundUp(deadlines[id], tick)
                if seen[id] || deadlines[id] > now || rounded > now || rounded <= previous {
                    Issue.record("id \(id) deadline \(deadlines[id]) fired at \(now), previous \(previous)")
                }
                seen[id] = true
                firedCount += 1
            }
            previous = now
        }
        #expect(firedCount == n)
        #expect(w.count == 0)

        // Reuse every id; cancel the odd ones: only the even ones fire.
        for id in 0..<n { w.schedule(id, at: now + 5_000 + UInt64(id % 1000)) }
        for id in stride(from: 1, to: n, by: 2) { w.cancel(id) }
        #expect(w.count == n / 2)
        let fired = advance(&w, to: now + 10_000)
        #expect(fired.count == n / 2)
        #expect(fired.allSatisfy { $0 % 2 == 0 })
    }

    /// advance over one tick examines only the entries of that tick's bucket,
    /// not the 100k far-future entries elsewhere (counters, not timing).
    @Test func advanceCostIsBoundedByTheBucket() {
        var w = TimingWheel(tickMs: 10, slotCount: 512, startMs: 0)
        for id in 0..<100_000 {
            // Ticks with residue 3...511, one to five turns ahead.
            let tick = UInt64(3 + id % 509) + 512 * UInt64(1 + id % 5)
            w.schedule(id, at: tick * 10)
        }
        // Bucket 1: five entries due at tick 1, three of a later turn (tick 513).
        for id in 100_000..<100_005 { w.schedule(id, at: 10) }
        for id in 100_005..<100_008 { w.schedule(id, at: 5_130) }
        let visited = w.bucketsVisited
        let examined = w.entriesExamined
        let fired = advance(&w, to: 10)
        #expect(fired == Set(100_000..<100_005))
        #expect(w.bucketsVisited - visited == 1)
        #expect(w.entriesExamined - examined == 8)
        // The next tick's bucket is empty: nothing examined.
        #expect(advance(&w, to: 20).isEmpty)
        #expect(w.bucketsVisited - visited == 2)
        #expect(w.entriesExamined - examined == 8)
        // Refreshing O(1): rescheduling does not visit anything.
        for id in 0..<100_000 { w.schedule(id, at: 6 * 5_120) }
        #expect(w.bucketsVisited - visited == 2)
        #expect(w.entriesExamined - examined == 8)
        // A jump of many turns visits each bucket once, each entry once.
        let all = advance(&w, to: 100 * 5_120)
        #expect(all.count == 100_003)
        #expect(w.bucketsVisited - visited == 2 + 512)
        #expect(w.entriesExamined - examined == 8 + 100_003)
    }

    /// Random schedule/reschedule/cancel/advance sequences against a
    /// reference model (a dictionary id -> deadline). With T the largest time
    /// given so far, advance(to:) must report exactly the entries with
    /// roundUp(deadline) <= T not reported before. That implies "never
    /// early" (deadline <= T) and "at most one tick late" (an entry left
    /// has deadline > T - tick), both also checked directly. The expiry
    /// handler mutates the wheel at random.
    @Test(arguments: zip([10, 7, 100, 1, 3] as [UInt64], [8, 5, 512, 1, 64]))
    func matchesReferenceModel(tick: UInt64, slots: Int) {
        for seed in 1...6 as ClosedRange<UInt64> {
            var rng = SeededGenerator(state: seed &* 0x1234_5678 &+ tick)
            let start = 1_000 + rng.next() % 1_000
            let turn = tick * UInt64(slots)
            var w = TimingWheel(tickMs: tick, slotCount: slots, startMs: start)
            var ref: [Int: UInt64] = [:]
            var now = start       // the largest time given so far
            let ids = 0..<40
            func randomFuture() -> UInt64 {
                switch rng.next() % 4 {
                case 0: return now + 1 + rng.next() % (2 * tick)
                case 1: return now + 1 + rng.next() % (5 * turn)
                default: return now + 1 + rng.next() % (turn + tick)
                }
            }
            for _ in 0..<2_500 {
                switch rng.next() % 10 {
                case 0...3:  // schedule or reschedule
                    let id = Int.random(in: ids, using: &rng)
                    let d = rng.next() % 8 == 0 ? now - rng.next() % (2 * tick + 1) : randomFuture()
                    w.schedule(id, at: d)
                    ref[id] = d
                case 4:
                    let id = Int.random(in: ids, using: &rng)
                    w.cancel(id)
                    ref[id] = nil
                default:  // advance: small steps, big jumps, or backwards
                    let t: UInt64
                    switch rng.next() % 10 {
                    case 0: t = now - rng.next() % (3 * tick + 1)
                    case 1: t = now + rng.next() % (7 * turn)
                    default: t = now + rng.next() % (2 * tick)
                    }
                    w.advance(to: t)
                    now = max(now, t)
                    var pending = Set(ref.filter { roundUp($0.value, tick) <= now }.keys)
                    for (id, d) in ref where !pending.contains(id) && now >= tick {
                        #expect(d > now - tick, "id \(id) deadline \(d) more than a tick late at \(now)")
                    }
                    var reported: Set<Int> = []
                    while let id = w.popExpired() {
                        #expect(pending.remove(id) != nil, "id \(id) reported but not due at \(now)")
                        #expect(reported.insert(id).inserted)
                        #expect((ref[id] ?? .max) <= now, "id \(id) reported early")
                        #expect(!w.isScheduled(id))
                        ref[id] = nil
                        // The handler mutates the wheel.
                        let other = Int.random(in: ids, using: &rng)
                        switch rng.next() % 6 {
                        case 0:  // re-arm the same id into the future
                            let d = randomFuture()
                            w.schedule(id, at: d)
                            ref[id] = d
                        case 1:
                            w.cancel(other)
                            ref[other] = nil
                            pending.remove(other)
                        case 2:
                            let d = randomFuture()
                            w.schedule(other, at: d)
                            ref[other] = d
                            pending.remove(other)
                        case 3:  // into the past: reported by the next advance
                            let d = now - rng.next() % (2 * tick + 1)
                            w.schedule(other, at: d)
                            ref[other] = d
                            pending.remove(other)
                        default:
                            break
                        }
                    }
                    #expect(pending.isEmpty, "due but not reported: \(pending)")
                }
                // The wheel agrees with the model.
                #expect(w.count == ref.count)
                for id in ids { #expect(w.deadline(of: id) == ref[id]) }
                let timeout = w.nextTimeout(from: now)
                if let earliest = ref.values.map({ roundUp($0, tick) }).min() {
                    let bound = earliest > now ? earliest - now : 0
                    #expect(timeout != nil && timeout! <= bound)
                    if bound > 0 { #expect(timeout! > 0) }
                } else {
                    #expect(timeout == nil)
                }
            }
        }
    }
}
