import Glibc
import RoomcastIO

/// The `.stderr` sink's writer, which never makes the event loop wait: a
/// pipe or terminal nobody reads (a paused pager, a stopped `| less`) or a
/// journald stream it does not keep up with would otherwise block write(2)
/// and freeze every room .
///
/// How it avoids waiting depends on what the descriptor is (measured on
/// Linux 6.x):
/// - a socket (journald's stream, `JOURNAL_STREAM`): send(2) with MSG_DONTWAIT;
/// - a pipe, FIFO or character device (terminal, /dev/null): the same file
///   opened again through `/proc/self/fd/N` with O_NONBLOCK: a new open file
///   description, so the descriptor shared with the parent (the shell's
///   terminal) stays blocking; where that open fails (no /proc, EACCES),
///   poll(2) for room, then at most PIPE_BUF bytes per write (best effort
///   for a terminal);
/// - a regular file: written directly; it never blocks for long, and an
///   open through /proc would lose O_APPEND and the offset.
///
/// Bytes that could not be written wait in a backlog of at most
/// `backlogLimit` bytes and go first when there is room. A line that does
/// not fit in the backlog is dropped and counted (`dropped`); the rest of a
/// line already begun is always kept, so lines are never cut.
final class StderrOutput {
    /// The most bytes waiting in memory.
    static let backlogLimit = 64 * 1024

    private enum Mode {
        case socket(Int32)
        /// Reopened with O_NONBLOCK; this descriptor is ours.
        case nonBlocking(Int32)
        case polled(Int32)
        case direct(Int32)
        /// fstat(2) failed: no stderr at all.
        case discard
    }

    private let mode: Mode
    private var backlog: [UInt8] = []
    private var head = 0
    /// Lines dropped since writing last worked, for the caller to report.
    var dropped = 0

    init(fd: Int32) {
        var st = stat()
        guard fstat(fd, &st) == 0 else {
            mode = .discard
            return
        }
        switch st.st_mode & S_IFMT {
        case S_IFSOCK:
            mode = .socket(fd)
        case S_IFIFO, S_IFCHR:
            let reopened = open("/proc/self/fd/\(fd)", O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
            mode = reopened >= 0 ? .nonBlocking(reopened) : .polled(fd)
        default:
            mode = .direct(fd)
        }
    }

    deinit { if case .nonBlocking(let fd) = mode { Sys.close(fd) } }

    /// Bytes waiting to be written.
    var pending: Int { backlog.count - head }

    /// Writes the whole line `bytes` (or what fits now, the rest into the
    /// backlog), never waiting; drops it when the backlog is full.
    func write(_ bytes: [UInt8]) {
        if pending > 0 { flush() }
        if pending > 0 {
            if pending + bytes.count <= Self.backlogLimit {
                backlog.append(contentsOf: bytes)
            } else {
                dropped += 1
            }
            return
        }
        let n = bytes.withUnsafeBytes { writeSome($0) }
        if n < 0 { return }  // a stderr that is gone (EPIPE): nothing to keep it for
        if n < bytes.count {
            // A line begun is finished, whatever its length, before any other.
            backlog.append(contentsOf: bytes[n...])
        }
    }

    /// Writes as much of the backlog as fits now.
    func flush() {
        while pending > 0 {
            let n = backlog.withUnsafeBytes { writeSome(UnsafeRawBufferPointer(rebasing: $0[head...])) }
            if n < 0 {
                head = backlog.count  // gone: drop what waits
            } else if n == 0 {
                break
            } else {
                head += n
            }
        }
        if head == backlog.count {
            backlog.removeAll(keepingCapacity: backlog.capacity <= 2 * Self.backlogLimit)
            head = 0
        } else if head >= Self.backlogLimit {
            backlog.removeSubrange(0..<head)
            head = 0
        }
    }

    /// One attempt: bytes written (> 0), 0 when it would block, -1 on an error.
    private func writeSome(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard bytes.count > 0 else { return 0 }
        let result: Syscall<Int>
        do {
            switch mode {
            case .socket(let fd):
                result = try Sys.call("send") { send(fd, bytes.baseAddress, bytes.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }
            case .nonBlocking(let fd), .direct(let fd):
                result = try Sys.call("write") { Glibc.write(fd, bytes.baseAddress, bytes.count) }
            case .polled(let fd):
                var p = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                guard case .done(1) = try Sys.call("poll", { poll(&p, 1, 0) }) else { return 0 }
                result = try Sys.call("write") { Glibc.write(fd, bytes.baseAddress, min(bytes.count, Int(PIPE_BUF))) }
            case .discard:
                return bytes.count
            }
        } catch {
            return -1
        }
        switch result {
        case .done(let n): return n
        case .wouldBlock: return 0
        }
    }
}
