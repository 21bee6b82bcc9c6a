import CSystemd
import Glibc
import RoomcastCore

/// Where log records go.
public enum LogSink: Equatable, Sendable {
    /// journald's native protocol (`sd_journal_sendv`) with structured fields.
    case journal
    /// One line per record on stderr. `syslogPrefix` writes `<N>` in front
    /// (stderr connected to journald, sd-daemon(3)); otherwise the line
    /// carries a time stamp and the level for a human at a terminal.
    case stderr(syslogPrefix: Bool)

    /// Resolves `log.target` (`auto`: journal when stderr is the journal,
    /// compared by device and inode against `$JOURNAL_STREAM`, systemd.exec(5)).
    public static func resolve(_ target: LogTarget) -> LogSink {
        let onJournal = stderrIsJournal()
        switch target {
        case .journal:
            // Without journald (a container, a shell) every record would be
            // lost, fatal ones too: fall back to stderr.
            return access("/run/systemd/journal/socket", W_OK) == 0 ? .journal : .stderr(syslogPrefix: onJournal)
        case .stderr: return .stderr(syslogPrefix: onJournal)
        case .auto: return onJournal ? .journal : .stderr(syslogPrefix: false)
        }
    }

    static func stderrIsJournal() -> Bool {
        guard let env = getenv("JOURNAL_STREAM") else { return false }
        let parts = String(cString: env).split(separator: ":")
        guard parts.count == 2, let dev = UInt64(parts[0]), let ino = UInt64(parts[1]) else { return false }
        var st = stat()
        guard fstat(2, &st) == 0 else { return false }
        return UInt64(st.st_dev) == dev && UInt64(st.st_ino) == ino
    }
}

/// The daemon's logger: records with a level, a message and structured
/// fields (`CLIENT_ADDR`, `ROOM`, `REASON`, ...). Field names must be valid
/// journal field names (A-Z, 0-9, _; journald silently drops others).
/// Single-threaded, like everything driven by the event loop.
public final class Logger {
    /// Records below this level are discarded.
    public var level: LogLevel
    public let sink: LogSink
    private let identifier: String
    private var limits: [String: (windowStart: UInt64, count: Int, suppressed: Int)] = [:]

    /// Warnings of one kind allowed per `rateWindowMs` before suppression.
    let rateBurst = 10
    /// The window of `rateBurst`, in ms.
    let rateWindowMs: UInt64
    /// Where `.stderr` lines are written (2; a pipe in tests).
    private let outputFD: Int32

    /// - Parameters:
    ///   - rateWindowMs: the window in which `peerWarning` lets `rateBurst`
    ///     warnings of one kind through, in ms (10 s; shorter in tests).
    ///   - outputFD: the descriptor of the `.stderr` sink (2).
    public init(level: LogLevel, sink: LogSink, identifier: String = "roomcastd", rateWindowMs: UInt64 = 10_000, outputFD: Int32 = 2) {
        self.level = level
        self.sink = sink
        self.identifier = identifier
        self.rateWindowMs = rateWindowMs
        self.outputFD = outputFD
    }

    @inline(__always)
    public func enabled(_ l: LogLevel) -> Bool { l >= level }

    public func debug(_ message: @autoclosure () -> String, _ fields: @autoclosure () -> KeyValuePairs<String, String> = [:]) {
        if enabled(.debug) { emit(.debug, message(), fields()) }
    }
    public func info(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        if enabled(.info) { emit(.info, message, fields) }
    }
    public func notice(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        if enabled(.notice) { emit(.notice, message, fields) }
    }
    public func warning(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        if enabled(.warning) { emit(.warning, message, fields) }
    }
    public func error(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        if enabled(.error) { emit(.error, message, fields) }
    }

    /// A warning caused by a peer (bad input, limits): at most `rateBurst`
    /// per `rateWindowMs` for each `reason`; the rest are counted and
    /// reported in one line when the next window opens. `reason` is a stable
    /// snake_case code (`bad_frame`, `slow_consumer`, ...) logged as the
    /// `REASON` field, so `journalctl -F REASON` lists kinds, not instances.
    public func peerWarning(reason: String, nowMs: UInt64, _ message: @autoclosure () -> String,
                            _ fields: @autoclosure () -> KeyValuePairs<String, String> = [:]) {
        guard enabled(.warning) else { return }
        var entry = limits[reason] ?? (nowMs, 0, 0)
        if nowMs &- entry.windowStart >= rateWindowMs {
            reportSuppressed(reason, entry, nowMs: nowMs)
            entry = (nowMs, 0, 0)
        }
        entry.count += 1
        if entry.count <= rateBurst {
            emit(.warning, message(), fields(), reason: reason)
        } else {
            entry.suppressed += 1
        }
        limits[reason] = entry
    }

    /// Reports the warnings suppressed in windows that have ended (in every
    /// window with `final`, at stop), so the count of a burst is logged
    /// even when no warning of its kind follows. Call it every few seconds.
    public func flushSuppressed(nowMs: UInt64, final: Bool = false) {
        for (reason, entry) in limits where final || nowMs &- entry.windowStart >= rateWindowMs {
            reportSuppressed(reason, entry, nowMs: nowMs)
            limits[reason] = nil  // the next warning of this kind opens a new window
        }
    }

    private func reportSuppressed(_ reason: String, _ entry: (windowStart: UInt64, count: Int, suppressed: Int), nowMs: UInt64) {
        guard entry.suppressed > 0, enabled(.warning) else { return }  // the level may have risen since (reload)
        emit(.warning, "suppressed \(entry.suppressed) similar warnings (\(reason)) in the last \(formatDuration(ms: nowMs &- entry.windowStart))",
             ["REASON": reason])
    }

    /// Longest message or field value written, in bytes: the last line of
    /// defence against peer-supplied text the call site did not shorten to
    /// `logClipBytes` with `clipForLog` (longer ones are cut the same way).
    public static let maxValueBytes = 4096

    private func emit(_ level: LogLevel, _ message: String, _ fields: KeyValuePairs<String, String>, reason: String? = nil) {
        let message = clipForLog(message, maxBytes: Self.maxValueBytes)
        let fields = fields.map { ($0.key, clipForLog($0.value, maxBytes: Self.maxValueBytes)) }
        switch sink {
        case .journal:
            var entries = ["MESSAGE=" + message, "PRIORITY=\(level.syslogPriority)", "SYSLOG_IDENTIFIER=" + identifier]
            if let reason { entries.append("REASON=" + reason) }
            for (k, v) in fields { entries.append(k + "=" + v) }
            Self.sendJournal(entries)
        case .stderr(let prefix):
            // One record, one line: text from peers (room and user names) is
            // escaped, so a client cannot forge log lines (journald keeps the
            // fields binary-safe instead).
            var line = prefix ? "<\(level.syslogPriority)>" : Self.timestamp() + " " + level.rawValue.uppercased() + " "
            line += Self.escaped(message)
            if let reason { line += " REASON=" + reason }
            for (k, v) in fields {
                let value = Self.escaped(v)
                line += " " + k + "=" + (v.contains(" ") || v.contains("\"") || v.isEmpty ? "\"" + value + "\"" : value)
            }
            line += "\n"
            var bytes = Array(line.utf8)
            bytes.withUnsafeMutableBytes { buf in
                var off = 0
                while off < buf.count {
                    let n = write(outputFD, buf.baseAddress! + off, buf.count - off)
                    if n > 0 { off += n } else if n < 0 && errno == EINTR { continue } else { break }
                }
            }
        }
    }

    /// `text` on one line: JSON's escaping (`\\`, `\"`, `\n`, `\u001b`, ...)
    /// without the surrounding quotes.
    static func escaped(_ text: String) -> String {
        let literal = jsonStringLiteral(text)
        return String(literal.dropFirst().dropLast())
    }

    /// One datagram to journald: every `FIELD=value` entry packed into one
    /// byte array, with an iovec per entry pointing into it.
    private static func sendJournal(_ entries: [String]) {
        var packed: [UInt8] = []
        var lengths: [Int] = []
        for e in entries {
            packed.append(contentsOf: e.utf8)
            lengths.append(e.utf8.count)
        }
        packed.withUnsafeMutableBytes { buf in
            withUnsafeTemporaryAllocation(of: iovec.self, capacity: lengths.count) { iov in
                var offset = 0
                for (i, n) in lengths.enumerated() {
                    iov[i] = iovec(iov_base: buf.baseAddress.map { $0 + offset }, iov_len: n)
                    offset += n
                }
                _ = sd_journal_sendv(iov.baseAddress, Int32(lengths.count))
            }
        }
    }

    private static func timestamp() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        var t = ts.tv_sec
        var tmv = tm()
        localtime_r(&t, &tmv)
        func pad(_ v: Int32, _ w: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, w - s.count)) + s
        }
        return "\(tmv.tm_year + 1900)-\(pad(tmv.tm_mon + 1, 2))-\(pad(tmv.tm_mday, 2)) "
            + "\(pad(tmv.tm_hour, 2)):\(pad(tmv.tm_min, 2)):\(pad(tmv.tm_sec, 2)).\(pad(Int32(ts.tv_nsec / 1_000_000), 3))"
    }
}
