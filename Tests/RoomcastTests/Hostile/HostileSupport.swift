// Measurements of the daemon process from /proc, and helpers shared by the
// hostile-input cases.
import Foundation
import Glibc
import RoomcastCore
import Testing
@testable import roomcast_bench

/// Whether the slow hostile suites run: `make test` sets ROOMCAST_SLOW_TESTS=1,
/// a plain `swift test` skips them.
let slowTestsEnabled = ProcessInfo.processInfo.environment["ROOMCAST_SLOW_TESTS"].map { $0 != "" && $0 != "0" } ?? false

/// The sanitizer the daemon and the tests were built with (`make test-asan`
/// sets ROOMCAST_SANITIZER=address), or nil.
let sanitizer = ProcessInfo.processInfo.environment["ROOMCAST_SANITIZER"].flatMap { $0.isEmpty ? nil : $0 }

/// Memory bounds are multiplied by this: ASan's shadow memory and quarantine
/// (freed blocks kept for 256 MiB) inflate RSS without any leak of ours.
let rssBoundFactor = sanitizer == nil ? 1 : 8

/// Figures of one process read from /proc/PID.
enum ProcStats {
    /// The whole text of a /proc file (roomcast-bench's `readProcFile`: read(2) to
    /// end of file, where `String(contentsOfFile:)` stops after 4 KiB).
    static func text(_ path: String) -> String? { readProcFile(path) }

    /// VmRSS from /proc/PID/status, in KiB (nil once the process is gone).
    static func rssKiB(_ pid: Int32) -> Int? {
        guard let text = ProcStats.text("/proc/\(pid)/status") else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return line.dropFirst(6).split(whereSeparator: { $0 == " " || $0 == "\t" }).first.flatMap { Int($0) }
        }
        return nil
    }

    /// utime + stime from /proc/PID/stat, in seconds.
    static func cpuSeconds(_ pid: Int32) -> Double? {
        guard let text = ProcStats.text("/proc/\(pid)/stat"),
              let close = text.lastIndex(of: ")") else { return nil }
        // Fields after "(comm)": state is field 3, utime 14, stime 15.
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let utime = Double(fields[11]), let stime = Double(fields[12]) else { return nil }
        return (utime + stime) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Open descriptors (entries of /proc/PID/fd).
    static func fdCount(_ pid: Int32) -> Int? {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd"))?.count
    }

    /// The targets of /proc/PID/fd (e.g. `socket:[123]`), by descriptor number.
    static func fdTargets(_ pid: Int32) -> [Int: String] {
        var out: [Int: String] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? [] {
            if let n = Int(name), let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(name)") {
                out[n] = target
            }
        }
        return out
    }
}

extension Daemon {
    var pid: Int32 { child.pid }
    /// The daemon's VmRSS in KiB (0 if unreadable, which fails the bounds below).
    var rssKiB: Int { ProcStats.rssKiB(pid) ?? 0 }
    /// The daemon's CPU time so far (user + system), in seconds.
    var cpuSeconds: Double { ProcStats.cpuSeconds(pid) ?? .infinity }
    /// Lines of the daemon's log containing `needle`.
    func logLines(containing needle: String) -> [Substring] {
        stderr.current.split(separator: "\n").filter { $0.contains(needle) }
    }
}

/// A figure a test measured, printed to the test log so CI keeps the numbers
/// (`FIGURE case=N name=value`).
func reportFigure(_ testCase: String, _ name: String, _ value: String) {
    print("FIGURE case=\(testCase) \(name)=\(value)")
}

/// An opaque frame whose body starts with the u32le sequence number `i`, `size` bytes long.
func numberedFrame(_ i: Int, size: Int, type: UInt16 = Wire.opaque) -> [UInt8] {
    var body = [UInt8](repeating: UInt8(truncatingIfNeeded: i), count: max(size, 4))
    withUnsafeBytes(of: UInt32(truncatingIfNeeded: i).littleEndian) { body.replaceSubrange(0..<4, with: $0) }
    return Wire.frame(type, body)
}

/// The sequence number `numberedFrame` put in `frame`'s body.
func sequenceNumber(_ frame: Frame) -> Int? {
    guard frame.body.count >= 4 else { return nil }
    return Int(UInt32(frame.body[0]) | UInt32(frame.body[1]) << 8 | UInt32(frame.body[2]) << 16 | UInt32(frame.body[3]) << 24)
}

extension TestClient {
    /// The socket descriptor (for tests that set options or shut it down by hand).
    var descriptor: Int32 { fd }

    /// Sets SO_RCVBUF after connecting (a reader that pauses later).
    func setReceiveBuffer(_ bytes: Int32) {
        var v = bytes
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, socklen_t(MemoryLayout<Int32>.size))
    }

    /// Whether the daemon closed the connection: a non-blocking peek that
    /// sees EOF or a reset (pending data counts as open).
    var peerHasClosed: Bool {
        var byte: UInt8 = 0
        let n = recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        if n == 0 { return true }
        if n < 0 { return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR }
        return false
    }
}
