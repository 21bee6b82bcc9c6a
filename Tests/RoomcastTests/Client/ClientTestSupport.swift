// Launchers for the client tests: a real roomcastd on an ephemeral loopback
// port, and the roomcast executable run as a child process. Everything lives
// in per-test temporary files: tests run in parallel in one process, so no
// setenv, no chdir, no fixed ports.
import Foundation
import Glibc
import RoomcastClient

/// The folder holding the built products (roomcastd, roomcast), found from
/// the running test binary so it follows `--scratch-path` and `-c release`.
let productsDirectory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

private func temporaryURL(_ name: String) -> URL {
    FileManager.default.temporaryDirectory.appendingPathComponent("roomcast-client-\(getpid())-\(UUID().uuidString)-\(name)")
}

/// Polls `condition` every 10 ms for up to `seconds` (the harness's `waitUntil`).
func waitFor(_ seconds: Double, _ condition: () -> Bool) -> Bool {
    waitUntil(.milliseconds(Int64(seconds * 1000)), condition)
}

/// A roomcastd child process. Logs go to a file (no pipe to fill up).
final class TestDaemon {
    let process = Process()
    let port: UInt16
    let configURL: URL
    let logURL: URL

    /// Starts roomcastd with `config` (INI text appended to `[log] target = stderr`)
    /// on 127.0.0.1:`port` (0: ephemeral) and waits until it is listening.
    init(config: String = "", port: UInt16 = 0) throws {
        configURL = temporaryURL("roomcastd.conf")
        logURL = temporaryURL("roomcastd.log")
        try Data(("[log]\ntarget = stderr\nstats_interval = 0\n" + config).utf8).write(to: configURL)
        _ = FileManager.default.createFile(atPath: logURL.path, contents: nil)
        process.executableURL = productsDirectory.appendingPathComponent("roomcastd")
        process.arguments = ["--config", configURL.path, "--listen", "127.0.0.1:\(port)"]
        process.standardError = try FileHandle(forWritingTo: logURL)
        process.standardOutput = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
        var found: UInt16?
        let (process, logURL) = (process, logURL)
        _ = waitFor(10) {
            guard let log = try? String(contentsOf: logURL, encoding: .utf8),
                  let range = log.range(of: "listening on 127.0.0.1:") else { return !process.isRunning }
            found = UInt16(log[range.upperBound...].prefix { $0.isNumber })
            return found != nil
        }
        guard let found else {
            process.terminate()
            throw TestFailure("roomcastd did not start listening: \((try? String(contentsOf: logURL, encoding: .utf8)) ?? "")")
        }
        self.port = found
    }

    /// `127.0.0.1:PORT`.
    var address: String { "127.0.0.1:\(port)" }
    var serverAddress: ServerAddress { ServerAddress(host: "127.0.0.1", port: port) }
    var log: String { (try? String(contentsOf: logURL, encoding: .utf8)) ?? "" }

    /// SIGTERM (graceful stop) and wait for the exit.
    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        if !waitFor(10, { !process.isRunning }) { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(at: configURL)
        try? FileManager.default.removeItem(at: logURL)
    }
}

/// A port nothing listens on: bound once by us, then released.
func unusedPort() -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var sa = sockaddr_in()
    sa.sin_family = sa_family_t(AF_INET)
    sa.sin_addr.s_addr = INADDR_LOOPBACK.bigEndian
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
    _ = withUnsafeMutablePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
    return UInt16(bigEndian: sa.sin_port)
}

/// What a finished roomcast run printed.
struct CommandResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// The roomcast executable as a child process; stdout and stderr go to
/// files, stdin is a pipe the test may write to.
final class RoomcastCommand {
    let process = Process()
    let stdoutURL = temporaryURL("stdout")
    let stderrURL = temporaryURL("stderr")
    let input = Pipe()

    /// Starts `executable` (default: the built roomcast) with `arguments`.
    init(_ arguments: [String], executable: URL = productsDirectory.appendingPathComponent("roomcast")) throws {
        _ = FileManager.default.createFile(atPath: stdoutURL.path, contents: nil)
        _ = FileManager.default.createFile(atPath: stderrURL.path, contents: nil)
        process.executableURL = executable
        process.arguments = arguments
        process.standardOutput = try FileHandle(forWritingTo: stdoutURL)
        process.standardError = try FileHandle(forWritingTo: stderrURL)
        process.standardInput = input
        try process.run()
    }

    var stdout: String { (try? String(contentsOf: stdoutURL, encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }

    /// Writes `text` to the child's stdin.
    func type(_ text: String) { input.fileHandleForWriting.write(Data(text.utf8)) }

    /// Waits up to `seconds` until stderr contains `text`.
    func waitForStderr(_ text: String, seconds: Double = 10) -> Bool { waitFor(seconds) { stderr.contains(text) } }
    /// Waits up to `seconds` until stdout contains `text`.
    func waitForStdout(_ text: String, seconds: Double = 10) -> Bool { waitFor(seconds) { stdout.contains(text) } }

    /// Waits up to `seconds` for the exit (then kills it and throws).
    func finish(seconds: Double = 10) throws -> CommandResult {
        if !waitFor(seconds, { !process.isRunning }) {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw TestFailure("\(process.executableURL?.lastPathComponent ?? "?") \(process.arguments ?? []) did not exit within \(seconds) s; stderr: \(stderr)")
        }
        process.waitUntilExit()
        return CommandResult(status: process.terminationStatus, stdout: stdout, stderr: stderr)
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
        try? FileManager.default.removeItem(at: stdoutURL)
        try? FileManager.default.removeItem(at: stderrURL)
    }
}

/// Runs roomcast to completion.
func roomcast(_ arguments: [String], seconds: Double = 15) throws -> CommandResult {
    let command = try RoomcastCommand(arguments)
    try? command.input.fileHandleForWriting.close()
    return try command.finish(seconds: seconds)
}

/// A library client that records what it sees, for tests.
final class RecordingClient {
    let client: RoomcastClient
    var events: [ClientEvent] = []
    var statuses: [ClientStatus] = []

    init(loop: EventLoop, configuration: ClientConfiguration) {
        let box = Box()
        client = RoomcastClient(loop: loop, configuration: configuration,
                                onEvent: { box.owner?.events.append($0) },
                                onStatus: { box.owner?.statuses.append($0) })
        box.owner = self
    }

    private final class Box { weak var owner: RecordingClient? }

    var texts: [String] { events.compactMap { if case .text(let m) = $0 { m.text } else { nil } } }
    var disconnects: Int { statuses.filter { if case .disconnected = $0 { true } else { false } }.count }
}

/// A configuration for a test daemon: fast heartbeats and reconnects.
func testConfiguration(_ daemon: TestDaemon) -> ClientConfiguration {
    var configuration = ClientConfiguration(server: daemon.serverAddress)
    configuration.heartbeatIntervalMs = 200
    configuration.connectTimeoutMs = 2_000
    configuration.reconnect.initialDelayMs = 50
    configuration.reconnect.maxDelayMs = 200
    return configuration
}
