import CShim
import Glibc

/// A failed system call: the call's name and errno (e.g. `bind: Address already in use`).
public struct SystemError: Error, Equatable, CustomStringConvertible {
    public var call: String
    public var errno: Int32
    public init(_ call: String, errno: Int32) { self.call = call; self.errno = errno }
    public var description: String { "\(call): \(String(cString: strerror(errno)))" }
}

/// Outcome of a system call on a non-blocking descriptor.
package enum Syscall<Value> {
    /// The call succeeded with this (non-negative) result.
    case done(Value)
    /// EAGAIN (= EWOULDBLOCK on Linux): try again after the next readiness event.
    case wouldBlock
}

/// Why `Sys.readFile` could not read a file.
package enum FileReadError: Error {
    /// open(2), fstat(2) or read(2) failed.
    case system(SystemError)
    /// A directory, FIFO, device or socket.
    case notRegularFile
    /// Longer than the caller's limit.
    case tooLarge
}

/// Outcome of a non-blocking read or write (memcached's small result enums).
package enum IOResult: Equatable {
    /// `n` bytes were transferred (n > 0 for a read).
    case done(Int)
    /// EAGAIN: try again after the next readiness event.
    case wouldBlock
    /// The peer closed its side (a read of 0 bytes).
    case endOfFile
    /// Any other error, with errno.
    case failed(Int32)
}

/// Every system call of the daemon and the client goes through `Sys.call`
/// (swift-nio's `syscall` wrapper): EINTR is retried, EAGAIN becomes
/// `.wouldBlock`, errno is read immediately, EBADF and EFAULT trap (a closed
/// descriptor or a bad pointer is a bug in roomcast, never the peer's doing),
/// and every other errno is thrown as a `SystemError` naming the call.
package enum Sys {
    /// Runs `body`, a system call that returns -1 and sets errno on failure.
    /// - Parameter name: the call, for the error (evaluated only on failure).
    /// - Returns: `.done` with the call's result, or `.wouldBlock` for EAGAIN.
    /// - Throws: `SystemError(name, errno)` for every errno but EINTR
    ///   (retried), EAGAIN, EBADF and EFAULT (traps).
    @inline(__always)
    package static func call<T: BinaryInteger>(_ name: @autoclosure () -> String, _ body: () -> T) throws(SystemError) -> Syscall<T> {
        while true {
            let result = body()
            if result >= 0 { return .done(result) }
            let e = Glibc.errno
            switch e {
            case EINTR:
                continue
            case EAGAIN:
                return .wouldBlock
            case EBADF, EFAULT:
                preconditionFailure("\(name()): \(String(cString: strerror(e))): a roomcast bug (closed descriptor or bad pointer)")
            default:
                throw SystemError(name(), errno: e)
            }
        }
    }

    /// `call` for calls that cannot return EAGAIN (or where it is an error).
    /// - Returns: the call's non-negative result.
    /// - Throws: `SystemError`, as `call` (EAGAIN included).
    @inline(__always)
    package static func blocking<T: BinaryInteger>(_ name: @autoclosure () -> String, _ body: () -> T) throws(SystemError) -> T {
        switch try call(name(), body) {
        case .done(let value): return value
        case .wouldBlock: throw SystemError(name(), errno: EAGAIN)
        }
    }

    /// `call` for a transfer (read, send): its errno becomes `.failed`.
    @inline(__always)
    private static func transfer(_ name: StaticString, _ body: () -> Int) -> IOResult {
        do {
            switch try call("\(name)", body) {
            case .done(let n): return .done(n)
            case .wouldBlock: return .wouldBlock
            }
        } catch {
            return .failed(error.errno)
        }
    }

    /// read(2) into `buffer`; 0 bytes is `.endOfFile`.
    @inline(__always)
    package static func read(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> IOResult {
        let r = transfer("read") { Glibc.read(fd, buffer, count) }
        return r == .done(0) ? .endOfFile : r
    }

    /// send(2) with MSG_NOSIGNAL: a vanished peer gives EPIPE, never SIGPIPE.
    @inline(__always)
    package static func send(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> IOResult {
        transfer("send") { Glibc.send(fd, buffer, count, Int32(MSG_NOSIGNAL)) }
    }

    /// One sendmsg(2) of `first` then `second` (a gather write; either may be
    /// empty), with MSG_NOSIGNAL.
    @inline(__always)
    package static func send(_ fd: Int32, _ first: UnsafeRawBufferPointer, _ second: UnsafeRawBufferPointer) -> IOResult {
        if first.isEmpty { return send(fd, second.baseAddress!, second.count) }
        if second.isEmpty { return send(fd, first.baseAddress!, first.count) }
        var vectors = (iovec(iov_base: UnsafeMutableRawPointer(mutating: first.baseAddress), iov_len: first.count),
                       iovec(iov_base: UnsafeMutableRawPointer(mutating: second.baseAddress), iov_len: second.count))
        return withUnsafeMutableBytes(of: &vectors) { raw in
            var message = msghdr()
            message.msg_iov = raw.baseAddress!.assumingMemoryBound(to: iovec.self)
            message.msg_iovlen = 2
            return transfer("sendmsg") { Glibc.sendmsg(fd, &message, Int32(MSG_NOSIGNAL)) }
        }
    }

    /// write(2) of all of `bytes` to a blocking descriptor (stdio, a file),
    /// retried after short writes. Stops at the first error or EAGAIN.
    /// - Returns: the bytes written.
    @discardableResult
    package static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Int {
        var offset = 0
        while offset < bytes.count {
            guard case .done(let n)? = try? call("write", { Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset) }),
                  n > 0 else { break }
            offset += n
        }
        return offset
    }

    /// accept4(2) of one pending connection, non-blocking and close-on-exec.
    /// - Returns: the new descriptor and the peer's address, or `.wouldBlock`
    ///   when none is pending.
    /// - Throws: `SystemError` (ECONNABORTED, EMFILE, ...): the caller's policy.
    package static func accept(_ listener: Int32) throws(SystemError) -> Syscall<(fd: Int32, peer: sockaddr_storage)> {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let result = try call("accept4") {
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    cshim_accept4(listener, $0, &length, Int32(SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue))
                }
            }
        }
        switch result {
        case .done(let fd): return .done((fd, storage))
        case .wouldBlock: return .wouldBlock
        }
    }

    /// close(2). Never retried: on Linux the descriptor is gone even when
    /// close reports EINTR (close(2), "Dealing with error returns").
    package static func close(_ fd: Int32) {
        _ = Glibc.close(fd)
    }

    /// Sets O_NONBLOCK (sockets passed by systemd are blocking unless
    /// `NonBlocking=yes`, systemd.socket(5)).
    /// - Throws: `SystemError` from fcntl(2).
    package static func setNonBlocking(_ fd: Int32) throws(SystemError) {
        let flags = try blocking("fcntl(F_GETFL)") { fcntl(fd, F_GETFL) }
        if flags & O_NONBLOCK == 0 {
            _ = try blocking("fcntl(F_SETFL)") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
        }
    }

    /// setsockopt(2) of an int option.
    /// - Returns: false if the kernel refused it (e.g. a TCP option on an
    ///   AF_UNIX socket); callers treat options as best effort.
    @discardableResult
    package static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) -> Bool {
        var v = value
        return (try? blocking("setsockopt") { setsockopt(fd, level, name, &v, socklen_t(MemoryLayout<Int32>.size)) }) != nil
    }

    /// Reads a whole regular file with open(2)/read(2), at most `limit` bytes.
    /// O_NONBLOCK: a FIFO or device in place of the file must never block
    /// the event loop during a reload; it is refused as not a regular file.
    /// - Throws: `FileReadError`.
    package static func readFile(_ path: String, limit: Int) throws(FileReadError) -> [UInt8] {
        do {
            let fd = try blocking("open") { open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) }
            defer { close(fd) }
            var st = stat()
            _ = try blocking("fstat") { fstat(fd, &st) }
            guard st.st_mode & S_IFMT == S_IFREG else { throw FileReadError.notRegularFile }
            var bytes: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = try chunk.withUnsafeMutableBytes { (buffer) throws(SystemError) in
                    try blocking("read") { Glibc.read(fd, buffer.baseAddress, buffer.count) }
                }
                if n == 0 { return bytes }
                bytes.append(contentsOf: chunk[..<n])
                if bytes.count > limit { throw FileReadError.tooLarge }
            }
        } catch let error as FileReadError {
            throw error
        } catch let error as SystemError {
            throw .system(error)
        } catch {
            preconditionFailure("unexpected \(error)")
        }
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

    /// Eight random bytes as a nonzero number, never blocking: getrandom(2)
    /// with GRND_NONBLOCK (`source`, replaceable by tests); while the pool
    /// is not initialised (EAGAIN, early boot) or getrandom fails,
    /// /dev/urandom, which never blocks (random(4)); failing that, the
    /// monotonic clock and the PID mixed. For ids that must differ between
    /// processes, not for secrets.
    package static func randomSeed(source: (UnsafeMutableRawPointer, Int) -> Int = { cshim_getrandom_nonblocking($0, $1) }) -> UInt64 {
        var seed: UInt64 = 0
        if withUnsafeMutableBytes(of: &seed, { source($0.baseAddress!, 8) }) != 8 {
            seed = 0
            let fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC)
            if fd >= 0 {
                if withUnsafeMutableBytes(of: &seed, { Glibc.read(fd, $0.baseAddress!, 8) }) != 8 { seed = 0 }
                Glibc.close(fd)
            }
        }
        if seed == 0 { seed = monotonicUsec() &* 0x9E37_79B9_7F4A_7C15 ^ UInt64(getpid()) }
        return seed == 0 ? 1 : seed
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
