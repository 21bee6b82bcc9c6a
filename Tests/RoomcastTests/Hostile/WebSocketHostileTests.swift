// Hostile WebSocket input (docs/protocol/websocket.md §15): control frames inside
// fragmented messages, bad UTF-8 split across fragments, fragmented control
// frames, and 10,000 half-open upgrades. Each costs only its sender, with
// a close code (or HTTP status) and a journal line.
import Foundation
import Glibc
import Testing

@Suite("WebSocket hostile input")
struct WebSocketHostileTests {
    static let settings = WebSocketIntegrationTests.settings

    @Test("a ping between the fragments of a message is answered at once, and the message arrives whole")
    func pingInsideFragments() throws {
        let d = try Daemon(Self.settings)
        let w = try WebSocketTestClient.open(d)
        let text = Array(#"{"cmd":"nickname","nickname":"frag"}"#.utf8)
        try w.connection.sendRaw(WebSocketTestClient.frame(0x1, Array(text[0..<10]), fin: false)
            + WebSocketTestClient.frame(0x9, Array("p1".utf8)))
        let pong = try #require(w.receive())
        #expect(pong.opcode == 0xA && pong.payload == Array("p1".utf8), "the pong comes before the message is complete")
        try w.connection.sendRaw(WebSocketTestClient.frame(0x0, Array(text[10..<20]), fin: false)
            + WebSocketTestClient.frame(0xA, [])  // an unsolicited pong, ignored (RFC 6455 §5.5.3)
            + WebSocketTestClient.frame(0x0, Array(text[20...])))
        w.expectJSON(["cmd": "join", "nickname": "frag", "addr": w.address])
    }

    @Test("UTF-8 split across fragments: a valid split is one message; an invalid one closes with 1007 and a journal line")
    func utf8AcrossFragments() throws {
        let d = try Daemon(Self.settings)
        let good = try WebSocketTestClient.open(d)
        // "é" is C3 A9: its two bytes in two fragments.
        let head = Array(#"{"cmd":"nickname","nickname":"caf"#.utf8) + [0xC3]
        try good.connection.sendRaw(WebSocketTestClient.frame(0x1, head, fin: false)
            + WebSocketTestClient.frame(0x0, [0xA9] + Array(#""}"#.utf8)))
        good.expectJSON(["cmd": "join", "nickname": "café", "addr": good.address])
        let bad = try WebSocketTestClient.open(d)
        try bad.connection.sendRaw(WebSocketTestClient.frame(0x1, head, fin: false)
            + WebSocketTestClient.frame(0x0, [0x28] + Array(#""}"#.utf8)))
        #expect(bad.expectCloseCode() == 1007)
        #expect(d.stderr.wait(forLineWith: ["REASON=websocket_invalid_utf8", "CLIENT_ADDR=\(bad.address)"]))
        // Only the sender paid: the other client still chats.
        try good.sendJSON(["cmd": "msg", "content": "still here"])
        good.expectJSON(["cmd": "msg", "from": "café", "content": "still here"])
    }

    @Test("a fragmented ping, an oversized ping and a continuation without a message close with 1002",
          arguments: ["fragmented-ping", "oversized-ping", "stray-continuation", "text-inside-text"])
    func controlFrameViolations(kind: String) throws {
        let d = try Daemon(Self.settings)
        let w = try WebSocketTestClient.open(d)
        let bytes: [UInt8] = switch kind {
        case "fragmented-ping": WebSocketTestClient.frame(0x9, [1], fin: false)
        case "oversized-ping": WebSocketTestClient.frame(0x9, [UInt8](repeating: 7, count: 126))
        case "stray-continuation": WebSocketTestClient.frame(0x0, Array("x".utf8))
        default: WebSocketTestClient.frame(0x1, Array("{".utf8), fin: false) + WebSocketTestClient.frame(0x1, Array("}".utf8))
        }
        try w.connection.sendRaw(bytes)
        #expect(w.expectCloseCode() == 1002)
        #expect(d.stderr.wait(forLineWith: ["REASON=websocket_protocol_error", "CLIENT_ADDR=\(w.address)"]))
    }

    @Test("10,000 half-open upgrades: another client is served meanwhile, each gets 408 after 5 s and is closed",
          .enabled(if: slowTestsEnabled, "slow: ROOMCAST_SLOW_TESTS=1 (make test)"))
    func tenThousandHalfOpenUpgrades() throws {
        let count = 10_000
        // The daemon holds them all plus the client that chats (max_clients 10,000 by default).
        let d = try Daemon(Self.settings.merging(["server.max_clients": "10100"]) { $1 })
        let port = try #require(d.webSocketPort)
        let fdsBefore = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(d.child.pid)/fd").count
        var fds: [Int32] = []
        defer { for fd in fds { close(fd) } }
        let partial = Array("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n".utf8)
        for _ in 0..<count {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
            try #require(fd >= 0, "socket: \(errnoText())")
            fds.append(fd)
            let rc = try withSocketAddress(host: "127.0.0.1", port: port) { _, address, length in connect(fd, address, length) }
            try #require(rc == 0, "connect: \(errnoText())")
            _ = partial.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }
        // Each costs only its sender: a fresh client upgrades and chats while they hang.
        let w = try WebSocketTestClient.open(d)
        try w.sendJSON(["cmd": "nickname", "nickname": "patient"])
        w.expectJSON(["cmd": "join", "nickname": "patient", "addr": w.address])
        // Every half-open one is answered 408 and closed within its 5 s (plus load).
        var answered = 0, closed = 0
        var buffer = [UInt8](repeating: 0, count: 512)
        let deadline = monotonicMs() + 60_000
        var open = Set(fds.indices)
        var got = [Int: [UInt8]]()
        while !open.isEmpty && monotonicMs() < deadline {
            var polls = open.map { pollfd(fd: fds[$0], events: Int16(POLLIN), revents: 0) }
            let indices = Array(open)
            guard poll(&polls, nfds_t(polls.count), 1_000) >= 0 else { break }
            for (k, p) in polls.enumerated() where p.revents != 0 {
                let i = indices[k]
                let n = buffer.withUnsafeMutableBytes { recv(fds[i], $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if n > 0 { got[i, default: []] += buffer[0..<n]; continue }
                if n < 0 && errno == EAGAIN { continue }
                open.remove(i)
                closed += 1
                if got[i].map({ String(decoding: $0, as: UTF8.self).hasPrefix("HTTP/1.1 408 ") }) == true { answered += 1 }
            }
        }
        #expect(closed == count, "\(count - closed) half-open upgrades still open after 60 s")
        #expect(answered == count, "\(count - answered) closed without a 408 answer")
        // Their descriptors are gone from the daemon; the patient client is still there.
        #expect(waitUntil(.seconds(10)) {
            ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(d.child.pid)/fd").count) ?? .max) <= fdsBefore + 1
        })
        try w.sendJSON(["cmd": "msg", "content": "all gone"])
        w.expectJSON(["cmd": "msg", "from": "patient", "content": "all gone"])
    }
}
