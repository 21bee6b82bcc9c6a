// The crash path keeps WebSocket clients (docs/protocol/websocket.md §15, "Restarts"),
// in-process with the fake fd store of HandOverTests: no hand-over, only what
// the live box and log held when the process died. Clients on both
// subprotocols, one in the middle of a fragmented message and of a frame,
// one in the middle of its upgrade request and one whose 101 answer was
// queued but never written, go on byte-exactly in the next process.
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("Crash path: WebSocket connections (live box and log)")
struct CrashWebSocketTests {
    typealias T = HandOverTests
    typealias W = HandOverWebSocketTests

    static func crash(_ node: T.Node, _ sections: String) throws -> T.Node {
        node.notify.update()
        return try T.Node(sections, clock: node.clock, stored: node.notify.passed)
    }

    @Test("after a crash, WebSocket clients on both subprotocols go on mid-message, mid-frame and mid-upgrade; fragments are appended to the log")
    func webSocketClientsSurviveACrash() throws {
        let clock = T.ManualClock()
        let sections = T.config + "[websocket]\nlisten = 127.0.0.1:\(try freeLoopbackPort())\n"
        let a = try T.Node(sections, clock: clock)
        #expect(a.server.live != nil)
        let x = a.connect()
        let j = a.connect(dialect: .webSocket)  // roomcast.json.v1 (none offered)
        let l = a.connect(dialect: .webSocket)  // roomcast.ltb.v1
        let u = a.connect(dialect: .webSocket)  // still upgrading at the crash
        T.send(j.peer, W.upgradeRequest(nil))
        T.send(l.peer, W.upgradeRequest("roomcast.ltb.v1"))
        let request = W.upgradeRequest("roomcast.ltb.v1")
        T.send(u.peer, Array(request[0..<40]))
        try a.tick()
        for c in [j, l] { #expect(String(decoding: T.drain(c.peer) ?? [], as: UTF8.self).hasPrefix("HTTP/1.1 101 ")) }
        T.send(x.peer, T.join("xavier", room: "lobby"))
        T.send(j.peer, clientFrame(0x81, Array(#"{"cmd":"nickname","nickname":"jo","room":"lobby"}"#.utf8)))
        T.send(l.peer, clientFrame(0x82, T.join("lou", room: "lobby")))
        try a.tick()
        _ = [x, j, l].map { T.drain($0.peer) }

        // J: a text message in three fragments over three reads (é split
        // across the first two), its final fragment cut in the middle.
        let content = "héllo wörld"
        let json = Array(#"{"cmd":"msg","content":"\#(content)"}"#.utf8)
        let split = json.firstIndex(of: 0xC3)! + 1
        let second = json.lastIndex(of: 0xC3)! + 1
        let final = clientFrame(0x80, Array(json[second...]))
        let committedBefore = a.server.live!.committed
        T.send(j.peer, clientFrame(0x01, Array(json[..<split])))
        try a.tick()
        T.send(j.peer, clientFrame(0x00, Array(json[split..<second])))
        try a.tick()
        T.send(j.peer, Array(final[0..<9]))
        try a.tick()
        // L: one LTB frame in a binary message, cut in its payload.
        let ltbText = FrameCodec.encode(type: 100, body: Array("from lou".utf8), byteOrder: .little)
        let lFrame = clientFrame(0x82, ltbText)
        T.send(l.peer, Array(lFrame[0..<8]))
        try a.tick()
        #expect(a.server.table.slots[j.id]!.webSocket!.decoder.messageOpcode == .text, "J is in the middle of a fragmented message")
        // Appends only: the fragments' payload and the partial frames, plus record headers, never the message again.
        let logBytes = a.server.live!.committed - committedBefore
        #expect(logBytes < second + 9 + 8 + 4 * 40, "\(logBytes) bytes logged for \(second) bytes of fragments and 17 of partial frames")
        let jDecoder = a.server.table.slots[j.id]!.webSocket!.decoder.carried
        let logged = try CrashLogTests.liveLog(a)[a.server.live!.slot(j.id).serial]
        #expect(logged?.webSocket?.decoder.message == jDecoder.message && logged?.webSocket?.decoder.utf8 == jDecoder.utf8)
        #expect(logged?.input == Array(final[0..<9]))

        // V: upgraded in the last iteration before the crash, its 101 answer queued, not written.
        let v = a.connect(dialect: .webSocket)
        let vRequest = W.upgradeRequest("roomcast.ltb.v1")
        a.server.scratch.withUnsafeMutableBytes { out in vRequest.withUnsafeBytes { out.copyMemory(from: $0) } }
        a.server.consume(v.id, count: vRequest.count)  // as if read; the iteration's flush never ran
        #expect(a.server.table.slots[v.id]!.webSocket!.isOpen && a.server.table.fanout.outboxes[v.id].queue.count > 0)
        a.server.liveEndOfIteration()  // V into the live box, as every iteration ends

        let b = try Self.crash(a, sections)
        let s = b.server
        func id(_ c: (id: Int, peer: Int32)) -> Int { s.table.ids.first { s.table.address(of: $0) == "peer-\(c.peer)" }! }
        #expect(s.table.count == 5, "every connection kept: \(b.log)")
        #expect(b.log.contains("restored 5 connections") && s.handOver.startedFrom == "crash")
        #expect(s.relay.memberCount(of: "lobby") == 4, "X, J, L and V in the lobby, the default room (U joins once upgraded)")
        #expect(s.relay.name(of: id(j)) == "jo" && s.relay.name(of: id(l)) == "lou")
        #expect(s.table.slots[id(j)]!.webSocket!.subprotocol == .json && s.table.slots[id(l)]!.webSocket!.subprotocol == .ltb)
        #expect(s.table.slots[id(j)]!.webSocket!.decoder.carried.message == jDecoder.message, "J's message so far")
        #expect(s.table.slots[id(u)]!.webSocket!.isOpen == false && s.table.slots[id(u)]!.input == Array(request[0..<40]))

        // V gets its 101 answer, once, before anything else.
        try b.tick()
        #expect(String(decoding: T.drain(v.peer) ?? [], as: UTF8.self).hasPrefix("HTTP/1.1 101 "), "the 101 answer owed at the crash")
        // J completes its message: X gets it whole, in LTB, and J its JSON form.
        T.send(j.peer, Array(final[9...]))
        try b.tick()
        let xText = T.frames(T.drain(x.peer) ?? []).filter { $0.0 == 2 }
        #expect(xText.count == 1 && xText[0].1.suffix(content.utf8.count).elementsEqual(content.utf8),
                "the message split across the crash arrives whole: \(xText.map(\.1))")
        let jGot = W.serverFrames(T.drain(j.peer) ?? []).frames
        #expect(jGot.filter { $0.0 == 1 }.contains { String(decoding: $0.1, as: UTF8.self).contains(#""content":"\#(content)""#) },
                "J gets its message's JSON form: \(jGot.map { String(decoding: $0.1, as: UTF8.self) })")
        // Under its nickname, as before the crash (it was sent as "" once, and the browser showed ": text").
        #expect(jGot.filter { $0.0 == 1 }.contains { String(decoding: $0.1, as: UTF8.self).contains(#""from":"jo""#) },
                "J's message is from jo: \(jGot.map { String(decoding: $0.1, as: UTF8.self) })")
        #expect((try? ChatMessage(protobuf: xText.first?.1 ?? []))?.user.name == "jo", "X sees jo's name on the text")
        // L completes its frame.
        T.send(l.peer, Array(lFrame[8...]))
        try b.tick()
        #expect(T.frames(T.drain(x.peer) ?? []).filter { $0.0 == 100 }.map(\.1) == [Array("from lou".utf8)])
        let lGot = W.serverFrames(T.drain(l.peer) ?? []).frames
        #expect(lGot.last?.1 == ltbText, "L's own frame comes back as one binary message")
        // U completes its upgrade.
        T.send(u.peer, Array(request[40...]))
        try b.tick()
        #expect(String(decoding: T.drain(u.peer) ?? [], as: UTF8.self).hasPrefix("HTTP/1.1 101 "))
        // V converses.
        T.send(v.peer, clientFrame(0x82, FrameCodec.encode(type: 100, body: Array("vee".utf8), byteOrder: .little)))
        try b.tick()
        #expect(W.serverFrames(T.drain(v.peer) ?? []).frames.last?.1 == FrameCodec.encode(type: 100, body: Array("vee".utf8), byteOrder: .little))
    }
}
