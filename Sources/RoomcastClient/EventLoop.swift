import Glibc
import RoomcastIO

/// Readiness of a watched descriptor, as handed to a watch handler:
/// `.readable`, `.writable`, `.hangup` (EPOLLHUP or EPOLLERR: read to learn
/// the error or EOF, then close). The selector's own type.
public typealias IOReadiness = Readiness

/// A registration of a descriptor with an `EventLoop`. Stale ids (after
/// `unwatch`) are ignored by every call, so a handler may drop its own watch.
public struct WatchID: Hashable, Sendable {
    fileprivate let slot: Int
    fileprivate let generation: UInt32
}

/// A pending one-shot timer of an `EventLoop`.
public struct TimerID: Hashable, Sendable {
    fileprivate let value: UInt64
}

/// A single-threaded event loop: level-triggered epoll for descriptors plus
/// one-shot timers on the monotonic clock, in milliseconds.
///
/// Threading: not thread-safe and not `Sendable`. Create it, and everything
/// that uses it (`RoomcastClient`s, watches, timers), on one thread and drive
/// it from that thread with `run(timeoutMs:until:)` or `runOnce(maxWaitMs:)`.
/// Handlers run on that thread, inside those calls, one at a time.
///
/// Timers are kept in a small array (O(n) per wakeup): a client has a handful.
/// A timer never fires early; one scheduled from a handler with a 0 ms delay
/// fires on the next iteration, never inside the current one.
public final class EventLoop {
    private struct Watch {
        var fd: Int32 = -1
        var generation: UInt32 = 0
        var handler: ((IOReadiness) -> Void)?
    }

    private struct Timer {
        var id: UInt64
        var deadline: UInt64
        var action: () -> Void
    }

    private let selector: Selector
    private let clock: () -> UInt64
    private var watches: [Watch] = []
    private var freeSlots: [Int] = []
    private var timers: [Timer] = []
    private var nextTimerID: UInt64 = 1
    private var stopRequested = false

    /// - Parameter clock: monotonic time in milliseconds (injectable for tests).
    /// - Throws: `ClientError.system` if epoll_create1 fails (e.g. EMFILE).
    public init(clock: @escaping () -> UInt64 = monotonicMilliseconds) throws(ClientError) {
        do { selector = try Selector(capacity: 64) } catch { throw ClientError(error) }
        self.clock = clock
    }

    /// The loop's clock, in milliseconds (CLOCK_MONOTONIC by default).
    public var nowMs: UInt64 { clock() }

    // MARK: - Descriptors

    /// Starts reporting readiness of `fd` to `handler`. The loop never closes
    /// `fd`; call `unwatch` before closing it.
    /// - Throws: `ClientError.system` if epoll_ctl refuses the descriptor.
    public func watch(_ fd: Int32, readable: Bool = true, writable: Bool = false,
                      _ handler: @escaping (IOReadiness) -> Void) throws(ClientError) -> WatchID {
        let slot: Int
        if let free = freeSlots.popLast() {
            slot = free
        } else {
            slot = watches.count
            watches.append(Watch())
        }
        watches[slot].fd = fd
        watches[slot].handler = handler
        let id = WatchID(slot: slot, generation: watches[slot].generation)
        do {
            try selector.register(fd, token: token(id), readable: readable, writable: writable)
        } catch {
            release(slot)
            throw ClientError(error)
        }
        return id
    }

    /// Changes the readiness reported for a watch (e.g. arms writability only
    /// while output is queued). A stale id is ignored.
    /// - Throws: `ClientError.system` if epoll_ctl fails.
    public func update(_ id: WatchID, readable: Bool, writable: Bool) throws(ClientError) {
        guard isLive(id) else { return }
        do {
            try selector.modify(watches[id.slot].fd, token: token(id), readable: readable, writable: writable)
        } catch {
            throw ClientError(error)
        }
    }

    /// Stops reporting a descriptor. Events already collected for it in the
    /// current batch are dropped. A stale id is ignored.
    public func unwatch(_ id: WatchID) {
        guard isLive(id) else { return }
        selector.deregister(watches[id.slot].fd)
        release(id.slot)
    }

    private func isLive(_ id: WatchID) -> Bool {
        id.slot < watches.count && watches[id.slot].generation == id.generation && watches[id.slot].handler != nil
    }

    private func release(_ slot: Int) {
        watches[slot] = Watch(fd: -1, generation: watches[slot].generation &+ 1, handler: nil)
        freeSlots.append(slot)
    }

    private func token(_ id: WatchID) -> UInt64 { UInt64(id.generation) << 32 | UInt64(UInt32(id.slot)) }

    /// Drops every watch and timer, and with them their handlers, for a loop
    /// that is done: handlers usually capture the objects that own the loop,
    /// and this breaks those reference cycles. Descriptors are not closed.
    public func removeAll() {
        for slot in watches.indices where watches[slot].handler != nil {
            selector.deregister(watches[slot].fd)
            release(slot)
        }
        timers.removeAll()
    }

    // MARK: - Timers

    /// Runs `action` once, no earlier than `afterMs` milliseconds from now.
    @discardableResult
    public func schedule(afterMs: UInt64, _ action: @escaping () -> Void) -> TimerID {
        let id = nextTimerID
        nextTimerID += 1
        let now = clock()
        timers.append(Timer(id: id, deadline: now &+ afterMs < now ? .max : now &+ afterMs, action: action))
        return TimerID(value: id)
    }

    /// Cancels a timer; a timer that already fired or was cancelled is ignored.
    public func cancel(_ id: TimerID) {
        timers.removeAll { $0.id == id.value }
    }

    // MARK: - Running

    /// One iteration: waits for readiness at most `maxWaitMs` (-1: until the
    /// next timer or forever) and at most until the earliest timer, runs the
    /// handlers of ready descriptors, then the timers that are due.
    /// - Throws: `ClientError.system` if epoll_wait fails (EINTR is not a failure).
    public func runOnce(maxWaitMs: Int32 = -1) throws(ClientError) {
        var timeout = maxWaitMs
        if let earliest = timers.lazy.map(\.deadline).min() {
            let now = clock()
            let untilTimer = Int32(clamping: earliest > now ? earliest - now : 0)
            timeout = timeout < 0 ? untilTimer : min(timeout, untilTimer)
        }
        do {
            try selector.wait(timeoutMs: timeout) { token, readiness in
                dispatch(token, readiness)
            }
        } catch {
            throw ClientError(error)
        }
        fireDueTimers()
    }

    /// Runs iterations until `done()` is true, `stop()` is called, or
    /// `timeoutMs` milliseconds pass (nil: no limit).
    /// - Returns: `done()` when the loop returns (false on timeout or stop).
    /// - Throws: `ClientError.system` if epoll_wait fails.
    @discardableResult
    public func run(timeoutMs: UInt64? = nil, until done: () -> Bool) throws(ClientError) -> Bool {
        stopRequested = false
        let deadline = timeoutMs.map { clock() + $0 }
        while !done() && !stopRequested {
            var wait: Int32 = -1
            if let deadline {
                let now = clock()
                if now >= deadline { break }
                wait = Int32(clamping: deadline - now)
            }
            try runOnce(maxWaitMs: wait)
        }
        return done()
    }

    /// Makes the current `run` return after the handler that called this.
    public func stop() { stopRequested = true }

    private func dispatch(_ token: UInt64, _ readiness: Readiness) {
        let slot = Int(token & 0xFFFF_FFFF)
        let id = WatchID(slot: slot, generation: UInt32(token >> 32))
        guard isLive(id), let handler = watches[slot].handler else { return }  // stale: unwatched in this batch
        handler(readiness)
    }

    /// Fires due timers one by one, earliest first, so an action that cancels
    /// another due timer really cancels it; timers scheduled by these actions
    /// wait for the next iteration.
    private func fireDueTimers() {
        let now = clock()
        let firstNew = nextTimerID
        while true {
            var best: Int?
            for (index, timer) in timers.enumerated() where timer.deadline <= now && timer.id < firstNew {
                if let b = best, (timers[b].deadline, timers[b].id) < (timer.deadline, timer.id) { continue }
                best = index
            }
            guard let best else { return }
            let timer = timers.remove(at: best)
            timer.action()
        }
    }
}
