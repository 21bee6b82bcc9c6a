/// A hashed timing wheel holding at most one deadline per id: the heartbeat
/// deadlines of docs/protocol/rooms.md §5 (one per client, O(1) to refresh, no scan of
/// all clients).
///
/// Design, after netty's `HashedWheelTimer` and Linux `kernel/time/timer.c`:
/// - Time is never read here; the caller passes its monotonic clock in ms.
///   Tick `k` covers `[k * tickMs, (k + 1) * tickMs)` on that clock.
/// - A deadline is rounded **up** to the next tick boundary
///   (`ceil(deadline / tickMs) * tickMs`), as Linux timers are: an entry
///   never fires early, and fires at the first `advance(to:)` whose time
///   reaches that boundary, so at most one tick late when the caller
///   advances every tick (`nextTimeout(from:)` says when).
/// - Ids are small dense non-negative `Int`s (connection slot indices, reused
///   after release). Each bucket is an intrusive doubly linked list threaded
///   through flat arrays indexed by id (`next`, `prev`, `deadline`,
///   `bucket`), grown on demand: no allocation per schedule in steady state
///   and no object per entry.
/// - An entry lives in bucket `expiryTick % slotCount` and keeps its absolute
///   deadline, so deadlines longer than one turn (`slotCount * tickMs`) stay
///   in their bucket until their own turn instead of firing early (netty
///   counts remaining rounds; comparing the absolute deadline is the same
///   rule without a counter to keep in sync).
/// - Deadlines already due when scheduled go to an "overdue" list that the
///   next `advance(to:)` reports, whatever time it is given.
///
/// Expiry is pop-style, so the code handling an expiry may freely call
/// `schedule`/`cancel` on the wheel (a closure given to a `mutating` method
/// could not touch the wheel without an exclusivity violation):
/// ```swift
/// wheel.advance(to: nowMs)
/// while let id = wheel.popExpired() { evict(id) }   // evict may cancel/schedule
/// ```
public struct TimingWheel: Sendable {
    /// The resolution in ms: deadlines are rounded up to a multiple of it.
    public let tickMs: UInt64
    /// The number of buckets; one turn of the wheel is `slotCount * tickMs` ms.
    public let slotCount: Int
    /// The number of scheduled entries, including those that `advance(to:)`
    /// found due and `popExpired()` has not yet returned.
    public private(set) var count: Int = 0

    /// Every tick `<= currentTick` has been processed: no entry in the wheel
    /// buckets has an expiry tick `<= currentTick`.
    private(set) var currentTick: UInt64

    // Per-id intrusive list links, indexed by id; -1 means none.
    private var next: [Int] = []
    private var prev: [Int] = []
    /// The list holding the id (a bucket, `overdueList` or `dueList`), or -1.
    private var listOf: [Int] = []
    /// The deadline in ms, as given to `schedule`.
    private var deadlines: [UInt64] = []

    /// List heads: `slotCount` wheel buckets, then the overdue and due lists.
    private var heads: [Int]
    /// One bit per wheel bucket, set when the bucket is not empty, so that
    /// `nextTimeout(from:)` finds the next occupied bucket in slotCount/64 words.
    private var occupied: [UInt64]

    /// Entries scheduled with a deadline already due; moved to `dueList` by
    /// the next `advance(to:)`.
    private var overdueList: Int { slotCount }
    /// Entries found due by `advance(to:)`, returned by `popExpired()`.
    private var dueList: Int { slotCount + 1 }

    /// Buckets visited by `advance(to:)` since creation (for complexity tests).
    internal private(set) var bucketsVisited = 0
    /// Entries examined in visited buckets since creation (for complexity tests).
    internal private(set) var entriesExamined = 0

    /// Creates an empty wheel.
    /// - Parameters:
    ///   - tickMs: the resolution in ms (> 0), e.g. `heartbeat.tick` = 100.
    ///   - slotCount: the number of buckets (> 0), e.g. 512. Memory is
    ///     O(slotCount); `advance(to:)` after a long gap visits at most
    ///     `slotCount` buckets.
    ///   - startMs: the current time in ms on the caller's monotonic clock.
    public init(tickMs: UInt64, slotCount: Int = 512, startMs: UInt64) {
        precondition(tickMs > 0, "TimingWheel: tickMs must be > 0")
        precondition(slotCount > 0, "TimingWheel: slotCount must be > 0")
        self.tickMs = tickMs
        self.slotCount = slotCount
        self.currentTick = startMs / tickMs
        self.heads = Array(repeating: -1, count: slotCount + 2)
        self.occupied = Array(repeating: 0, count: (slotCount + 63) / 64)
    }

    /// Whether `id` has a deadline (including one found due and not yet
    /// popped). O(1).
    public func isScheduled(_ id: Int) -> Bool {
        id >= 0 && id < listOf.count && listOf[id] >= 0
    }

    /// The deadline of `id` in ms, exactly as given to `schedule` (not
    /// rounded), or nil when `id` is not scheduled. O(1).
    public func deadline(of id: Int) -> UInt64? {
        isScheduled(id) ? deadlines[id] : nil
    }

    /// Grows the per-id arrays so that ids `0..<idCount` never allocate.
    public mutating func reserveCapacity(_ idCount: Int) {
        guard idCount > next.count else { return }
        let extra = idCount - next.count
        next += Array(repeating: -1, count: extra)
        prev += Array(repeating: -1, count: extra)
        listOf += Array(repeating: -1, count: extra)
        deadlines += Array(repeating: 0, count: extra)
    }

    /// Schedules `id` (>= 0) to expire at `deadlineMs` (absolute, ms on the
    /// caller's clock), replacing its previous deadline if it had one
    /// (a heartbeat refresh). O(1); re-arming into the same bucket only
    /// updates the stored deadline. Allocates only when `id` is beyond every
    /// id seen so far (the arrays double).
    ///
    /// The entry expires at the first `advance(to:)` whose time reaches
    /// `deadlineMs` rounded up to a tick boundary. A deadline already due
    /// (at or before the last processed tick) is reported by the next
    /// `advance(to:)`, never by the current `popExpired()` loop.
    public mutating func schedule(_ id: Int, at deadlineMs: UInt64) {
        precondition(id >= 0, "TimingWheel: ids are non-negative")
        if id >= next.count { reserveCapacity(Swift.max(id + 1, next.count * 2, 16)) }
        let expiry = expiryTick(deadlineMs)
        let target = expiry <= currentTick ? overdueList : Int(expiry % UInt64(slotCount))
        let current = listOf[id]
        deadlines[id] = deadlineMs
        if current == target { return }
        if current >= 0 { unlink(id) } else { count += 1 }
        link(id, into: target)
    }

    /// Removes `id` if it is scheduled (also when found due but not yet
    /// popped: it is then never reported). O(1).
    public mutating func cancel(_ id: Int) {
        guard isScheduled(id) else { return }
        unlink(id)
        count -= 1
    }

    /// Moves time forward to `nowMs` and marks every entry whose rounded-up
    /// deadline is `<= nowMs` as due; fetch them with `popExpired()`.
    ///
    /// Cost: O(ticks elapsed + entries examined in their buckets), never
    /// O(all entries); after a gap longer than one turn each bucket is
    /// visited once. Time going backwards (or staying in the same tick)
    /// moves nothing, except that overdue entries scheduled since the last
    /// call become due.
    public mutating func advance(to nowMs: UInt64) {
        while heads[overdueList] >= 0 {
            let id = heads[overdueList]
            unlink(id)
            link(id, into: dueList)
        }
        let nowTick = nowMs / tickMs
        guard nowTick > currentTick else { return }
        let elapsed = nowTick - currentTick
        let visits = elapsed >= UInt64(slotCount) ? slotCount : Int(elapsed)
        var slot = Int((currentTick + 1) % UInt64(slotCount))
        for _ in 0..<visits {
            bucketsVisited += 1
            var id = heads[slot]
            while id >= 0 {
                let following = next[id]
                entriesExamined += 1
                // Entries of a later turn share the bucket and stay in it.
                if expiryTick(deadlines[id]) <= nowTick {
                    unlink(id)
                    link(id, into: dueList)
                }
                id = following
            }
            slot += 1
            if slot == slotCount { slot = 0 }
        }
        currentTick = nowTick
    }

    /// Removes and returns one entry found due by `advance(to:)`, or nil when
    /// none is left. O(1). Order among due entries is unspecified.
    ///
    /// The entry is removed before it is returned, so the caller may
    /// re-arm it with `schedule` (it is not returned again until a later
    /// `advance(to:)` finds it due) or `cancel` other ids (a cancelled id
    /// is not returned, even if it was due).
    public mutating func popExpired() -> Int? {
        let id = heads[dueList]
        guard id >= 0 else { return nil }
        unlink(id)
        count -= 1
        return id
    }

    /// Milliseconds from `nowMs` until the next tick boundary at which an
    /// entry may expire, or nil when the wheel is empty; 0 when entries are
    /// due now (call `advance(to:)`). Meant to bound `epoll_wait`'s timeout.
    ///
    /// May be earlier than the real next expiry (the first non-empty bucket
    /// may hold only entries of a later turn, so the answer is at most one
    /// turn away), never later. O(slotCount / 64).
    public func nextTimeout(from nowMs: UInt64) -> UInt64? {
        guard count > 0 else { return nil }
        if heads[dueList] >= 0 || heads[overdueList] >= 0 { return 0 }
        // Every entry in a bucket has an expiry tick > currentTick.
        let (first, overflow) = currentTick.addingReportingOverflow(1)
        guard !overflow else { return 0 }
        let start = Int(first % UInt64(slotCount))
        guard let slot = firstOccupied(atOrAfter: start) else { return 0 }
        let distance = slot >= start ? slot - start : slot + slotCount - start
        let (tick, o1) = first.addingReportingOverflow(UInt64(distance))
        let (boundary, o2) = tick.multipliedReportingOverflow(by: tickMs)
        if o1 || o2 { return UInt64.max - nowMs }
        return boundary > nowMs ? boundary - nowMs : 0
    }

    // MARK: - Internals

    /// `ceil(deadlineMs / tickMs)`: the first tick boundary at or after the deadline.
    private func expiryTick(_ deadlineMs: UInt64) -> UInt64 {
        let (q, r) = deadlineMs.quotientAndRemainder(dividingBy: tickMs)
        return r == 0 ? q : q + 1
    }

    private mutating func link(_ id: Int, into list: Int) {
        let head = heads[list]
        next[id] = head
        prev[id] = -1
        if head >= 0 {
            prev[head] = id
        } else if list < slotCount {
            occupied[list >> 6] |= 1 << UInt64(list & 63)
        }
        heads[list] = id
        listOf[id] = list
    }

    private mutating func unlink(_ id: Int) {
        let list = listOf[id]
        let n = next[id]
        let p = prev[id]
        if p >= 0 {
            next[p] = n
        } else {
            heads[list] = n
            if n < 0 && list < slotCount {
                occupied[list >> 6] &= ~(1 << UInt64(list & 63))
            }
        }
        if n >= 0 { prev[n] = p }
        listOf[id] = -1
    }

    /// The first non-empty bucket at or after `start`, wrapping around.
    private func firstOccupied(atOrAfter start: Int) -> Int? {
        firstOccupied(in: start..<slotCount) ?? firstOccupied(in: 0..<start)
    }

    private func firstOccupied(in range: Range<Int>) -> Int? {
        var i = range.lowerBound
        while i < range.upperBound {
            let bits = occupied[i >> 6] >> UInt64(i & 63)
            if bits != 0 {
                let found = i + bits.trailingZeroBitCount
                return found < range.upperBound ? found : nil
            }
            i = ((i >> 6) + 1) << 6
        }
        return nil
    }
}
