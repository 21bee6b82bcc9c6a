import RoomcastCore
import RoomcastIO

/// Where each loop iteration's time goes (GET /metrics,
/// `roomcast_loop_wait_seconds` and `roomcast_loop_iteration_seconds`):
/// waiting in epoll_wait(2), and the rest (events, timers, flush), in µs
/// of CLOCK_MONOTONIC. `Server.runOnce` marks the wait's start and end and
/// the iteration's end.
struct LoopClock {
    /// Time spent in epoll_wait(2) per iteration, µs.
    private(set) var wait = DurationHistogram()
    /// Time spent in the rest of each iteration, µs.
    private(set) var work = DurationHistogram()
    /// When the last wait of the loop returned, µs (monotonic).
    private var waitEndUs: UInt64 = 0

    /// The wait that began at `startUs` returned: recorded once per
    /// iteration (the first event's callback, or after the wait).
    @inline(__always)
    mutating func waitEnded(startedUs startUs: UInt64) {
        guard waitEndUs < startUs else { return }
        waitEndUs = Sys.monotonicUsec()
        wait.record(waitEndUs &- startUs)
    }

    /// The iteration is over: the time since its wait returned is work.
    mutating func iterationEnded() { work.record(Sys.monotonicUsec() &- waitEndUs) }
}
