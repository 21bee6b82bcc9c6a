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
    /// A private temp directory holding the socket, removed on deinit.
    private let directory: String
    private let socket: DatagramReader<JournalRecord>

    init() throws {
        var template = Array("/tmp/roomcast-journal-XXXXXX".utf8CString)
        guard let p = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw HarnessError("mkdtemp: \(errnoText())")
        }
        directory = String(cString: p)
        socket = try DatagramReader(path: directory + "/journal.sock", bufferSize: 512 * 1024) { raw, at, index in
            JournalRecord(index: index, atMs: at, fields: try parseJournalDatagram(raw), raw: raw)
        }
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    var path: String { socket.path }
    func stop() { socket.stop() }
    /// Stops reading; returns once the reading thread has stopped (it may
    /// take a datagram that arrives meanwhile, none after the return).
    func pauseReading() { socket.pauseReading() }
    func resumeReading() { socket.resumeReading() }

    /// Every record so far.
    var all: [JournalRecord] { socket.all }
    /// Datagrams that did not parse, with the parser's complaint.
    var malformedDatagrams: [String] { socket.refusedDatagrams }

    /// The first record at `index >= from` satisfying `match`, waiting up to `timeout`.
    func wait(from: Int = 0, timeout: Duration = .seconds(5), _ match: (JournalRecord) -> Bool) -> JournalRecord? {
        socket.wait(from: from, timeout: timeout, match)
    }
}
