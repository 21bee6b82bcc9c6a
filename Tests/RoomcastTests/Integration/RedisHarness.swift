// A real redis-server for the cluster tests: on an ephemeral
// loopback port, no persistence, its own temp directory; killed (and
// restarted, stopped, continued) on demand and at the end however the test
// ends. `make deps` installs it (Debian's redis-server).
import Foundation
import Glibc
import Testing

let redisServerPath = "/usr/bin/redis-server"
let redisCLIPath = "/usr/bin/redis-cli"

final class RedisServer {
    let port: UInt16
    private let directory: TempDirectory
    private(set) var child: ChildProcess?
    private let arguments: [String]

    /// Starts redis-server on loopback port `port` (nil: a free one) and
    /// waits until it accepts commands; `arguments` are added to its command line.
    init(port: UInt16? = nil, arguments: [String] = []) throws {
        guard FileManager.default.isExecutableFile(atPath: redisServerPath),
              FileManager.default.isExecutableFile(atPath: redisCLIPath) else {
            throw HarnessError("\(redisServerPath) or \(redisCLIPath) is not installed: run `make deps` (Debian's redis-server)")
        }
        directory = try TempDirectory()
        self.port = try port ?? freeLoopbackPort()
        self.arguments = arguments
        try start()
    }

    deinit {
        guard let child else { return }
        child.kill(SIGCONT)
        child.kill(SIGKILL)
        _ = child.waitForExit(timeout: .seconds(5))
    }

    /// `host:port` as `[cluster] redis` takes it.
    var address: String { "127.0.0.1:\(port)" }

    /// Starts it (again, after `kill`) on the same port.
    func start() throws {
        precondition(child == nil || child?.process.isRunning == false)
        let c = try ChildProcess(URL(fileURLWithPath: redisServerPath),
                                 ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                  "--daemonize", "no", "--dir", directory.path, "--loglevel", "notice"] + arguments,
                                 environment: childEnvironment([:]))
        child = c
        guard c.stdout.wait(for: "Ready to accept connections", timeout: .seconds(10)) else {
            throw HarnessError("redis-server did not start on port \(port): \(c.stdout.current) \(c.stderr.current)")
        }
    }

    /// SIGKILL, and waits until it is gone.
    func kill() {
        child?.kill(SIGKILL)
        _ = child?.waitForExit(timeout: .seconds(5))
    }

    /// SIGSTOP: frozen, its TCP connections still open (the kernel still
    /// accepts and acknowledges).
    func freeze() { child?.kill(SIGSTOP) }

    /// SIGCONT.
    func thaw() { child?.kill(SIGCONT) }

    /// Runs redis-cli with `arguments`; its stdout, or nil if it failed.
    func cli(_ arguments: [String]) -> String? {
        guard let c = try? ChildProcess(URL(fileURLWithPath: redisCLIPath), ["-p", String(port)] + arguments,
                                        environment: childEnvironment([:])),
              c.waitForExit(timeout: .seconds(5)) == 0, c.stdout.waitForEOF() else { return nil }
        return c.stdout.current
    }

    /// `PUBSUB NUMSUB channel`: how many connections subscribe to it.
    func subscribers(_ channel: String) -> Int? {
        cli(["PUBSUB", "NUMSUB", channel]).flatMap { Int($0.split(separator: "\n").last ?? "") }
    }

    /// Waits up to `timeout` until `channel` has exactly `count` subscribers.
    @discardableResult
    func waitForSubscribers(_ channel: String, _ count: Int, timeout: Duration = .seconds(10)) -> Bool {
        waitUntil(timeout) { subscribers(channel) == count }
    }

    /// `PUBSUB CHANNELS pattern`, sorted.
    func channels(_ pattern: String = "*") -> [String] {
        (cli(["PUBSUB", "CHANNELS", pattern]) ?? "").split(separator: "\n").map(String.init).sorted()
    }
}

/// A plain Redis client that PUBLISHes any bytes, as another daemon
/// would: `send` does not wait for the answer (Redis may be stopped),
/// `answers` collects them; or that `watch`es channels.
final class RedisPublisher {
    private let fd: Int32
    private var input: [UInt8] = []

    init(_ redis: RedisServer) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: \(errnoText())") }
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let r = try withSocketAddress(host: "127.0.0.1", port: redis.port) { _, sa, len in Glibc.connect(fd, sa, len) }
        guard r == 0 else { let e = errno; close(fd); throw HarnessError("connect to Redis: \(errnoText(e))") }
    }

    deinit { close(fd) }

    /// Sends PUBLISH `channel` `payload` without waiting for the answer.
    func send(_ channel: [UInt8], _ payload: [UInt8]) throws {
        var command = Array("*3\r\n$7\r\nPUBLISH\r\n".utf8)
        for part in [channel, payload] { command += Array("$\(part.count)\r\n".utf8) + part + [0x0D, 0x0A] }
        guard command.withUnsafeBytes({ Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == command.count else {
            throw HarnessError("send to Redis: \(errnoText())")
        }
    }

    /// The next `count` answers (integers: subscribers reached), waiting up to 5 s for each.
    func answers(_ count: Int) throws -> [Int] {
        var result: [Int] = []
        var buffer = [UInt8](repeating: 0, count: 256)
        while result.count < count {
            if let end = input.firstIndex(of: 0x0A) {
                let line = String(decoding: input[..<end], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
                input.removeFirst(end + 1)
                guard line.first == ":", let n = Int(line.dropFirst()) else { throw HarnessError("PUBLISH: \(line)") }
                result.append(n)
                continue
            }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw HarnessError("no answer from Redis (\(n < 0 ? errnoText() : "EOF"))") }
            input += buffer[0..<n]
        }
        return result
    }

    /// PUBLISH and its answer.
    @discardableResult
    func publish(_ channel: [UInt8], _ payload: [UInt8]) throws -> Int {
        try send(channel, payload)
        return try answers(1)[0]
    }

    /// PSUBSCRIBE `pattern`: from now on this connection only reads what
    /// Redis pushes. A pattern subscription is not counted by `PUBSUB NUMSUB`,
    /// so a test can watch a channel without changing what the daemons see.
    func watch(_ pattern: String) throws {
        let command = Array("*2\r\n$10\r\nPSUBSCRIBE\r\n$\(pattern.utf8.count)\r\n\(pattern)\r\n".utf8)
        guard command.withUnsafeBytes({ Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == command.count else {
            throw HarnessError("send to Redis: \(errnoText())")
        }
    }

    /// Reads what Redis pushes until it holds `bytes` (for example a
    /// frame inside a cluster envelope); false after about 5 s without them.
    func waitFor(_ bytes: [UInt8]) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            if input.count >= bytes.count,
               (0...(input.count - bytes.count)).contains(where: { input[$0..<($0 + bytes.count)].elementsEqual(bytes) }) {
                return true
            }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return false }
            input += buffer[0..<n]
        }
    }
}
