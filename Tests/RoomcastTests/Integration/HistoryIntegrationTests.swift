// Recent lines on join against a real roomcastd ([rooms] history,
// docs/protocol/positions.md §4): an LTB client joining after 200 lines gets its join
// echo, the notice `history` (50) and the last 50 byte-identical, then live;
// a JSON client gets the same lines in its own form.
import Foundation
import Testing
@testable import RoomcastCore

@Suite("Recent lines on join (real roomcastd)")
struct HistoryIntegrationTests {
    @Test("history = 50: a join after 200 lines gets the last 50 in order, then live; LTB byte-identical, JSON in its form")
    func joinAfter200Lines() throws {
        let d = try Daemon(["rooms.history": "50", "json.listen": "127.0.0.1:0"])
        let streamer = try d.connect()
        let su = Wire.user("streamer", room: "live")
        try streamer.send(Wire.join(su))
        #expect(streamer.receiveFrame()?.wire == Wire.join(su))
        let first = try #require(streamer.receiveFrame())
        #expect((try? Notice(protobuf: first.body)).map { [$0.code: $0.count] } == ["history": 0], "the room was empty")
        let lines = (0..<200).map { Wire.text(su, "line \($0)") }
        for f in lines { try streamer.send(f) }
        let echoes = streamer.receiveFrames(200, timeout: .seconds(20)).map(\.wire)
        let echoed = echoes == lines  // a Bool: a mismatch would print 200 frames
        #expect(echoed, "the streamer's 200 echoes (\(echoes.count))")

        let viewer = try d.connect()
        let vu = Wire.user("viewer", room: "live")
        try viewer.send(Wire.join(vu))
        #expect(viewer.receiveFrame()?.wire == Wire.join(vu), "the join echo first")
        let notice = try #require(viewer.receiveFrame())
        #expect(notice.type == 9 && (try? Notice(protobuf: notice.body)).map { [$0.code: $0.count] } == ["history": 50])
        let replayed = viewer.receiveFrames(50).map(\.wire)
        let last50 = replayed == Array(lines[150...])
        #expect(last50, "the last 50, oldest first, byte-identical (\(replayed.count) frames)")
        try streamer.send(Wire.text(su, "live"))
        #expect(viewer.receiveFrame()?.wire == Wire.text(su, "live"), "then live")

        let json = try JSONTestClient(d)
        try json.send(["cmd": "nickname", "nickname": "web", "room": "live"])
        var got: [[String: Any]] = []
        while got.count < 53, let m = json.receive() { got.append(m) }
        #expect(got.first?["cmd"] as? String == "join", "its join echo")
        #expect(got.count > 1 && got[1]["cmd"] as? String == "notice" && got[1]["code"] as? String == "history")
        let texts = got.dropFirst(2).filter { $0["cmd"] as? String == "msg" }.compactMap { $0["content"] as? String }
        #expect(texts == (151..<200).map { "line \($0)" } + ["live"], "the last 50 the room heard, as JSON msg: \(texts.suffix(3))")
    }
}
