// The logger's rate limit for peer-caused warnings: a burst is cut to
// `rateBurst` lines and the rest is reported as a count, also when nothing
// of its kind follows (found by a review: the count used to wait for one).
import Glibc
import RoomcastIO
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

@Suite("Logger: journald's native protocol, written without waiting")
struct JournalEncodingTests {
    @Test("FIELD=value per field; a value with a newline in the binary form (name, newline, 64-bit LE length, value, newline)")
    func encoding() throws {
        let bytes = JournalEncoding.encode([("MESSAGE", "hello"), ("ROOM", "two\nlines"), ("EMPTY", ""), ("UTF8", "é 你好 🎉")])
        let expected = Array("MESSAGE=hello\nROOM\n".utf8) + [9, 0, 0, 0, 0, 0, 0, 0] + Array("two\nlines\nEMPTY=\nUTF8=é 你好 🎉\n".utf8)
        #expect(bytes == expected)
        // The test's own parser (written from the protocol document) agrees.
        let fields = try parseJournalDatagram(bytes)
        #expect(fields.map(\.name) == ["MESSAGE", "ROOM", "EMPTY", "UTF8"])
        #expect(fields.map { String(decoding: $0.value, as: UTF8.self) } == ["hello", "two\nlines", "", "é 你好 🎉"])
        #expect(fields.map(\.binary) == [false, true, false, false])
        // A value of exactly 256 bytes with a newline: the length's second byte is used.
        let long = String(repeating: "a", count: 255) + "\n"
        let b = JournalEncoding.encode([("M", long)])
        #expect(Array(b[0..<10]) == Array("M\n".utf8) + [0, 1, 0, 0, 0, 0, 0, 0])
        #expect(try parseJournalDatagram(b).first?.value == Array(long.utf8))
    }

    @Test("field names journald would drop are made valid; valid ones are kept as they are")
    func fieldNames() {
        for valid in ["MESSAGE", "CLIENT_ADDR", "A1", String(repeating: "X", count: 64)] {
            #expect(JournalEncoding.fieldName(valid) == valid)
        }
        #expect(JournalEncoding.fieldName("client-addr.v2") == "CLIENT_ADDR_V2")
        #expect(JournalEncoding.fieldName("_TRUSTED") == "TRUSTED")
        #expect(JournalEncoding.fieldName("2FA") == "F2FA")
        #expect(JournalEncoding.fieldName(String(repeating: "y", count: 70)).count == 64)
        #expect(JournalEncoding.fieldName("___") == "")
        for name in ["client-addr.v2", "_TRUSTED", "2FA", "ümlaut", String(repeating: "y", count: 70)] {
            #expect(isValidJournalFieldName(JournalEncoding.fieldName(name)), "\(name)")
        }
        // A field whose name cannot be made valid is left out, not sent broken.
        #expect(JournalEncoding.encode([("___", "x"), ("OK", "y")]) == Array("OK=y\n".utf8))
    }

    @Test("a value over 16 KiB is cut at a character boundary and ends in …")
    func longValueCut() throws {
        let value = "a" + String(repeating: "é", count: 20_000)  // 2-byte characters, the cut falls inside one
        let fields = try parseJournalDatagram(JournalEncoding.encode([("MESSAGE", value)]))
        let cut = try #require(fields.first?.value)
        #expect(cut.count <= JournalEncoding.maxValueBytes + 3 && cut.count > JournalEncoding.maxValueBytes - 4)
        let text = try #require(String(validating: cut, as: UTF8.self), "valid UTF-8")
        #expect(text.hasPrefix("aéé") && text.hasSuffix("é…"))
    }

    /// A fake journald socket that reads only when asked.
    final class Journal {
        let path: String
        let fd: Int32
        init(path: String = "/tmp/roomcast-ljournal-\(getpid())-\(UInt32.random(in: 0...UInt32.max))") throws {
            self.path = path
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_CLOEXEC.rawValue | SOCK_NONBLOCK.rawValue), 0)
            var addr = sockaddr_un()
            addr.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
            let r = withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            try #require(r == 0)
        }
        deinit { close(fd); unlink(path) }
        func read() throws -> [[JournalField]] {
            var records: [[JournalField]] = []
            var buffer = [UInt8](repeating: 0, count: 256 * 1024)
            while case let n = buffer.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, 0) }), n > 0 {
                records.append(try parseJournalDatagram(Array(buffer[0..<n])))
            }
            return records
        }
    }

    @Test("journald not reading: records are dropped without waiting and counted; one warning with the count comes before the next record")
    func droppedAndCounted() throws {
        let journal = try Journal()
        let logger = Logger(level: .info, sink: .journal, journalPath: journal.path)
        let start = monotonicMilliseconds()
        for i in 0..<100 { logger.info("record \(i)", ["N": String(i)]) }
        #expect(monotonicMilliseconds() - start < 1_000, "never waits")
        let first = try journal.read()
        let taken = first.count
        #expect(taken > 0 && taken < 100, "the socket's queue holds net.unix.max_dgram_qlen records: \(taken)")
        #expect(logger.journalDropped == 100 - taken)
        logger.flushPending()
        logger.info("after", ["REASON": "x"])
        let next = try journal.read()
        func value(_ r: [JournalField], _ name: String) -> String? {
            r.first { $0.name == name }.map { String(decoding: $0.value, as: UTF8.self) }
        }
        #expect(next.count == 2)
        #expect(next.first.flatMap { value($0, "MESSAGE") } == "journald did not read its socket: \(100 - taken) log records dropped")
        #expect(next.first.flatMap { value($0, "REASON") } == "journal_dropped" && next.first.flatMap { value($0, "DROPPED") } == String(100 - taken))
        #expect(next.first.flatMap { value($0, "PRIORITY") } == "4")
        #expect(next.last.flatMap { value($0, "MESSAGE") } == "after" && next.last.flatMap { value($0, "PRIORITY") } == "6")
        #expect(next.last.map { $0.map(\.name) } == ["MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "REASON"])
        #expect(logger.journalDropped == 0)
    }

    @Test("journald restarted (a new socket at the same path): the logger connects again; records lost meanwhile are counted")
    func reconnects() throws {
        var journal: Journal? = try Journal()
        let path = journal!.path
        let logger = Logger(level: .info, sink: .journal, journalPath: path)
        logger.info("one")
        #expect(try journal!.read().count == 1)
        journal = nil  // closed and unlinked: journald is gone
        logger.info("lost")
        #expect(logger.journalDropped == 1)
        let again = try Journal(path: path)
        logger.info("two")
        let records = try again.read()
        #expect(records.compactMap { $0.first { $0.name == "MESSAGE" } }.map { String(decoding: $0.value, as: UTF8.self) }
                == ["journald was not reachable (No such file or directory): 1 log record dropped", "two"])
    }
}

@Suite("Logger: a stderr nobody reads never blocks; lines wait in a bounded backlog, the rest are counted")
struct StderrBacklogTests {
    @Test("stderr is a stream socket (journald's) that is not read: each record returns at once; the kept lines come whole, then the count")
    func socketNotRead() throws {
        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        // A blocking write would wait 200 ms and give up (so that the test
        // fails instead of hanging on a logger that waits).
        var tv = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(fds[1], SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var small: Int32 = 4096
        setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        let logger = Logger(level: .info, sink: .stderr(syslogPrefix: true), outputFD: fds[1])
        let total = 2_000
        var slowest: UInt64 = 0
        for i in 0..<total {
            let start = monotonicMilliseconds()
            logger.info("line \(i) " + String(repeating: "x", count: 80))
            slowest = max(slowest, monotonicMilliseconds() - start)
            if slowest > 100 { break }
        }
        #expect(slowest <= 100, "a log call waited \(slowest) ms for stderr")

        // Read it all, letting the logger write what waits.
        _ = fcntl(fds[0], F_SETFL, O_NONBLOCK)
        var text: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        for _ in 0..<200 {
            while case let n = buffer.withUnsafeMutableBytes({ read(fds[0], $0.baseAddress, $0.count) }), n > 0 { text += buffer[0..<n] }
            logger.flushPending()
        }
        logger.info("after")
        while case let n = buffer.withUnsafeMutableBytes({ read(fds[0], $0.baseAddress, $0.count) }), n > 0 { text += buffer[0..<n] }
        let lines = String(decoding: text, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        #expect(lines.last == "", "ends with a whole line")
        let kept = lines.filter { $0.hasPrefix("<6>line ") }
        #expect(kept.enumerated().allSatisfy { $0.element == "<6>line \($0.offset) " + String(repeating: "x", count: 80) }, "whole lines, in order, none skipped before the drops")
        let notice = try #require(lines.first { $0.hasPrefix("<4>stderr was not read: ") }, "\(lines.suffix(3))")
        let dropped = notice.split(separator: " ").first { $0.hasPrefix("DROPPED=") }.flatMap { Int($0.dropFirst(8)) } ?? 0
        #expect(notice == "<4>stderr was not read: \(dropped) log lines dropped REASON=stderr_dropped DROPPED=\(dropped)")
        #expect(dropped > 0 && kept.count + dropped == total, "\(kept.count) kept, \(dropped) dropped")
        let keptBytes = kept.reduce(0) { $0 + $1.utf8.count + 1 }
        #expect(keptBytes >= StderrOutput.backlogLimit - 100, "the backlog's worth (less than a line) was kept: \(keptBytes) bytes")
        #expect(Array(lines.suffix(3)) == [notice, "<6>after", ""], "the count comes after the kept lines, before the next")
    }
}
