// The [websocket] listener (docs/protocol/websocket.md §15, RFC 6455) with the real
// daemon: a raw-socket client written here (it masks its frames, as RFC
// 6455 §5.3 requires of clients) talks with LTB and JSON clients in one room.
import Foundation
import Glibc
import RoomcastCore
import Testing

/// A WebSocket client on a plain socket: the upgrade request, masked frames
/// out, unmasked frames in. Nothing from the daemon's code is used to frame.
final class WebSocketTestClient {
    let connection: TestClient
    private var pending: [UInt8] = []
    private var buffer = [UInt8](repeating: 0, count: 64 * 1024)
    /// The head of the daemon's HTTP answer (status line and headers).
    private(set) var answer = ""
    var address: String { connection.address }

    /// Connects and waits until the daemon logged the accept; sends nothing.
    /// `receiveBuffer`: for a slow consumer (`TestClient.init`).
    init(_ daemon: Daemon, receiveBuffer: Int? = nil) throws {
        let port = try #require(daemon.webSocketPort, "the daemon has no [websocket] listener")
        connection = try TestClient(host: daemon.host, port: port, receiveBuffer: receiveBuffer, owner: daemon)
        guard daemon.stderr.wait(for: "client connected CLIENT_ADDR=\(connection.address) ") else {
            throw HarnessError("roomcastd did not log accepting \(connection.address)")
        }
    }

    /// A fresh client that upgraded to `path`, offering `subprotocol` (nil: none).
    /// - Throws: when the answer is not 101.
    static func open(_ daemon: Daemon, path: String = "/", subprotocol: String? = "roomcast.json.v1",
                     receiveBuffer: Int? = nil) throws -> WebSocketTestClient {
        let c = try WebSocketTestClient(daemon, receiveBuffer: receiveBuffer)
        var extra: [String] = []
        if let subprotocol { extra.append("Sec-WebSocket-Protocol: \(subprotocol)") }
        try c.sendRequest(path: path, extra: extra)
        let head = try #require(c.readAnswer(), "no HTTP answer")
        guard head.hasPrefix("HTTP/1.1 101 ") else { throw HarnessError("upgrade refused: \(head)") }
        return c
    }

    /// The RFC 6455 §1.3 example key; its accept value is `s3pPLMBiTxaQ9kYGzzhZRbK+xOo=`.
    static let key = "dGhlIHNhbXBsZSBub25jZQ=="

    func sendRequest(path: String = "/", extra: [String] = [], version: String = "13") throws {
        var lines = ["GET \(path) HTTP/1.1", "Host: 127.0.0.1", "Upgrade: websocket", "Connection: Upgrade",
                     "Sec-WebSocket-Key: \(Self.key)", "Sec-WebSocket-Version: \(version)"]
        lines += extra
        try connection.sendRaw(Array((lines.joined(separator: "\r\n") + "\r\n\r\n").utf8))
    }

    /// The HTTP answer's head (up to the empty line), or nil on timeout or close.
    func readAnswer(timeout: Duration = .seconds(5)) -> String? {
        let deadline = monotonicMs() + Int64(timeout.ms)
        while true {
            if let end = pending.indices.dropLast(3).first(where: { pending[$0..<$0 + 4].elementsEqual([13, 10, 13, 10]) }) {
                answer = String(decoding: pending[0..<end], as: UTF8.self)
                pending.removeFirst(end + 4)
                return answer
            }
            guard fill(until: deadline) else { return nil }
        }
    }

    /// Reads more bytes; false on timeout or close.
    private func fill(until deadline: Int64) -> Bool {
        let left = deadline - monotonicMs()
        if left <= 0 { return false }
        var p = pollfd(fd: connection.fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, Int32(left)) > 0 else { return false }
        let n = buffer.withUnsafeMutableBytes { recv(connection.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n <= 0 { return false }
        pending += buffer[0..<n]
        return true
    }

    /// One client frame: FIN as given, the opcode, masked with a fixed key
    /// unless `masked` is false (for the 1002 case).
    static func frame(_ opcode: UInt8, _ payload: [UInt8], fin: Bool = true, masked: Bool = true) -> [UInt8] {
        var out: [UInt8] = [(fin ? 0x80 : 0) | opcode]
        let m: UInt8 = masked ? 0x80 : 0
        if payload.count < 126 {
            out.append(m | UInt8(payload.count))
        } else if payload.count <= 0xFFFF {
            out += [m | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        } else {
            out.append(m | 127)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((payload.count >> shift) & 0xFF)) }
        }
        guard masked else { return out + payload }
        let key: [UInt8] = [0x37, 0xFA, 0x21, 0x3D]
        out += key
        for (i, b) in payload.enumerated() { out.append(b ^ key[i % 4]) }
        return out
    }

    func sendText(_ text: String) throws { try connection.sendRaw(Self.frame(0x1, Array(text.utf8))) }
    func sendBinary(_ bytes: [UInt8]) throws { try connection.sendRaw(Self.frame(0x2, bytes)) }
    func sendJSON(_ object: [String: Any]) throws {
        try sendText(String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self))
    }

    /// The next frame from the daemon (opcode, payload), or nil on timeout or close.
    /// Checks that server frames are unmasked and final (the daemon never fragments).
    func receive(timeout: Duration = .seconds(5)) -> (opcode: UInt8, payload: [UInt8])? {
        let deadline = monotonicMs() + Int64(timeout.ms)
        while true {
            if pending.count >= 2 {
                #expect(pending[0] & 0x80 != 0, "a server frame is not final")
                #expect(pending[1] & 0x80 == 0, "a server frame is masked")
                var length = Int(pending[1] & 0x7F)
                var header = 2
                if length == 126, pending.count >= 4 { length = Int(pending[2]) << 8 | Int(pending[3]); header = 4 }
                else if length == 127, pending.count >= 10 { length = pending[2..<10].reduce(0) { $0 << 8 | Int($1) }; header = 10 }
                else if length >= 126 { header = Int.max }
                if header != Int.max, pending.count >= header + length {
                    let frame = (pending[0] & 0x0F, Array(pending[header..<header + length]))
                    pending.removeFirst(header + length)
                    return frame
                }
            }
            guard fill(until: deadline) else { return nil }
        }
    }

    /// The next data frame, answering nothing and skipping pings.
    func receiveMessage(timeout: Duration = .seconds(5)) -> (opcode: UInt8, payload: [UInt8])? {
        while let f = receive(timeout: timeout) {
            if f.opcode != 0x9 { return f }
        }
        return nil
    }

    /// The next text message as a JSON object.
    func receiveJSON(timeout: Duration = .seconds(5)) -> [String: Any]? {
        guard let f = receiveMessage(timeout: timeout) else { return nil }
        #expect(f.opcode == 0x1, "expected a text frame, got opcode \(f.opcode)")
        return try? JSONSerialization.jsonObject(with: Data(f.payload)) as? [String: Any]
    }

    func expectJSON(_ expected: [String: Any], sourceLocation: SourceLocation = #_sourceLocation) {
        guard let got = receiveJSON() else {
            Issue.record("\(address) received no JSON message, expected \(expected)", sourceLocation: sourceLocation)
            return
        }
        let canonical = { (o: [String: Any]) in o.mapValues { ($0 as? String).map { "\"\($0)\"" } ?? "\($0)" } }
        #expect(canonical(got) == canonical(expected), sourceLocation: sourceLocation)
    }

    /// The close code of the daemon's close frame, then the TCP close; nil
    /// when no close frame came within `timeout`.
    func expectCloseCode(timeout: Duration = .seconds(5)) -> UInt16? {
        while let f = receive(timeout: timeout) {
            if f.opcode == 0x8 {
                #expect(connection.isClosed(within: .seconds(3)), "the daemon did not close the TCP connection after its close frame")
                return f.payload.count >= 2 ? UInt16(f.payload[0]) << 8 | UInt16(f.payload[1]) : 1005
            }
        }
        return nil
    }
}

@Suite("WebSocket listener")
struct WebSocketIntegrationTests {
    static let settings = ["websocket.listen": "127.0.0.1:0", "json.listen": "127.0.0.1:0"]

    @Test("the 101 answer carries RFC 6455's accept value and the chosen subprotocol; none offered means roomcast.json.v1")
    func handshake() throws {
        let d = try Daemon(Self.settings)
        let a = try WebSocketTestClient.open(d, subprotocol: "chat.other, roomcast.ltb.v1")
        #expect(a.answer.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"))
        #expect(a.answer.contains("Sec-WebSocket-Protocol: roomcast.ltb.v1"))
        let b = try WebSocketTestClient.open(d, subprotocol: nil)
        #expect(!b.answer.contains("Sec-WebSocket-Protocol"))
        try b.sendJSON(["cmd": "nickname", "nickname": "bob"])
        b.expectJSON(["cmd": "join", "nickname": "bob", "addr": b.address])
    }

    @Test("WebSocket JSON and LTB clients, a JSON client and an LTB client share one room both ways")
    func sharedRoom() throws {
        let d = try Daemon(Self.settings)
        let wj = try WebSocketTestClient.open(d, subprotocol: "roomcast.json.v1")
        let wl = try WebSocketTestClient.open(d, subprotocol: "roomcast.ltb.v1")
        let j = try JSONTestClient(d)
        let ltb = try d.connect()
        let alice = Wire.user("alice")
        // LTB → everyone: the WebSocket LTB client gets the same bytes in one binary message.
        try ltb.send(Wire.join(alice))
        #expect(ltb.receiveFrame()?.wire == Wire.join(alice))
        let binary = try #require(wl.receiveMessage())
        #expect(binary.opcode == 0x2 && binary.payload == Wire.join(alice))
        wj.expectJSON(["cmd": "join", "nickname": "alice", "addr": ltb.address])
        j.expect(["cmd": "join", "nickname": "alice", "addr": ltb.address])
        // WebSocket JSON → everyone.
        try wj.sendJSON(["cmd": "nickname", "nickname": "web"])
        let web = UserInfo(level: 0, name: "web", iconURL: "")
        #expect(ltb.receiveFrame()?.wire == Wire.join(web))
        wj.expectJSON(["cmd": "join", "nickname": "web", "addr": wj.address])
        j.expect(["cmd": "join", "nickname": "web", "addr": wj.address])
        #expect(wl.receiveMessage()?.payload == Wire.join(web))
        try wj.sendJSON(["cmd": "msg", "content": "hello from a browser, 世界"])
        #expect(ltb.receiveFrame()?.wire == Wire.text(web, "hello from a browser, 世界"))
        j.expect(["cmd": "msg", "from": "web", "content": "hello from a browser, 世界"])
        wj.expectJSON(["cmd": "msg", "from": "web", "content": "hello from a browser, 世界"])
        #expect(wl.receiveMessage()?.payload == Wire.text(web, "hello from a browser, 世界"))
        // WebSocket LTB → everyone: one binary message is one LTB frame, relayed unchanged.
        let carol = Wire.user("carol")
        try wl.sendBinary(Wire.join(carol))
        #expect(ltb.receiveFrame()?.wire == Wire.join(carol))
        wj.expectJSON(["cmd": "join", "nickname": "carol", "addr": wl.address])
        j.expect(["cmd": "join", "nickname": "carol", "addr": wl.address])
        #expect(wl.receiveMessage()?.payload == Wire.join(carol), "echo to the sender, as for LTB")
        // JSON → WebSocket.
        try j.send(["cmd": "nickname", "nickname": "jay"])
        wj.expectJSON(["cmd": "join", "nickname": "jay", "addr": j.address])
        #expect(wl.receiveMessage()?.payload == Wire.join(UserInfo(level: 0, name: "jay", iconURL: "")))
        // A WebSocket client that goes away: its room hears the synthesized leave.
        wl.connection.reset()
        #expect(ltb.receiveFrames(2).map(\.wire) == [Wire.join(UserInfo(level: 0, name: "jay", iconURL: "")), Wire.leave(carol)])
        wj.connection.reset()
        j.expect(["cmd": "join", "nickname": "jay", "addr": j.address])
        j.expect(["cmd": "leave", "nickname": "carol", "addr": wl.address])
        j.expect(["cmd": "leave", "nickname": "web", "addr": wj.address])
    }

    @Test("a binary message that is not exactly one LTB frame is dropped as a violation, the client stays")
    func ltbMessageMustBeOneFrame() throws {
        let d = try Daemon(Self.settings)
        let wl = try WebSocketTestClient.open(d, subprotocol: "roomcast.ltb.v1")
        try wl.sendBinary(Wire.join(Wire.user("x")) + [1])
        #expect(d.stderr.wait(for: "is not exactly one LTB frame"))
        try wl.sendBinary(Wire.join(Wire.user("y")))
        #expect(wl.receiveMessage()?.payload == Wire.join(Wire.user("y")))
    }

    @Test("protocol.max_violations bad messages close with 1008; a stopping daemon closes with 1001")
    func policyAndGoingAway() throws {
        let d = try Daemon(Self.settings.merging(["protocol.max_violations": "2"]) { $1 })
        let w = try WebSocketTestClient.open(d)
        try w.sendText("not JSON")
        try w.sendText("[1, 2]")
        #expect(w.expectCloseCode() == 1008)
        let other = try WebSocketTestClient.open(d)
        d.child.kill(SIGTERM)
        #expect(other.expectCloseCode() == 1001)
    }

    @Test("pings come every ping_interval; a pong answers a ping; a client that answers nothing is closed")
    func liveness() throws {
        let d = try Daemon(Self.settings.merging(["heartbeat.timeout": "2s", "websocket.ping_interval": "1s"]) { $1 })
        let w = try WebSocketTestClient.open(d)
        try w.connection.sendRaw(WebSocketTestClient.frame(0x9, Array("abc".utf8)))
        let pong = try #require(w.receive())
        #expect(pong.opcode == 0xA && pong.payload == Array("abc".utf8))
        // A client that answers each ping stays past the timeout.
        let start = monotonicMs()
        var pings = 0
        while monotonicMs() - start < 3_000 {
            guard let f = w.receive(timeout: .seconds(2)) else { break }
            if f.opcode == 0x9 {
                pings += 1
                try w.connection.sendRaw(WebSocketTestClient.frame(0xA, f.payload))
            }
        }
        #expect(pings >= 2)
        w.connection.expectOpen()
        // One that stops answering is closed within the timeout (and a tick), with 1011
        // (docs/protocol/websocket.md §15) and REASON=heartbeat_timeout at debug.
        #expect(w.expectCloseCode(timeout: .seconds(4)) == 1011)
        #expect(d.stderr.wait(for: "REASON=heartbeat_timeout"))
    }

    @Test("a close frame is answered with a close frame, then the connection is closed")
    func closeHandshake() throws {
        let d = try Daemon(Self.settings)
        let w = try WebSocketTestClient.open(d)
        try w.connection.sendRaw(WebSocketTestClient.frame(0x8, [0x03, 0xE8]))
        #expect(w.expectCloseCode() == 1000)
    }

    @Test("close codes: an unmasked frame 1002, an oversized message 1009, bad UTF-8 1007, each logged once with a REASON",
          arguments: [
            ("unmasked", UInt16(1002), "websocket_protocol_error"),
            ("oversized", UInt16(1009), "websocket_message_too_big"),
            ("bad-utf8", UInt16(1007), "websocket_invalid_utf8"),
          ])
    func closeCodes(kind: String, code: UInt16, reason: String) throws {
        let d = try Daemon(Self.settings.merging(["websocket.max_message_bytes": "1K"]) { $1 })
        let w = try WebSocketTestClient.open(d)
        let frame: [UInt8] = switch kind {
        case "unmasked": WebSocketTestClient.frame(0x1, Array("{}".utf8), masked: false)
        case "oversized": WebSocketTestClient.frame(0x1, [UInt8](repeating: 0x20, count: 600), fin: false)
            + WebSocketTestClient.frame(0x0, [UInt8](repeating: 0x20, count: 600))
        default: WebSocketTestClient.frame(0x1, [0x22, 0xC3, 0x28, 0x22])
        }
        try w.connection.sendRaw(frame)
        #expect(w.expectCloseCode() == code)
        #expect(d.stderr.wait(for: "REASON=\(reason)"))
        let other = try WebSocketTestClient.open(d)
        other.connection.expectOpen()
    }

    @Test("refusals: 403 for another origin, 400 for a bad key, 426 for a plain GET and for another version, then closed",
          arguments: [
            ("origin", "HTTP/1.1 403 "), ("key", "HTTP/1.1 400 "), ("plain", "HTTP/1.1 426 "), ("version", "HTTP/1.1 426 "),
          ])
    func refusals(kind: String, status: String) throws {
        let d = try Daemon(Self.settings.merging(["websocket.allowed_origins": "https://chat.example"]) { $1 })
        let w = try WebSocketTestClient(d)
        switch kind {
        case "origin": try w.sendRequest(extra: ["Origin: https://evil.example"])
        case "key": try w.connection.sendRaw(Array(
            "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: short\r\nSec-WebSocket-Version: 13\r\n\r\n".utf8))
        case "plain": try w.connection.sendRaw(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
        default: try w.sendRequest(version: "8")
        }
        let head = try #require(w.readAnswer())
        #expect(head.hasPrefix(status), "\(head)")
        w.connection.expectClosed()
        #expect(d.stderr.wait(for: "REASON=websocket_upgrade_refused"))
        // The allowed origin, and no Origin at all (not a browser), are served.
        _ = try WebSocketTestClient.open(d)
        let ok = try WebSocketTestClient(d)
        try ok.sendRequest(extra: ["Origin: https://chat.example"])
        #expect(ok.readAnswer()?.hasPrefix("HTTP/1.1 101 ") == true)
    }

    @Test("an upgrade that never ends is closed after 5 s")
    func slowUpgrade() throws {
        let d = try Daemon(Self.settings)
        let w = try WebSocketTestClient(d)
        try w.connection.sendRaw(Array("GET / HTTP/1.1\r\nHost: x\r\n".utf8))
        w.connection.expectOpen()
        pause(.seconds(3))
        w.connection.expectOpen()
        // 408 once the upgrade's 5 s passed, then closed (docs/protocol/websocket.md §15).
        let head = w.readAnswer(timeout: .seconds(4))
        #expect(head?.hasPrefix("HTTP/1.1 408 ") == true, "\(head ?? "no answer")")
        w.connection.expectClosed(within: .seconds(2), "the upgrade's 5 s passed")
    }

    @Test("socket activation hands over the WebSocket listener by FileDescriptorName=websocket")
    func socketActivationWebSocket() throws {
        let ltbPort = try freeLoopbackPort(), wsPort = try freeLoopbackPort()
        let d = try Daemon([:], socketActivation: [("ltb", ltbPort), ("websocket", wsPort)])
        #expect(d.stderr.wait(for: "Listening on 127.0.0.1:\(wsPort)"), "systemd-socket-activate: \(d.stderr.current)")
        let c = try TestClient(host: "127.0.0.1", port: wsPort, owner: d)
        try c.sendRaw(Array(("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: \(WebSocketTestClient.key)\r\nSec-WebSocket-Version: 13\r\n\r\n").utf8))
        var reply = [UInt8](repeating: 0, count: 512)
        var p = pollfd(fd: c.fd, events: Int16(POLLIN), revents: 0)
        #expect(poll(&p, 1, 5000) == 1)
        let n = reply.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, $0.count, 0) }
        #expect(String(decoding: reply[0..<max(0, n)], as: UTF8.self).hasPrefix("HTTP/1.1 101 "))
        #expect(d.stderr.wait(forLineWith: ["listening on 127.0.0.1:\(wsPort) (websocket)"]))
    }

    @Test("echo = yes serves /echo: each message back to its sender, in no room")
    func echo() throws {
        let d = try Daemon(Self.settings.merging(["websocket.echo": "yes"]) { $1 })
        let e = try WebSocketTestClient.open(d, path: "/echo", subprotocol: nil)
        let ltb = try d.connect()
        try e.sendText("not JSON at all")
        let back = try #require(e.receiveMessage())
        #expect(back.opcode == 0x1 && back.payload == Array("not JSON at all".utf8))
        try e.sendBinary([0, 1, 2, 255])
        #expect(e.receiveMessage()?.payload == [0, 1, 2, 255])
        try ltb.send(Wire.join(Wire.user("a")))
        _ = ltb.receiveFrame()
        #expect(e.receiveMessage(timeout: .milliseconds(300)) == nil, "an echo client is in no room")
    }
}

@Suite("WebSocket interop")
struct WebSocketInteropTests {
    /// Runs Reference/ws_peer.py (Python's `websockets`, PyPI; `make deps`
    /// installs it) with `arguments`; while it runs, `during` (if any) plays
    /// the other side. Its output goes to files, not pipes: a daemon another
    /// test spawns at the same moment may inherit a pipe's write end, and a
    /// read to EOF would then wait for that daemon.
    /// - Returns: the peer's exit status (nil: still running after 20 s, then
    ///   terminated), stdout and stderr.
    static func runPeer(_ arguments: [String], during: () throws -> Void = {}) throws -> (status: Int32?, out: String, err: String) {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Reference/ws_peer.py")
        let dir = try TempDirectory()
        let outPath = try dir.write("out", ""), errPath = try dir.write("err", "")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script.path] + arguments
        process.standardOutput = FileHandle(forWritingAtPath: outPath)
        process.standardError = FileHandle(forWritingAtPath: errPath)
        try process.run()
        defer { if process.isRunning { process.terminate() } }
        try during()
        let ended = waitUntil(.seconds(20)) { !process.isRunning }
        let read = { (path: String) in String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self) }
        return (ended ? process.terminationStatus : nil, read(outPath), read(errPath))
    }

    /// `runPeer` while an LTB client in the default room sees the peer's join
    /// and text, answers "hi python" and sees its leave.
    static func converse(_ ltb: TestClient, _ arguments: [String]) throws -> (status: Int32?, out: String, err: String) {
        try runPeer(arguments) {
            let py = UserInfo(level: 0, name: "py", iconURL: "")
            #expect(ltb.receiveFrames(2, timeout: .seconds(10)).map(\.wire) == [Wire.join(py), Wire.text(py, "hello from python")])
            try ltb.send(Wire.text(Wire.user("alice"), "hi python"))
            #expect(ltb.receiveFrames(2, timeout: .seconds(10)).map(\.wire) == [Wire.text(Wire.user("alice"), "hi python"), Wire.leave(py)])
        }
    }

    @Test("Python's websockets library chats with an LTB client and closes cleanly")
    func pythonWebsockets() throws {
        let d = try Daemon(WebSocketIntegrationTests.settings)
        let ltb = try d.connect()
        let port = try #require(d.webSocketPort)
        let r = try Self.converse(ltb, ["--url", "ws://127.0.0.1:\(port)/"])
        #expect(r.status == 0, "python3 ws_peer.py (needs PyPI websockets): \(r.err)")
        #expect(r.out.contains("\"ok\": true") && r.out.contains("\"received\": \"hi python\""), "\(r.out)")
    }

    /// wss:// (`[websocket] listen_tls`, docs/protocol/tls.md §16): Python's ssl
    /// verifies the daemon's certificate, the page's origin is allowed, another
    /// origin is refused with 403 before the upgrade as on the plain listener.
    @Test("wss: Python's websockets over TLS (certificate verified) chats with an LTB client; allowed_origins applies")
    func pythonWebsocketsOverTLS() throws {
        let certs = try TestCertificates()
        let d = try Daemon(["websocket.listen_tls": "127.0.0.1:0", "websocket.allowed_origins": "https://chat.example",
                            "tls.cert_file": certs.cert, "tls.key_file": certs.key])
        let ltb = try d.connect()
        let port = try #require(d.tlsPorts["websocket"])
        let r = try Self.converse(ltb, ["--url", "wss://localhost:\(port)/", "--ca", certs.cert, "--origin", "https://chat.example"])
        #expect(r.status == 0, "python3 ws_peer.py over wss: \(r.err)")
        #expect(r.out.contains("\"received\": \"hi python\"") && r.out.contains("\"tls\": \"TLSv1.3\""), "\(r.out)")

        let refused = try Self.runPeer(["--url", "wss://localhost:\(port)/", "--ca", certs.cert, "--origin", "https://evil.example"])
        #expect(refused.status == 1 && refused.err.contains("HTTP 403"), "another origin over wss: \(refused.status) \(refused.err)")
        #expect(d.stderr.wait(for: "REASON=websocket_upgrade_refused"), "no log line for the refused origin")
    }
}

extension WebSocketIntegrationTests {
    @Test("a WebSocket client kicked by the backend gets the notice kicked, then the close frame 1008 (not a bare TCP close: a browser would see 1006)")
    func kickClosesWith1008() throws {
        let (d, _) = try APIIntegrationTests.daemon(Self.settings)  // the key file is read at start
        let w = try WebSocketTestClient.open(d)
        try w.sendJSON(["cmd": "nickname", "nickname": "troll", "room": "stage"])
        #expect(w.receiveJSON()?["cmd"] as? String == "join")
        let api = try APITestClient(port: try #require(d.apiPort))
        let k = try #require(api.request("POST", "/v1/rooms/stage/kick", body: #"{"name": "troll"}"#))
        #expect(k.status == 200 && k.body.contains(#""kicked": 1"#))
        let notice = w.receiveJSON()
        #expect(notice?["cmd"] as? String == "notice" && notice?["code"] as? String == "kicked", "\(String(describing: notice))")
        #expect(w.expectCloseCode() == 1008)
    }
}
