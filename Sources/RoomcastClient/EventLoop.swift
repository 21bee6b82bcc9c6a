import Glibc
import RoomcastIO

/// Readiness of a watched descriptor, as handed to a watch handler:
/// `.readable`, `.writable`, `.hangup` (EPOLLHUP or EPOLLERR: read to learn
/// the error or EOF, then close). The selector's own type.
public typealias IOReadiness = Readiness

/// A registration of a descriptor with an `EventLoop`. Stale ids (after
/// `unwatch`) are ignored by every call, so a handler may drop its own watch.
public struct WatchID: Hashable, Sendable {
    fileprivate let registration: Registration
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
    private struct Timer {
        var id: UInt64
        var deadline: UInt64
        var action: () -> Void
    }

    /// The selector's registry keeps each watch's handler and drops events
    /// of watches removed earlier in the same batch.
    private let selector: Selector<(IOReadiness) -> Void>
    private let clock: () -> UInt64
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
        do {
            return WatchID(registration: try selector.register(fd, handler, readable: readable, writable: writable))
        } catch {
            throw ClientError(error)
        }
    }

    /// Changes the readiness reported for a watch (e.g. arms writability only
    /// while output is queued). A stale id is ignored.
    /// - Throws: `ClientError.system` if epoll_ctl fails.
    public func update(_ id: WatchID, readable: Bool, writable: Bool) throws(ClientError) {
        do {
            try selector.setInterest(id.registration, readable: readable, writable: writable)
        } catch {
            throw ClientError(error)
        }
    }

    /// Stops reporting a descriptor. Events already collected for it in the
    /// current batch are dropped. A stale id is ignored.
    public func unwatch(_ id: WatchID) {
        selector.deregister(id.registration)
    }

    /// Drops every watch and timer, and with them their handlers, for a loop
    /// that is done: handlers usually capture the objects that own the loop,
    /// and this breaks those reference cycles. Descriptors are not closed.
    public func removeAll() {
        selector.deregisterAll()
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
            try selector.wait(timeoutMs: timeout) { handler, readiness in handler(readiness) }
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
