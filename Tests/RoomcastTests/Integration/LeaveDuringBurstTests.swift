// Issue 28 item 8 against the real binary (docs/protocol/rooms.md §6): the
// hard output limit never cuts a reader that keeps up, even when members
// leave during a burst. `output_hard_bytes = 512K`; a burst of 100 x 8 KiB
// texts into a room where 10 members reset (SO_LINGER 0) just before it and
// 10 never read (SO_RCVBUF 4096, TCP_MAXSEG 1400, so their backlog builds in
// the daemon and they are cut), while a reader with default buffers reads
// continuously on its own thread (as does the publisher, its echo). Several
// rounds, each with fresh resetting and stalled members.
import Foundation
import Glibc
import RoomcastCore
import Synchronization
import Testing

/// Reads a socket as fast as the kernel hands it bytes, on its own thread,
/// and counts the LTB frames (little-endian) by type until `stop()` or EOF.
final class ContinuousReader: Sendable {
    struct Counts: Sendable {
        var texts = 0
        /// The sum of the counts of the `skipped` notices.
        var skipped = 0
        var bytes = 0
        /// EOF or an error: the daemon closed it.
        var closed = false
    }
    let counts = Mutex(Counts())
    private let stopped = Mutex(false)
    private let done = Mutex(false)

    init(fd: Int32) {
        Thread.detachNewThread { [self] in self.loop(fd) }
    }

    private func loop(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 256 * 1024)
        var pending: [UInt8] = []
        while !stopped.withLock({ $0 }) {
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 20) > 0 else { continue }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n == 0 || n < 0 && errno != EAGAIN && errno != EINTR {
                counts.withLock { $0.closed = true }
                break
            }
            guard n > 0 else { continue }
            pending += buffer[0..<n]
            var at = 0, texts = 0, skipped = 0
            while pending.count - at >= FrameCodec.headerSize {
                let length = Int(pending[at]) | Int(pending[at + 1]) << 8 | Int(pending[at + 2]) << 16 | Int(pending[at + 3]) << 24
                let type = UInt16(pending[at + 4]) | UInt16(pending[at + 5]) << 8
                guard pending.count - at >= FrameCodec.headerSize + length else { break }
                if type == Wire.text { texts += 1 }
                if type == Wire.notice, let notice = try? Notice(protobuf: Array(pending[at + 6..<at + 6 + length])), notice.code == "skipped" {
                    skipped += Int(notice.count ?? 0)
                }
                at += FrameCodec.headerSize + length
            }
            pending.removeFirst(at)
            counts.withLock {
                $0.texts += texts
                $0.skipped += skipped
                $0.bytes += n
            }
        }
        done.withLock { $0 = true }
    }

    /// Stops the thread (within 20 ms) and waits for it.
    func stop() {
        stopped.withLock { $0 = true }
        _ = waitUntil(.seconds(2)) { done.withLock { $0 } }
    }
}

@Suite("Members leaving during a burst", .serialized)
struct LeaveDuringBurstTests {
    static let rounds = 10
    static let burst = 100
    static let frameBytes = 8 * 1024

    /// Text `i` of round `r`, about `frameBytes` bytes of frame.
    static func text(_ r: Int, _ i: Int) -> [UInt8] {
        let head = "r\(r) t\(i) "
        return Wire.text(Wire.user("streamer"), head + String(repeating: "x", count: frameBytes - 40 - head.utf8.count))
    }

    @Test("output_hard_bytes = 512K, 100 x 8 KiB texts while 10 members reset and 10 never read: a reader that reads continuously (and the publisher, its echo) is never cut and gets every text (10 rounds)")
    func readerKeepsUpWhileMembersResetAndStall() throws {
        // The members that never read are cut by the hard limit, or by the
        // soft one (2 s) when a burst leaves them within the hard limit and
        // one pass's frames (docs/protocol/rooms.md §6).
        let d = try Daemon(["limits.output_hard_bytes": "512K", "limits.output_soft_seconds": "2s"])
        var allStalled: [TestClient] = []
        let publisher = try d.connect()
        let reader = try d.connect()
        let readers = [reader, publisher].map { ContinuousReader(fd: $0.fd) }
        defer { for r in readers { r.stop() } }
        func cutLines() -> [Substring] {
            // The debug line of every close (warnings are rate-limited).
            d.stderr.current.split(separator: "\n").filter { l in
                l.contains("client disconnected") && [reader.address, publisher.address].contains { l.contains("CLIENT_ADDR=\($0) ") }
            }
        }
        for round in 0..<Self.rounds {
            let stalled = try (0..<10).map { _ in try d.connect(receiveBuffer: 4096, maxSegment: 1400) }
            allStalled += stalled
            let resetting = try (0..<10).map { _ in try d.connect() }
            let burst = (0..<Self.burst).flatMap { Self.text(round, $0) }
            for c in resetting { c.reset() }
            try publisher.sendRaw(burst)
            let want = (round + 1) * Self.burst
            _ = waitUntil(.seconds(20)) {
                readers.contains { $0.counts.withLock { $0.closed } }
                    || readers.allSatisfy { r in r.counts.withLock { $0.texts + $0.skipped >= want } }
            }
            let got = readers.map { r in r.counts.withLock { $0 } }
            let cut = cutLines()
            #expect(cut.isEmpty && !got.contains { $0.closed }, "round \(round), reader \(reader.address), publisher \(publisher.address): cut:\n\(cut.joined(separator: "\n"))")
            for (name, c) in zip(["reader", "publisher"], got) {
                #expect(c.texts + c.skipped == want, "round \(round): the \(name) got \(c.texts) texts + \(c.skipped) skipped of \(want)")
            }
            guard cut.isEmpty, got.allSatisfy({ $0.texts + $0.skipped == want }) else { return }
        }
        for c in allStalled {
            #expect(d.stderr.wait(forLineWith: ["client disconnected", "slow consumer", "CLIENT_ADDR=\(c.address) "], timeout: .seconds(5)),
                    "a member that never reads is cut")
        }
        reportFigure("leave during burst: \(Self.rounds) rounds of \(Self.burst) x 8 KiB, nobody who reads cut")
    }
}
