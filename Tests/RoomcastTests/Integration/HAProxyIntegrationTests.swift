// A real HAProxy from Debian in front of roomcastd (docs/protocol/proxy.md §14):
// TLS terminated there with a certificate made at test time, PROXY v2 to
// the daemon, Python `ssl` clients from distinct loopback addresses. Needs
// haproxy, openssl and python3 (`make deps`); without them it FAILS.
import Foundation
import Glibc
import RoomcastCore
import Testing

private let haproxyPath = "/usr/sbin/haproxy"

private func hexString(_ b: [UInt8]) -> String { b.map { String(format: "%02x", $0) }.joined() }

@Suite("Behind a real HAProxy (TLS there, send-proxy-v2)")
struct HAProxyIntegrationTests {
    @Test("clients' addresses reach logs, JSON addr and max_clients_per_ip; a missing header or a proxy outside proxy_from is refused")
    func tlsClientsThroughHAProxy() throws {
        try #require(FileManager.default.isExecutableFile(atPath: haproxyPath), "haproxy is not installed: run `make deps`")
        let certs = try TestCertificates()
        let dir = certs.dir, cert = certs.cert
        let pem = try String(contentsOfFile: cert, encoding: .utf8) + String(contentsOfFile: certs.key, encoding: .utf8)
        let combined = try dir.write("haproxy.pem", pem)

        let d = try Daemon(["server.proxy_protocol": "yes", "server.proxy_from": "127.0.0.1", "server.max_clients_per_ip": "1",
                            "json.listen": "127.0.0.1:0", "json.proxy_protocol": "yes", "json.proxy_from": "127.0.0.1"])
        let jsonPort = try #require(d.jsonPort)
        let (ltbTLS, jsonTLS, noHeader, outside) = (try freeLoopbackPort(), try freeLoopbackPort(), try freeLoopbackPort(), try freeLoopbackPort())
        let config = """
            global
                maxconn 100
            defaults
                mode tcp
                timeout connect 5s
                timeout client 30s
                timeout server 30s
            frontend ltb
                bind 127.0.0.1:\(ltbTLS) ssl crt \(combined)
                default_backend ltb
            backend ltb
                server roomcastd 127.0.0.1:\(d.port) send-proxy-v2
            frontend json
                bind 127.0.0.1:\(jsonTLS) ssl crt \(combined)
                default_backend json
            backend json
                server roomcastd 127.0.0.1:\(jsonPort) send-proxy-v2
            frontend noheader
                bind 127.0.0.1:\(noHeader) ssl crt \(combined)
                default_backend noheader
            backend noheader
                server roomcastd 127.0.0.1:\(d.port)
            frontend outside
                bind 127.0.0.1:\(outside) ssl crt \(combined)
                default_backend outside
            backend outside
                server roomcastd 127.0.0.1:\(d.port) send-proxy-v2 source 127.0.0.5

            """
        let cfg = try dir.write("haproxy.cfg", config)
        let haproxy = try ChildProcess(URL(fileURLWithPath: haproxyPath), ["-db", "-f", cfg], environment: childEnvironment([:]))
        defer {
            haproxy.kill(SIGTERM)
            if haproxy.waitForExit(timeout: .seconds(5)) == nil { haproxy.kill(SIGKILL) }
        }
        try #require(waitUntil(.seconds(10)) { (try? TestClient(host: "127.0.0.1", port: outside)) != nil },
                     "haproxy did not listen; stderr: \(haproxy.stderr.current)")

        let alice = Wire.user("alice"), bob = Wire.user("bob"), eve = Wire.user("eve")
        let nickname = JSONFrameCodec.encode(Array(#"{"cmd":"nickname","nickname":"jo"}"#.utf8))
        let clients: [[String: Any]] = [
            ["src": "127.0.0.2", "port": ltbTLS, "send": hexString(Wire.join(alice))],
            ["src": "127.0.0.3", "port": ltbTLS, "send": hexString(Wire.join(bob))],
            ["src": "127.0.0.2", "port": ltbTLS, "send": hexString(Wire.join(eve))],  // a second from 127.0.0.2
            ["src": "127.0.0.4", "port": jsonTLS, "send": hexString(nickname)],
            ["src": "127.0.0.6", "port": noHeader, "send": hexString(Wire.join(eve))],
            ["src": "127.0.0.7", "port": outside, "send": hexString(Wire.join(eve))],
        ]
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Reference/tls_proxy_clients.py").path
        let spec = String(decoding: try JSONSerialization.data(withJSONObject: clients), as: UTF8.self)
        let output = try runTool("/usr/bin/python3", [script, spec, cert, "3"])
        let results = try output.split(separator: "\n").map {
            try #require(JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
        try #require(results.count == clients.count, "python said: \(output)")
        let got = results.map { ($0["got"] as? String) ?? "" }
        let closed = results.map { ($0["closed"] as? Bool) ?? false }

        // The addresses the clients connected from are the daemon's clients.
        #expect(d.stderr.wait(for: "client connected CLIENT_ADDR=127.0.0.2:"))
        #expect(d.stderr.wait(for: "client connected CLIENT_ADDR=127.0.0.3:"))
        #expect(d.stderr.wait(forLineWith: ["alice joined lobby", "CLIENT_ADDR=127.0.0.2:"]))
        #expect(d.stderr.wait(forLineWith: ["bob joined lobby", "CLIENT_ADDR=127.0.0.3:"]))
        #expect(got[0].hasPrefix(hexString(Wire.join(alice))) && !closed[0], "alice: \(results[0])")
        #expect(got[1].hasPrefix(hexString(Wire.join(bob))) && !closed[1], "bob: \(results[1])")
        // max_clients_per_ip = 1 counts 127.0.0.2, not HAProxy's 127.0.0.1.
        #expect(closed[2] && !got[2].contains(hexString(Wire.join(eve))), "second from 127.0.0.2: \(results[2])")
        #expect(d.stderr.wait(forLineWith: ["max_clients_per_ip (1) reached for 127.0.0.2"]))
        // JSON addr is the client's.
        let jsonBody = try #require(got[3].count > 8 ? got[3] : nil, "the JSON client got nothing: \(results[3])")
        let bytes = stride(from: 0, to: jsonBody.count, by: 2).map { UInt8(jsonBody.dropFirst($0).prefix(2), radix: 16)! }
        let join = try #require(try JSONSerialization.jsonObject(with: Data(bytes[4...])) as? [String: Any])
        #expect(join["cmd"] as? String == "join")
        #expect((join["addr"] as? String)?.hasPrefix("127.0.0.4:") == true, "\(join)")
        // No header, and a proxy outside proxy_from: refused.
        #expect(closed[4] && got[4].isEmpty, "no header: \(results[4])")
        #expect(d.stderr.wait(forLineWith: ["REASON=proxy_header", "not a PROXY protocol header"]))
        #expect(closed[5] && got[5].isEmpty, "outside proxy_from: \(results[5])")
        #expect(d.stderr.wait(forLineWith: ["REASON=proxy_from", "refused 127.0.0.5:"]))
        #expect(!d.stderr.current.contains("client connected CLIENT_ADDR=127.0.0.1:"), "the proxy is not a client")
        print("haproxy test: daemon lines:\n" + d.stderr.current.split(separator: "\n")
            .filter { $0.contains("client connected") || $0.contains("REASON=proxy") || $0.contains("max_clients_per_ip") }
            .joined(separator: "\n"))
    }
}
