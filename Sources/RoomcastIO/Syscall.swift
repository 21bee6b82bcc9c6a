import CShim
import Glibc

/// A failed system call: the call's name and errno (e.g. `bind: Address already in use`).
public struct SystemError: Error, Equatable, CustomStringConvertible {
    public var call: String
    public var errno: Int32
    public init(_ call: String, errno: Int32) { self.call = call; self.errno = errno }
    public var description: String { "\(call): \(String(cString: strerror(errno)))" }
}

/// Outcome of a non-blocking read or write (memcached's small result enums).
package enum IOResult: Equatable {
    /// `n` bytes were transferred (n > 0).
    case done(Int)
    /// EAGAIN: try again after the next readiness event.
    case wouldBlock
    /// The peer closed its side (a read of 0 bytes).
    case endOfFile
    /// Any other error, with errno.
    case failed(Int32)
}

/// Every syscall goes through these helpers: EINTR is retried, EAGAIN
/// becomes `.wouldBlock`, errno is read immediately.
package enum Sys {
    package static func read(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> IOResult {
        while true {
            let n = Glibc.read(fd, buffer, count)
            if n > 0 { return .done(n) }
            if n == 0 { return .endOfFile }
            let e = Glibc.errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
            return .failed(e)
        }
    }

    /// send(2) with MSG_NOSIGNAL: a vanished peer gives EPIPE, never SIGPIPE.
    package static func send(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> IOResult {
        while true {
            let n = Glibc.send(fd, buffer, count, Int32(MSG_NOSIGNAL))
            if n >= 0 { return .done(n) }
            let e = Glibc.errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
            return .failed(e)
        }
    }

    package static func close(_ fd: Int32) {
        // close(2) must not be retried on EINTR on Linux: the fd is gone either way.
        _ = Glibc.close(fd)
    }

    package static func setNonBlocking(_ fd: Int32) throws(SystemError) {
        let flags = fcntl(fd, F_GETFL)
        guard flags >= 0 else { throw SystemError("fcntl(F_GETFL)", errno: Glibc.errno) }
        if flags & O_NONBLOCK == 0, fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 {
            throw SystemError("fcntl(F_SETFL)", errno: Glibc.errno)
        }
    }

    package static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) -> Bool {
        var v = value
        return setsockopt(fd, level, name, &v, socklen_t(MemoryLayout<Int32>.size)) == 0
    }

    /// Raises the soft `RLIMIT_NOFILE` to the hard limit, as a program that
    /// needs many descriptors and never calls select(2) should (systemd.exec(5),
    /// `LimitNOFILE=`: the soft limit stays 1024 for select()'s sake).
    /// - Returns: the soft limit in force afterwards, in descriptors
    ///   (`RLIM_INFINITY` as `UInt64.max`); unchanged if setrlimit(2) fails.
    package static func raiseDescriptorLimit() -> UInt64 {
        var limit = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        guard getrlimit(resource, &limit) == 0 else { return UInt64.max }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(resource, &raised) == 0 { limit = raised }
        }
        return limit.rlim_cur == rlim_t.max ? UInt64.max : UInt64(limit.rlim_cur)  // RLIM_INFINITY
    }

    /// Milliseconds on CLOCK_MONOTONIC: the daemon's only clock.
    package static func monotonicMs() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1000 &+ UInt64(ts.tv_nsec / 1_000_000)
    }

    /// Microseconds on CLOCK_MONOTONIC (for sd_notify's MONOTONIC_USEC).
    package static func monotonicUsec() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000 &+ UInt64(ts.tv_nsec / 1000)
    }
}

/// Milliseconds on CLOCK_MONOTONIC: the daemon's clock (injectable in `Server`).
public func monotonicMilliseconds() -> UInt64 { Sys.monotonicMs() }
