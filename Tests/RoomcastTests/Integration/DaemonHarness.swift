// Starts the built roomcastd as a child process with a temp config and a fake
// NOTIFY_SOCKET, and tears it down however the test ends. Safe for tests
// running in parallel in one process: ephemeral ports, private temp dirs, the
// environment passed to the child only, no global state.
import Foundation
import Glibc
import Synchronization
import Testing

/// The `roomcastd` built next to the running test bundle (debug or release).
let roomcastdURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    .deletingLastPathComponent().appendingPathComponent("roomcastd")

/// Polls `condition` every 10 ms until it is true or `timeout` passes.
func waitUntil(_ timeout: Duration, _ condition: () -> Bool) -> Bool {
    let deadline = monotonicMs() + Int64(timeout.ms)
    while !condition() {
        if monotonicMs() >= deadline { return false }
        usleep(10_000)
    }
    return true
}

/// A private temp directory, removed with everything in it on deinit.
final class TempDirectory {
    let path: String

    init() throws {
        var template = Array("/tmp/roomcast-itest-XXXXXX".utf8CString)
        guard let p = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw HarnessError("mkdtemp: \(errnoText())")
        }
        path = String(cString: p)
    }

    /// Writes `text` to `name` in the directory and returns its path.
    @discardableResult
    func write(_ name: String, _ text: String) throws -> String {
        let file = path + "/" + name
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        return file
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// One datagram received on the fake notify socket.
struct Notification: Sendable {
    /// Position in the order of arrival (0-based).
    var index: Int
    /// Arrival time, `monotonicMs()`.
    var atMs: Int64
    /// The newline-separated `KEY=VALUE` assignments (sd_notify(3)).
    var lines: [String]

    /// The value of `key` in this datagram, if it is assigned.
    func value(_ key: String) -> String? {
        lines.first { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) }
    }
}

/// An AF_UNIX datagram socket bound at `path` and read by a background
/// thread, which turns each datagram into a `Record` (`parse` gets its bytes,
/// its arrival time `monotonicMs()` and its index) and keeps them in order;
/// datagrams `parse` refuses are kept with its complaint. It can stop
/// reading and read again, like a busy PID 1 or journald: the socket stays
/// bound and its queue fills. The fake notify socket and the fake journald
/// are both one.
final class DatagramReader<Record: Sendable>: Sendable {
    let path: String
    private let records = Mutex<[Record]>([])
    private let refused = Mutex<[String]>([])
    private let stopped = Mutex(false)
    private let paused = Mutex(false)
    /// Set by the reading thread once it saw `paused` (it reads nothing more).
    private let pauseSeen = Mutex(false)

    /// - Parameter bufferSize: the largest datagram read whole, in bytes.
    init(path: String, bufferSize: Int, parse: @escaping @Sendable (_ bytes: [UInt8], _ atMs: Int64, _ index: Int) throws -> Record) throws {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket(AF_UNIX): \(errnoText())") }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { close(fd); throw HarnessError("path too long: \(path)") }
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: bytes) }
        let r = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard r == 0 else { let e = errno; close(fd); throw HarnessError("bind \(path): \(errnoText(e))") }
        var tv = timeval(tv_sec: 0, tv_usec: 50_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        self.path = path
        Thread.detachNewThread { [self] in self.receiveLoop(fd, bufferSize: bufferSize, parse) }
    }

    /// Runs on the background thread until `stop()`; owns and closes `fd`.
    private func receiveLoop(_ fd: Int32, bufferSize: Int, _ parse: ([UInt8], Int64, Int) throws -> Record) {
        var buffer = [UInt8](repeating: 0, count: bufferSize)
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
                let record = try parse(raw, at, records.withLock { $0.count })
                records.withLock { $0.append(record) }
            } catch {
                refused.withLock { $0.append("\(error): \(String(decoding: raw.prefix(200), as: UTF8.self))") }
            }
        }
        close(fd)
    }

    /// Stops the background thread (it closes the socket within 50 ms).
    func stop() { stopped.withLock { $0 = true } }

    /// Stops reading: the socket stays bound, and its queue fills and stays
    /// full. Returns once the reading thread has stopped (it may take a
    /// datagram that arrives meanwhile, none after the return).
    func pauseReading() {
        pauseSeen.withLock { $0 = false }
        paused.withLock { $0 = true }
        _ = waitUntil(.seconds(1)) { pauseSeen.withLock { $0 } }
    }

    /// Reads again (what the kernel queued comes first).
    func resumeReading() { paused.withLock { $0 = false } }

    /// Every record so far.
    var all: [Record] { records.withLock { $0 } }
    /// Datagrams `parse` refused, with its complaint.
    var refusedDatagrams: [String] { refused.withLock { $0 } }

    /// The first record at `index >= from` satisfying `match`, waiting up to `timeout`.
    func wait(from: Int, timeout: Duration, _ match: (Record) -> Bool) -> Record? {
        var found: Record?
        _ = waitUntil(timeout) {
            found = all.dropFirst(from).first(where: match)
            return found != nil
        }
        return found
    }
}

/// A fake `$NOTIFY_SOCKET` that records every datagram with its arrival
/// time. `pauseReading()` plays a PID 1 busy elsewhere
/// (`net.unix.max_dgram_qlen` datagrams queue, then senders get EAGAIN).
final class NotifySocket: Sendable {
    private let socket: DatagramReader<Notification>

    init(path: String) throws {
        socket = try DatagramReader(path: path, bufferSize: 4096) { bytes, at, index in
            Notification(index: index, atMs: at, lines: String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init))
        }
    }

    var path: String { socket.path }
    /// Stops the background thread (it closes the socket within 50 ms).
    func stop() { socket.stop() }
    func pauseReading() { socket.pauseReading() }
    func resumeReading() { socket.resumeReading() }

    /// Every datagram so far.
    var all: [Notification] { socket.all }

    /// The first datagram at `index >= from` that has a line satisfying
    /// `match`, waiting up to `timeout` for it.
    func wait(from: Int = 0, timeout: Duration = .seconds(10), _ match: (String) -> Bool) -> Notification? {
        socket.wait(from: from, timeout: timeout) { $0.lines.contains(where: match) }
    }

    /// The first datagram at `index >= from` with the line `line` (e.g. `READY=1`).
    func wait(for line: String, from: Int = 0, timeout: Duration = .seconds(10)) -> Notification? {
        wait(from: from, timeout: timeout) { $0 == line }
    }
}

/// Text read from a child's pipe by a background thread until EOF.
final class PipeCollector: Sendable {
    private let text = Mutex("")
    private let finished = Mutex(false)
    private let paused = Mutex(false)

    /// Starts reading `pipe` (its write end must be closed in this process,
    /// as `Process.run()` does).
    init(_ pipe: Pipe) {
        let handle = pipe.fileHandleForReading
        Thread.detachNewThread { [self] in
            var buffer = [UInt8](repeating: 0, count: 16 * 1024)
            while true {
                if paused.withLock({ $0 }) {
                    usleep(10_000)
                    continue
                }
                let n = buffer.withUnsafeMutableBytes { read(handle.fileDescriptor, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                let chunk = String(decoding: buffer[0..<n], as: UTF8.self)
                text.withLock { $0 += chunk }
            }
            finished.withLock { $0 = true }
            try? handle.close()
        }
    }

    /// Everything read so far.
    var current: String { text.withLock { $0 } }

    /// Stops reading, like a paused pager: the pipe fills (64 KiB) and the
    /// writer's next write(2) would block.
    func pauseReading() { paused.withLock { $0 = true } }

    /// Reads again.
    func resumeReading() { paused.withLock { $0 = false } }

    /// Waits up to `timeout` for the text to contain `needle`.
    @discardableResult
    func wait(for needle: String, timeout: Duration = .seconds(5)) -> Bool {
        waitUntil(timeout) { current.contains(needle) }
    }

    /// Waits up to `timeout` for one line to contain every string of `needles`.
    @discardableResult
    func wait(forLineWith needles: [String], timeout: Duration = .seconds(5)) -> Bool {
        waitUntil(timeout) { line(with: needles) != nil }
    }

    /// The first line so far that contains every string of `needles`.
    func line(with needles: [String]) -> String? {
        current.split(separator: "\n").first { l in needles.allSatisfy { l.contains($0) } }.map(String.init)
    }

    /// Waits up to `timeout` for EOF (the child and its descendants closed the pipe).
    func waitForEOF(timeout: Duration = .seconds(5)) -> Bool {
        waitUntil(timeout) { finished.withLock { $0 } }
    }
}

/// A child process with stdout and stderr captured. On deinit a child still
/// running gets SIGTERM, then SIGKILL after 5 s.
final class ChildProcess {
    let process = Process()
    let stdout: PipeCollector
    let stderr: PipeCollector

    /// Starts `executable` with exactly `environment` (the test process's
    /// environment is never modified), and with SIGHUP, SIGINT and SIGTERM
    /// unblocked, as systemd starts a service (it resets the signal mask):
    /// `Process` passes the calling thread's mask on, and the threads Swift
    /// Testing runs tests on block them.
    init(_ executable: URL, _ arguments: [String], environment: [String: String]) throws {
        let out = Pipe(), err = Pipe()
        process.executableURL = executable
        process.arguments = arguments
        process.environment = environment
        process.standardInput = FileHandle(forReadingAtPath: "/dev/null")
        process.standardOutput = out
        process.standardError = err
        var unblock = sigset_t(), old = sigset_t()
        sigemptyset(&unblock)
        for signal in [SIGHUP, SIGINT, SIGTERM] { sigaddset(&unblock, signal) }
        pthread_sigmask(SIG_UNBLOCK, &unblock, &old)
        defer { pthread_sigmask(SIG_SETMASK, &old, nil) }
        try process.run()
        stdout = PipeCollector(out)
        stderr = PipeCollector(err)
    }

    var pid: Int32 { process.processIdentifier }

    /// Sends `signal` to the child.
    func kill(_ signal: Int32) { if process.isRunning { Glibc.kill(pid, signal) } }

    /// The exit status (or the signal number, for a child killed by one),
    /// or nil if it is still running after `timeout`.
    func waitForExit(timeout: Duration = .seconds(10)) -> Int32? {
        guard waitUntil(timeout, { !process.isRunning }) else { return nil }
        return process.terminationStatus
    }

    /// Whether the child exited normally (not killed by a signal).
    var exitedNormally: Bool { !process.isRunning && process.terminationReason == .exit }

    deinit {
        guard process.isRunning else { return }
        Glibc.kill(pid, SIGTERM)
        if waitForExit(timeout: .seconds(5)) == nil {
            Glibc.kill(pid, SIGKILL)
            _ = waitForExit(timeout: .seconds(5))
        }
    }
}

/// The environment for a child: the test process's own, minus anything that
/// would make the child think systemd runs it, plus `extra`.
func childEnvironment(_ extra: [String: String]) -> [String: String] {
    var env = ProcessInfo.processInfo.environment
    for key in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "JOURNAL_STREAM"] {
        env[key] = nil
    }
    env.merge(extra) { $1 }
    return env
}

/// A running roomcastd on an ephemeral loopback port with a fake
/// NOTIFY_SOCKET. Everything is torn down on deinit (SIGTERM, then SIGKILL;
/// temp files removed), so a failing test cleans up too.
final class Daemon {
    /// Settings every test gets unless it overrides them: ephemeral
    /// loopback port, readable debug log on stderr, a fast timer tick, and
    /// no `viewers` notices (tests that count frames would see them every 5 s;
    /// the tests of counts turn them on).
    static let baseSettings = [
        "server.listen": "127.0.0.1:0",
        "log.target": "stderr",
        "log.level": "debug",
        "heartbeat.tick": "50ms",
        "rooms.counts": "0",
    ]

    /// Renders `section.key = value` settings as an INI file.
    static func configText(_ settings: [String: String]) -> String {
        var sections: [String: [String]] = [:]
        for (dotted, value) in settings {
            let parts = dotted.split(separator: ".", maxSplits: 1).map(String.init)
            sections[parts[0], default: []].append("\(parts[1]) = \(value)")
        }
        return sections.keys.sorted().map { "[\($0)]\n" + sections[$0]!.sorted().joined(separator: "\n") + "\n" }
            .joined(separator: "\n")
    }

    let directory: TempDirectory
    let configPath: String
    let notify: NotifySocket
    /// The fake journald the daemon logs to (`log.target = journal`), if any.
    let journal: FakeJournal?
    let child: ChildProcess
    /// The listening host and port (from the log line `listening on HOST:PORT`).
    private(set) var host = ""
    private(set) var port: UInt16 = 0
    /// The port of the `[json]` listener (docs/protocol/json.md §7), when configured.
    private(set) var jsonPort: UInt16?
    /// The port of the `[websocket]` listener (docs/protocol/clients.md §8), when configured.
    private(set) var webSocketPort: UInt16?
    /// The port of the first TCP `[api]` listener (docs/api.md), when configured.
    private(set) var apiPort: UInt16?
    /// The ports of the `listen_tls` listeners by dialect (`ltb`, `json`, `websocket`), when configured.
    private(set) var tlsPorts: [String: UInt16] = [:]

    /// Starts roomcastd with `baseSettings` overridden by `settings`, then
    /// waits for READY=1 and `roomcastd ready` on stderr (10 s in all), so
    /// `log.level` must stay at `info` or below.
    /// - Parameters:
    ///   - environment: extra variables for the child (e.g. `WATCHDOG_USEC`).
    ///   - socketActivation: start it through `systemd-socket-activate` with
    ///     one `-l 127.0.0.1:PORT` per entry and `--fdname=` the names (`ltb`,
    ///     `json`) instead; it is then only started by the first connection,
    ///     so nothing is awaited. `port` is the first entry's.
    ///   - descriptorLimit: start it through `/bin/sh -c 'ulimit -Sn S && ulimit -Hn H && exec ...'`
    ///     (systemd's `LimitNOFILE=S:H`); the shell execs, so the PID is the daemon's.
    ///   - journal: a fake journald, passed as `ROOMCAST_JOURNAL_SOCKET`; with
    ///     `log.target = journal` the `roomcastd ready`, `listening on` and
    ///     `client connected` records are awaited there instead of on stderr.
    ///   - afterSpawn: called with the daemon's PID as soon as it is
    ///     spawned, before waiting for it to be ready (e.g. to signal it while it starts).
    init(_ settings: [String: String] = [:], environment: [String: String] = [:],
         socketActivation: [(name: String, port: UInt16)] = [], descriptorLimit: (soft: Int, hard: Int)? = nil,
         journal: FakeJournal? = nil, afterSpawn: (Int32) -> Void = { _ in }) throws {
        directory = try TempDirectory()
        configPath = try directory.write("roomcastd.conf", Self.configText(Self.baseSettings.merging(settings) { $1 }))
        notify = try NotifySocket(path: directory.path + "/notify")
        self.journal = journal
        var extra = ["NOTIFY_SOCKET": notify.path]
        if let journal { extra["ROOMCAST_JOURNAL_SOCKET"] = journal.path }
        let env = childEnvironment(environment.merging(extra) { $1 })
        if let first = socketActivation.first {
            let listen = socketActivation.flatMap { ["-l", "127.0.0.1:\($0.port)"] }
            let names = "--fdname=" + socketActivation.map(\.name).joined(separator: ":")
            child = try ChildProcess(URL(fileURLWithPath: "/usr/bin/systemd-socket-activate"),
                                     listen + [names, "-E", "NOTIFY_SOCKET", roomcastdURL.path, "--config", configPath],
                                     environment: env)
            host = "127.0.0.1"
            self.port = first.port
            return
        }
        if let limit = descriptorLimit {
            child = try ChildProcess(URL(fileURLWithPath: "/bin/sh"),
                                     ["-c", "ulimit -Sn \(limit.soft) && ulimit -Hn \(limit.hard) && exec \"$0\" \"$@\"", roomcastdURL.path, "--config", configPath],
                                     environment: env)
        } else {
            child = try ChildProcess(roomcastdURL, ["--config", configPath], environment: env)
        }
        afterSpawn(child.pid)
        do {
            try waitUntilReady()
        } catch {
            notify.stop()
            throw error
        }
    }

    deinit {
        notify.stop()
        // Stop the daemon here (not in `child`'s deinit) so that whatever a
        // sanitizer prints at exit is read and fails the test that ran it.
        child.kill(SIGTERM)
        if child.waitForExit(timeout: .seconds(8)) == nil { child.kill(SIGKILL) }
        _ = stderr.waitForEOF(timeout: .seconds(2))
        checkSanitizerReports(stderr.current)
        // `directory`'s deinit removes the files.
    }

    /// Waits for READY=1 and the `roomcastd ready` line on stderr. That line
    /// is written after READY=1 and after every `listening on` line, so all
    /// of them have been read once it is seen (the notify socket and the
    /// stderr pipe are read by different threads: READY=1 alone could win).
    func waitUntilReady(timeout: Duration = .seconds(10)) throws {
        if let journal { return try waitUntilReady(journal, timeout: timeout) }
        let ready = { self.notify.all.contains { $0.lines.contains("READY=1") } && self.stderr.current.contains("roomcastd ready") }
        // A daemon that exits (a bad config, a taken port) fails at once, not after `timeout`.
        guard waitUntil(timeout, { ready() || !child.process.isRunning }), ready() else {
            let how = child.process.isRunning ? "did not become ready within \(timeout)" : "exited before it was ready"
            if !child.process.isRunning { _ = stderr.waitForEOF(timeout: .seconds(2)) }  // all it said
            throw HarnessError("roomcastd \(how); stderr:\n\(stderr.current)")
        }
        let lines = stderr.current.split(separator: "\n").filter { $0.contains("listening on ") && !$0.contains("listening on unix:") }
        for line in lines {
            let address = line[line.range(of: "listening on ")!.upperBound...].prefix { $0 != " " }
            guard let colon = address.lastIndex(of: ":"), let port = UInt16(address[address.index(after: colon)...]) else {
                throw HarnessError("no port in log line: \(line)")
            }
            if let tls = ["ltb", "json", "websocket"].first(where: { line.contains("(\($0)+tls)") }) {
                tlsPorts[tls] = port
            } else if line.contains("(api)") {
                apiPort = apiPort ?? port
            } else if line.contains("(json)") {
                jsonPort = port
            } else if line.contains("(websocket)") {
                webSocketPort = port
            } else if self.port == 0 {
                host = address[..<colon].trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
                self.port = port
            }
        }
    }

    /// `waitUntilReady` for a daemon logging to `journal`: the same records, as journal fields.
    private func waitUntilReady(_ journal: FakeJournal, timeout: Duration) throws {
        let ready = { self.notify.all.contains { $0.lines.contains("READY=1") } && journal.all.contains { $0.message == "roomcastd ready" } }
        guard waitUntil(timeout, { ready() || !child.process.isRunning }), ready() else {
            if !child.process.isRunning { _ = stderr.waitForEOF(timeout: .seconds(2)) }
            throw HarnessError("roomcastd did not log 'roomcastd ready' to the fake journal; records: \(journal.all.map(\.message)); "
                               + "malformed: \(journal.malformedDatagrams); stderr:\n\(stderr.current)")
        }
        for record in journal.all where record.message.hasPrefix("listening on ") {
            guard let address = record.value("LISTEN"), let colon = address.lastIndex(of: ":"),
                  let port = UInt16(address[address.index(after: colon)...]) else {
                throw HarnessError("no LISTEN port in record: \(record.fields)")
            }
            if record.value("PROTOCOL") == "json" {
                jsonPort = port
            } else if record.value("PROTOCOL") == "websocket" {
                webSocketPort = port
            } else if self.port == 0 {
                host = address[..<colon].trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
                self.port = port
            }
        }
    }

    /// The daemon's stderr (its log, with `target = stderr`).
    var stderr: PipeCollector { child.stderr }

    /// A new client connection. With `awaitAccept` it returns only once the
    /// daemon logged `client connected` for it (so it is in the default room
    /// before anybody sends); that needs `log.level = debug`, the default here.
    func connect(receiveBuffer: Int? = nil, sourceIP: String? = nil, awaitAccept: Bool = true) throws -> TestClient {
        let client = try TestClient(host: host, port: port, receiveBuffer: receiveBuffer, sourceIP: sourceIP, owner: self)
        if awaitAccept, let journal {
            guard journal.wait(timeout: .seconds(5), { $0.message == "client connected" && $0.value("CLIENT_ADDR") == client.address }) != nil else {
                throw HarnessError("roomcastd did not log accepting \(client.address) to the fake journal")
            }
            return client
        }
        if awaitAccept && !stderr.wait(for: "client connected CLIENT_ADDR=\(client.address) ") {
            throw HarnessError("roomcastd did not log accepting \(client.address); stderr:\n\(stderr.current)")
        }
        return client
    }

    /// A client that never reads with its own TCP_MAXSEG (`TestClient.init`), once accepted.
    func connect(receiveBuffer: Int, maxSegment: Int32) throws -> TestClient {
        let client = try TestClient(host: host, port: port, receiveBuffer: receiveBuffer, maxSegment: maxSegment, owner: self)
        if !stderr.wait(for: "client connected CLIENT_ADDR=\(client.address) ") {
            throw HarnessError("roomcastd did not log accepting \(client.address); stderr:\n\(stderr.current)")
        }
        return client
    }

    /// Replaces the config file (for SIGHUP tests); `text` is written verbatim.
    func rewriteConfig(_ text: String) throws {
        try directory.write("roomcastd.conf", text)
    }

    /// The config text `settings` gives, with the base settings included.
    static func fullConfig(_ settings: [String: String]) -> String {
        configText(baseSettings.merging(settings) { $1 })
    }
}

/// Records an issue when a child's stderr holds a sanitizer report (the
/// binary is ASan-built under `make test-asan`).
func checkSanitizerReports(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
    for marker in ["AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "ThreadSanitizer"] where text.contains(marker) {
        let start = text.range(of: marker)!.lowerBound
        Issue.record("roomcastd's stderr has a \(marker) report:\n\(text[start...].prefix(4000))", sourceLocation: sourceLocation)
        return
    }
}

/// Runs roomcastd with `arguments` to completion (10 s at most) and returns
/// its exit status, stdout and stderr. A fake notify socket is passed so
/// tests can check that nothing was reported.
func runRoomcastd(_ arguments: [String]) throws -> (status: Int32?, stdout: String, stderr: String, notifications: [Notification]) {
    let dir = try TempDirectory()
    let notify = try NotifySocket(path: dir.path + "/notify")
    defer { notify.stop() }
    let child = try ChildProcess(roomcastdURL, arguments, environment: childEnvironment(["NOTIFY_SOCKET": notify.path]))
    let status = child.waitForExit(timeout: .seconds(10))
    _ = child.stdout.waitForEOF()
    _ = child.stderr.waitForEOF()
    pause(.milliseconds(20))  // let the notify thread take a last datagram
    checkSanitizerReports(child.stderr.current)
    return (status, child.stdout.current, child.stderr.current, notify.all)
}
