// Shedding before cutting (docs/protocol/rooms.md §6, "Shedding") against the real
// daemon: a viewer reading at about 20 KiB/s in a room where a sender sends
// about 200 KiB/s of text and one gift a second. With `[limits] shed = text`
// it stays connected, gets every gift and `skipped` notices whose counts,
// with the texts it got, make up every text sent; with `shed = none` it is
// cut as a slow consumer, as before shedding existed.
import Foundation
import Glibc
import RoomcastCore
import Testing

/// What the slow viewer of `runSlowViewer` saw.
struct SlowViewerRun: CustomStringConvertible {
    var textsSent = 0
    var giftsSent = 0
    var textsReceived = 0
    var giftsReceived = 0
    /// `skipped` notices received, and the sum of their counts.
    var skippedNotices = 0
    var skipped = 0
    /// Texts that did not come after the previous one received (a duplicate or a reordering).
    var outOfOrder = 0
    /// Bytes of frames the viewer read while it was slow.
    var bytesRead = 0
    var seconds = 0.0
    /// The daemon closed the viewer.
    var closed = false

    var description: String {
        "texts sent \(textsSent), received \(textsReceived), skipped \(skipped) in \(skippedNotices) notices; "
            + "gifts sent \(giftsSent), received \(giftsReceived); out of order \(outOfOrder); "
            + "viewer read \(bytesRead / 1024) KiB in \(String(format: "%.1f", seconds)) s; closed: \(closed)"
    }
}

@Suite("Shedding before cutting: a slow viewer", .serialized)
struct SheddingIntegrationTests {
    /// How long the sender sends, in seconds.
    static let seconds = 8
    /// Text frames of about 1 KiB: 200 a second is 200 KiB/s.
    static let textBytes = 1024
    static let textsPerSecond = 200
    /// The viewer's reading rate, in bytes a second.
    static let readRate = 20 * 1024

    /// Output limits small enough to make the test quick: the backlog of a
    /// viewer that keeps receiving 200 KiB/s at 20 KiB/s passes the hard
    /// limit within about 2 s; the soft clock has 4 s.
    static func settings(shed: String) -> [String: String] {
        ["protocol.echo": "no", "limits.output_soft_bytes": "32K", "limits.output_hard_bytes": "384K",
         "limits.output_soft_seconds": "4s", "limits.shed": shed]
    }

    static let user = Wire.user("streamer")

    /// Text `i`: "t<i> " padded to about `textBytes` bytes of frame.
    static func text(_ i: Int) -> [UInt8] {
        let head = "t\(i) "
        return Wire.text(user, head + String(repeating: "x", count: textBytes - 60 - head.utf8.count))
    }

    /// For `seconds`, a sender sends texts at 200 KiB/s and a gift each
    /// second (the first at 0) while the viewer reads at `readRate`; then the
    /// viewer reads at full speed until it has accounted for every text and
    /// gift (or 10 s pass, or it is closed).
    static func runSlowViewer(_ d: Daemon) throws -> (SlowViewerRun, TestClient) {
        let sender = try d.connect()
        // A small receive buffer and MSS (TestClient): the backlog builds in the daemon.
        let viewer = try d.connect(receiveBuffer: 4096)
        var run = SlowViewerRun()
        var lastText = -1
        func take(_ f: Frame) {
            switch f.type {
            case Wire.text:
                run.textsReceived += 1
                let text = (try? ChatMessage(protobuf: f.body))?.text ?? ""
                let n = Int(text.dropFirst().prefix { $0 != " " }) ?? -1
                if n <= lastText { run.outOfOrder += 1 }
                lastText = n
            case Wire.gift:
                run.giftsReceived += 1
            case 9:
                if let notice = try? Notice(protobuf: f.body), notice.code == "skipped" {
                    run.skippedNotices += 1
                    run.skipped += Int(notice.count ?? 0)
                }
            default:
                break
            }
        }
        let start = monotonicMs()
        let end = start + Int64(seconds) * 1_000
        var closedAt: Int64?
        while case let now = monotonicMs(), now < end {
            let elapsed = now - start
            // What the sender owes by now, in one write.
            var batch: [UInt8] = []
            let texts = Int(elapsed) * textsPerSecond / 1_000
            while run.textsSent < texts {
                batch += text(run.textsSent)
                run.textsSent += 1
            }
            while run.giftsSent <= Int(elapsed) / 1_000 {
                batch += Wire.gift(user, "rose", count: Int32(run.giftsSent + 1))
                run.giftsSent += 1
            }
            if !batch.isEmpty { try sender.sendRaw(batch) }
            // The viewer reads within its budget until the next tick (10 ms).
            let tickEnd = now + 10
            while case let t = monotonicMs(), t < tickEnd {
                guard closedAt == nil, run.bytesRead < Int(t - start) * readRate / 1_000 else {
                    pause(.milliseconds(Int(tickEnd - t)))
                    break
                }
                guard let f = viewer.receiveFrame(timeout: .milliseconds(Int(tickEnd - t))) else {
                    if viewer.isClosed(within: .milliseconds(0)) { closedAt = closedAt ?? monotonicMs() }
                    break
                }
                run.bytesRead += f.body.count + FrameCodec.headerSize
                take(f)
            }
        }
        run.seconds = Double(monotonicMs() - start) / 1_000
        // Caught up at full speed: the last episode's notice follows its texts.
        let deadline = monotonicMs() + 10_000
        while closedAt == nil, run.textsReceived + run.skipped < run.textsSent || run.giftsReceived < run.giftsSent,
              case let left = deadline - monotonicMs(), left > 0 {
            guard let f = viewer.receiveFrame(timeout: .milliseconds(Int(left))) else { break }
            take(f)
        }
        run.closed = closedAt != nil || viewer.isClosed(within: .milliseconds(200))
        sender.expectOpen()
        return (run, viewer)
    }

    @Test("shed = text: the slow viewer stays connected, gets every gift, and texts received + skipped == texts sent; logged once per episode; roomcast_frames_shed_total counts them")
    func shedText() throws {
        let (d, keys) = try APIIntegrationTests.daemon(Self.settings(shed: "text"))  // the API, for /metrics
        defer { withExtendedLifetime(keys) {} }
        let (run, viewer) = try Self.runSlowViewer(d)
        reportFigure("shed=text: \(run)")
        reportFigure("shedding", "texts_sent", "\(run.textsSent)")
        reportFigure("shedding", "texts_received", "\(run.textsReceived)")
        reportFigure("shedding", "texts_skipped", "\(run.skipped)")
        reportFigure("shedding", "skipped_notices", "\(run.skippedNotices)")
        reportFigure("shedding", "gifts", "\(run.giftsReceived)/\(run.giftsSent)")
        #expect(!run.closed, "\(run)")
        #expect(run.giftsSent == Self.seconds && run.giftsReceived == run.giftsSent, "\(run)")
        #expect(run.skippedNotices > 0 && run.skipped > 0, "\(run)")
        #expect(run.textsReceived + run.skipped == run.textsSent, "\(run)")
        #expect(run.outOfOrder == 0, "\(run)")
        // The viewer read about 20 KiB/s: most texts cannot have reached it.
        #expect(run.textsReceived < run.textsSent / 2, "\(run)")
        #expect(d.stderr.line(with: ["slow consumer", "closing"]) == nil, "\(d.stderr.line(with: ["slow consumer", "closing"]) ?? "")")

        let address = viewer.address
        let started = d.stderr.current.split(separator: "\n").filter { $0.contains("REASON=shedding ") && $0.contains("CLIENT_ADDR=\(address)") }
        let ended = d.stderr.current.split(separator: "\n").filter { $0.contains("REASON=shedding_ended") && $0.contains("CLIENT_ADDR=\(address)") }
        #expect(!started.isEmpty && !ended.isEmpty, "the journal lines of the episodes")
        // Logged once per episode, within the logger's rate limit: never more lines than notices.
        #expect(started.count <= run.skippedNotices && ended.count <= run.skippedNotices, "\(started.count) starts, \(ended.count) ends")
        #expect(ended.first.map { $0.contains(" SKIPPED=") && $0.contains(" text frames were not sent to it") } == true, "\(ended.first ?? "")")

        let api = try APITestClient(port: try #require(d.apiPort))
        let body = api.request("GET", "/metrics")?.body ?? ""
        #expect(body.contains("# TYPE roomcast_frames_shed_total counter\n"))
        #expect(RefusalMetricsTests.sample(body, "roomcast_frames_shed_total") == UInt64(run.skipped), "\(run)")
        viewer.expectOpen()
    }

    @Test("shed = none: the same slow viewer is cut as a slow consumer, and told of no skipped text")
    func shedNone() throws {
        let d = try Daemon(Self.settings(shed: "none"))
        let (run, viewer) = try Self.runSlowViewer(d)
        reportFigure("shed=none: \(run)")
        reportFigure("shedding", "none_texts_received", "\(run.textsReceived)/\(run.textsSent)")
        #expect(run.closed, "\(run)")
        #expect(run.skippedNotices == 0 && run.skipped == 0, "\(run)")
        #expect(d.stderr.wait(forLineWith: ["slow consumer", "CLIENT_ADDR=\(viewer.address)"], timeout: .seconds(2)),
                "cut with REASON=output_hard_limit or output_soft_limit")
        #expect(d.stderr.line(with: ["REASON=shedding"]) == nil)
    }

    /// 300 texts of about 1 KiB and 3 gifts (one after each 100), in
    /// batches of 10 texts 20 ms apart: small batches, so that no loop turn
    /// alone holds more than the hard limit.
    static func sendBurst(_ sender: TestClient) throws {
        for batch in 0..<30 {
            var bytes = (0..<10).flatMap { text(batch * 10 + $0) }
            if batch % 10 == 9 { bytes += Wire.gift(user, "rose", count: Int32(batch / 10 + 1)) }
            try sender.sendRaw(bytes)
            pause(.milliseconds(20))
        }
    }

    @Test("shed = none, then text after SIGHUP: the reload applies to a connected viewer that read nothing through a burst")
    func reload() throws {
        let d = try Daemon(Self.settings(shed: "none"))
        let sender = try d.connect()
        let viewer = try d.connect(receiveBuffer: 4096)
        func burstThenRead() throws -> (texts: Int, gifts: Int, skipped: Int) {
            try Self.sendBurst(sender)
            var texts = 0, gifts = 0, skipped = 0
            while texts + skipped < 300 || gifts < 3, let f = viewer.receiveFrame(timeout: .seconds(5)) {
                switch f.type {
                case Wire.text: texts += 1
                case Wire.gift: gifts += 1
                case 9: skipped += (try? Notice(protobuf: f.body)).flatMap { $0.code == "skipped" ? $0.count : nil }.map(Int.init) ?? 0
                default: break
                }
            }
            return (texts, gifts, skipped)
        }
        let before = try burstThenRead()
        #expect(before == (300, 3, 0), "shed = none: every text, none skipped: \(before)")
        try d.rewriteConfig(Daemon.fullConfig(Self.settings(shed: "text")))
        d.child.kill(SIGHUP)
        #expect(d.stderr.wait(forLineWith: ["configuration reloaded from \(d.configPath)"]))
        let after = try burstThenRead()
        reportFigure("reload none -> text: before \(before), after \(after) (texts, gifts, skipped)")
        #expect(after.skipped > 0 && after.texts + after.skipped == 300 && after.gifts == 3, "shed = text after the reload: \(after)")
        viewer.expectOpen()
    }

    @Test("a JSON viewer that reads nothing while 300 texts and 3 gifts come: then it gets every gift, the texts not shed, and {\"cmd\":\"notice\",\"code\":\"skipped\"} with the rest")
    func jsonViewer() throws {
        let d = try Daemon(Self.settings(shed: "text").merging(["json.listen": "127.0.0.1:0"]) { $1 })
        let viewer = try JSONTestClient(d, receiveBuffer: 4096)
        try viewer.send(["cmd": "nickname", "nickname": "phone", "room": "live"])
        let sender = try d.connect()
        try sender.send(Wire.join(Wire.user("streamer", room: "live")))
        #expect(viewer.receive(timeout: .seconds(3))?["cmd"] as? String == "join", "the viewer is in the room")
        try Self.sendBurst(sender)
        #expect(d.stderr.wait(forLineWith: ["REASON=shedding ", "CLIENT_ADDR=\(viewer.address)"], timeout: .seconds(5)))
        var texts = 0, gifts = 0, skipped = 0, notices = 0
        while texts + skipped < 300 || gifts < 3, let m = viewer.receive(timeout: .seconds(5)) {
            switch m["cmd"] as? String {
            case "msg": texts += 1
            case "gift": gifts += 1
            case "notice" where m["code"] as? String == "skipped":
                notices += 1
                skipped += m["count"] as? Int ?? 0
            default: break
            }
        }
        reportFigure("shed=text, JSON viewer: \(texts) texts received + \(skipped) skipped (\(notices) notices) of 300, \(gifts) of 3 gifts")
        #expect(notices >= 1 && skipped > 0 && texts + skipped == 300 && gifts == 3,
                "\(texts) texts + \(skipped) skipped in \(notices) notices, \(gifts) gifts")
        viewer.connection.expectOpen()
        sender.expectOpen()
    }
}
