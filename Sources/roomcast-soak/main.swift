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
let startedMs = nowMs()
while !daemonLog().contains("roomcastd ready") {
    if nowMs() - startedMs > 10_000 || !daemon.isRunning { print("FAIL: roomcastd did not start:\n\(daemonLog())"); exit(1) }
    usleep(10_000)
}
let baselineFds = fdCount(pid)
let baselineRss = procField(pid, "VmRSS")
print("soak: roomcastd pid \(pid) on 127.0.0.1:\(port), \(totalClients) clients, \(seconds) s; baseline RSS \(baselineRss) KiB, \(baselineFds) fds")

// MARK: - Clients

let magic: UInt64 = 0x534F_414B_4652_4D31  // "SOAKFRM1"
let chatType: UInt16 = 100
/// Chat frames carry magic, chatter, sequence number and padding: 10 chatters
/// at 2 frames/s put 10 KiB/s into every member's stream.
let chatBodySize = 512

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

var chatFramesDelivered = 0
var otherFramesDelivered = 0

var peakRss = baselineRss
var lastSample: Int64 = 0

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
