// The JSON chat room on the [json] listener, bridged into the rooms
// of the length-type-body protocol (docs/protocol/json.md §7).
import Foundation
import Glibc
import RoomcastCore
import Testing

/// A client that behaves like the original JSON chat client: a u32 little-endian length, then a
/// pretty-printed JSON object; no heartbeats.
final class JSONTestClient {
    let connection: TestClient
    private var pending: [UInt8] = []
    private var buffer = [UInt8](repeating: 0, count: 64 * 1024)
    var address: String { connection.address }

    /// - Parameter receiveBuffer: for a slow consumer (see `TestClient.init`).
    init(_ daemon: Daemon, receiveBuffer: Int? = nil) throws {
        let port = try #require(daemon.jsonPort, "the daemon has no [json] listener")
        connection = try TestClient(host: daemon.host, port: port, receiveBuffer: receiveBuffer, owner: daemon)
        guard daemon.stderr.wait(for: "client connected CLIENT_ADDR=\(connection.address) ") else {
            throw HarnessError("roomcastd did not log accepting \(connection.address)")
        }
    }

    /// Sends one command the way the original JSON chat client does (pretty-printed).
    func send(_ object: [String: Any]) throws {
        try sendBody(JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]))
    }

    /// Sends any body with its length prefix (for malformed input).
    func sendBody(_ body: some Collection<UInt8>) throws {
        try connection.sendRaw(JSONFrameCodec.encode(body))
    }

    /// The next JSON object from the daemon, or nil on timeout or close.
    func receive(timeout: Duration = .seconds(5)) -> [String: Any]? {
        let deadline = monotonicMs() + Int64(timeout.ms)
        while true {
            if pending.count >= 4 {
                let length = Int(UInt32(pending[0]) | UInt32(pending[1]) << 8 | UInt32(pending[2]) << 16 | UInt32(pending[3]) << 24)
                if pending.count >= 4 + length {
                    let body = Data(pending[4..<4 + length])
                    pending.removeFirst(4 + length)
                    guard let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any] else {
                        Issue.record("daemon sent a body that is not a JSON object: \(String(decoding: body, as: UTF8.self))")
                        return nil
                    }
                    return object
                }
            }
            let left = deadline - monotonicMs()
            if left <= 0 { return nil }
            var p = pollfd(fd: connection.fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, Int32(left)) > 0 else { continue }
            let n = buffer.withUnsafeMutableBytes { recv(connection.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n <= 0 { return nil }
            pending += buffer[0..<n]
        }
    }

    /// Records an issue unless the next object equals `expected` (as strings/numbers).
    func expect(_ expected: [String: Any], sourceLocation: SourceLocation = #_sourceLocation) {
        guard let got = receive() else {
            Issue.record("\(address) received nothing, expected \(expected)", sourceLocation: sourceLocation)
            return
        }
        #expect(Self.canonical(got) == Self.canonical(expected), sourceLocation: sourceLocation)
    }

    /// Values as text, strings quoted, so `"99"` and `99` differ.
    private static func canonical(_ object: [String: Any]) -> [String: String] {
        object.mapValues { ($0 as? String).map { "\"\($0)\"" } ?? "\($0)" }
    }
}

@Suite("JSON listener")
struct JSONIntegrationTests {
    static let settings = ["json.listen": "127.0.0.1:0"]

    @Test("nickname, msg and leave among JSON clients reach everyone including the sender")
    func jsonClientsChat() throws {
        let d = try Daemon(Self.settings)
        let a = try JSONTestClient(d), b = try JSONTestClient(d)
        try a.send(["cmd": "nickname", "nickname": "guest232"])
        for c in [a, b] { c.expect(["cmd": "join", "nickname": "guest232", "addr": a.address]) }
        try b.send(["cmd": "nickname", "nickname": "guest7"])
        for c in [a, b] { c.expect(["cmd": "join", "nickname": "guest7", "addr": b.address]) }
        try a.send(["cmd": "msg", "content": "hello, 世界 \"quoted\" / slash"])
        for c in [a, b] { c.expect(["cmd": "msg", "from": "guest232", "content": "hello, 世界 \"quoted\" / slash"]) }
        try a.send(["cmd": "leave"])
        for c in [a, b] { c.expect(["cmd": "leave", "nickname": "guest232", "addr": a.address]) }
        // After leave, a is in no room but stays connected; a rejoin works.
        try b.send(["cmd": "msg", "content": "gone?"])
        b.expect(["cmd": "msg", "from": "guest7", "content": "gone?"])
        #expect(a.receive(timeout: .milliseconds(300)) == nil)
        a.connection.expectOpen()
        // Disconnect announces the leave, with nickname and address.
        try a.send(["cmd": "nickname", "nickname": "guest232"])
        a.expect(["cmd": "join", "nickname": "guest232", "addr": a.address])
        b.expect(["cmd": "join", "nickname": "guest232", "addr": a.address])
        b.connection.reset()
        a.expect(["cmd": "leave", "nickname": "guest7", "addr": b.address])
        let c = try JSONTestClient(d)
        try c.send(["cmd": "nickname", "nickname": "carol"])
        a.expect(["cmd": "join", "nickname": "carol", "addr": c.address])
        c.connection.hangUp()
        a.expect(["cmd": "leave", "nickname": "carol", "addr": c.address])
    }

    @Test("a conversation crosses dialects both ways: joins, texts, gifts, leaves")
    func crossDialect() throws {
        let d = try Daemon(Self.settings)
        let j = try JSONTestClient(d)
        let ltb = try d.connect()
        let alice = Wire.user("alice")
        // LTB → JSON
        try ltb.send(Wire.join(alice))
        #expect(ltb.receiveFrame()?.wire == Wire.join(alice))
        j.expect(["cmd": "join", "nickname": "alice", "addr": ltb.address])
        try ltb.send(Wire.text(alice, "hi from LTB"))
        j.expect(["cmd": "msg", "from": "alice", "content": "hi from LTB"])
        let gift = Wire.frame(Wire.gift, GiftMessage(user: alice, giftname: "yacht", giftURL: "https://g/y.png", giftcount: 99).serialized())
        try ltb.send(gift)
        j.expect(["cmd": "gift", "from": "alice", "giftname": "yacht", "giftURL": "https://g/y.png", "giftcount": 99])
        #expect(ltb.receiveFrames(2).map(\.wire) == [Wire.text(alice, "hi from LTB"), gift], "LTB echoes are unchanged")
        // Opaque and heartbeat frames have no JSON form.
        try ltb.send(Wire.frame(Wire.opaque, [1, 2, 3]))
        try ltb.send(Wire.frame(Wire.heartbeat, []))
        // JSON → LTB: the user is the nickname with level 0 and an empty icon URL.
        let guest = UserInfo(level: 0, name: "guest232", iconURL: "")
        try j.send(["cmd": "nickname", "nickname": "guest232"])
        #expect(j.receive()?["cmd"] as? String == "join", "opaque/heartbeat frames never reach JSON clients")
        #expect(ltb.receiveFrames(2).map(\.wire) == [Wire.frame(Wire.opaque, [1, 2, 3]), Wire.join(guest)])
        try j.send(["cmd": "msg", "content": "hi from JSON"])
        #expect(ltb.receiveFrame()?.wire == Wire.text(guest, "hi from JSON"))
        j.expect(["cmd": "msg", "from": "guest232", "content": "hi from JSON"])
        // Leaves cross too: a JSON leave reaches LTB as a leave frame, an LTB
        // disconnect reaches JSON as a leave object.
        try j.send(["cmd": "leave"])
        #expect(ltb.receiveFrame()?.wire == Wire.leave(guest))
        j.expect(["cmd": "leave", "nickname": "guest232", "addr": j.address])
        try j.send(["cmd": "nickname", "nickname": "guest232"])
        #expect(ltb.receiveFrame()?.wire == Wire.join(guest))
        j.expect(["cmd": "join", "nickname": "guest232", "addr": j.address])
        ltb.reset()
        j.expect(["cmd": "leave", "nickname": "alice", "addr": ltb.address])
    }

    @Test("malformed JSON is dropped and logged; repeat offenders are disconnected")
    func malformedJSON() throws {
        let d = try Daemon(Self.settings.merging(["protocol.max_violations": "3"]) { $1 })
        let bad = try JSONTestClient(d), good = try JSONTestClient(d)
        try bad.sendBody(Array("{not json".utf8))
        try bad.sendBody(Array("[1, 2, 3]".utf8))
        try bad.send(["cmd": "msg", "content": 5])
        #expect(good.receive(timeout: .milliseconds(300)) == nil, "nothing malformed is relayed")
        bad.connection.expectClosed(within: .seconds(2), "after 3 violations")
        #expect(d.stderr.line(with: ["WARNING", bad.address, "not a JSON object"]) != nil)
        #expect(d.stderr.line(with: ["WARNING", bad.address, "'content' is not a string"]) != nil)
        // Unknown commands are ignored, not violations; one bad frame is not fatal.
        let once = try JSONTestClient(d)
        try once.send(["cmd": "dance"])
        try once.send(["nickname": "no cmd"])
        try once.send(["cmd": "nickname", "nickname": "ok"])
        once.expect(["cmd": "join", "nickname": "ok", "addr": once.address])
        good.expect(["cmd": "join", "nickname": "ok", "addr": once.address])
    }

    @Test("a hostile length closes only its sender")
    func hostileLength() throws {
        let d = try Daemon(Self.settings.merging(["json.max_frame_bytes": "1K"]) { $1 })
        let hostile = try JSONTestClient(d), peer = try JSONTestClient(d), ltb = try d.connect()
        try hostile.connection.sendRaw(Array("GET / HTTP/1.1\r\n".utf8))  // claims ~542 MB
        hostile.connection.expectClosed(within: .seconds(2))
        #expect(d.stderr.wait(forLineWith: ["WARNING", hostile.address, "542393671"]))
        try peer.send(["cmd": "nickname", "nickname": "still here"])
        peer.expect(["cmd": "join", "nickname": "still here", "addr": peer.address])
        #expect(ltb.receiveFrame()?.wire == Wire.join(UserInfo(level: 0, name: "still here", iconURL: "")))
        // Exactly at the limit passes the framing (an unknown command: ignored).
        func padded(_ prefix: String) -> [UInt8] {
            let head = Array(prefix.utf8)
            return head + [UInt8](repeating: UInt8(ascii: "x"), count: 1024 - head.count - 2) + Array("\"}".utf8)
        }
        try peer.sendBody(padded(#"{"cmd":"dance","pad":""#))
        // A msg at the limit too, but its broadcast, with "from":"still here"
        // added (20 bytes), is over it: dropped with the reason, for everyone alike.
        try peer.sendBody(padded(#"{"cmd":"msg","content":""#))
        #expect(d.stderr.wait(forLineWith: ["WARNING", peer.address, "its JSON broadcast would be 1044 bytes, over json.max_frame_bytes (1K)",
                                            "REASON=frame_too_large"]))
        try peer.send(["cmd": "msg", "content": "fits"])
        #expect(ltb.receiveFrame()?.wire == Wire.text(UserInfo(level: 0, name: "still here", iconURL: ""), "fits"))
        peer.expect(["cmd": "msg", "from": "still here", "content": "fits"])
    }

    @Test("frames made for the other dialect stay within its max_frame_bytes; too large ones are dropped and logged")
    func bridgedFramesRespectLimits() throws {
        let d = try Daemon(Self.settings.merging(["protocol.max_frame_bytes": "1K", "json.max_frame_bytes": "1K"]) { $1 })
        let j = try JSONTestClient(d), other = try JSONTestClient(d)
        let ltb = try d.connect()
        // JSON → LTB: a 600-byte nickname and a 600-byte message each fit in
        // a JSON frame, but their text frame would be over 1K for LTB clients.
        let nick = String(repeating: "n", count: 600)
        try j.send(["cmd": "nickname", "nickname": nick])
        #expect(ltb.receiveFrame()?.wire == Wire.join(UserInfo(level: 0, name: nick, iconURL: "")))
        let content = String(repeating: "c", count: 600)
        try j.send(["cmd": "msg", "content": content])
        let bridged = ChatMessage(user: UserInfo(level: 0, name: nick, iconURL: ""), text: content).serialized().count
        #expect(d.stderr.wait(forLineWith: ["WARNING", j.address, "would be \(bridged) bytes, over protocol.max_frame_bytes (1K)",
                                            "REASON=frame_too_large"]))
        #expect(ltb.receiveFrame(timeout: .milliseconds(300)) == nil, "LTB clients never get a frame over their limit")
        // LTB → JSON: 300 control characters are 1,800 bytes of JSON escapes.
        let alice = Wire.user("alice")
        try ltb.send(Wire.text(alice, String(repeating: "\u{1}", count: 300)))
        #expect(d.stderr.wait(forLineWith: ["WARNING", ltb.address, "over json.max_frame_bytes (1K)", "REASON=frame_over_json_limit"]))
        try ltb.send(Wire.text(alice, "short"))
        for c in [j, other] {
            c.expect(["cmd": "join", "nickname": nick, "addr": j.address])
            c.expect(["cmd": "msg", "from": "alice", "content": "short"])
        }
        j.connection.expectOpen()
    }

    @Test("a JSON frame must complete within heartbeat.timeout of its first byte; silence alone never evicts")
    func partialFrameTimeout() throws {
        let d = try Daemon(Self.settings.merging(["heartbeat.timeout": "1s"]) { $1 })
        let quiet = try JSONTestClient(d), stuck = try JSONTestClient(d), trickle = try JSONTestClient(d)
        try stuck.connection.sendRaw([40, 0])  // two bytes of a header, then nothing
        // One byte every 200 ms for up to 4 s: progress, but the frame is not
        // done within 1 s of its first byte. (Were the clock restarted by
        // each byte, the close would come only 1 s after the last one.)
        let frame = JSONFrameCodec.encode(Array(#"{"cmd":"nickname","nickname":"a-slow-typist"}"#.utf8))
        let start = monotonicMs()
        var closedAfterMs: Int64?
        for byte in frame.prefix(20) {
            let sent = (try? trickle.connection.sendRaw([byte])) != nil
            if !sent || trickle.connection.isClosed(within: .milliseconds(200)) {
                closedAfterMs = monotonicMs() - start
                break
            }
        }
        let closed = try #require(closedAfterMs, "the trickling client was not closed within 4 s")
        #expect(closed >= 1_000 && closed < 2_500, "closed \(closed) ms after its first byte (timeout 1 s)")
        stuck.connection.expectClosed(within: .seconds(1))
        #expect(d.stderr.wait(forLineWith: ["evicting \(stuck.address)", "a JSON frame incomplete for 1s"]))
        // A client that completes its frames, or says nothing at all, stays.
        try quiet.send(["cmd": "nickname", "nickname": "q"])
        quiet.expect(["cmd": "join", "nickname": "q", "addr": quiet.address])
        pause(.milliseconds(1_500))
        quiet.connection.expectOpen()
    }

    @Test("socket activation hands over the JSON listener by FileDescriptorName=json")
    func socketActivationJSON() throws {
        let ltbPort = try freeLoopbackPort(), jsonPort = try freeLoopbackPort()
        let d = try Daemon([:], socketActivation: [("ltb", ltbPort), ("json", jsonPort)])
        #expect(d.stderr.wait(for: "Listening on 127.0.0.1:\(jsonPort)"), "systemd-socket-activate: \(d.stderr.current)")
        let j = try TestClient(host: "127.0.0.1", port: jsonPort, owner: d)
        try j.sendRaw(JSONFrameCodec.encode(Array(#"{"cmd":"nickname","nickname":"sa"}"#.utf8)))
        var reply = [UInt8](repeating: 0, count: 256)
        var p = pollfd(fd: j.fd, events: Int16(POLLIN), revents: 0)
        #expect(poll(&p, 1, 5000) == 1)
        let n = reply.withUnsafeMutableBytes { recv(j.fd, $0.baseAddress, $0.count, 0) }
        #expect(n > 4 && String(decoding: reply[4..<max(4, n)], as: UTF8.self).contains(#""nickname":"sa""#))
        #expect(d.stderr.wait(forLineWith: ["listening on 127.0.0.1:\(jsonPort) (json)"]))
    }
}
