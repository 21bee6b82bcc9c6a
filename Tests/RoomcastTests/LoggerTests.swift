// The logger's rate limit for peer-caused warnings: a burst is cut to
// `rateBurst` lines and the rest is reported as a count, also when nothing
// of its kind follows (found by a review: the count used to wait for one).
import Glibc
@testable import RoomcastServer
import RoomcastCore
import Testing

@Suite("Logger: peer warnings are rate-limited and the rest counted")
struct LoggerTests {
    /// A logger writing `.stderr` lines into a pipe, and a way to read them.
    final class Capture {
        let logger: Logger
        private var fds: [Int32] = [0, 0]

        init(rateWindowMs: UInt64) {
            _ = pipe(&fds)
            _ = fcntl(fds[0], F_SETFL, O_NONBLOCK)
            logger = Logger(level: .info, sink: .stderr(syslogPrefix: false), rateWindowMs: rateWindowMs, outputFD: fds[1])
        }
        deinit { close(fds[0]); close(fds[1]) }

        /// Lines written since the last call.
        func lines() -> [String] {
            var bytes: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = chunk.withUnsafeMutableBytes { read(fds[0], $0.baseAddress, $0.count) }
                if n <= 0 { break }
                bytes += chunk[0..<n]
            }
            return String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init)
        }
    }

    @Test("15 warnings of one kind: 10 lines, then one count when the window ends, without another warning")
    func burstThenCount() {
        let c = Capture(rateWindowMs: 1_000)
        for i in 0..<15 { c.logger.peerWarning(reason: "bad_frame", nowMs: 5_000 + UInt64(i), "bad \(i)") }
        c.logger.peerWarning(reason: "rate_limit", nowMs: 5_020, "another kind")
        let burst = c.lines()
        #expect(burst.filter { $0.contains("REASON=bad_frame") }.map { $0.contains(" WARNING bad ") } == Array(repeating: true, count: 10))
        #expect(burst.contains { $0.contains("another kind") }, "kinds are limited separately")
        c.logger.flushSuppressed(nowMs: 5_999)
        #expect(c.lines().isEmpty, "the window is still open")
        c.logger.flushSuppressed(nowMs: 6_000)
        let summary = c.lines()
        #expect(summary.count == 1 && summary[0].contains(" WARNING suppressed 5 similar warnings (bad_frame) in the last 1s"), "\(summary)")
        c.logger.flushSuppressed(nowMs: 9_000)
        #expect(c.lines().isEmpty, "reported once")
    }

    @Test("at stop, warnings suppressed in a window still open are counted too")
    func countedAtStop() {
        let c = Capture(rateWindowMs: 1_000)
        for i in 0..<12 { c.logger.peerWarning(reason: "bad_frame", nowMs: 9_000 + UInt64(i), "again \(i)") }
        #expect(c.lines().count == 10)
        c.logger.flushSuppressed(nowMs: 9_100, final: true)
        #expect(c.lines().map { $0.contains("suppressed 2 similar warnings (bad_frame)") } == [true], "at stop, open windows too")
    }

    @Test("no count once the level has risen above warning (a reload to level = error)")
    func countRespectsLevel() {
        let c = Capture(rateWindowMs: 1_000)
        for i in 0..<12 { c.logger.peerWarning(reason: "bad_frame", nowMs: 100 + UInt64(i), "bad \(i)") }
        #expect(c.lines().count == 10)
        c.logger.level = .error
        c.logger.flushSuppressed(nowMs: 2_000, final: true)
        #expect(c.lines().isEmpty)
    }

    @Test("peer text is clipped: a 10,000-byte message and field make a bounded line that states their length")
    func longValuesAreClipped() {
        let c = Capture(rateWindowMs: 1_000)
        let huge = String(repeating: "r", count: 10_000)
        c.logger.info("joined \(huge)", ["ROOM": huge, "CLIENT_ADDR": "1.2.3.4:5"])
        let lines = c.lines()
        #expect(lines.count == 1)
        let line = lines.first ?? ""
        #expect(line.utf8.count < 2 * Logger.maxValueBytes + 200, "\(line.utf8.count) bytes")
        #expect(line.contains("…(10007 bytes) ROOM=") && line.contains("…(10000 bytes)\" CLIENT_ADDR=1.2.3.4:5"), "\(line.suffix(120))")
        // Short values are untouched.
        c.logger.info("hello", ["ROOM": "lobby"])
        #expect(c.lines().first?.hasSuffix(" INFO hello ROOM=lobby") == true)
    }
}

/// `clipForLog`: peer-supplied strings cut for log lines at a UTF-8 boundary,
/// with the original length.
@Suite struct ClipForLogTests {
    @Test func shortTextIsUnchanged() {
        #expect(clipForLog("lobby") == "lobby")
        let exactly = String(repeating: "x", count: logClipBytes)
        #expect(clipForLog(exactly) == exactly)
        #expect(clipForLog("") == "")
    }

    @Test func longTextIsCutAndItsLengthStated() {
        let clipped = clipForLog(String(repeating: "x", count: 60_000))
        #expect(clipped == String(repeating: "x", count: 256) + "…(60000 bytes)")
        #expect(clipForLog("abcdef", maxBytes: 3) == "abc…(6 bytes)")
        #expect(clipForLog("abc", maxBytes: 0) == "…(3 bytes)")
    }

    @Test("cut at a character boundary, never inside a multi-byte UTF-8 sequence", arguments: [
        ("é", 2), ("€", 3), ("😀", 4), ("e\u{301}", 3),
    ] as [(String, Int)])
    func cutAtScalarBoundaries(unit: String, width: Int) {
        #expect(unit.utf8.count == width)
        let text = String(repeating: unit, count: 200)
        for limit in [255, 256, 257, 5, 1] {
            let clipped = clipForLog(text, maxBytes: limit)
            let kept = clipped.prefix { $0 != "…" }
            #expect(kept.utf8.count <= limit && limit - kept.utf8.count < 4, "limit \(limit): kept \(kept.utf8.count) bytes")
            #expect(text.utf8.starts(with: kept.utf8), "a prefix of the original bytes")
            #expect(!kept.unicodeScalars.contains("\u{FFFD}"), "no broken sequence")
            #expect(clipped.hasSuffix("…(\(200 * width) bytes)"))
        }
    }
}
