// The backend's HTTP API (docs/api.md) against the real daemon: each
// endpoint, its auth on TCP (bearer keys) and on a Unix socket (peer
// credentials), and malformed requests, each answered with its status and
// costing nothing else. The client here is a plain socket writing bytes.
import Foundation
import Glibc
import RoomcastCore
import Testing
@testable import RoomcastServer

/// One HTTP/1.1 client connection on a plain socket.
final class APITestClient {
    let fd: Int32
    private var pending: [UInt8] = []

    init(port: UInt16) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let r = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard r == 0 else { close(fd); throw HarnessError("connect: \(errnoText())") }
    }

    deinit { close(fd) }

    func send(_ text: String) { send(Array(text.utf8)) }

    func send(_ bytes: [UInt8]) {
        var off = 0
        while off < bytes.count {
            let n = bytes[off...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { return }
            off += n
        }
    }

    /// Sends a request with `Content-Length` and returns the answer.
    func request(_ method: String, _ path: String, body: String? = nil, key: String? = "k-0123456789abcdef", headers: [String] = []) -> (status: Int, body: String)? {
        var text = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if let key { text += "Authorization: Bearer \(key)\r\n" }
        for h in headers { text += h + "\r\n" }
        if let body { text += "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body } else { text += "\r\n" }
        send(text)
        return answer()
    }

    /// The next answer (status and body), or nil at EOF or after `timeout`.
    func answer(timeout: Duration = .seconds(5)) -> (status: Int, body: String)? {
        let deadline = monotonicMs() + Int64(timeout.components.seconds * 1000)
        while true {
            if let end = pending.indices.dropLast(3).first(where: { pending[$0] == 13 && pending[$0 + 1] == 10 && pending[$0 + 2] == 13 && pending[$0 + 3] == 10 }) {
                let head = String(decoding: pending[..<end], as: UTF8.self)
                let status = Int(head.split(separator: " ")[1]) ?? 0
                let length = head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                    .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
                if pending.count >= end + 4 + length {
                    let body = String(decoding: pending[(end + 4)..<(end + 4 + length)], as: UTF8.self)
                    pending.removeFirst(end + 4 + length)
                    if status == 100 { continue }
                    return (status, body)
                }
            }
            let left = deadline - monotonicMs()
            guard left > 0 else { return nil }
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, Int32(left)) == 1 else { return nil }
            var buf = [UInt8](repeating: 0, count: 65536)
            let n = recv(fd, &buf, buf.count, 0)
            guard n > 0 else { return nil }
            pending += buf[0..<n]
        }
    }

    /// Whether the daemon closed the connection within `timeout`.
    func isClosed(within timeout: Duration = .seconds(3)) -> Bool {
        let deadline = monotonicMs() + Int64(timeout.components.seconds * 1000)
        while monotonicMs() < deadline {
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 100) == 1 else { continue }
            var buf = [UInt8](repeating: 0, count: 4096)
            if recv(fd, &buf, buf.count, 0) <= 0 { return true }
        }
        return false
    }
}

@Suite(.serialized) struct APIIntegrationTests {
    static let key = "k-0123456789abcdef"

    /// A daemon with the API on an ephemeral loopback port and a key file.
    static func daemon(_ extra: [String: String] = [:]) throws -> (Daemon, TempDirectory) {
        let dir = try TempDirectory()
        let keys = try dir.write("api.keys", "# backend keys\n\(key)\nk-second-key-0000000\n")
        chmod(keys, 0o600)
        let d = try Daemon(["api.listen": "127.0.0.1:0", "api.key_file": keys].merging(extra) { $1 })
        return (d, dir)
    }

    @Test func healthStatsAndKeys() throws {
        let (d, _) = try Self.daemon()
        let c = try APITestClient(port: try #require(d.apiPort))
        #expect(c.request("GET", "/healthz")?.status == 200)
        #expect(c.request("GET", "/healthz", key: nil)?.status == 401)  // public only with api.public_metrics
        let noKey = c.request("GET", "/v1/stats", key: nil)
        #expect(noKey?.status == 401)
        #expect(noKey?.body.contains(#""error": "unauthorized""#) == true)
        #expect(c.request("GET", "/v1/stats", key: "k-0123456789abcdeX")?.status == 401)
        #expect(c.request("GET", "/v1/stats", key: "k-second-key-0000000")?.status == 200)
        let stats = try #require(c.request("GET", "/v1/stats"))
        #expect(stats.status == 200 && stats.body.contains(#""clients": 0"#))
        #expect(c.request("GET", "/v1/nothing")?.status == 404)
        #expect(c.request("DELETE", "/v1/stats")?.status == 405)
        #expect(!d.stderr.current.contains(Self.key), "a key reached the log")
    }

    @Test func publicMetricsNeedNoKey() throws {
        let (d, _) = try Self.daemon(["api.public_metrics": "yes"])
        let c = try APITestClient(port: try #require(d.apiPort))
        let m = try #require(c.request("GET", "/metrics", key: nil))
        #expect(m.status == 200 && m.body.contains("# TYPE roomcast_clients gauge"))
        #expect(c.request("GET", "/v1/rooms", key: nil)?.status == 401)
    }

    /// Publish goes to the room's members as a member's frame would, once per Idempotency-Key.
    @Test func publishTextGiftOpaqueAndIdempotency() throws {
        let (d, _) = try Self.daemon()
        let alice = try d.connect()
        try alice.send(Wire.join(Wire.user("alice", room: "live 1")))
        _ = alice.receiveFrame()  // her own join (echo)
        let c = try APITestClient(port: try #require(d.apiPort))
        let text = #"{"type": "text", "user": {"name": "system", "level": 9, "icon": ""}, "text": "welcome"}"#
        let r = try #require(c.request("POST", "/v1/rooms/live%201/publish", body: text, headers: ["Idempotency-Key: pub-1"]))
        #expect(r.status == 200 && r.body == "{\"delivered\": 1}\n")
        let f = try #require(alice.receiveFrame())
        #expect(f.type == Wire.text)
        #expect(try ChatMessage(protobuf: f.body).text == "welcome")
        // The same key again: the first reply, nothing relayed.
        #expect(c.request("POST", "/v1/rooms/live%201/publish", body: text, headers: ["Idempotency-Key: pub-1"])?.body == "{\"delivered\": 1}\n")
        alice.expectNoFrame(within: .milliseconds(300), "a repeated Idempotency-Key was relayed again")
        let gift = #"{"type": "gift", "user": {"name": "shop"}, "giftname": "rose", "giftcount": 3}"#
        #expect(c.request("POST", "/v1/rooms/live%201/publish", body: gift)?.status == 200)
        let g = try #require(alice.receiveFrame())
        #expect(try g.type == Wire.gift && GiftMessage(protobuf: g.body).giftcount == 3)
        #expect(c.request("POST", "/v1/rooms/live%201/publish", body: #"{"type": 42, "body_base64": "AAEC/w=="}"#)?.status == 200)
        let o = try #require(alice.receiveFrame())
        #expect(o.type == 42 && o.body == [0, 1, 2, 255])
        // Refusals: each its status, the connection still serves.
        #expect(c.request("POST", "/v1/rooms/live%201/publish", body: "{not json")?.status == 400)
        #expect(c.request("POST", "/v1/rooms/live%201/publish", body: #"{"type": 0, "body_base64": ""}"#)?.status == 422)
        #expect(c.request("POST", "/v1/rooms/live%201/publish", body: #"{"type": 42, "body_base64": "AA="}"#)?.status == 422)
        #expect(c.request("POST", "/v1/rooms/live%201/publish", body: #"{"type": "text", "text": "no user"}"#)?.status == 422)
        #expect(c.request("POST", "/v1/rooms/live%201/publish", body: #"{"type": "text", "user": {"name": "x"}, "text": "ok"}"#)?.body == "{\"delivered\": 1}\n")
    }

    @Test func roomsMembersAndKick() throws {
        let (d, _) = try Self.daemon()
        let alice = try d.connect(), bob = try d.connect(), carol = try d.connect()
        try alice.send(Wire.join(Wire.user("alice", room: "a")))
        try bob.send(Wire.join(Wire.user("bob", room: "b")))
        try carol.send(Wire.join(Wire.user("carol", room: "b")))
        let c = try APITestClient(port: try #require(d.apiPort))
        #expect(waitUntil(.seconds(5)) { c.request("GET", "/v1/rooms/b")?.body.contains(#""viewers": 2"#) == true })
        let page1 = try #require(c.request("GET", "/v1/rooms?limit=1"))
        #expect(page1.body.contains(#"{"room": "a", "viewers": 1}"#) && page1.body.contains(#""next_cursor": "a""#))
        let page2 = try #require(c.request("GET", "/v1/rooms?limit=1&cursor=a"))
        #expect(page2.body.contains(#"{"room": "b", "viewers": 2}"#) && page2.body.contains(#""next_cursor": null"#))
        let members = try #require(c.request("GET", "/v1/rooms/b"))
        #expect(members.body.contains(#""name": "bob""#) && members.body.contains(#""name": "carol""#))
        _ = carol.receiveFrames(1, timeout: .milliseconds(500))  // its own join, maybe bob's before it
        while carol.receiveFrame(timeout: .milliseconds(200)) != nil {}
        let k = try #require(c.request("POST", "/v1/rooms/b/kick", body: #"{"name": "bob"}"#))
        #expect(k.status == 200 && k.body.contains(#""kicked": 1"#))
        var sawNotice = false
        while let f = bob.receiveFrame(timeout: .seconds(2)) {
            if f.type == 9, (try? Notice(protobuf: f.body))?.code == "kicked" { sawNotice = true }
        }
        #expect(sawNotice, "no kicked notice")
        bob.expectClosed()
        let leave = try #require(carol.receiveFrame())
        #expect(try leave.type == Wire.leave && UserInfo(protobuf: leave.body).name == "bob")
        alice.expectOpen()
    }

    /// Malformed requests: each its status, the daemon and other API clients unaffected.
    @Test func malformedRequestsCostOnlyTheirSender() throws {
        let (d, _) = try Self.daemon()
        let port = try #require(d.apiPort)
        let good = try APITestClient(port: port)
        // Oversized body: 413 before the body is read.
        let big = try APITestClient(port: port)
        big.send("POST /v1/rooms/r/publish HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(Self.key)\r\nContent-Length: 70000\r\n\r\n")
        #expect(big.answer()?.status == 413)
        #expect(big.isClosed())
        // Chunked: 411.
        let chunked = try APITestClient(port: port)
        chunked.send("POST /v1/rooms/r/publish HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        #expect(chunked.answer()?.status == 411)
        // Pipelined: two good requests then garbage: two answers, then 400 and close.
        let piped = try APITestClient(port: port)
        piped.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(Self.key)\r\n\r\nGET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(Self.key)\r\n\r\n\u{1}garbage\r\n\r\n")
        #expect(piped.answer()?.status == 200)
        #expect(piped.answer()?.status == 200)
        #expect(piped.answer()?.status == 400)
        #expect(piped.isClosed())
        // Headers over 8 KiB: 431.
        let huge = try APITestClient(port: port)
        huge.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + String(repeating: "a", count: 9000) + "\r\n\r\n")
        #expect(huge.answer()?.status == 431)
        // Slowloris: half a request, then nothing: 408 after 5 s, while the good client is served.
        let slow = try APITestClient(port: port)
        slow.send("GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthor")
        let started = monotonicMs()
        for _ in 0..<5 {
            #expect(good.request("GET", "/healthz")?.status == 200)
            pause(.milliseconds(200))
        }
        let timedOut = slow.answer(timeout: .seconds(10))
        #expect(timedOut?.status == 408)
        #expect(monotonicMs() - started >= 4_500)
        #expect(slow.isClosed())
        #expect(good.request("GET", "/v1/stats")?.status == 200)
    }

    @Test func maxConnections() throws {
        let (d, _) = try Self.daemon(["api.max_connections": "2"])
        let port = try #require(d.apiPort)
        let a = try APITestClient(port: port), b = try APITestClient(port: port)
        #expect(a.request("GET", "/healthz")?.status == 200)
        #expect(b.request("GET", "/healthz")?.status == 200)
        let c = try APITestClient(port: port)
        #expect(c.answer()?.status == 503)
        #expect(c.isClosed())
        #expect(a.request("GET", "/healthz")?.status == 200)
    }

    /// On the Unix socket the peer's uid decides: root passes, uid 65534 gets 403 unless allowed.
    @Test func unixSocketPeerCredentials() throws {
        let path = "/tmp/roomcast-api-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).sock"
        defer { unlink(path) }
        func ask(asNobody: Bool) throws -> String {
            let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
                + "s.sendall(b'GET /v1/stats HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n')\nd=b''\nwhile True:\n  c=s.recv(65536)\n  if not c: break\n  d+=c\nprint(d.split(b' ')[1].decode())\n"
            let p = Process()
            p.executableURL = URL(fileURLWithPath: asNobody ? "/usr/bin/setpriv" : "/usr/bin/python3")
            p.arguments = (asNobody ? ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"] : []) + ["-c", script, path]
            let out = Pipe()
            p.standardOutput = out
            try p.run()
            p.waitUntilExit()
            return String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        do {
            let d = try Daemon(["api.listen": "unix:" + path])
            #expect(try ask(asNobody: false) == "200")
            #expect(try ask(asNobody: true) == "403")
            _ = d
        }
        let allowed = try Daemon(["api.listen": "unix:" + path, "api.allow_uids": "65534"])
        _ = allowed
        #expect(try ask(asNobody: true) == "200")
    }
}

/// GET /metrics passes `promtool check metrics` (Debian's prometheus
/// package, unpacked by make deps) after traffic.
@Suite struct MetricsIntegrationTests {
    static let promtool: String = {
        var parts = "\(#filePath)".split(separator: "/", omittingEmptySubsequences: false)
        parts.removeLast(4)  // APIIntegrationTests.swift, Integration, RoomcastTests, Tests
        return parts.joined(separator: "/") + "/.build-deps/prometheus/root/usr/bin/promtool"
    }()

    @Test func promtoolAcceptsTheExposition() throws {
        #expect(FileManager.default.isExecutableFile(atPath: Self.promtool), "no promtool at \(Self.promtool): run make deps")
        let (d, _) = try APIIntegrationTests.daemon()
        let alice = try d.connect()
        try alice.send(Wire.join(Wire.user("alice", room: "m")))
        try alice.send(Wire.text(Wire.user("alice", room: "m"), "hi"))
        _ = alice.receiveFrames(2)
        // Two disconnects with reasons: a client that closes, one that announces a frame over max_frame_bytes.
        let bob = try d.connect()
        bob.hangUp()
        #expect(bob.isClosed(within: .seconds(5)))
        let carol = try d.connect()
        try carol.sendRaw([0xFF, 0xFF, 0xFF, 0x7F, 0x02, 0x00])
        #expect(carol.isClosed(within: .seconds(5)))
        let c = try APITestClient(port: try #require(d.apiPort))
        var m = try #require(c.request("GET", "/metrics"))
        _ = waitUntil(.seconds(5)) {
            m = c.request("GET", "/metrics") ?? m
            return m.body.contains("roomcast_disconnects_total{reason=\"frame_too_large\"} 1")
                && m.body.contains("roomcast_disconnects_total{reason=\"peer_closed\"} 1")
        }
        #expect(m.status == 200)
        for family in ["roomcast_clients{dialect=\"ltb\"} 1", "roomcast_rooms 1",
                       "roomcast_frames_received_total{type=\"join\"} 1", "roomcast_frames_received_total{type=\"text\"} 1",
                       "roomcast_frames_received_total{type=\"gift\"} 0",
                       "roomcast_frames_delivered_total{type=\"join\"} 1", "roomcast_frames_delivered_total{type=\"text\"} 1",
                       "roomcast_disconnects_total{reason=\"peer_closed\"} 1", "roomcast_disconnects_total{reason=\"frame_too_large\"} 1",
                       "roomcast_disconnects_total{reason=\"heartbeat_timeout\"} 0", "roomcast_start_info{from=\"fresh\"} 1",
                       "roomcast_restored_connections 0", "roomcast_cluster_daemons 0",
                       "roomcast_loop_wait_seconds_bucket{le=\"+Inf\"}", "# TYPE roomcast_loop_iteration_seconds histogram"] {
            #expect(m.body.contains(family), "no \(family) in:\n\(m.body)")
        }
        // Bytes: alice's join and text in, their echoes out (at least; the API's own bytes are not client bytes).
        let join = Wire.join(Wire.user("alice", room: "m")).count, text = Wire.text(Wire.user("alice", room: "m"), "hi").count
        func value(_ name: String) -> Int? {
            m.body.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Int($0.split(separator: " ")[1]) }
        }
        #expect(value("roomcast_received_bytes_total") == join + text + 6, "alice's two frames and carol's header")
        #expect(value("roomcast_sent_bytes_total") == join + text)
        let (status, said) = try promtoolCheck(m.body)
        #expect(status == 0, "promtool check metrics: \(said)")
        #expect(said.isEmpty, "promtool had remarks: \(said)")
    }
}

/// `[api] key_file`: refused at start like `[auth] key_file`, re-read on SIGHUP.
@Suite struct APIKeyFileTests {
    @Test func parseAndConstantTimeMatch() throws {
        let keys = try APIKeys.parse("# comment\n\n  k-0123456789abcdef  \r\nk-second-key-0000000\n", file: "k")
        #expect(keys.accepts(Array("k-0123456789abcdef".utf8)))
        #expect(keys.accepts(Array("k-second-key-0000000".utf8)))
        #expect(!keys.accepts(Array("k-0123456789abcde".utf8)))  // a prefix
        #expect(!keys.accepts(Array("k-0123456789abcdefX".utf8)))  // longer
        #expect(!keys.accepts([]))
        #expect(throws: ConfigError.self) { try APIKeys.parse("short\n", file: "k") }
        #expect(throws: ConfigError.self) { try APIKeys.parse("# only a comment\n", file: "k") }
        do {
            _ = try APIKeys.parse("k-0123456789abcdef\nhas a space in it!!\n", file: "k")
            Issue.record("a key with spaces was accepted")
        } catch {
            #expect(error.line == 2 && !error.description.contains("space in it"), "\(error)")
        }
    }

    @Test func refusedAtStartWhenOthersCanReadIt() throws {
        let dir = try TempDirectory()
        let path = try dir.write("api.keys", "k-0123456789abcdef\n")
        chmod(path, 0o644)
        let conf = try dir.write("c.conf", "[api]\nlisten = 127.0.0.1:0\nkey_file = \(path)\n")
        let r = try runRoomcastd(["--config", conf, "--check-config"])
        #expect(r.status == 78, "\(r.stderr)")
        #expect(r.stderr.contains("mode 644 lets group or others at the keys"), "\(r.stderr)")
        #expect(!r.stderr.contains("k-0123456789abcdef"))
        let missing = try dir.write("m.conf", "[api]\nlisten = 127.0.0.1:0\n")
        let m = try runRoomcastd(["--config", missing, "--check-config"])
        #expect(m.status == 78 && m.stderr.contains("api.listen on TCP needs api.key_file"), "\(m.stderr)")
    }

    @Test func sighupRotatesKeysAndABadFileKeepsThem() throws {
        let (d, dir) = try APIIntegrationTests.daemon()
        let c = try APITestClient(port: try #require(d.apiPort))
        #expect(c.request("GET", "/v1/stats", key: "k-rotated-key-000000")?.status == 401)
        let path = dir.path + "/api.keys"
        try "k-rotated-key-000000\n".write(toFile: path, atomically: false, encoding: .utf8)
        d.child.kill(SIGHUP)
        #expect(d.stderr.wait(for: "API keys reloaded from \(path): 1 key(s)"))
        #expect(c.request("GET", "/v1/stats", key: "k-rotated-key-000000")?.status == 200)
        #expect(c.request("GET", "/v1/stats")?.status == 401, "the removed key still works")
        try "short\n".write(toFile: path, atomically: false, encoding: .utf8)
        d.child.kill(SIGHUP)
        #expect(d.stderr.wait(forLineWith: ["API key file reload failed, keeping the keys in use", "REASON=api_key_file_invalid"]))
        #expect(c.request("GET", "/v1/stats", key: "k-rotated-key-000000")?.status == 200)
        #expect(!d.stderr.current.contains("k-rotated-key-000000") && !d.stderr.current.contains("k-0123456789abcdef"), "a key reached the log")
    }
}
