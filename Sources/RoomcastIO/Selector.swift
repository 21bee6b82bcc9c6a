import CShim
import Glibc

/// Readiness of a descriptor, translated from epoll bits. The selector knows
/// nothing of what the descriptor is. Public because the client library
/// hands it to its watch handlers (`RoomcastClient.IOReadiness`).
public struct Readiness: OptionSet, Sendable {
    /// Bit 0 readable, bit 1 writable, bit 2 hangup.
    public let rawValue: UInt8
    /// A set from its bits (see `rawValue`).
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    /// Bytes (or EOF) can be read without blocking.
    public static let readable = Readiness(rawValue: 1)
    /// Bytes can be written without blocking (or a non-blocking connect finished).
    public static let writable = Readiness(rawValue: 2)
    /// EPOLLHUP or EPOLLERR: the descriptor should be read (to learn the error
    /// or EOF) and then closed.
    public static let hangup = Readiness(rawValue: 4)
}

/// A level-triggered epoll(7) selector. Each registration carries a 64-bit
/// token chosen by the caller (slot index plus a generation, so events for a
/// descriptor closed and reused within one batch can be recognised as stale).
package final class Selector {
    private let epfd: Int32
    private var events: [epoll_event]

    /// - Parameter capacity: events returned per `wait` at most.
    package init(capacity: Int = 512) throws(SystemError) {
        epfd = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epfd >= 0 else { throw SystemError("epoll_create1", errno: errno) }
        events = Array(repeating: epoll_event(), count: capacity)
    }

    deinit { Sys.close(epfd) }

    private static func mask(readable: Bool, writable: Bool) -> UInt32 {
        (readable ? EPOLLIN.rawValue : 0) | (writable ? EPOLLOUT.rawValue : 0)
    }

    package func register(_ fd: Int32, token: UInt64, readable: Bool = true, writable: Bool = false) throws(SystemError) {
        var ev = epoll_event(events: Self.mask(readable: readable, writable: writable), data: epoll_data_t(u64: token))
        guard epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0 else { throw SystemError("epoll_ctl(ADD)", errno: errno) }
    }

    package func modify(_ fd: Int32, token: UInt64, readable: Bool, writable: Bool) throws(SystemError) {
        var ev = epoll_event(events: Self.mask(readable: readable, writable: writable), data: epoll_data_t(u64: token))
        guard epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev) == 0 else { throw SystemError("epoll_ctl(MOD)", errno: errno) }
    }

    package func deregister(_ fd: Int32) {
        var ev = epoll_event()
        _ = epoll_ctl(epfd, EPOLL_CTL_DEL, fd, &ev)
    }

    /// Waits up to `timeoutMs` (-1: forever) and calls `handler` for each ready
    /// registration. EINTR returns with no events.
    package func wait(timeoutMs: Int32, _ handler: (UInt64, Readiness) -> Void) throws(SystemError) {
        let n = events.withUnsafeMutableBufferPointer { epoll_wait(epfd, $0.baseAddress, Int32($0.count), timeoutMs) }
        if n < 0 {
            if errno == EINTR { return }
            throw SystemError("epoll_wait", errno: errno)
        }
        for i in 0..<Int(n) {
            let ev = events[i]
            var r: Readiness = []
            if ev.events & EPOLLIN.rawValue != 0 { r.insert(.readable) }
            if ev.events & EPOLLOUT.rawValue != 0 { r.insert(.writable) }
            if ev.events & (EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 { r.insert(.hangup) }
            handler(ev.data.u64, r)
        }
    }
}
