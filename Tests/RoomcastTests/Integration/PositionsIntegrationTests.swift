// Positions and resume against real roomcastd processes (docs/protocol/positions.md
// §4): a viewer whose connection is reset while lines are sent rejoins with
// its position and gets each line exactly once; one away longer than the
// history holds gets `history_lost`; JSON clients get positions as keys;
// across two daemons each numbers the room's frames itself.
import Foundation
import Testing
@testable import RoomcastCore

/// A client's position as docs/protocol/positions.md §4 tells a client to keep it:
/// a notice with a position sets it (the `count` frames after a `history`
/// notice are already in its seq), every other text or gift frame adds one.
struct PositionTracker {
    var position: RoomPosition?
    private var replayed = 0
    /// The texts received, in order (replayed ones included).
    var texts: [String] = []

    mutating func take(_ f: Frame) throws {
        switch f.type {
        case Wire.notice:
            let n = try Notice(protobuf: f.body)
            if let p = n.position { position = p }
            if n.code == "history" { replayed = Int(n.count ?? 0) }
        case Wire.text, Wire.gift:
            if f.type == Wire.text { texts.append(try ChatMessage(protobuf: f.body).text) }
            if replayed > 0 { replayed -= 1 } else { position?.seq += 1 }
        default:
            break
        }
    }
}

@Suite("Positions and resume (real roomcastd)")
struct PositionsIntegrationTests {
    static func join(_ name: String, room: String = "live", positions: Bool = true, since: RoomPosition? = nil) -> [UInt8] {
        var u = Wire.user(name, room: room)
        u.positions = positions
        u.since = since
        return Wire.join(u)
    }

    /// Reads until `done` holds or 10 s pass, feeding `tracker`.
    static func read(_ c: TestClient, _ tracker: inout PositionTracker, until done: (PositionTracker) -> Bool) throws {
        let deadline = monotonicMs() + 10_000
        while !done(tracker), monotonicMs() < deadline, let f = c.receiveFrame(timeout: .seconds(2)) { try tracker.take(f) }
    }

    @Test("a connection reset while 100 lines are sent: the rejoin with its position gets all 100 exactly once; away too long: history_lost")
    func resetAndResume() throws {
        let d = try Daemon(["rooms.history": "100"])
        let streamer = try d.connect()
        let su = Wire.user("streamer", room: "live")
        try streamer.send(Wire.join(su))
        _ = streamer.receiveFrames(2)  // its join echo, the notice history (0)

        let viewer = try d.connect()
        try viewer.send(Self.join("viewer"))
        var v = PositionTracker()
        try Self.read(viewer, &v) { $0.position != nil }
        let epoch = try #require(v.position?.epoch)
        #expect(v.position == RoomPosition(epoch: epoch, seq: 0))

        let lines = (0..<100).map { "line \($0)" }
        for l in lines[..<40] { try streamer.send(Wire.text(su, l)) }
        try Self.read(viewer, &v) { $0.texts.count >= 20 }
        viewer.reset()  // the lines still in flight to it are lost with the connection
        for l in lines[40...] { try streamer.send(Wire.text(su, l)) }
        #expect(streamer.receiveFrames(100, timeout: .seconds(10)).count == 100, "the streamer's echoes: every line relayed")
        let before = v.texts.count
        let held = try #require(v.position)

        let back = try d.connect()
        try back.send(Self.join("viewer", since: held))
        #expect(back.receiveFrame()?.wire == Wire.join(Wire.user("viewer", room: "live")), "the join echo, without fields 6-8")
        let notice = try Notice(protobuf: try #require(back.receiveFrame()).body)
        #expect(notice.code == "history" && notice.count == Int64(100 - held.seq))
        #expect(notice.position == RoomPosition(epoch: epoch, seq: 100))
        var resumed = PositionTracker()
        resumed.texts = v.texts
        for f in back.receiveFrames(Int(notice.count ?? 0)) { resumed.texts.append(try ChatMessage(protobuf: f.body).text) }
        let exactlyOnce = resumed.texts == lines
        #expect(exactlyOnce, "\(before) lines before the reset (position \(held.seq)), \(resumed.texts.count - before) after; all 100 once, in order")
        print("positions: reset after \(before) of 100 lines (position \(held.seq)); the rejoin got \(notice.count ?? -1): \(resumed.texts.count) lines, \(Set(resumed.texts).count) distinct")
        #expect(try Notice(protobuf: try #require(back.receiveFrame()).body).code == "position")

        // Away while 150 more lines pass (more than the 100 held): history_lost, then the 100 held.
        back.reset()
        for i in 0..<150 { try streamer.send(Wire.text(su, "later \(i)")) }
        #expect(streamer.receiveFrames(150, timeout: .seconds(10)).count == 150)
        let late = try d.connect()
        try late.send(Self.join("viewer", positions: false, since: RoomPosition(epoch: epoch, seq: 100)))
        _ = late.receiveFrame()
        let lost = try Notice(protobuf: try #require(late.receiveFrame()).body)
        #expect(lost == Notice(code: "history_lost", position: RoomPosition(epoch: epoch, seq: 250)))
        let reload = try Notice(protobuf: try #require(late.receiveFrame()).body)
        #expect(reload.code == "history" && reload.count == 100)
        let texts = try late.receiveFrames(100).map { try ChatMessage(protobuf: $0.body).text }
        #expect(texts == (50..<150).map { "later \($0)" })
        late.expectNoFrame(within: .milliseconds(200), "no position notice: it did not ask")
    }

    @Test("JSON: nickname with positions and since; notices carry epoch and seq keys")
    func json() throws {
        let d = try Daemon(["rooms.history": "10", "json.listen": "127.0.0.1:0"])
        let a = try JSONTestClient(d)
        try a.send(["cmd": "nickname", "nickname": "web", "room": "live", "positions": true])
        var got: [[String: Any]] = []
        while got.count < 3, let m = a.receive() { got.append(m) }
        #expect(got.map { $0["code"] as? String } == [nil, "history", "position"])
        let epoch = try #require(got[2]["epoch"] as? String)
        #expect(epoch.count == 16 && got[2]["seq"] as? Int == 0)
        for i in 0..<3 { try a.send(["cmd": "msg", "content": "m\(i)"]) }
        // The three lines may be read in one loop pass or more: a position
        // notice follows each pass, the last one at seq 3.
        var seen: [[String: Any]] = []
        while !(seen.last?["code"] as? String == "position" && seen.last?["seq"] as? Int == 3), seen.count < 8, let m = a.receive() { seen.append(m) }
        #expect(seen.last?["code"] as? String == "position" && seen.last?["seq"] as? Int == 3 && seen.last?["epoch"] as? String == epoch, "\(seen)")
        #expect(seen.compactMap { $0["content"] as? String } == ["m0", "m1", "m2"])

        let b = try JSONTestClient(d)
        try b.send(["cmd": "nickname", "nickname": "web2", "room": "live", "since": ["epoch": epoch, "seq": 1]])
        var r: [[String: Any]] = []
        while r.count < 4, let m = b.receive() { r.append(m) }
        #expect(r.count == 4 && r[1]["code"] as? String == "history" && r[1]["count"] as? Int == 2 && r[1]["seq"] as? Int == 3)
        #expect(r.dropFirst(2).map { $0["content"] as? String } == ["m1", "m2"])
        try b.send(["cmd": "nickname", "nickname": "web3", "room": "live", "since": ["seq": 1]])
        #expect(d.stderr.wait(for: "missing 'epoch'", timeout: .seconds(5)), "since without its epoch is a malformed command")
    }

    @Test("across two daemons: each numbers the room's frames, the other daemon's too; a resume on the same daemon is exact, on another history_lost")
    func acrossDaemons() throws {
        let redis = try RedisServer()
        let a = try clusterDaemon(redis, name: "pos", ["rooms.history": "50"])
        let b = try clusterDaemon(redis, name: "pos", ["rooms.history": "50"])
        let watcher = try b.connect()
        try watcher.send(Self.join("watcher", positions: false))
        _ = watcher.receiveFrames(2)
        let viewer = try b.connect()
        try viewer.send(Self.join("viewer"))
        var v = PositionTracker()
        try Self.read(viewer, &v) { $0.position != nil }
        _ = watcher.receiveFrame()  // the viewer's join
        let streamer = try a.connect()
        let su = Wire.user("streamer", room: "live")
        try streamer.send(Wire.join(su))
        _ = streamer.receiveFrames(2)
        #expect(redis.waitForSubscribers("roomcast:pos:room:live", 2))
        _ = watcher.receiveFrame()  // the streamer's join, from daemon A

        for i in 0..<10 { try streamer.send(Wire.text(su, "a\(i)")) }
        #expect(watcher.receiveFrames(10, timeout: .seconds(10)).count == 10)
        try Self.read(viewer, &v) { $0.texts.count == 10 && $0.position?.seq == 10 }
        #expect(v.position?.seq == 10, "daemon B numbered daemon A's frames")
        viewer.reset()
        for i in 10..<20 { try streamer.send(Wire.text(su, "a\(i)")) }
        #expect(watcher.receiveFrames(10, timeout: .seconds(10)).count == 10, "daemon B relayed the next 10")

        let back = try b.connect()
        try back.send(Self.join("viewer", since: v.position))
        _ = back.receiveFrame()
        let n = try Notice(protobuf: try #require(back.receiveFrame()).body)
        #expect(n.code == "history" && n.count == 10 && n.position == RoomPosition(epoch: v.position!.epoch, seq: 20))
        #expect(try back.receiveFrames(10).map { try ChatMessage(protobuf: $0.body).text } == (10..<20).map { "a\($0)" })

        let elsewhere = try a.connect()
        try elsewhere.send(Self.join("viewer", since: RoomPosition(epoch: v.position!.epoch, seq: 20)))
        _ = elsewhere.receiveFrame()
        let lost = try Notice(protobuf: try #require(elsewhere.receiveFrame()).body)
        #expect(lost.code == "history_lost" && lost.position?.epoch != v.position?.epoch && lost.position?.seq == 20,
                "daemon A numbered the same 20 frames under its own epoch")
    }
}
