import Glibc
import RoomcastCore
import RoomcastIO

/// Where log records go.
public enum LogSink: Equatable, Sendable {
    /// journald's native protocol with structured fields, sent without
    /// waiting (`JournalSocket`).
    case journal
    /// One line per record on stderr. `syslogPrefix` writes `<N>` in front
    /// (stderr connected to journald, sd-daemon(3)); otherwise the line
    /// carries a time stamp and the level for a human at a terminal.
    case stderr(syslogPrefix: Bool)

    /// journald's socket for the native protocol.
    public static let defaultJournalPath = JournalSocket.defaultPath

    /// Resolves `log.target` (`auto`: journal when stderr is the journal,
    /// compared by device and inode against `$JOURNAL_STREAM`, systemd.exec(5)).
    /// - Parameter journalPath: journald's socket (another one in tests).
    public static func resolve(_ target: LogTarget, journalPath: String = defaultJournalPath) -> LogSink {
        let onJournal = stderrIsJournal()
        switch target {
        case .journal:
            // Without journald (a container, a shell) every record would be
            // lost, fatal ones too: fall back to stderr.
            return access(journalPath, W_OK) == 0 ? .journal : .stderr(syslogPrefix: onJournal)
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
/// fields (`CLIENT_ADDR`, `ROOM`, `REASON`, ...). Field names should be
/// valid journal field names (A-Z, 0-9, _; others are made valid before
/// journald would drop them, `JournalEncoding.fieldName`). Writing never
/// waits : see `JournalSocket` and `StderrOutput`.
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
    /// Where `.stderr` lines are written (2; a pipe in tests), without waiting.
    private let output: StderrOutput?
    /// The `.journal` sink's socket.
    private let journal: JournalSocket?
    /// Records journald did not take (its queue full, or not reachable)
    /// since the last one it took, and the errno of the last of them.
    private(set) var journalDropped = 0
    private var journalDropErrno: Int32 = 0

    /// - Parameters:
    ///   - rateWindowMs: the window in which `peerWarning` lets `rateBurst`
    ///     warnings of one kind through, in ms (10 s; shorter in tests).
    ///   - outputFD: the descriptor of the `.stderr` sink (2).
    ///   - journalPath: journald's socket for the `.journal` sink (a fake one in tests).
    public init(level: LogLevel, sink: LogSink, identifier: String = "roomcastd", rateWindowMs: UInt64 = 10_000, outputFD: Int32 = 2,
                journalPath: String = LogSink.defaultJournalPath) {
        self.level = level
        self.sink = sink
        self.identifier = identifier
        self.rateWindowMs = rateWindowMs
        if case .journal = sink {
            self.journal = JournalSocket(path: journalPath)
            self.output = nil
        } else {
            self.journal = nil
            self.output = StderrOutput(fd: outputFD)
        }
    }

    /// Whether something waits for `flushPending`.
    public var owed: Bool {
        journalDropped > 0 || output.map { $0.pending > 0 || $0.dropped > 0 } == true
    }

    /// Retries what could not be written without waiting: stderr's backlog
    /// and the count of lines dropped, once stderr takes them; the count of
    /// records journald dropped, once it reads again. The event loop calls
    /// it every iteration; it costs a few comparisons when nothing is owed.
    public func flushPending() {
        if journalDropped > 0 { _ = reportJournalDropped() }
        if let output, output.pending > 0 || output.dropped > 0 { flushStderr(output) }
    }

    /// At exit: retries what `flushPending` retries every 10 ms for up to
    /// `timeoutMs`.
    public func flushBeforeExit(timeoutMs: UInt64) {
        let deadline = monotonicMilliseconds() + timeoutMs
        while true {
            flushPending()
            if !owed || monotonicMilliseconds() >= deadline { return }
            usleep(10_000)
        }
    }

    /// Writes stderr's backlog; once it is out, the count of lines dropped
    /// (logged whatever the level: the lines it counts passed the level).
    private func flushStderr(_ output: StderrOutput) {
        output.flush()
        guard output.pending == 0, output.dropped > 0 else { return }
        let n = output.dropped
        output.dropped = 0
        output.write(Array(line(.warning, "stderr was not read: " + (n == 1 ? "1 log line dropped" : "\(n) log lines dropped"),
                                [("DROPPED", String(n))], reason: "stderr_dropped").utf8))
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
            var entries = [(name: "MESSAGE", value: message), ("PRIORITY", String(level.syslogPriority)), ("SYSLOG_IDENTIFIER", identifier)]
            if let reason { entries.append(("REASON", reason)) }
            for (k, v) in fields { entries.append((k, v)) }
            sendJournal(JournalEncoding.encode(entries))
        case .stderr:
            guard let output else { return }
            if output.pending > 0 || output.dropped > 0 { flushStderr(output) }
            output.write(Array(line(level, message, fields, reason: reason).utf8))
        }
    }

    /// A record as one `.stderr` line, newline included: text from peers
    /// (room and user names) is escaped, so a client cannot forge log lines
    /// (journald keeps the fields binary-safe instead).
    private func line(_ level: LogLevel, _ message: String, _ fields: [(String, String)], reason: String?) -> String {
        guard case .stderr(let prefix) = sink else { return "" }
        var line = prefix ? "<\(level.syslogPriority)>" : Self.timestamp() + " " + level.rawValue.uppercased() + " "
        line += Self.escaped(message)
        if let reason { line += " REASON=" + reason }
        for (k, v) in fields {
            let value = Self.escaped(v)
            line += " " + k + "=" + (v.contains(" ") || v.contains("\"") || v.isEmpty ? "\"" + value + "\"" : value)
        }
        return line + "\n"
    }

    /// `text` on one line: JSON's escaping (`\\`, `\"`, `\n`, `\u001b`, ...)
    /// without the surrounding quotes.
    static func escaped(_ text: String) -> String {
        let literal = jsonStringLiteral(text)
        return String(literal.dropFirst().dropLast())
    }

    /// One record to journald, never waiting: when its queue is full the
    /// record is dropped and counted, and the count is logged (one warning,
    /// `REASON=journal_dropped`) before the next record it takes.
    private func sendJournal(_ datagram: [UInt8]) {
        guard let journal else { return }
        if journalDropped > 0 && !reportJournalDropped() {
            journalDropped += 1
            return
        }
        switch journal.send(datagram) {
        case .sent: break
        case .wouldBlock: noteJournalDrop(EAGAIN)
        case .failed(let e): noteJournalDrop(e)
        }
    }

    private func noteJournalDrop(_ e: Int32) {
        journalDropped += 1
        journalDropErrno = e
    }

    /// Sends the warning counting the dropped records; true once journald took it.
    /// It is logged whatever the level: the records it counts passed the level.
    private func reportJournalDropped() -> Bool {
        guard let journal else { return true }
        let n = journalDropped
        let count = n == 1 ? "1 log record dropped" : "\(n) log records dropped"
        let cause = String(cString: strerror(journalDropErrno))
        let message = journalDropErrno == EAGAIN ? "journald did not read its socket: " + count
            : "journald was not reachable (\(cause)): " + count
        let record = JournalEncoding.encode([("MESSAGE", message), ("PRIORITY", String(LogLevel.warning.syslogPriority)),
                                             ("SYSLOG_IDENTIFIER", identifier), ("REASON", "journal_dropped"),
                                             ("DROPPED", String(n)), ("DETAIL", cause)])
        guard journal.send(record) == .sent else { return false }
        journalDropped = 0
        return true
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
