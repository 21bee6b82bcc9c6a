// Hostile input, cases 11-13: readiness, watchdog honesty and reload storms on the
// real roomcastd with a fake NOTIFY_SOCKET.
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Hostile lifecycle (case 11)")
struct HostileLifecycleTests {
    @Test("11. with the port already taken the daemon exits non-zero within 5 s and never sends READY=1")
    func portTaken() throws {
        let blocker = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        defer { close(blocker) }
        let bound = try withSocketAddress(host: "127.0.0.1", port: 0) { _, sa, len in bind(blocker, sa, len) }
        #expect(bound == 0 && listen(blocker, 1) == 0)
        let address = localAddress(of: blocker)
        let dir = try TempDirectory()
        let path = try dir.write("taken.conf", Daemon.fullConfig(["server.listen": address]))
        let start = monotonicMs()
        let run = try runRoomcastd(["--config", path])
        let elapsed = monotonicMs() - start
        reportFigure("11", "port_taken_exit_after_ms", String(elapsed))
        #expect(run.status != nil && run.status != 0, "exit status \(String(describing: run.status))")
        #expect(elapsed < 5_000)
        #expect(!run.notifications.contains { $0.lines.contains("READY=1") }, "no READY=1: \(run.notifications.map(\.lines))")
        #expect(run.stderr.contains(address) && run.stderr.contains("Address already in use"), "stderr: \(run.stderr)")
    }
}

@Suite("Sanitizer reports from the daemon fail the test")
struct SanitizerReportTests {
    @Test("a sanitizer report on a child's stderr is recorded as an issue")
    func reportIsCaught() {
        withKnownIssue {
            checkSanitizerReports("=================================================================\n"
                + "==4242==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602000000011\n")
        }
        checkSanitizerReports("2026-01-01 00:00:00.000 INFO roomcastd ready\n")  // no issue
    }

    @Test("under make test-asan the spawned roomcastd is ASan-built and its stderr is read",
          .enabled(if: sanitizer == "address"))
    func daemonIsInstrumented() throws {
        let child = try ChildProcess(roomcastdURL, ["--version"], environment: childEnvironment(["ASAN_OPTIONS": "help=1"]))
        #expect(child.waitForExit() == 0)
        _ = child.stderr.waitForEOF()
        #expect(child.stderr.current.contains("Available flags for AddressSanitizer"), "stderr: \(child.stderr.current.prefix(500))")
    }
}

@Suite("Hostile lifecycle (cases 11-13; slow)", .serialized, .enabled(if: slowTestsEnabled))
struct HostileLifecycleSlowTests {
    // MARK: 11. Readiness

    @Test("11. across 20 starts, a connect made the moment READY=1 arrives always succeeds")
    func connectAtReady() throws {
        var failures: [String] = []
        var startup: [Int64] = []
        for i in 0..<20 {
            let dir = try TempDirectory()
            let port = try freeLoopbackPort()
            let path = try dir.write("c.conf", Daemon.fullConfig(["server.listen": "127.0.0.1:\(port)", "log.level": "info"]))
            let notify = try NotifySocket(path: dir.path + "/notify")
            defer { notify.stop() }
            let started = monotonicMs()
            let child = try ChildProcess(roomcastdURL, ["--config", path], environment: childEnvironment(["NOTIFY_SOCKET": notify.path]))
            var ready = false
            while !ready && monotonicMs() - started < 10_000 {
                ready = notify.all.contains { $0.lines.contains("READY=1") }
                if !ready { usleep(200) }
            }
            if !ready { failures.append("start \(i): no READY=1"); continue }
            startup.append(monotonicMs() - started)
            do {
                let c = try TestClient(host: "127.0.0.1", port: port)
                let f = Wire.frame(Wire.opaque, [UInt8(i)])
                try c.send(f)
                if c.receiveFrame()?.wire != f { failures.append("start \(i): connected but not served") }
            } catch {
                failures.append("start \(i): \(error)")
            }
            child.kill(SIGTERM)
            _ = child.waitForExit(timeout: .seconds(5))
            _ = child.stderr.waitForEOF(timeout: .seconds(2))
            checkSanitizerReports(child.stderr.current)
        }
        reportFigure("11", "ready_after_ms_min_max", "\(startup.min() ?? -1)..\(startup.max() ?? -1)")
        #expect(failures.isEmpty, "\(failures)")
    }

    // MARK: 12. Watchdog honesty

    /// Gaps between the WATCHDOG=1 datagrams at or after `fromMs`.
    static func pingGaps(_ notify: NotifySocket, fromMs: Int64) -> (count: Int, gaps: [Int64]) {
        let pings = notify.all.filter { $0.lines.contains("WATCHDOG=1") && $0.atMs >= fromMs }.map(\.atMs)
        return (pings.count, zip(pings.dropFirst(), pings).map { $0 - $1 })
    }

    /// Relays one frame every 50 ms for `duration`; returns how many arrived.
    static func relayFor(_ duration: Duration, from p: TestClient, to r: TestClient, tag: UInt8) throws -> (sent: Int, got: Int) {
        let end = monotonicMs() + Int64(duration.ms)
        var sent = 0, got = 0
        while monotonicMs() < end {
            let f = numberedFrame(sent, size: 8, type: 50 + UInt16(tag))
            try p.send(f)
            sent += 1
            if r.receiveFrame(timeout: .milliseconds(500))?.wire == f { got += 1 }
            _ = p.receiveFrame(timeout: .milliseconds(500))
            pause(.milliseconds(50))
        }
        return (sent, got)
    }

    @Test("12. WATCHDOG_USEC=1s: pings every 0.25-0.5 s while relays flow; a FIFO config never blocks the loop; SIGSTOP stops both")
    func watchdogHonesty() throws {
        let d = try Daemon(environment: ["WATCHDOG_USEC": "1000000"])
        let r = try d.connect(), p = try d.connect()
        var t0 = monotonicMs()
        var relay = try Self.relayFor(.seconds(3), from: p, to: r, tag: 0)
        var (count, gaps) = Self.pingGaps(d.notify, fromMs: t0)
        reportFigure("12", "ping_gaps_ms", "\(gaps.min() ?? -1)..\(gaps.max() ?? -1) (\(count) pings in 3 s)")
        #expect(relay.got == relay.sent)
        #expect(count >= 5, "\(count) pings in 3 s")
        #expect(gaps.allSatisfy { $0 >= 250 && $0 <= 500 }, "gaps between pings (ms): \(gaps)")

        // The config path becomes a FIFO with no writer; SIGHUP must not block the loop.
        unlink(d.configPath)
        #expect(mkfifo(d.configPath, 0o600) == 0)
        t0 = monotonicMs()
        d.child.kill(SIGHUP)
        relay = try Self.relayFor(.seconds(2), from: p, to: r, tag: 1)
        (count, gaps) = Self.pingGaps(d.notify, fromMs: t0)
        reportFigure("12", "ping_gaps_ms_after_fifo_sighup", "\(gaps.min() ?? -1)..\(gaps.max() ?? -1) (\(count) pings in 2 s)")
        #expect(relay.got == relay.sent, "relays kept flowing after SIGHUP with a FIFO config: \(relay)")
        #expect(count >= 3 && gaps.allSatisfy { $0 <= 500 }, "pings kept coming: \(count), gaps \(gaps)")
        #expect(d.stderr.wait(forLineWith: ["reload failed", "not a regular file"]))

        // A loop that cannot run sends nothing: pings stop together with the relays.
        d.child.kill(SIGSTOP)
        pause(.milliseconds(100))
        let stopped = monotonicMs()
        let f = Wire.frame(Wire.opaque, Array("while stopped".utf8))
        try p.send(f)
        let during = r.receiveFrame(timeout: .milliseconds(1500))
        let pingsWhileStopped = Self.pingGaps(d.notify, fromMs: stopped).count
        d.child.kill(SIGCONT)
        #expect(during == nil, "no relay while the loop is stopped")
        #expect(pingsWhileStopped == 0, "no watchdog ping while the loop is stopped")
        #expect(r.receiveFrame()?.wire == f, "the relay resumes")
        let resumed = monotonicMs()
        pause(.milliseconds(800))
        #expect(Self.pingGaps(d.notify, fromMs: resumed).count >= 1, "pings resume")
    }

    @Test("12. no pings at all when WATCHDOG_PID names another process or WATCHDOG_USEC is unset")
    func noPingsWhenNotOurs() throws {
        for env in [["WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"], [:]] {
            let d = try Daemon(environment: env)
            let r = try d.connect(), p = try d.connect()
            let relay = try Self.relayFor(.milliseconds(1500), from: p, to: r, tag: 2)
            #expect(relay.got == relay.sent)
            #expect(!d.notify.all.contains { $0.lines.contains("WATCHDOG=1") }, "WATCHDOG=1 sent with \(env)")
            #expect(d.stderr.line(with: ["watchdog enabled"]) == nil, "with \(env)")
        }
    }

    // MARK: 13. Reload storms

    /// The inode of the socket listening on `port` (from /proc/net/tcp*), or nil when no listener has it.
    ///
    /// The whole file is read (`ProcStats.text`: its first 4 KiB, all `String(contentsOfFile:)`
    /// returns, hold only about 27 sockets, fewer than the listeners of the suites running beside
    /// this one). The kernel writes it one read at a time from a walk of its socket tables, so a
    /// socket opened or closed between two reads can shift the walk past the line wanted (proc(5),
    /// seq_file): a miss is retried for up to 5 s.
    static func listenerInode(port: UInt16) -> String? {
        let deadline = monotonicMs() + 5_000
        for attempt in 0... {
            if attempt > 0 { if monotonicMs() >= deadline { break }; usleep(50_000) }
            for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
                guard let text = ProcStats.text(file) else { continue }
                for line in text.split(separator: "\n").dropFirst() {
                    let f = line.split(separator: " ")
                    guard f.count > 9, f[3] == "0A", let local = f[1].split(separator: ":").last,
                          UInt16(local, radix: 16) == port else { continue }
                    return String(f[9])
                }
            }
        }
        return nil
    }

    @Test("the listener's inode is found among 300 other listening sockets (more than the first 4 KiB of /proc/net/tcp)")
    func listenerInodeAmongMany() throws {
        var fds: [Int32] = []
        defer { fds.forEach { close($0) } }
        for _ in 0..<301 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var a = sockaddr_in()
            a.sin_family = sa_family_t(AF_INET)
            a.sin_addr.s_addr = inet_addr("127.0.0.1")
            let bound = withUnsafePointer(to: &a) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            try #require(fd >= 0 && bound == 0 && listen(fd, 1) == 0)
            fds.append(fd)
        }
        var a = sockaddr_in()
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fds[300], $0, &len) } }
        var st = stat()
        try #require(fstat(fds[300], &st) == 0)
        #expect(Self.listenerInode(port: UInt16(bigEndian: a.sin_port)) == String(st.st_ino))
    }

    @Test("13. five SIGHUPs 10 ms apart, a changed timeout, an invalid file: no missed or doubled relays, the listener never closes")
    func reloadStorm() throws {
        let d = try Daemon(["heartbeat.timeout": "30s"])
        let p = try d.connect(), r1 = try d.connect(), r2 = try d.connect()
        let inode = try #require(Self.listenerInode(port: d.port))
        #expect(ProcStats.fdTargets(d.pid).values.contains("socket:[\(inode)]"))
        var sent: [[UInt8]] = []
        var accepted: [TestClient] = []
        var refused: [String] = []
        func burst(_ n: Int) throws {
            for _ in 0..<n {
                let f = numberedFrame(sent.count, size: 32)
                sent.append(f)
                try p.send(f)
            }
            do { accepted.append(try TestClient(host: d.host, port: d.port)) } catch { refused.append("\(error)") }
        }
        let reloadsBefore = d.notify.all.count
        for _ in 0..<5 {
            d.child.kill(SIGHUP)
            try burst(10)
            usleep(10_000)
        }
        try d.rewriteConfig(Daemon.fullConfig(["heartbeat.timeout": "20s"]))
        d.child.kill(SIGHUP)
        try burst(10)
        #expect(d.stderr.wait(forLineWith: ["configuration reloaded"]))
        try d.rewriteConfig("[heartbeat]\ntimeout = soon\n")
        d.child.kill(SIGHUP)
        try burst(10)
        #expect(d.stderr.wait(forLineWith: ["reload failed", "\(d.configPath):2:"]))
        try burst(10)
        for c in [p, r1, r2] {
            let got = c.receiveFrames(sent.count, timeout: .seconds(10)).map(\.wire)
            #expect(got == sent, "\(got.count) of \(sent.count) frames, in order, once each, at \(c.address)")
            c.expectNoFrame(within: .milliseconds(200), "(nothing doubled)")
        }
        let reloads = d.notify.all.dropFirst(reloadsBefore).filter { $0.lines.contains("RELOADING=1") }.count
        reportFigure("13", "reloads_seen_of_7_sighups", String(reloads))
        #expect(reloads >= 3, "\(reloads) RELOADING=1 for 7 SIGHUPs (close ones may coalesce)")
        #expect(refused.isEmpty, "connects refused during the storm: \(refused)")
        #expect(Self.listenerInode(port: d.port) == inode, "the same listening socket throughout")
        #expect(ProcStats.fdTargets(d.pid).values.contains("socket:[\(inode)]"))
        // Clients connected during the storm were accepted and are in the room.
        let late = try d.connect()
        let f = Wire.frame(Wire.opaque, Array("after the storm".utf8))
        try late.send(f)
        for c in [r1, r2, late] { #expect(c.receiveFrame()?.wire == f, "at \(c.address)") }
        for c in accepted {
            // They also hold the frames relayed after their accept; the last one is `f`.
            #expect(c.receiveFrames(sent.count + 1, timeout: .seconds(2)).last?.wire == f, "at \(c.address), accepted during the storm")
        }
    }
}
