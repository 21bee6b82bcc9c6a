import Testing
@testable import RoomcastCore

/// The bounded request parser and the handshake decision (RFC 6455 §4,
/// RFC 9112): the RFC's own example, partial reads, the 8 KiB bound, and
/// each refusal with its status.
@Suite struct HTTPRequestParserTests {
    /// RFC 6455 §1.2's client handshake.
    static let rfcRequest = "GET /chat HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: http://example.com\r\n"
        + "Sec-WebSocket-Protocol: chat, superchat\r\nSec-WebSocket-Version: 13\r\n\r\n"

    static func request(path: String = "/", _ extra: [String] = [], drop: [String] = []) -> String {
        var lines = ["Host: 127.0.0.1:9897", "Upgrade: websocket", "Connection: Upgrade",
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
        lines.removeAll { l in drop.contains { l.hasPrefix($0 + ":") } }
        return "GET \(path) HTTP/1.1\r\n" + (lines + extra).map { $0 + "\r\n" }.joined() + "\r\n"
    }

    static func parse(_ text: String) -> HTTPRequestParser.Step {
        var p = HTTPRequestParser()
        return Array(text.utf8).withUnsafeBytes { p.parse($0) }
    }

    static func decide(_ text: String, policy: WebSocketPolicy = WebSocketPolicy(webSocketPaths: ["/", "/echo"], pagePaths: [])) -> Result<WebSocketHandshake, HTTPError> {
        guard case .request(let r, _) = parse(text) else { return .failure(HTTPError(0, "parse: \(parse(text))")) }
        do { return .success(try WebSocketHandshake.evaluate(r, policy: policy)) } catch { return .failure(error) }
    }

    static func status(_ text: String, policy: WebSocketPolicy = WebSocketPolicy(webSocketPaths: ["/", "/echo"])) -> Int? {
        if case .error(let e) = parse(text) { return e.status }
        if case .failure(let e) = decide(text, policy: policy) { return e.status }
        return nil
    }

    @Test func rfcExampleParses() throws {
        guard case .request(let r, let n) = Self.parse(Self.rfcRequest) else { Issue.record("not parsed"); return }
        #expect(n == Self.rfcRequest.utf8.count)
        #expect(r.method == "GET" && r.path == "/chat" && r.value("host") == "server.example.com")
        #expect(r.list("sec-websocket-protocol") == ["chat", "superchat"])
        #expect(r.hasToken("connection", "upgrade") && r.hasToken("upgrade", "WebSocket"))
        // Its subprotocols are none of ours: refused with a reason.
        #expect(Self.status(Self.rfcRequest, policy: WebSocketPolicy(webSocketPaths: ["/chat"])) == 400)
    }

    @Test func resumesAfterAnySplitAndScansOnce() {
        let text = Array(Self.request(path: "/?room=r1").utf8)
        for k in 0..<text.count {
            var p = HTTPRequestParser()
            #expect(text.withUnsafeBytes { p.parse(UnsafeRawBufferPointer(rebasing: $0[0..<k])) } == .needMore, "prefix \(k)")
            guard case .request(let r, let n) = text.withUnsafeBytes({ p.parse($0) }) else { Issue.record("split \(k)"); return }
            #expect(n == text.count && r.query == "room=r1" && r.path == "/")
        }
    }

    @Test func theHeadIsBoundedAt8KiB() {
        let filler = "X-Filler: " + String(repeating: "a", count: 8 * 1024) + "\r\n"
        // Never complete: refused once 8 KiB arrived, without waiting for more.
        var p = HTTPRequestParser()
        let partial = Array(("GET / HTTP/1.1\r\n" + filler).utf8)
        guard case .error(let e) = partial.withUnsafeBytes({ p.parse($0) }) else { Issue.record("not refused"); return }
        #expect(e.status == 431)
        // A head of exactly 8 KiB is fine; 8 KiB + 1 is not.
        let base = Self.request()
        let pad = 8 * 1024 - base.utf8.count - "X-Pad: \r\n".utf8.count
        let exact = base.replacingOccurrences("\r\n\r\n", "\r\nX-Pad: " + String(repeating: "p", count: pad) + "\r\n\r\n")
        #expect(exact.utf8.count == 8 * 1024)
        #expect(Self.status(exact) == nil)
        let over = exact.replacingOccurrences("X-Pad: ", "X-Pad: q")
        #expect(Self.status(over) == 431)
    }

    @Test func headerNamesAreCaseInsensitiveAndConnectionIsAList() {
        let text = "GET / HTTP/1.1\r\nhOsT: x\r\nUPGRADE: WebSocket\r\nconnection: keep-alive, Upgrade\r\n"
            + "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nSEC-WEBSOCKET-VERSION: 13\r\n\r\n"
        #expect(Self.decide(text) == .success(.upgrade(path: "/", key: "dGhlIHNhbXBsZSBub25jZQ==", subprotocol: nil)))
        // Bare LF line ends are accepted (RFC 9112 §2.2).
        #expect(Self.status(text.replacingOccurrences("\r\n", "\n")) == nil)
    }

    @Test func refusalsAndTheirStatuses() {
        let policy = WebSocketPolicy(webSocketPaths: ["/", "/echo"], allowedOrigins: ["http://127.0.0.1:9897", "https://Example.com"])
        #expect(Self.status(Self.request().replacingOccurrences("GET ", "POST ")) == 405)
        #expect(Self.status(Self.request(path: "/nowhere")) == 404)
        #expect(Self.status(Self.request(["Origin: http://evil.example"]), policy: policy) == 403)
        #expect(Self.status(Self.request(["Origin: https://example.com"]), policy: policy) == nil)  // compared lowercased
        #expect(Self.status(Self.request(), policy: policy) == nil)  // no Origin: an app, allowed
        #expect(Self.status(Self.request(["Origin: http://evil.example"])) == nil)  // empty list: any origin
        #expect(Self.status(Self.request(drop: ["Upgrade"])) == 426)  // a plain GET of a WebSocket path
        #expect(Self.status(Self.request(drop: ["Sec-WebSocket-Version"]) .replacingOccurrences("\r\n\r\n", "\r\nSec-WebSocket-Version: 8\r\n\r\n")) == 426)
        #expect(Self.status(Self.request(drop: ["Connection"])) == 400)
        #expect(Self.status(Self.request(drop: ["Host"])) == 400)
        #expect(Self.status(Self.request(drop: ["Sec-WebSocket-Key"])) == 400)
        #expect(Self.status(Self.request(["Sec-WebSocket-Key: short=="], drop: ["Sec-WebSocket-Key"])) == 400)
        #expect(Self.status(Self.request(["Sec-WebSocket-Protocol: mqtt"])) == 400)
        #expect(Self.status("GET / HTTP/1.0\r\nHost: x\r\n\r\n") == 400)
        #expect(Self.status("GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n") == 400)
        #expect(Self.status("GET / HTTP/1.1\r\nHost : x\r\n\r\n") == 400)
        #expect(Self.status("GET / HTTP/1.1\r\nHost: x\0y\r\n\r\n") == 400)
        #expect(Self.status("GARBAGE\r\n\r\n") == 400)
        #expect(Self.status("GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n") == 400)
        let e = HTTPError(426, "x", headers: [("Sec-WebSocket-Version", "13")])
        #expect(String(decoding: e.response, as: UTF8.self).hasPrefix("HTTP/1.1 426 Upgrade Required\r\n"))
        #expect(String(decoding: e.response, as: UTF8.self).contains("\r\nSec-WebSocket-Version: 13\r\n"))
    }

    @Test func subprotocolChoiceAndPage() {
        #expect(Self.decide(Self.request(["Sec-WebSocket-Protocol: mqtt, roomcast.ltb.v1, roomcast.json.v1"])).map(\.spoken) == .success(.ltb))
        #expect(Self.decide(Self.request(["Sec-WebSocket-Protocol: roomcast.json.v1"])).map(\.spoken) == .success(.json))
        #expect(Self.decide(Self.request()).map(\.spoken) == .success(.json))
        // permessage-deflate offered: the upgrade goes on, the extension is not named.
        #expect(Self.status(Self.request(["Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits"])) == nil)
        let page = WebSocketPolicy(webSocketPaths: ["/"], pagePaths: ["/"])
        #expect(Self.decide("GET /?room=x HTTP/1.1\r\nHost: h\r\n\r\n", policy: page) == .success(.page(path: "/")))
        let answer = String(decoding: WebSocketHandshake.response(accept: "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", subprotocol: .ltb), as: UTF8.self)
        #expect(answer == "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Protocol: roomcast.ltb.v1\r\n\r\n")
        #expect(WebSocketHandshake.acceptInput(key: "dGhlIHNhbXBsZSBub25jZQ==") == "dGhlIHNhbXBsZSBub25jZQ==258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
    }
}

extension String {
    /// Replaces every occurrence (no Foundation in this file).
    func replacingOccurrences(_ a: String, _ b: String) -> String {
        var out = ""
        var rest = Substring(self)
        while let r = rest.firstRange(of: a) {
            out += rest[..<r.lowerBound] + b
            rest = rest[r.upperBound...]
        }
        return out + rest
    }
}
