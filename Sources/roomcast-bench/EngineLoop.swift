@preconcurrency import COpenSSL
import CShim
@preconcurrency import Glibc
import RoomcastCore

// The load generator's event loop (Engine.swift holds its state).
extension Engine {
    /// One epoll_wait (at most `timeoutMs`) and the work it brings, then the
    /// timers (heartbeats, open-loop sends) and closed-loop sends.
    func pump(timeoutMs: Int32) {
        var timeout = timeoutMs
        if sending, let rate = o.rate, o.publishers > 0 {
            let next = rateStartNs &+ UInt64(Double(rateSent + 1) * 1e9 / rate)
            let now = monotonicNs()
            timeout = next <= now ? 0 : min(timeout, Int32((next - now + 999_999) / 1_000_000))
        }
        if launchNext < launchLimit && (inflightLimit == 0 || inflight < inflightLimit) { timeout = 0 }
        let n = epoll_wait(epfd, events, Int32(eventCap), timeout)
        if n < 0 && errno != EINTR { fatal("epoll_wait: \(String(cString: strerror(errno)))") }
        let turnStart = monotonicNs()
        defer {
            // The longest turn of this loop: a send lag much longer than this
            // means the generator was not running (preempted), not busy.
            let turn = monotonicNs() &- turnStart
            if measuring && turn > maxTurnNs { maxTurnNs = turn }
        }
        if n > 0 {
            for i in 0..<Int(n) {
                let ev = events[i]
                let id = Int(truncatingIfNeeded: ev.data.u64)
                let bits = ev.events
                let c = conns + id
                switch c.pointee.state {
                case .connecting:
                    finishConnect(id)
                case .handshaking:
                    handshake(id)
                case .open:
                    if bits & (EPOLLIN.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue | EPOLLRDHUP.rawValue) != 0 { readConn(id) }
                    if bits & EPOLLOUT.rawValue != 0 && c.pointee.state == .open { flush(id) }
                default:
                    break
                }
            }
        }
        if sending { sendDue() }
        if launchNext < launchLimit { startConnects() }
        let now = monotonicNs()
        if now &- lastPeriodicNs >= 5_000_000 {
            lastPeriodicNs = now
            heartbeats(now: now)
        }
    }

    /// Pumps until `done()` or `seconds` pass; returns whether `done()` held.
    @discardableResult
    func run(seconds: Double, until done: () -> Bool = { false }) -> Bool {
        let end = monotonicNs() &+ UInt64(seconds * 1e9)
        while true {
            if done() { return true }
            let now = monotonicNs()
            if now >= end { return false }
            pump(timeoutMs: Int32(min(10, max(0, (end - now) / 1_000_000))))
        }
    }
}
