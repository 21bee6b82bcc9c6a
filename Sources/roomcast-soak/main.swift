// roomcast-soak: a bounded chaos soak of roomcastd on loopback (the hostile-input checks).
//
// Starts the roomcastd built next to it, then drives ~2,000 clients from one
// epoll thread into one room: healthy readers (some of them chatters), slow
// readers, garbage senders, clients reconnecting in a loop and silent ones.
// Checks that every healthy client receives every chatter frame exactly once
// and in order, that the daemon's RSS stays bounded, and that its open
// descriptors return to the baseline once everybody is gone. Prints the
// figures; exits 1 on any failure.
//
//   roomcast-soak [--seconds 60] [--clients 2000] [--roomcastd PATH]
import CShim
import Foundation
import Glibc
import RoomcastCore

setvbuf(stdout, nil, _IOLBF, 0)
signal(SIGPIPE, SIG_IGN)

// MARK: - Options

var seconds = 60
var totalClients = 2000
var daemonPath = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
    .appendingPathComponent("roomcastd").path
var args = CommandLine.arguments.dropFirst()
while let a = args.popFirst() {
    switch a {
    case "--seconds": seconds = Int(args.popFirst() ?? "") ?? seconds
    case "--clients": totalClients = Int(args.popFirst() ?? "") ?? totalClients
    case "--roomcastd": daemonPath = args.popFirst() ?? daemonPath
    default:
        print("usage: roomcast-soak [--seconds N] [--clients N] [--roomcastd PATH]")
        exit(64)
    }
}

func nowMs() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

var failures: [String] = []
func fail(_ s: String) {
    if failures.count < 20 { print("FAIL: \(s)") }
    failures.append(s)
}

// MARK: - The daemon

func freePort() -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var a = sockaddr_in()
    a.sin_family = sa_family_t(AF_INET)
    a.sin_addr.s_addr = inet_addr("127.0.0.1")
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
    _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    return UInt16(bigEndian: a.sin_port)
}

func procField(_ pid: Int32, _ key: String) -> Int {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return -1 }
    for line in text.split(separator: "\n") where line.hasPrefix(key + ":") {
        return line.dropFirst(key.count + 1).split(whereSeparator: { $0 == " " || $0 == "\t" }).first.flatMap { Int($0) } ?? -1
    }
    return -1
}
func fdCount(_ pid: Int32) -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd"))?.count ?? -1 }
func cpuSeconds(_ pid: Int32) -> Double {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = text.lastIndex(of: ")") else { return -1 }
    let f = text[text.index(after: close)...].split(separator: " ")
    return ((Double(f[11]) ?? 0) + (Double(f[12]) ?? 0)) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

let port = freePort()
let dir = FileManager.default.temporaryDirectory.appendingPathComponent("roomcast-soak-\(getpid())")
try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(at: dir) }
let configPath = dir.appendingPathComponent("soak.conf").path
try! """
[server]
listen = 127.0.0.1:\(port)
max_clients = 10000

[protocol]
max_violations = 3

[heartbeat]
timeout = 10s
tick = 100ms

[limits]
output_soft_bytes = 64K
output_soft_seconds = 2s
output_hard_bytes = 512K
# Healthy readers must get every chatter frame (shedding is tested in SheddingIntegrationTests).
shed = none

[log]
target = stderr
level = info
stats_interval = 10s

""".write(toFile: configPath, atomically: true, encoding: .utf8)
let logPath = dir.appendingPathComponent("roomcastd.log").path
_ = FileManager.default.createFile(atPath: logPath, contents: nil)
let daemon = Process()
daemon.executableURL = URL(fileURLWithPath: daemonPath)
daemon.arguments = ["--config", configPath]
daemon.standardError = FileHandle(forWritingAtPath: logPath)
daemon.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
do { try daemon.run() } catch { print("FAIL: cannot start \(daemonPath): \(error)"); exit(1) }
let pid = daemon.processIdentifier
func daemonLog() -> String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }
let startedMs = nowMs()
while !daemonLog().contains("roomcastd ready") {
    if nowMs() - startedMs > 10_000 || !daemon.isRunning { print("FAIL: roomcastd did not start:\n\(daemonLog())"); exit(1) }
    usleep(10_000)
}
let baselineFds = fdCount(pid)
let baselineRss = procField(pid, "VmRSS")
print("soak: roomcastd pid \(pid) on 127.0.0.1:\(port), \(totalClients) clients, \(seconds) s; baseline RSS \(baselineRss) KiB, \(baselineFds) fds")

// MARK: - Clients

enum Role: String, CaseIterable { case healthy, chatter, slow, garbage, reconnect, silent }

let magic: UInt64 = 0x534F_414B_4652_4D31  // "SOAKFRM1"
let chatType: UInt16 = 100
/// Chat frames carry magic, chatter, sequence number and padding: 10 chatters
/// at 2 frames/s put 10 KiB/s into every member's stream.
let chatBodySize = 512

final class Client {
    let id: Int
    let role: Role
    var fd: Int32 = -1
    var decoder = FrameDecoder(byteOrder: .little, maxFrameBytes: 1 << 20)
    var outbox: [UInt8] = []
    var nextActionMs: Int64 = 0
    var joined = false        // own join echoed back: it is in the room
    var expected: [Int] = []  // per chatter: the next sequence number
    var sent = 0              // chatters: frames sent
    var connects = 0
    var closedByDaemon = 0
    init(id: Int, role: Role) { self.id = id; self.role = role }
    var user: UserInfo { UserInfo(level: 1, name: "\(role.rawValue)\(id)", iconURL: "https://img.example/\(id).png") }
}

let epfd = epoll_create1(Int32(EPOLL_CLOEXEC))
var byFD: [Int32: Client] = [:]

// The mix: ~75 % healthy readers (10 of them chatters), the rest hostile.
let chatterCount = 10
let slowCount = totalClients / 20, garbageCount = totalClients / 20, reconnectCount = totalClients / 10, silentCount = totalClients / 20
let healthyCount = totalClients - chatterCount - slowCount - garbageCount - reconnectCount - silentCount
var clients: [Client] = []
for (role, n) in [(Role.chatter, chatterCount), (.healthy, healthyCount), (.slow, slowCount), (.garbage, garbageCount),
                  (.reconnect, reconnectCount), (.silent, silentCount)] {
    for _ in 0..<n { clients.append(Client(id: clients.count, role: role)) }
}
let chatters = clients.filter { $0.role == .chatter }
let steady = clients.filter { $0.role == .healthy || $0.role == .chatter }
var rng = SystemRandomNumberGenerator()

func watch(_ c: Client) {
    // Slow readers are read on a timer only (level-triggered EPOLLIN would spin).
    var ev = epoll_event(events: c.role == .slow ? 0 : EPOLLIN.rawValue, data: epoll_data_t(fd: c.fd))
    epoll_ctl(epfd, EPOLL_CTL_ADD, c.fd, &ev)
}

func connectClient(_ c: Client) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { fail("socket: \(String(cString: strerror(errno)))"); return false }
    if c.role == .slow {
        var size: Int32 = 4096
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    }
    var a = sockaddr_in()
    a.sin_family = sa_family_t(AF_INET)
    a.sin_port = port.bigEndian
    a.sin_addr.s_addr = inet_addr("127.0.0.1")
    let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard r == 0 else {
        close(fd)
        if c.role == .healthy || c.role == .chatter { fail("connect \(c.role)\(c.id): \(String(cString: strerror(errno)))") }
        return false
    }
    _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
    var one: Int32 = 1
    setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    c.fd = fd
    c.connects += 1
    c.decoder = FrameDecoder(byteOrder: .little, maxFrameBytes: 1 << 20)
    c.outbox = []
    c.joined = false
    byFD[fd] = c
    watch(c)
    return true
}

func disconnect(_ c: Client, reset: Bool = false) {
    guard c.fd >= 0 else { return }
    if reset {
        var l = linger(l_onoff: 1, l_linger: 0)
        setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
    }
    epoll_ctl(epfd, EPOLL_CTL_DEL, c.fd, nil)
    byFD[c.fd] = nil
    close(c.fd)
    c.fd = -1
}

func send(_ c: Client, _ bytes: [UInt8]) {
    guard c.fd >= 0 else { return }
    c.outbox += bytes
    let n = c.outbox.withUnsafeBytes { Glibc.send(c.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
    if n > 0 { c.outbox.removeFirst(n) }
}

var chatFramesDelivered = 0
var otherFramesDelivered = 0

/// The daemon closed `c` (EOF or reset).
func peerClosed(_ c: Client, _ now: Int64) {
    disconnect(c)
    c.closedByDaemon += 1
    switch c.role {
    case .healthy, .chatter: fail("\(c.role)\(c.id) was disconnected by the daemon")
    case .slow, .garbage, .silent: c.nextActionMs = now + Int64.random(in: 200...1000, using: &rng)  // reconnect
    case .reconnect: c.nextActionMs = now + Int64.random(in: 50...500, using: &rng)
    }
}

func readable(_ c: Client, limit: Int, _ now: Int64) {
    var buffer = [UInt8](repeating: 0, count: min(limit, 64 * 1024))
    var total = 0
    while total < limit, c.fd >= 0 {
        let n = buffer.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, min($0.count, limit - total), Int32(MSG_DONTWAIT)) }
        if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) { peerClosed(c, now); return }
        if n < 0 { return }
        total += n
        guard c.role == .healthy || c.role == .chatter else { continue }
        c.decoder.append(buffer[0..<n])
        while true {
            let frame: Frame?
            do { frame = try c.decoder.next() } catch { fail("\(c.role)\(c.id): undecodable stream: \(error)"); disconnect(c); return }
            guard let f = frame else { break }
            if f.type == 0, !c.joined, f.body == c.user.serialized() { c.joined = true }
            guard f.type == chatType, f.body.count == chatBodySize else { otherFramesDelivered += 1; continue }
            let (m, who, seq) = f.body.withUnsafeBytes {
                ($0.loadUnaligned(fromByteOffset: 0, as: UInt64.self), Int($0.loadUnaligned(fromByteOffset: 8, as: UInt32.self)),
                 Int($0.loadUnaligned(fromByteOffset: 12, as: UInt32.self)))
            }
            guard m == magic, who < chatterCount else { otherFramesDelivered += 1; continue }
            chatFramesDelivered += 1
            if seq != c.expected[who] {
                fail("\(c.role)\(c.id): from chatter \(who) got #\(seq), expected #\(c.expected[who]) (\(seq < c.expected[who] ? "duplicate" : "gap"))")
                c.expected[who] = seq + 1
            } else {
                c.expected[who] += 1
            }
        }
    }
}

func garbage() -> [UInt8] {
    switch Int.random(in: 0..<3, using: &rng) {
    case 0: return (0..<64).map { _ in UInt8.random(in: 0...255, using: &rng) }  // a random "header"
    case 1: return Array("GET / HTTP/1.1\r\nHost: soak\r\n\r\n".utf8)
    default:  // three malformed texts: max_violations = 3
        return (0..<3).flatMap { _ in FrameCodec.encode(type: 2, body: [0x0A, 0x05, 0xFF, 0xFF], byteOrder: .little) }
    }
}

/// Timed behaviour of every role.
func act(_ c: Client, _ now: Int64, chatting: Bool) {
    guard now >= c.nextActionMs else { return }
    if c.fd < 0 {
        guard connectClient(c) else { c.nextActionMs = now + 500; return }
        switch c.role {
        case .healthy, .chatter, .slow:
            send(c, FrameCodec.encode(type: 0, body: c.user.serialized(), byteOrder: .little))
            c.nextActionMs = now + 5_000
        case .garbage:
            send(c, garbage())
            c.nextActionMs = now + 5_000
        case .reconnect:
            if Int.random(in: 0..<5, using: &rng) == 0 { send(c, FrameCodec.encode(type: 0, body: c.user.serialized(), byteOrder: .little)) }
            c.nextActionMs = now + Int64.random(in: 100...2000, using: &rng)
        case .silent:
            c.nextActionMs = .max  // until evicted
        }
        return
    }
    switch c.role {
    case .chatter where chatting:
        var body = [UInt8](repeating: 0x2E, count: chatBodySize)
        body.withUnsafeMutableBytes {
            $0.storeBytes(of: magic, toByteOffset: 0, as: UInt64.self)
            $0.storeBytes(of: UInt32(c.id), toByteOffset: 8, as: UInt32.self)
            $0.storeBytes(of: UInt32(c.sent), toByteOffset: 12, as: UInt32.self)
        }
        send(c, FrameCodec.encode(type: chatType, body: body, byteOrder: .little))
        c.sent += 1
        c.nextActionMs = now + 500
    case .healthy, .chatter:
        send(c, FrameCodec.encode(type: 8, body: [], byteOrder: .little))
        c.nextActionMs = now + 5_000
    case .slow:
        readable(c, limit: 200, now)  // 200 bytes per 100 ms: 2 KB/s, below the room's pace
        c.nextActionMs = now + 100
        if c.fd >= 0, now % 5_000 < 100 { send(c, FrameCodec.encode(type: 8, body: [], byteOrder: .little)) }
    case .garbage:
        send(c, garbage())
        c.nextActionMs = now + 2_000
    case .reconnect:
        disconnect(c, reset: Bool.random(using: &rng))
        c.nextActionMs = now + Int64.random(in: 50...500, using: &rng)
    case .silent:
        break
    }
}

func pump(untilMs end: Int64, chatting: Bool, act doAct: Bool = true) {
    var events = [epoll_event](repeating: epoll_event(), count: 1024)
    var lastScan: Int64 = 0
    while nowMs() < end {
        let n = events.withUnsafeMutableBufferPointer { epoll_wait(epfd, $0.baseAddress, Int32($0.count), 10) }
        let now = nowMs()
        if n > 0 {
            for i in 0..<Int(n) {
                if let c = byFD[events[i].data.fd] { readable(c, limit: 256 * 1024, now) }
            }
        }
        if doAct && now - lastScan >= 10 {
            lastScan = now
            for c in clients { act(c, now, chatting: chatting) }
            for c in clients where !c.outbox.isEmpty && c.fd >= 0 { send(c, []) }
        }
        sampleDaemon(now)
    }
}

var peakRss = baselineRss
var lastSample: Int64 = 0
func sampleDaemon(_ now: Int64) {
    guard now - lastSample >= 500 else { return }
    lastSample = now
    peakRss = max(peakRss, procField(pid, "VmRSS"))
    if !daemon.isRunning { print("FAIL: roomcastd exited (status \(daemon.terminationStatus))\n\(daemonLog().suffix(3000))"); exit(1) }
}

// MARK: - Run

let t0 = nowMs()
let cpu0 = cpuSeconds(pid)
for c in clients { c.expected = [Int](repeating: 0, count: chatterCount) }
// Ramp up: the steady clients first, 100 every 20 ms, then wait until each saw its own join.
for (i, c) in steady.enumerated() {
    _ = connectClient(c)
    send(c, FrameCodec.encode(type: 0, body: c.user.serialized(), byteOrder: .little))
    c.nextActionMs = nowMs() + 5_000
    if i % 100 == 99 { pump(untilMs: nowMs() + 20, chatting: false, act: false) }
}
let rampEnd = nowMs() + 20_000
while steady.contains(where: { !$0.joined }) && nowMs() < rampEnd { pump(untilMs: nowMs() + 50, chatting: false, act: false) }
let notIn = steady.filter { !$0.joined }.count
if notIn > 0 { fail("\(notIn) steady clients never saw their own join") }
print("soak: \(steady.count) steady clients in the room after \(nowMs() - t0) ms; starting the hostile ones and the chat")
let chatStart = nowMs()
let chatEnd = t0 + Int64(seconds) * 1000 - 5_000
pump(untilMs: max(chatEnd, chatStart + 5_000), chatting: true)
// Drain: the chat stops, the hostile clients go on for 2 s more.
pump(untilMs: nowMs() + 2_000, chatting: false)
let cpuUsed = cpuSeconds(pid) - cpu0
let rssAtEnd = procField(pid, "VmRSS")
let fdsAtPeak = fdCount(pid)

// Every steady client got every chatter frame exactly once, in order.
var incomplete = 0
for c in steady {
    for (who, ch) in chatters.enumerated() where c.expected[who] != ch.sent {
        if incomplete < 5 { fail("\(c.role)\(c.id): from chatter \(who) got up to #\(c.expected[who]), \(ch.sent) sent") }
        incomplete += 1
    }
}
let sentTotal = chatters.reduce(0) { $0 + $1.sent }

// Everybody leaves; the daemon's descriptors must return to the baseline.
for c in clients { disconnect(c, reset: c.id % 2 == 0) }
let leaveStart = nowMs()
var fdsAfter = fdCount(pid)
while fdsAfter != baselineFds && nowMs() - leaveStart < 10_000 {
    usleep(50_000)
    fdsAfter = fdCount(pid)
}
let fdSettleMs = nowMs() - leaveStart
if fdsAfter != baselineFds { fail("descriptors: \(fdsAfter) open 10 s after every client left, baseline \(baselineFds)") }
let rssGrowth = peakRss - baselineRss
if rssGrowth > 256 * 1024 { fail("RSS grew by \(rssGrowth) KiB") }

daemon.terminate()
daemon.waitUntilExit()
let log = daemonLog()
for marker in ["AddressSanitizer", "Fatal error", "LeakSanitizer"] where log.contains(marker) { fail("roomcastd's log has \(marker)") }
if daemon.terminationStatus != 0 { fail("roomcastd exited with \(daemon.terminationStatus)") }
let warnings = log.split(separator: "\n").filter { $0.contains(" WARNING ") }.count
let errors = log.split(separator: "\n").filter { $0.contains(" ERROR ") }

func count(_ role: Role, _ key: KeyPath<Client, Int>) -> Int { clients.filter { $0.role == role }.reduce(0) { $0 + $1[keyPath: key] } }
print("""
soak figures:
  clients:            \(clients.count) (\(healthyCount) healthy readers, \(chatterCount) chatters, \(slowCount) slow readers, \
\(garbageCount) garbage senders, \(reconnectCount) reconnecting, \(silentCount) silent)
  connections made:   \(clients.reduce(0) { $0 + $1.connects }) (reconnect \(count(.reconnect, \.connects)), garbage \(count(.garbage, \.connects)), \
slow \(count(.slow, \.connects)), silent \(count(.silent, \.connects)))
  closed by daemon:   garbage \(count(.garbage, \.closedByDaemon)), slow \(count(.slow, \.closedByDaemon)), silent \(count(.silent, \.closedByDaemon)), \
healthy \(count(.healthy, \.closedByDaemon) + count(.chatter, \.closedByDaemon))
  chat frames:        \(sentTotal) sent by \(chatterCount) chatters over \((nowMs() - chatStart) / 1000) s; \(chatFramesDelivered) delivered \
to \(steady.count) steady clients (expected \(sentTotal * steady.count)); \(incomplete) incomplete streams
  other frames:       \(otherFramesDelivered) (joins, leaves) delivered to steady clients
  daemon RSS:         baseline \(baselineRss) KiB, peak \(peakRss) KiB (+\(rssGrowth) KiB), at end \(rssAtEnd) KiB
  daemon CPU:         \(String(format: "%.2f", cpuUsed)) s over \((nowMs() - t0) / 1000) s
  daemon descriptors: baseline \(baselineFds), with clients \(fdsAtPeak), after all left \(fdsAfter) (settled in \(fdSettleMs) ms)
  daemon log:         \(warnings) warnings, \(errors.count) errors
""")
if !errors.isEmpty { print("errors: \(errors.prefix(3))") }
if chatFramesDelivered != sentTotal * steady.count { fail("\(chatFramesDelivered) chat frames delivered, \(sentTotal * steady.count) expected") }
if sentTotal == 0 { fail("no chat frame was sent") }
print(failures.isEmpty ? "soak: PASS" : "soak: FAIL (\(failures.count) problems)")
exit(failures.isEmpty ? 0 : 1)
