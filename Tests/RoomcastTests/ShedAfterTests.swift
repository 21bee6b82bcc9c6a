import Foundation
import Glibc
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

/// `[limits] shed_after` (docs/protocol.md §6, "Shedding"): texts are shed
/// only once a reader's backlog has stayed above `output_soft_bytes` that
/// long, and a replay (recent lines on join, missed lines on resume) is never shed.
@Suite struct ShedAfterTests {
    @Test("shed_after: default 1s (never past output_soft_seconds), a set value, 0; a reload applies it")
    func config() throws {
        #expect(try Config.parse("", file: "t").limits.effectiveShedAfterMs == 1_000)
        #expect(try Config.parse("[limits]\nshed_after = 250ms\n", file: "t").limits.effectiveShedAfterMs == 250)
        #expect(try Config.parse("[limits]\nshed_after = 0\n", file: "t").limits.effectiveShedAfterMs == 0)
        #expect(try Config.parse("[limits]\noutput_soft_seconds = 10s\nshed_after = 10s\n", file: "t").limits.effectiveShedAfterMs == 10_000)
        // A file that predates the key, with a soft window under 1 s, stays valid.
        #expect(try Config.parse("[limits]\noutput_soft_seconds = 300ms\n", file: "t").limits.effectiveShedAfterMs == 300)

        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("shed-after-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("roomcastd.conf").path
        let head = "[server]\nlisten = 127.0.0.1:0\n[rooms]\ncounts = 0\n[log]\nlevel = warning\n"
        try (head + "[limits]\nshed_after = 2s\n").write(toFile: path, atomically: true, encoding: .utf8)
        var logPipe: [Int32] = [-1, -1]
        _ = pipe(&logPipe)
        defer { logPipe.forEach { close($0) } }
        _ = fcntl(logPipe[1], F_SETFL, O_NONBLOCK)
        let server = try Server(config: try Config.load(path: path), options: .init(configPath: path),
                                systemd: Systemd(notifySocket: false, watchdogUsec: nil, listenFDs: []),
                                logger: Logger(level: .warning, sink: .stderr(syslogPrefix: false), outputFD: logPipe[1]),
                                signalFD: -1, clock: { 1_000 }, keys: nil)
        #expect(server.table.fanout.shedAfterMs == 2_000)
        try (head + "[limits]\nshed_after = 300ms\n").write(toFile: path, atomically: true, encoding: .utf8)
        server.reload()
        #expect(server.table.fanout.shedAfterMs == 300, "SIGHUP applies shed_after")
        try (head + "[limits]\noutput_soft_seconds = 1s\nshed_after = 2s\n").write(toFile: path, atomically: true, encoding: .utf8)
        server.reload()
        #expect(server.table.fanout.shedAfterMs == 300, "a refused file keeps the running value")
    }

    @Test("a reader above output_soft_bytes for less than shed_after loses no text; past it, its texts of others are shed")
    func shedOnlyAfterShedAfter() {
        let (t, ours, peers) = OutputPathTests.table(3, hard: 8 << 20)
        defer { for id in 0..<3 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        var now: UInt64 = 1  // makeSlow starts the soft clock at 1
        t.fanout.clock = { now }
        t.fanout.shedAfterMs = 1_000
        SheddingTests.makeSlow(t)
        let room = [0, 1, 2]
        now = 999
        #expect(SheddingTests.pass(t, SheddingTests.frame(2, 10), from: 0, to: room) == 3, "998 ms above: not shed")
        #expect(t.fanout.shedding.isEmpty && t.fanout.framesShed == 0)
        now = 1_001
        #expect(SheddingTests.pass(t, SheddingTests.frame(2, 11), from: 0, to: room) == 2, "1 s above: shed")
        #expect(t.fanout.shedding == [1: 1])
        let got = SheddingTests.frames(SheddingTests.catchUp(t, 1, peers[1]))
        #expect(got.map(\.marker) == [0xBB, 10], "the text before shed_after came, in order")
        #expect(t.fanout.sheddingEnded.map(\.count) == [1])
    }

    @Test("a replay (recent or missed lines) is never shed, and not counted as skipped, even past shed_after")
    func replayIsNeverShed() {
        let (t, ours, peers) = OutputPathTests.table(2, hard: 8 << 20)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        t.fanout.shedAfterMs = 0
        SheddingTests.makeSlow(t)
        for i in 0..<5 { #expect(SheddingTests.frame(2, UInt8(i)).withUnsafeBytes { t.fanout.replay($0, to: 1) } == 1) }
        #expect(t.fanout.shedding.isEmpty && t.fanout.framesShed == 0)
        #expect(SheddingTests.pass(t, SheddingTests.frame(2, 9), from: 0, to: [0, 1]) == 1, "a live text is still shed")
        let got = SheddingTests.frames(SheddingTests.catchUp(t, 1, peers[1]))
        #expect(got.map(\.marker) == [0xBB, 0, 1, 2, 3, 4])
        #expect(t.fanout.sheddingEnded.map(\.count) == [1], "skipped counts the live text only")
    }
}

/// The withheld count across a restart (docs/protocol.md §6): the texts shed
/// before it and after it make one `skipped` notice.
@Suite("Shedding across a restart (socketpairs, a fake fd store)")
struct ShedAcrossRestartTests {
    static func text(_ s: String) -> [UInt8] {
        FrameCodec.encode(type: 2, body: ChatMessage(user: UserInfo(level: 1, name: "xavier", iconURL: "", room: nil), text: s).serialized(),
                          byteOrder: .little)
    }

    @Test("3 texts shed before a restart and 2 after: the slow reader's skipped notice, once caught up, counts 5")
    func withheldCountCarriesOver() throws {
        let sections = CrashLogTests.config + "output_soft_bytes = 16K\noutput_soft_seconds = 10s\nshed_after = 0\n"
        let (a, x, w) = try CrashLogTests.senderAndSlowReader(sections)
        HandOverTests.send(x.peer, FrameCodec.encode(type: 100, body: [UInt8](repeating: 3, count: 60_000), byteOrder: .little))
        try a.tick()
        #expect(a.server.table.fanout.outboxes[w.id].softSinceMs != nil, "W went over output_soft_bytes")
        for i in 0..<3 {
            HandOverTests.send(x.peer, Self.text("before \(i)"))
            try a.tick()
        }
        #expect(a.server.table.fanout.shedding[w.id] == 3)
        let b = try HandOverTests.handOver(a, sections: sections)
        let wB = CrashLogTests.id(b, w)
        #expect(b.server.table.fanout.shedding[wB] == 3, "the episode goes on after the restart")
        for i in 0..<2 {
            HandOverTests.send(x.peer, Self.text("after \(i)"))
            try b.tick()
        }
        var got: [(UInt16, [UInt8])] = []
        var bytes: [UInt8] = []
        for _ in 0..<2_000 where !got.contains(where: { $0.0 == 9 }) {
            bytes += HandOverTests.drain(w.peer) ?? []
            try b.tick()
            got = HandOverTests.frames(bytes)
        }
        let notices = got.filter { $0.0 == 9 }.compactMap { try? Notice(protobuf: $0.1) }
        #expect(notices.map(\.code) == ["skipped"] && notices.first?.count == 5, "\(notices)")
        #expect(got.filter { $0.0 == 2 }.isEmpty, "no text of X came to W")
        [x, w].forEach { close($0.peer) }
    }
}
