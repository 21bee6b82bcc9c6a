// The built roomcastd as systemd runs it: readiness, watchdog, signals,
// reload, config errors, command line, IPv6, socket activation.
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Lifecycle integration (real roomcastd, fake NOTIFY_SOCKET)")
struct LifecycleIntegrationTests {
    @Test("READY=1 comes after the port accepts, with STATUS=; WATCHDOG=1 every WATCHDOG_USEC/3")
    func readinessStatusAndWatchdog() throws {
        let d = try Daemon(environment: ["WATCHDOG_USEC": "400000"])
        let ready = try #require(d.notify.wait(for: "READY=1"))
        // Connecting right after READY=1 must succeed: `connect` also waits
        // for the daemon to log the accept.
        let client = try d.connect()
        #expect(ready.value("STATUS")?.contains("0 clients") == true, "READY=1 carries STATUS=: \(ready.lines)")
        #expect(d.stderr.line(with: ["watchdog enabled", "133ms"]) != nil)

        let windowStart = monotonicMs()
        pause(.milliseconds(1500))
        let pings = d.notify.all.filter { $0.lines.contains("WATCHDOG=1") && $0.atMs >= windowStart }.map(\.atMs)
        #expect(pings.count >= 5, "\(pings.count) WATCHDOG=1 in 1.5 s with WATCHDOG_USEC=400000")
        let gaps = zip(pings.dropFirst(), pings).map { $0 - $1 } + [pings.first.map { $0 - windowStart } ?? 1500]
        #expect(gaps.allSatisfy { $0 <= 400 }, "gaps between pings (ms): \(gaps)")

        // STATUS= is refreshed with live figures (every 2 s).
        let status = d.notify.wait(from: ready.index + 1, timeout: .seconds(3)) { $0.hasPrefix("STATUS=1 client,") }
        #expect(status != nil, "no STATUS= refresh counting the connected client; got \(d.notify.all.map(\.lines))")
        client.expectOpen()
        // A change in the number of clients is reported within about a second,
        // sooner than the periodic refresh.
        let second = try d.connect()
        let since = d.notify.all.count
        let start = monotonicMs()
        let two = d.notify.wait(from: since, timeout: .seconds(3)) { $0.hasPrefix("STATUS=2 clients,") }
        #expect(two != nil && monotonicMs() - start <= 1_500, "STATUS=2 clients after \(monotonicMs() - start) ms")
        second.expectOpen()
    }

    @Test("SIGTERM/SIGINT: STOPPING=1, clients see EOF, exit status 0", arguments: [SIGTERM, SIGINT])
    func gracefulStop(signal: Int32) throws {
        let d = try Daemon()
        let a = try d.connect(), b = try d.connect()
        let alice = Wire.user("alice")
        try a.send(Wire.join(alice))
        #expect(b.receiveFrame()?.wire == Wire.join(alice))
        d.child.kill(signal)
        let stopping = d.notify.wait(for: "STOPPING=1", timeout: .seconds(5))
        #expect(stopping != nil, "no STOPPING=1; got \(d.notify.all.map(\.lines))")
        a.expectClosed(within: .seconds(3))
        b.expectClosed(within: .seconds(3))
        #expect(d.child.waitForExit(timeout: .seconds(5)) == 0)
        #expect(d.child.exitedNormally, "exited, not killed by a signal")
        #expect(!d.notify.all.contains { $0.lines.contains("WATCHDOG=1") }, "no watchdog pings without WATCHDOG_USEC")
        #expect(throws: HarnessError.self, "the listener is closed") { try TestClient(host: d.host, port: d.port) }
    }

    @Test("SIGHUP: RELOADING=1 + MONOTONIC_USEC then READY=1, clients kept, echo change live; a broken file keeps the old config")
    func reloadOnSIGHUP() throws {
        let d = try Daemon(["protocol.echo": "yes"])
        let a = try d.connect(), b = try d.connect()
        let alice = Wire.user("alice")
        try a.send(Wire.join(alice))
        #expect(a.receiveFrame()?.wire == Wire.join(alice), "echo = yes at start")
        #expect(b.receiveFrame()?.wire == Wire.join(alice))

        try d.rewriteConfig(Daemon.fullConfig(["protocol.echo": "no"]))
        var from = d.notify.all.count
        d.child.kill(SIGHUP)
        let reloading = try #require(d.notify.wait(for: "RELOADING=1", from: from, timeout: .seconds(5)))
        let usec = try #require(reloading.value("MONOTONIC_USEC").flatMap(Int64.init), "RELOADING=1 without MONOTONIC_USEC: \(reloading.lines)")
        #expect(abs(usec / 1000 - reloading.atMs) < 2_000, "MONOTONIC_USEC is CLOCK_MONOTONIC now")
        #expect(d.notify.wait(for: "READY=1", from: reloading.index + 1, timeout: .seconds(5)) != nil, "READY=1 after the reload")
        #expect(d.stderr.wait(forLineWith: ["configuration reloaded from \(d.configPath)"]))

        let hi = Wire.text(alice, "after reload")
        try a.send(hi)
        #expect(b.receiveFrame()?.wire == hi, "clients kept across the reload")
        a.expectNoFrame(within: .milliseconds(300), "echo = no applied live")

        // Line 3 is invalid: the reload is refused and echo stays off.
        try d.rewriteConfig("[protocol]\necho = yes\nmax_violations = zero\n")
        from = d.notify.all.count
        d.child.kill(SIGHUP)
        let second = try #require(d.notify.wait(for: "RELOADING=1", from: from, timeout: .seconds(5)))
        #expect(d.notify.wait(for: "READY=1", from: second.index + 1, timeout: .seconds(5)) != nil, "READY=1 after a failed reload too")
        #expect(d.stderr.wait(forLineWith: ["reload failed", "\(d.configPath):3:", "max_violations"]),
                "the log names FILE:LINE and the reason")
        let still = Wire.text(alice, "old config still running")
        try a.send(still)
        #expect(b.receiveFrame()?.wire == still)
        a.expectNoFrame(within: .milliseconds(300), "echo = yes from the broken file must not apply")
    }

    /// Sends SIGHUP to a starting `pid` as early as a SIGHUP can be survived:
    /// at the first sign in /proc/PID/status that the dynamic loader is done,
    /// SIGHUP in SigBlk (the early block) or the Swift runtime's crash
    /// handlers in SigCgt (SIGQUIT: installed by libswiftCore's initializer,
    /// about a millisecond before main.swift runs). Before that the loader
    /// is still mapping and relocating, and nothing of the binary's own can
    /// run (docs/operations/running.md, "Signals while starting"). The status file is re-read
    /// with pread(2) and scanned with C string functions, tens of
    /// microseconds a turn, so the signal lands well inside that millisecond.
    /// - Returns: the sign seen (`blocked`, `runtime`), or `exited`/`timeout`.
    static func sighupWhenTheRuntimeStarts(_ pid: Int32) -> String {
        let fd = open("/proc/\(pid)/status", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "exited" }
        defer { close(fd) }
        var buffer = [CChar](repeating: 0, count: 8192)
        let deadline = monotonicMs() + 2_000
        while monotonicMs() < deadline {
            let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count - 1, 0) }
            guard n > 0 else { return "exited" }
            buffer[n] = 0
            let (state, blocked, caught) = buffer.withUnsafeBufferPointer { b -> (CChar, UInt64, UInt64) in
                func field(_ name: String) -> UnsafeMutablePointer<CChar>? { strstr(b.baseAddress!, name) }
                let state = field("State:\t").map { $0[7] } ?? 0
                let blocked = field("SigBlk:").map { strtoull($0 + 7, nil, 16) } ?? 0
                let caught = field("SigCgt:").map { strtoull($0 + 7, nil, 16) } ?? 0
                return (state, UInt64(blocked), UInt64(caught))
            }
            if state == CChar(UInt8(ascii: "Z")) { return "exited" }
            if blocked & (1 << UInt64(SIGHUP - 1)) != 0 { kill(pid, SIGHUP); return "blocked" }
            if caught & (1 << UInt64(SIGQUIT - 1)) != 0 { kill(pid, SIGHUP); return "runtime" }
        }
        return "timeout"
    }

    @Test("a SIGHUP while roomcastd starts (from the Swift runtime's first initializer on) is kept for the loop: 20 starts survive and reload")
    func sighupWhileStarting() throws {
        var seen: [String: Int] = [:]
        for start in 1...20 {
            var sign = "not spawned"
            do {
                let d = try Daemon(afterSpawn: { sign = Self.sighupWhenTheRuntimeStarts($0) })
                seen[sign, default: 0] += 1
                // The blocked SIGHUP was pending, so the loop's first turn reloads.
                #expect(d.stderr.wait(forLineWith: ["configuration reloaded from \(d.configPath)"]),
                        "start \(start) (\(sign)): the early SIGHUP was lost; stderr: \(d.stderr.current)")
            } catch {
                seen[sign, default: 0] += 1
                Issue.record("start \(start): a SIGHUP at the first sign '\(sign)' killed roomcastd: \(error)")
            }
        }
        print("early SIGHUP: signs seen \(seen.sorted { $0.key < $1.key })")
    }

    @Test("the test process does not get roomcastd's early signal block (CEarlySignals is linked into roomcastd only)")
    func earlyBlockIsRoomcastdOnly() throws {
        let status = try #require(ProcStats.text("/proc/self/status"))
        let line = try #require(status.split(separator: "\n").first { $0.hasPrefix("SigBlk:") })
        let blocked = UInt64(line.split(separator: "\t").last ?? "", radix: 16) ?? 0
        for signal in [SIGHUP, SIGINT, SIGTERM] {
            #expect(blocked & (1 << UInt64(signal - 1)) == 0, "signal \(signal) is blocked in the test process: \(line)")
        }
    }

    @Test("a bad config at start: exit 78, FILE:LINE and the reason on stderr, nothing bound, no READY=1")
    func badConfigRefusedAtStart() throws {
        let dir = try TempDirectory()
        let port = try freeLoopbackPort()
        let path = try dir.write("bad.conf", "[server]\nlisten = 127.0.0.1:\(port)\n\n[heartbeat]\ntimeout = 30x\n")
        let run = try runRoomcastd(["--config", path])
        #expect(run.status == 78)
        #expect(run.stderr.contains("\(path):5:") && run.stderr.contains("heartbeat.timeout"), "stderr: \(run.stderr)")
        #expect(!run.stderr.contains("listening on"), "nothing bound")
        #expect(!run.notifications.contains { $0.lines.contains("READY=1") })
        #expect(run.notifications.contains { $0.value("STATUS")?.contains("invalid configuration") == true })
    }

    @Test("--check-config: 0 on a good file, 78 on a bad one")
    func checkConfig() throws {
        let dir = try TempDirectory()
        let good = try dir.write("good.conf", Daemon.fullConfig([:]))
        let bad = try dir.write("bad.conf", "[protocol]\nbyte_order = middle\n")
        let ok = try runRoomcastd(["--check-config", "--config", good])
        #expect(ok.status == 0)
        #expect(ok.stdout.contains("configuration is valid"))
        let ko = try runRoomcastd(["--config", bad, "--check-config"])
        #expect(ko.status == 78)
        #expect(ko.stderr.contains("\(bad):2:"), "stderr: \(ko.stderr)")
    }

    @Test("command line: unknown option exits 64 naming it; --version and --help exit 0")
    func commandLine() throws {
        let unknown = try runRoomcastd(["--bogus-option"])
        #expect(unknown.status == 64)
        #expect(unknown.stderr.contains("--bogus-option"), "stderr: \(unknown.stderr)")
        let version = try runRoomcastd(["--version"])
        #expect(version.status == 0)
        #expect(version.stdout.hasPrefix("roomcastd "))
        let help = try runRoomcastd(["--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("Usage: roomcastd") && help.stdout.contains("--check-config"))
    }

    @Test("IPv6: listen = [::1]:0 serves clients over ::1")
    func ipv6Loopback() throws {
        let d = try Daemon(["server.listen": "[::1]:0"])
        #expect(d.host == "::1")
        let a = try d.connect(), b = try d.connect()
        #expect(a.address.hasPrefix("[::1]:"))
        let frame = Wire.join(Wire.user("v6"))
        try a.send(frame)
        #expect(a.receiveFrame()?.wire == frame)
        #expect(b.receiveFrame()?.wire == frame)
    }

    @Test("socket activation: the first connection starts roomcastd on systemd's socket and is served")
    func socketActivation() throws {
        let port = try freeLoopbackPort()
        let d = try Daemon(socketActivation: [("ltb", port)])
        #expect(d.stderr.wait(for: "Listening on 127.0.0.1:\(port)"), "systemd-socket-activate: \(d.stderr.current)")
        #expect(d.notify.all.isEmpty, "nothing started before the first connection")
        let first = try d.connect(awaitAccept: false)
        #expect(d.notify.wait(for: "READY=1") != nil, "stderr: \(d.stderr.current)")
        #expect(d.stderr.wait(forLineWith: ["using 1 listening socket(s) from systemd"]))
        let frame = Wire.join(Wire.user("activated"))
        try first.send(frame)
        #expect(first.receiveFrame()?.wire == frame, "the connection that started the daemon is served")
        let second = try d.connect()
        try second.send(Wire.text(Wire.user("activated"), "me too"))
        #expect(first.receiveFrame()?.wire == Wire.text(Wire.user("activated"), "me too"))
    }
}
