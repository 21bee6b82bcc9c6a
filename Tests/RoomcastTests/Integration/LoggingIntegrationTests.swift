// What operators read: log lines that peers cannot forge, stable REASON
// codes, stats rates, logging without journald, addresses bound once.
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Logging and start-up checks (real roomcastd)")
struct LoggingIntegrationTests {
    @Test("text from peers cannot forge log lines: newlines and quotes are escaped")
    func peerTextIsEscaped() throws {
        let d = try Daemon()
        let c = try d.connect()
        let forged = "2026-11-29 19:09:00.000 ERROR fatal: forged by a client"
        try c.send(Wire.join(Wire.user("eve", room: "x\n" + forged + " \"q\"")))
        try c.send(Wire.frame(Wire.text, [0xFF]))  // a bad frame: its warning names the room
        #expect(d.stderr.wait(forLineWith: ["dropped bad frame", c.address]))
        let lines = d.stderr.current.split(separator: "\n")
        #expect(!lines.contains { $0.hasPrefix(forged) }, "a client forged a log line:\n\(d.stderr.current)")
        #expect(lines.contains { $0.contains("ROOM=\"x\\n" + forged + " \\\"q\\\"\"") }, "the room is escaped on one line")
    }

    @Test("rate-limit drops name the real frame type and REASON=rate_limit; bad frames REASON=bad_frame")
    func reasonsAreStableCodes() throws {
        let d = try Daemon(["limits.frames_per_second": "1", "protocol.max_violations": "5"])
        let c = try d.connect()
        try c.sendRaw(Wire.frame(Wire.opaque, [1]) + Wire.frame(Wire.opaque, [2]))
        #expect(d.stderr.wait(forLineWith: ["dropped frame of type 42: rate limit", "REASON=rate_limit", "FRAME_TYPE=42"]))
        let other = try d.connect()
        try other.send(Wire.frame(Wire.text, [0xFF]))
        #expect(d.stderr.wait(forLineWith: ["dropped bad frame of type 2", "REASON=bad_frame", "DETAIL="]))
    }

    @Test("the first stats line reports rates over its own interval, not since boot")
    func firstStatsRate() throws {
        let d = try Daemon(["log.stats_interval": "1s", "log.level": "info"])
        let c = try d.connect(awaitAccept: false)
        try c.sendRaw((0..<200).flatMap { _ in Wire.frame(Wire.heartbeat, []) })
        #expect(d.stderr.wait(forLineWith: ["stats: "], timeout: .seconds(3)))
        let line = d.stderr.current.split(separator: "\n").first { $0.contains("stats: ") }.map(String.init) ?? ""
        #expect(line.contains("200 frames in") && !line.contains("frames in (0/s)"), "\(line)")
    }

    @Test("log.target = journal without journald falls back to stderr",
          .enabled(if: access("/run/systemd/journal/socket", F_OK) != 0))
    func journalFallback() throws {
        // Daemon() waits for 'roomcastd ready' on stderr: it only starts if the records got there.
        let d = try Daemon(["log.target": "journal"])
        #expect(d.stderr.wait(forLineWith: [" WARNING ", "journald is not reachable", "logging to stderr", "REASON=journal_unavailable"]))
    }

    @Test("the soft descriptor limit is raised to the hard one; max_clients beyond it is warned about at start and on reload")
    func descriptorLimit() throws {
        let d = try Daemon(["server.max_clients": "200"], descriptorLimit: (soft: 64, hard: 256))
        let limits = ProcStats.text("/proc/\(d.pid)/limits") ?? ""
        let openFiles = limits.split(separator: "\n").first { $0.hasPrefix("Max open files") }.map { $0.split(separator: " ").filter { !$0.isEmpty } }
        #expect(openFiles.map { Array($0[3...4]) } == ["256", "256"], "soft and hard limits: \(limits)")
        #expect(d.stderr.line(with: ["REASON=descriptor_limit"]) == nil, "200 clients fit under 256 descriptors")

        try d.rewriteConfig(Daemon.fullConfig(["server.max_clients": "1000"]))
        d.child.kill(SIGHUP)
        #expect(d.stderr.wait(forLineWith: [" WARNING ", "server.max_clients = 1000 needs about 1032 descriptors",
                                            "RLIMIT_NOFILE allows 256", "near 224 clients", "REASON=descriptor_limit"]))

        let capped = try Daemon([:], descriptorLimit: (soft: 64, hard: 64))
        #expect(capped.stderr.wait(forLineWith: ["server.max_clients = 10000", "allows 64", "REASON=descriptor_limit"]), "at start")
    }

    @Test("an address given twice or covered by a wildcard (--listen, [json] listen, listen_tls) is refused before binding, naming it")
    func duplicateListenAddresses() throws {
        let dir = try TempDirectory()
        let conf = try dir.write("c.conf", "[json]\nlisten = 127.0.0.1:19001\n")
        for args in [["--listen", "127.0.0.1:19002", "--listen", "127.0.0.1:19002"], ["--listen", "127.0.0.1:19001"]] {
            let run = try runRoomcastd(["--check-config", "--config", conf] + args)
            #expect(run.status == 64, "\(args): \(run.stderr)")
            #expect(run.stderr.contains("is given twice"), "\(run.stderr)")
        }
        let overlap = try runRoomcastd(["--check-config", "--config", conf, "--listen", "0.0.0.0:19001"])
        #expect(overlap.status == 64 && overlap.stderr.contains("listen addresses 0.0.0.0:19001 and 127.0.0.1:19001 overlap"), "\(overlap.stderr)")
        // Every other listener of the file counts, listen_tls too, named with its line.
        let certs = try TestCertificates()
        let tls = try dir.write("t.conf", "[tls]\ncert_file = \(certs.cert)\nkey_file = \(certs.key)\n[websocket]\nlisten_tls = 127.0.0.1:19004\n"
                                + "[json]\nlisten_tls = 127.0.0.1:19005\n")
        for (address, needle) in [("127.0.0.1:19004", "t.conf:5: websocket.listen_tls: listen address 127.0.0.1:19004 is given twice"),
                                  ("0.0.0.0:19005", "t.conf:7: json.listen_tls: listen addresses 0.0.0.0:19005 and 127.0.0.1:19005 overlap")] {
            let run = try runRoomcastd(["--check-config", "--config", tls, "--listen", address])
            #expect(run.status == 64 && run.stderr.contains(needle), "--listen \(address): \(run.status) \(run.stderr)")
        }
        // In the file alone it is a config error with its line (exit 78: systemd does not restart).
        let overlapping = try dir.write("o.conf", "[server]\nlisten = 127.0.0.1:19003\n[json]\nlisten = 0.0.0.0:19003\n")
        let run = try runRoomcastd(["--check-config", "--config", overlapping])
        #expect(run.status == 78 && run.stderr.contains("o.conf:4: json.listen: 0.0.0.0:19003 overlaps 127.0.0.1:19003 at line 2"), "\(run.stderr)")
    }
}
