import Glibc
import RoomcastIO

/// journald's native protocol (systemd's docs/JOURNAL_NATIVE_PROTOCOL.md),
/// written by hand because libsystemd's `sd_journal_sendv` sends in
/// blocking mode: a journald that does not read its socket would stop the
/// event loop .
///
/// A record is one datagram; each field is `NAME=value\n`, or, for a value
/// containing a newline, `NAME\n`, the value's length as a little-endian
/// 64-bit integer, the value, `\n`.
enum JournalEncoding {
    /// Values longer than this, in bytes, are cut there (at a character
    /// boundary) and end in `…`. Records then always fit one datagram
    /// (a few fields of at most 16 KiB against the socket's 208 KiB send
    /// buffer), so the protocol's other form (a sealed memfd passed with
    /// SCM_RIGHTS for records that do not fit) is not needed.
    static let maxValueBytes = 16 * 1024

    /// The datagram of one record, fields in the order given. A field whose
    /// name is not a valid journal field name is renamed (see `fieldName`).
    static func encode(_ fields: [(name: String, value: String)]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(fields.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count + 10 })
        for (name, value) in fields {
            let key = fieldName(name)
            guard !key.isEmpty else { continue }
            out.append(contentsOf: key.utf8)
            var bytes = Array(value.utf8)
            if bytes.count > maxValueBytes {
                var end = maxValueBytes
                while end > 0 && bytes[end] & 0xC0 == 0x80 { end -= 1 }  // not inside a UTF-8 sequence
                bytes.removeSubrange(end...)
                bytes.append(contentsOf: "…".utf8)
            }
            if bytes.contains(UInt8(ascii: "\n")) {
                out.append(UInt8(ascii: "\n"))
                withUnsafeBytes(of: UInt64(bytes.count).littleEndian) { out.append(contentsOf: $0) }
            } else {
                out.append(UInt8(ascii: "="))
            }
            out.append(contentsOf: bytes)
            out.append(UInt8(ascii: "\n"))
        }
        return out
    }

    /// `name` as journald keeps it: A-Z, 0-9 and `_`, not starting with `_`
    /// (trusted fields) or a digit, at most 64 bytes; journald silently drops
    /// a field with any other name. Lowercase letters are uppercased, other
    /// characters become `_`, leading `_` are removed, a leading digit gets
    /// an `F` in front. Valid names (all of the daemon's) are returned as is.
    static func fieldName(_ name: String) -> String {
        func valid(_ b: UInt8) -> Bool {
            (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(b) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b) || b == UInt8(ascii: "_")
        }
        let utf8 = name.utf8
        if let first = utf8.first, utf8.count <= 64, first != UInt8(ascii: "_"), !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first),
           utf8.allSatisfy(valid) {
            return name
        }
        var bytes: [UInt8] = utf8.map { b in
            if (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(b) { return b - 32 }
            return valid(b) ? b : UInt8(ascii: "_")
        }
        bytes = Array(bytes.drop { $0 == UInt8(ascii: "_") })
        if let first = bytes.first, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) { bytes.insert(UInt8(ascii: "F"), at: 0) }
        return String(decoding: bytes.prefix(64), as: UTF8.self)
    }
}

/// The daemon's own datagram socket to journald, non-blocking and connected
/// once (a record is then one send(2), with no address to look up). When
/// journald restarts, its socket is a new one: the next send fails with
/// ECONNREFUSED (then ENOTCONN) and the socket is connected again.
final class JournalSocket {
    /// Where journald listens for the native protocol.
    static let defaultPath = "/run/systemd/journal/socket"

    let path: String
    private let fd: Int32
    /// nil when `path` does not fit `sun_path`: every send fails (ENAMETOOLONG).
    private let address: SocketAddress?

    enum Outcome: Equatable {
        case sent
        /// journald's queue is full (it is not reading): EAGAIN.
        case wouldBlock
        /// Anything else (no journald, a record too large), with errno.
        case failed(Int32)
    }

    init(path: String) {
        self.path = path
        fd = (try? Sys.blocking("socket") { socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0) }) ?? -1
        address = SocketAddress.unix(path: path)
        _ = connect()  // failing here is retried with the first record
    }

    deinit { if fd >= 0 { Sys.close(fd) } }

    /// connect(2) to `path`: 0, or errno (ENOENT: no journald; ECONNREFUSED:
    /// a socket file nobody listens on).
    private func connect() -> Int32 {
        guard fd >= 0 else { return EBADF }
        guard let address else { return ENAMETOOLONG }
        do {
            _ = try Sys.blocking("connect") { address.withSockaddr { Glibc.connect(fd, $0, $1) } }
            return 0
        } catch {
            return error.errno
        }
    }

    /// Sends one record without waiting (MSG_DONTWAIT).
    func send(_ datagram: [UInt8]) -> Outcome {
        guard fd >= 0 else { return .failed(EBADF) }
        var reconnected = false
        while true {
            let e: Int32
            do {
                let r = try Sys.call("send") { datagram.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) } }
                guard case .done = r else { return .wouldBlock }
                return .sent
            } catch {
                e = error.errno
            }
            switch e {
            case ENOBUFS, ENOMEM:
                return .wouldBlock
            case ECONNREFUSED, ENOTCONN, ENOENT, EDESTADDRREQ:
                // journald restarted (or was not there when we connected).
                guard !reconnected else { return .failed(e) }
                reconnected = true
                let c = connect()
                if c != 0 { return .failed(c) }
            default:
                return .failed(e)
            }
        }
    }
}
