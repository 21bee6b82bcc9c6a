// A restart keeps WebSocket clients (docs/protocol/websocket.md §15), in-process as
// HandOverTests does it: clients on both subprotocols are handed over in the
// middle of a fragmented message and of a frame, one in the middle of its
// upgrade request and one owed the rest of a frame; after the hand-over each
// goes on byte-exactly, and the server's pings go on.
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("Hand-over of WebSocket connections (socketpairs, a fake fd store)")
struct HandOverWebSocketTests {
    typealias T = HandOverTests

    static func upgradeRequest(_ subprotocol: String?) -> [UInt8] {
        Array(("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + (subprotocol.map { "Sec-WebSocket-Protocol: \($0)\r\n" } ?? "") + "\r\n").utf8)
    }

    /// Server frames (unmasked) in `bytes`: (opcode, payload), and the bytes after the last whole frame.
    static func serverFrames(_ bytes: [UInt8]) -> (frames: [(UInt8, [UInt8])], rest: Int) {
        var out: [(UInt8, [UInt8])] = []
        var i = 0
        while bytes.count - i >= 2 {
            var n = Int(bytes[i + 1] & 0x7F)
            var h = 2
            if n == 126 {
                guard bytes.count - i >= 4 else { break }
                n = Int(bytes[i + 2]) << 8 | Int(bytes[i + 3])
                h = 4
            } else if n == 127 {
                guard bytes.count - i >= 10 else { break }
                n = (0..<8).reduce(0) { $0 << 8 | Int(bytes[i + 2 + $1]) }
                h = 10
            }
            guard bytes.count - i - h >= n else { break }
            out.append((bytes[i] & 0x0F, Array(bytes[(i + h)..<(i + h + n)])))
            i += h + n
        }
        return (out, bytes.count - i)
    }

    @Test("WebSocket clients on both subprotocols, mid-message and mid-frame, go on byte-exactly after a restart; pings go on")
    func webSocketClientsCarryOver() throws {
        let clock = HandOverTests.ManualClock()
        let sections = T.config + "[websocket]\nlisten = 127.0.0.1:\(try freeLoopbackPort())\n"
        let a = try HandOverTests.Node(sections, clock: clock)
        let x = a.connect()
        let j = a.connect(dialect: .webSocket)  // roomcast.json.v1 (none offered)
        let l = a.connect(dialect: .webSocket)  // roomcast.ltb.v1
        let u = a.connect(dialect: .webSocket)  // still upgrading at the restart
        let w = a.connect(sendBuffer: 4096, dialect: .webSocket)  // reads nothing: owed the rest of a frame
        T.send(j.peer, Self.upgradeRequest(nil))
        T.send(l.peer, Self.upgradeRequest("roomcast.ltb.v1"))
        T.send(w.peer, Self.upgradeRequest("roomcast.ltb.v1"))
        let request = Self.upgradeRequest("roomcast.ltb.v1")
        T.send(u.peer, Array(request[0..<40]))
        try a.tick()
        for c in [j, l, w] { #expect(String(decoding: T.drain(c.peer) ?? [], as: UTF8.self).hasPrefix("HTTP/1.1 101 ")) }
        T.send(x.peer, T.join("xavier", room: "lobby"))
        T.send(j.peer, clientFrame(0x81, Array(#"{"cmd":"nickname","nickname":"jo"}"#.utf8)))
        T.send(l.peer, clientFrame(0x82, T.join("lou", room: "lobby")))
        try a.tick()
        // X's frames to W: more than its 4 KiB socket buffer takes, so part of a frame is written.
        let big = (0..<4).map { i in FrameCodec.encode(type: 100, body: [UInt8](repeating: UInt8(i), count: 9_000), byteOrder: .little) }
        for f in big {
            T.send(x.peer, f)
            try a.tick()
        }
        #expect(a.server.table.fanout.outboxes[w.id].pending > 0, "W owes output")
        // J: a fragmented text message (é split across fragments), its final fragment cut in the middle.
        let content = "héllo"
        let json = Array(#"{"cmd":"msg","content":"\#(content)"}"#.utf8)
        let split = json.firstIndex(of: 0xC3)! + 1
        let final = clientFrame(0x80, Array(json[split...]))
        T.send(j.peer, clientFrame(0x01, Array(json[..<split])) + Array(final[0..<9]))
        // L: one LTB frame in a binary message, cut in its payload.
        let ltbText = FrameCodec.encode(type: 100, body: Array("from lou".utf8), byteOrder: .little)
        let lFrame = clientFrame(0x82, ltbText)
        T.send(l.peer, Array(lFrame[0..<8]))
        try a.tick()
        #expect(a.server.table.slots[j.id]!.webSocket!.decoder.messageOpcode == .text, "J is in the middle of a fragmented message")
        #expect(a.server.table.slots[j.id]!.input == Array(final[0..<9]) && a.server.table.slots[l.id]!.input == Array(lFrame[0..<8]))
        _ = [x, j, l].map { T.drain($0.peer) }
        clock.nowMs += 4_000
        let jDecoder = a.server.table.slots[j.id]!.webSocket!.decoder
        let jHeartbeat = a.server.heartbeats.remaining(j.id, .webSocket, nowMs: clock.nowMs).heartbeat
        let owed = a.server.table.fanout.outboxes[w.id].pending
        let uLeft = a.server.heartbeats.upgradeRemaining(u.id, nowMs: clock.nowMs)
        #expect(uLeft == 1_000, "U's upgrade began 4 s ago: 1 s of its 5 s is left")

        let b = try T.handOver(a, sections: sections)
        let s = b.server
        func id(_ c: (id: Int, peer: Int32)) -> Int { s.table.ids.first { s.table.address(of: $0) == "peer-\(c.peer)" }! }
        #expect(s.table.count == 5, "every connection kept")
        #expect(b.log.contains("restored 5 connections"))
        #expect(s.relay.memberCount(of: "lobby") == 4, "X, J, L and W in the lobby; U joins once upgraded")
        #expect(s.relay.name(of: id(j)) == "jo" && s.relay.name(of: id(l)) == "lou")
        #expect(s.table.slots[id(j)]!.webSocket!.subprotocol == .json && s.table.slots[id(l)]!.webSocket!.subprotocol == .ltb)
        #expect(s.table.slots[id(j)]!.webSocket!.decoder == jDecoder, "J's decoder: the message so far and its UTF-8 state")
        #expect(s.table.slots[id(u)]!.webSocket!.isOpen == false && s.table.slots[id(u)]!.input == Array(request[0..<40]))
        #expect(s.heartbeats.remaining(id(j), .webSocket, nowMs: clock.nowMs).heartbeat == jHeartbeat)
        #expect(s.heartbeats.upgradeRemaining(id(u), nowMs: clock.nowMs) == uLeft, "U's upgrade deadline is as far as when A stopped")
        #expect(s.table.fanout.outboxes[id(w)].pending == owed)

        // J completes its message: X gets it whole, in LTB, and J its JSON form.
        T.send(j.peer, Array(final[9...]))
        try b.tick()
        let xText = T.frames(T.drain(x.peer) ?? []).filter { $0.0 == 2 }
        #expect(xText.count == 1 && xText[0].1.suffix(content.utf8.count).elementsEqual(content.utf8),
                "the message split across the restart arrives whole: \(xText.map(\.1))")
        let jGot = Self.serverFrames(T.drain(j.peer) ?? []).frames
        #expect(jGot.map(\.0) == [1] && String(decoding: jGot.first?.1 ?? [], as: UTF8.self).contains(#""content":"héllo""#))
        // L completes its frame.
        T.send(l.peer, Array(lFrame[8...]))
        try b.tick()
        #expect(T.frames(T.drain(x.peer) ?? []).filter { $0.0 == 100 }.map(\.1) == [Array("from lou".utf8)])
        let lGot = Self.serverFrames(T.drain(l.peer) ?? []).frames
        #expect(lGot.allSatisfy { $0.0 == 2 } && lGot.last?.1 == ltbText, "L's own frame comes back as one binary message: \(lGot.map(\.1.count))")
        // U completes its upgrade and joins the lobby.
        T.send(u.peer, Array(request[40...]))
        try b.tick()
        #expect(String(decoding: T.drain(u.peer) ?? [], as: UTF8.self).hasPrefix("HTTP/1.1 101 "))
        #expect(s.relay.memberCount(of: "lobby") == 5)
        // W gets every frame owed, whole and in order.
        var got: [UInt8] = []
        for _ in 0..<200 {
            got += T.drain(w.peer) ?? []
            try b.tick()
        }
        let wFrames = Self.serverFrames(got)
        let wBig = wFrames.frames.filter { $0.0 == 2 && $0.1.count == big[0].count }
        #expect(wBig.map(\.1) == big, "every frame owed to W arrives once, whole and in order")
        #expect(wFrames.rest == 0)
        // Pings go on: once the interval passes, each upgraded client gets one.
        _ = [j, l, u].map { T.drain($0.peer) }
        clock.nowMs += 25_000
        try b.tick()
        for c in [j, l, u] {
            #expect(Self.serverFrames(T.drain(c.peer) ?? []).frames.contains { $0.0 == 9 }, "a ping after the restart")
        }
        [x, j, l, u, w].forEach { close($0.peer) }
    }

    @Test("with heartbeat.timeout = 0 (no deadline), a restored WebSocket client's messages are relayed: its proof of life has a slot")
    func webSocketClientWithoutHeartbeatDeadline() throws {
        // Was a trap in LivenessTracker.touch: the restored, upgraded
        // connection was tracked only while it had a deadline to carry, so
        // its first message after the restart indexed past the tracker.
        let clock = HandOverTests.ManualClock()
        let sections = "[heartbeat]\ntimeout = 0\ntick = 100ms\n[websocket]\nlisten = 127.0.0.1:\(try freeLoopbackPort())\n"
        let a = try HandOverTests.Node(sections, clock: clock)
        let j = a.connect(dialect: .webSocket)  // roomcast.json.v1, the only client: no LTB one grows the tracker
        T.send(j.peer, Self.upgradeRequest(nil))
        try a.tick()
        #expect(String(decoding: T.drain(j.peer) ?? [], as: UTF8.self).hasPrefix("HTTP/1.1 101 "))
        T.send(j.peer, clientFrame(0x81, Array(#"{"cmd":"nickname","nickname":"jo","room":"stage"}"#.utf8)))
        try a.tick()
        _ = T.drain(j.peer)

        var node = a
        for round in 1...2 {
            node = try T.handOver(node, sections: sections)
            #expect(node.server.table.count == 1, "round \(round): J kept")
            T.send(j.peer, clientFrame(0x81, Array(#"{"cmd":"msg","content":"after \#(round)"}"#.utf8)))
            try node.tick()
            let got = Self.serverFrames(T.drain(j.peer) ?? []).frames
            #expect(got.contains { $0.0 == 1 && String(decoding: $0.1, as: UTF8.self).contains(#""content":"after \#(round)""#) },
                    "round \(round): J's message comes back to it: \(got.map { String(decoding: $0.1, as: UTF8.self) })")
        }
        close(j.peer)
    }
}
