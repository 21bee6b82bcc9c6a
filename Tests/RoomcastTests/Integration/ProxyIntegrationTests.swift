// PROXY protocol listeners (docs/protocol/proxy.md §14) with the real daemon: the
// header's address is the client's for logs, JSON `addr` and
// max_clients_per_ip; missing, malformed, late headers and peers outside
// proxy_from are refused.
import Foundation
import Glibc
import RoomcastCore
import Testing

private func v1(_ src: String, _ sport: Int) -> [UInt8] { Array("PROXY TCP4 \(src) 127.0.0.1 \(sport) 9898\r\n".utf8) }

private func v2(_ src: [UInt8], _ sport: UInt16, command: UInt8 = 0x21) -> [UInt8] {
    ProxyHeader.v2Signature + [command, 0x11, 0, 12] + src + [127, 0, 0, 1]
        + [UInt8(sport >> 8), UInt8(sport & 0xFF), 0x26, 0xAA]
}

/// The next length-prefixed JSON object `client` receives.
private func receiveJSON(_ client: TestClient, timeout: Duration = .seconds(5)) -> [String: Any]? {
    var pending: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    let deadline = monotonicMs() + Int64(timeout.ms)
    while monotonicMs() < deadline {
        if pending.count >= 4 {
            let n = Int(pending[0]) | Int(pending[1]) << 8 | Int(pending[2]) << 16 | Int(pending[3]) << 24
            if pending.count >= 4 + n {
                return try? JSONSerialization.jsonObject(with: Data(pending[4..<4 + n])) as? [String: Any]
            }
        }
        var p = pollfd(fd: client.fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, 100) > 0 else { continue }
        let got = buffer.withUnsafeMutableBytes { recv(client.fd, $0.baseAddress, 1, Int32(MSG_DONTWAIT)) }  // one byte: no over-read
        if got <= 0 { return nil }
        pending.append(buffer[0])
    }
    return nil
}

@Suite("PROXY protocol listeners")
struct ProxyIntegrationTests {
    static let settings = ["server.proxy_protocol": "yes", "server.proxy_from": "127.0.0.0/8"]

    @Test("a v1 header split across writes, with frames in the same write as its end: nothing lost, the client's address logged")
    func v1SplitThenFrames() throws {
        let d = try Daemon(Self.settings)
        let c = try d.connect(awaitAccept: false)
        let header = v1("203.0.113.7", 51234)
        try c.sendRaw(Array(header[0..<9]))
        pause(.milliseconds(100))
        try c.sendRaw(Array(header[9..<30]))
        pause(.milliseconds(100))
        let alice = Wire.user("alice")
        try c.sendRaw(Array(header[30...]) + Wire.join(alice) + Wire.text(alice, "hi"))
        #expect(d.stderr.wait(for: "client connected CLIENT_ADDR=203.0.113.7:51234 "))
        #expect(c.receiveFrame()?.wire == Wire.join(alice))
        #expect(c.receiveFrame()?.wire == Wire.text(alice, "hi"))
        #expect(d.stderr.wait(forLineWith: ["alice joined lobby", "CLIENT_ADDR=203.0.113.7:51234"]))
    }

    @Test("a v2 header on the JSON listener: the header's address is JSON addr")
    func v2OnJSONGivesAddr() throws {
        let d = try Daemon(["json.listen": "127.0.0.1:0", "json.proxy_protocol": "yes", "json.proxy_from": "127.0.0.1"])
        let c = try TestClient(host: d.host, port: try #require(d.jsonPort), owner: d)
        let body = Array(#"{"cmd":"nickname","nickname":"guest7"}"#.utf8)
        try c.sendRaw(v2([192, 0, 2, 7], 40000) + JSONFrameCodec.encode(body))
        let join = try #require(receiveJSON(c))
        #expect(join["cmd"] as? String == "join" && join["addr"] as? String == "192.0.2.7:40000")
        #expect(d.stderr.wait(for: "client connected CLIENT_ADDR=192.0.2.7:40000 "))  // the log pipe is read beside the socket
        // The LTB listener has no proxy_protocol: an LTB client connects as before.
        let plain = try d.connect()
        plain.expectOpen()
    }

    @Test("v2 LOCAL (a health check) keeps the proxy's own address")
    func v2LocalKeepsProxyAddress() throws {
        let d = try Daemon(Self.settings)
        let c = try d.connect(awaitAccept: false)
        let bob = Wire.user("bob")
        try c.sendRaw(ProxyHeader.v2Signature + [0x20, 0x00, 0, 0] + Wire.join(bob))
        #expect(d.stderr.wait(for: "client connected CLIENT_ADDR=\(c.address) "))
        #expect(c.receiveFrame()?.wire == Wire.join(bob))
    }

    @Test("a missing header (a plain LTB client) and a malformed one close the connection with REASON=proxy_header")
    func missingAndMalformed() throws {
        let d = try Daemon(Self.settings)
        let plain = try d.connect(awaitAccept: false)
        try plain.sendRaw(Wire.join(Wire.user("carol")))
        plain.expectClosed(within: .seconds(2), "(no header)")
        #expect(d.stderr.wait(forLineWith: ["REASON=proxy_header", plain.address, "not a PROXY protocol header"]))
        let bad = try d.connect(awaitAccept: false)
        try bad.sendRaw(Array("PROXY TCP4 1.2.3.4 5.6.7.8 80x 9898\r\n".utf8))
        bad.expectClosed(within: .seconds(2), "(bad port)")
        #expect(d.stderr.wait(forLineWith: ["REASON=proxy_header", bad.address, "port is not a decimal"]))
        #expect(!d.stderr.current.contains("client connected CLIENT_ADDR=\(plain.address)"))
    }

    @Test("a header not complete within 5 s closes the connection")
    func slowHeader() throws {
        let d = try Daemon(Self.settings)
        let c = try d.connect(awaitAccept: false)
        let started = monotonicMs()
        try c.sendRaw(Array("PROXY TCP4 1.2".utf8))
        c.expectClosed(within: .seconds(8), "(slow header)")
        let elapsed = monotonicMs() - started
        #expect(elapsed >= 4_900, "closed after \(elapsed) ms")
        #expect(d.stderr.wait(forLineWith: ["REASON=proxy_header", c.address, "no complete PROXY header within 5s", "14 bytes received"]))
    }

    @Test("a connection from outside proxy_from is refused at accept, logged once per address")
    func outsideProxyFrom() throws {
        let d = try Daemon(["server.proxy_protocol": "yes", "server.proxy_from": "127.0.0.2, 10.0.0.0/8"])
        let a = try d.connect(awaitAccept: false)
        a.expectClosed(within: .seconds(2), "(from 127.0.0.1)")
        let b = try d.connect(awaitAccept: false)
        b.expectClosed(within: .seconds(2), "(again from 127.0.0.1)")
        #expect(d.stderr.wait(forLineWith: ["REASON=proxy_from", "refused \(a.address): not in server.proxy_from"]))
        pause(.milliseconds(200))
        #expect(d.stderr.current.components(separatedBy: "REASON=proxy_from").count - 1 == 1)
        // From an allowed proxy, with a header, it works.
        let ok = try d.connect(sourceIP: "127.0.0.2", awaitAccept: false)
        try ok.sendRaw(v1("198.51.100.9", 1234))
        #expect(d.stderr.wait(for: "client connected CLIENT_ADDR=198.51.100.9:1234 "))
        ok.expectOpen()
    }

    @Test("max_clients_per_ip counts the address in the header, not the proxy's")
    func perIPCountsTheClient() throws {
        let d = try Daemon(Self.settings.merging(["server.max_clients_per_ip": "1"]) { $1 })
        var open: [TestClient] = []
        for (src, port) in [("203.0.113.7", 1000), ("203.0.113.8", 1001)] {
            let c = try d.connect(awaitAccept: false)
            try c.sendRaw(v1(src, port))
            #expect(d.stderr.wait(for: "client connected CLIENT_ADDR=\(src):\(port) "))
            open.append(c)
        }
        let third = try d.connect(awaitAccept: false)
        try third.sendRaw(v1("203.0.113.7", 1002))
        third.expectClosed(within: .seconds(2), "(second from 203.0.113.7)")
        #expect(d.stderr.wait(forLineWith: ["max_clients_per_ip (1) reached for 203.0.113.7", "203.0.113.7:1002"]))
        for c in open { c.expectOpen() }
    }
}
