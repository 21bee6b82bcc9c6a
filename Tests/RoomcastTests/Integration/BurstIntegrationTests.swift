// The hard output limit against the real binary (docs/protocol/rooms.md §6): it
// counts what a client holds of its own after the kernel took what it could,
// never the frames one loop pass read for everyone. A pass holding more than
// the limit cuts no reader that reads; the closed-loop large-frame workload
// with echo at the default limits cuts nobody.
import Foundation
import Glibc
import Testing

/// The load generator built next to the running test bundle (BENCHMARKS.md).
let roomcastBenchURL = roomcastdURL.deletingLastPathComponent().appendingPathComponent("roomcast-bench")

@Suite("Bursts and the hard output limit", .serialized)
struct BurstIntegrationTests {
    @Test("one loop pass holding 200 KiB with output_hard_bytes = 128K: the senders (echo) and two readers with nothing queued all stay connected and get every frame")
    func burstInOnePassCutsNoReader() throws {
        let d = try Daemon(["limits.output_hard_bytes": "128K", "limits.output_soft_bytes": "64K",
                            "limits.output_soft_seconds": "1min", "log.level": "info"])
        let senders = try (0..<4).map { _ in try d.connect(awaitAccept: false) }
        let readers = try (0..<2).map { _ in try d.connect(awaitAccept: false) }
        let everyone = senders + readers
        // Every client is in the room once a probe reaches all of them.
        let probe = Wire.frame(Wire.opaque, [0])
        try senders[0].send(probe)
        for c in everyone { #expect(c.receiveFrame()?.wire == probe) }

        // 4 x 50 KiB, sent while the daemon is stopped: each fits in its
        // socket's receive window, so the daemon reads all 200 KiB in the
        // one pass after SIGCONT, and every member's range of that pass is
        // 200 KiB, over the 128 KiB limit.
        let frames = (0..<4).map { s in (0..<5).map { numberedFrame(s * 5 + $0, size: 10 * 1024 - 6) } }
        d.child.kill(SIGSTOP)
        defer { d.child.kill(SIGCONT) }
        for (s, c) in senders.enumerated() { try c.sendRaw(frames[s].flatMap { $0 }) }
        pause(.milliseconds(100))
        d.child.kill(SIGCONT)

        for c in everyone {
            let got = c.receiveFrames(20, timeout: .seconds(5))
            #expect(got.count == 20, "\(c.address) got \(got.count) of 20 frames")
            for s in 0..<4 {
                let mine = got.compactMap(sequenceNumber).filter { $0 / 5 == s }
                #expect(mine == Array(s * 5..<(s + 1) * 5), "\(c.address): sender \(s)'s frames in order")
            }
        }
        #expect(d.stderr.line(with: ["slow consumer"]) == nil, "nobody was cut: \(d.stderr.line(with: ["slow consumer"]) ?? "")")
        for c in everyone { c.expectOpen() }
    }

    @Test("1 publisher keeping 64 x 16 KiB text frames in flight to 100 members, echo on, default output limits: no disconnect, nothing lost (roomcast-bench, 3 s)")
    func largeFramesWithEchoAtDefaultLimits() throws {
        // shed = none: the closed loop keeps up to 1 MiB in flight to each
        // member, so a member that reads still sits above output_soft_bytes
        // (256K) for a moment when the generator falls behind (a loaded
        // machine), and shed = text would withhold texts the bench counts as
        // loss. This test is about cuts; shedding has SheddingIntegrationTests.
        let d = try Daemon(["log.level": "info", "limits.shed": "none"])
        let out = Pipe()
        let bench = Process()
        bench.executableURL = roomcastBenchURL
        bench.arguments = ["--mode", "large", "--echo", "yes", "--host", d.host, "--port", String(d.port),
                           "--duration", "3", "--warmup", "0.5", "--drain", "3", "--heartbeat", "0", "--setup-timeout", "30", "--json"]
        bench.standardOutput = out
        try bench.run()
        let deadline = monotonicMs() + 60_000
        while bench.isRunning && monotonicMs() < deadline { usleep(50_000) }
        if bench.isRunning { bench.terminate() }
        bench.waitUntilExit()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        let result = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any],
                                  "roomcast-bench printed no JSON: \(String(decoding: data, as: UTF8.self))")
        reportFigure("burst", "large_echo_deliveries", "\(result["deliveries"] ?? "?")")
        #expect(result["closed_by_server"] as? Int == 0, "closed by the server: \(result["closed_by_server"] ?? "?"); \(result["first_problem"] ?? "")")
        #expect(result["loss"] as? Int == 0, "loss \(result["loss"] ?? "?")")
        #expect(d.stderr.line(with: ["slow consumer"]) == nil, "\(d.stderr.line(with: ["slow consumer"]) ?? "")")
    }
}
