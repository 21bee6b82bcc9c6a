// A fake journald: an AF_UNIX datagram socket that the daemon is pointed at
// with ROOMCAST_JOURNAL_SOCKET, and a parser of journald's native protocol
// (systemd's docs/JOURNAL_NATIVE_PROTOCOL.md) written from the document, apart
// from the daemon's encoder, so that each checks the other.
import Foundation
import Glibc
import Synchronization
import Testing

/// One field of a journal record: its name and its raw value.
struct JournalField: Sendable, Equatable {
    var name: String
    var value: [UInt8]
    /// Whether it was sent in the binary form (`NAME\n` + 64-bit LE length + value + `\n`).
    var binary: Bool
}

/// One datagram received by the fake journald, parsed.
struct JournalRecord: Sendable {
    /// Position in the order of arrival (0-based).
    var index: Int
    /// Arrival time, `monotonicMs()`.
    var atMs: Int64
    var fields: [JournalField]
    /// The datagram as received.
    var raw: [UInt8]

    /// The (first) value of `name` as UTF-8 text.
    func value(_ name: String) -> String? {
        fields.first { $0.name == name }.map { String(decoding: $0.value, as: UTF8.self) }
    }
    var message: String { value("MESSAGE") ?? "" }
}

/// Whether `name` is a field name journald keeps: A-Z, 0-9 and `_`, not
/// starting with a digit or `_` (those are trusted fields), 1 to 64 bytes
/// (journald's `journal_field_valid()`; invalid ones are dropped silently).
func isValidJournalFieldName(_ name: String) -> Bool {
    let b = Array(name.utf8)
    guard (1...64).contains(b.count), b[0] != UInt8(ascii: "_"), !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b[0]) else { return false }
    return b.allSatisfy { (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || $0 == UInt8(ascii: "_") }
}

/// Parses one datagram of the native protocol: per field either
/// `NAME=value\n`, or `NAME\n`, a little-endian 64-bit length, the value and `\n`.
func parseJournalDatagram(_ bytes: [UInt8]) throws -> [JournalField] {
    var fields: [JournalField] = []
    var i = 0
    while i < bytes.count {
        guard let end = bytes[i...].firstIndex(where: { $0 == UInt8(ascii: "=") || $0 == UInt8(ascii: "\n") }) else {
            throw HarnessError("field at byte \(i) has no '=' or newline")
        }
        let name = String(decoding: bytes[i..<end], as: UTF8.self)
        guard !name.isEmpty else { throw HarnessError("empty field name at byte \(i)") }
        if bytes[end] == UInt8(ascii: "=") {
            guard let nl = bytes[(end + 1)...].firstIndex(of: UInt8(ascii: "\n")) else {
                throw HarnessError("\(name): value not terminated by a newline")
            }
            fields.append(JournalField(name: name, value: Array(bytes[(end + 1)..<nl]), binary: false))
            i = nl + 1
        } else {
            guard end + 9 <= bytes.count else { throw HarnessError("\(name): truncated length") }
            var length: UInt64 = 0
            for k in 0..<8 { length |= UInt64(bytes[end + 1 + k]) << (8 * UInt64(k)) }
            let start = end + 9
            guard length <= UInt64(bytes.count - start), start + Int(length) < bytes.count,
                  bytes[start + Int(length)] == UInt8(ascii: "\n") else {
                throw HarnessError("\(name): binary value of \(length) bytes does not fit or lacks its newline")
            }
            fields.append(JournalField(name: name, value: Array(bytes[start..<(start + Int(length))]), binary: true))
            i = start + Int(length) + 1
        }
    }
    return fields
}

/// A fake `/run/systemd/journal/socket` read by a background thread, which
/// can stop reading (a journald that does not keep up).
final class FakeJournal: Sendable {
    let path: String
    /// A private temp directory holding the socket, removed on deinit.
    private let directory: String
    private let received = Mutex<[JournalRecord]>([])
    private let malformed = Mutex<[String]>([])
    private let stopped = Mutex(false)
    private let paused = Mutex(false)
    /// Set by the reading thread once it saw `paused` (it reads nothing more).
    private let pauseSeen = Mutex(false)

    init() throws {
        var template = Array("/tmp/roomcast-journal-XXXXXX".utf8CString)
        guard let p = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw HarnessError("mkdtemp: \(errnoText())")
        }
        directory = String(cString: p)
        path = directory + "/journal.sock"
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket(AF_UNIX): \(errnoText())") }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let r = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard r == 0 else { let e = errno; close(fd); throw HarnessError("bind \(path): \(errnoText(e))") }
        var tv = timeval(tv_sec: 0, tv_usec: 50_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        Thread.detachNewThread { [self] in self.receiveLoop(fd) }
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    private func receiveLoop(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 512 * 1024)
        while !stopped.withLock({ $0 }) {
            if paused.withLock({ $0 }) {
                pauseSeen.withLock { $0 = true }
                usleep(10_000)
                continue
            }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { continue }
            let raw = Array(buffer[0..<n])
            let at = monotonicMs()
            do {
                let fields = try parseJournalDatagram(raw)
                received.withLock { $0.append(JournalRecord(index: $0.count, atMs: at, fields: fields, raw: raw)) }
            } catch {
                malformed.withLock { $0.append("\(error): \(String(decoding: raw.prefix(200), as: UTF8.self))") }
            }
        }
        close(fd)
    }

    func stop() { stopped.withLock { $0 = true } }
    /// Stops reading; returns once the reading thread has stopped (it may
    /// take a datagram that arrives meanwhile, none after the return).
    func pauseReading() {
        pauseSeen.withLock { $0 = false }
        paused.withLock { $0 = true }
        _ = waitUntil(.seconds(1)) { pauseSeen.withLock { $0 } }
    }
    func resumeReading() { paused.withLock { $0 = false } }

    /// Every record so far.
    var all: [JournalRecord] { received.withLock { $0 } }
    /// Datagrams that did not parse, with the parser's complaint.
    var malformedDatagrams: [String] { malformed.withLock { $0 } }

    /// The first record at `index >= from` satisfying `match`, waiting up to `timeout`.
    func wait(from: Int = 0, timeout: Duration = .seconds(5), _ match: (JournalRecord) -> Bool) -> JournalRecord? {
        var found: JournalRecord?
        _ = waitUntil(timeout) {
            found = all.dropFirst(from).first(where: match)
            return found != nil
        }
        return found
    }
}
