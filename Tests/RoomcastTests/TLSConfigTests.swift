// `[tls]` and `listen_tls` (TLSSection.swift): parsing, defaults and the
// rules that refuse a start.
import Testing
@testable import RoomcastCore

@Suite("[tls] and listen_tls")
struct TLSConfigTests {
    @Test func defaults() {
        let t = Config.defaults.tls
        #expect(t.certFile == "" && t.keyFile == "" && t.caFile == "")
        #expect(t.clientAuth == .none && t.minVersion == .tls12 && t.handshakeTimeoutMs == 10_000)
        #expect(Config.defaults.allTLSListen.isEmpty)
    }

    @Test func everyKeyAndEverySection() throws {
        let c = try Config.parse("""
            [server]
            listen_tls = 127.0.0.1:9888
            [json]
            listen_tls = 127.0.0.1:9889
            listen_tls = [::1]:9889
            [websocket]
            listen_tls = 127.0.0.1:9887
            proxy_protocol = yes
            proxy_from = 10.0.0.0/8
            [tls]
            cert_file = /etc/roomcast/cert.pem
            key_file = /etc/roomcast/key.pem
            ca_file = /etc/roomcast/ca.pem
            client_auth = optional
            min_version = 1.3
            handshake_timeout = 2s
            """, file: "t.conf")
        #expect(c.server.listenTLS.map(\.description) == ["127.0.0.1:9888"])
        #expect(c.json.listenTLS.map(\.description) == ["127.0.0.1:9889", "[::1]:9889"])
        #expect(c.webSocket.listenTLS.map(\.description) == ["127.0.0.1:9887"])
        #expect(c.server.listen == Config.defaults.server.listen, "listen_tls does not replace listen")
        #expect(c.webSocket.proxy.enabled && c.webSocket.proxy.allows([10, 1, 2, 3]) && !c.webSocket.proxy.allows([11, 1, 2, 3]))
        #expect(c.tls.certFile == "/etc/roomcast/cert.pem" && c.tls.keyFile == "/etc/roomcast/key.pem" && c.tls.caFile == "/etc/roomcast/ca.pem")
        #expect(c.tls.clientAuth == .optional && c.tls.minVersion == .tls13 && c.tls.handshakeTimeoutMs == 2_000)
        #expect(c.tls.lines["cert_file"] == 11 && c.tls.lines["key_file"] == 12)
    }

    @Test(arguments: [
        ("[json]\nlisten_tls = 127.0.0.1:1\n", "t.conf:2: listen_tls needs tls.cert_file and tls.key_file"),
        ("[tls]\ncert_file = /c.pem\n[server]\nlisten_tls = 127.0.0.1:1\n", "t.conf:4: listen_tls needs tls.cert_file and tls.key_file"),
        ("[tls]\nclient_auth = required\n", "t.conf:2: tls.client_auth = required needs tls.ca_file"),
        ("[tls]\nmin_version = 1.1\n", "t.conf:2: tls.min_version: '1.1' is not one of 1.2, 1.3"),
        ("[tls]\nclient_auth = yes\n", "t.conf:2: tls.client_auth: 'yes' is not one of none, optional, required"),
        ("[tls]\ncert_file = cert.pem\n", "t.conf:2: tls.cert_file: 'cert.pem' is not an absolute path"),
        ("[tls]\nhandshake_timeout = 10min\n", "t.conf:2: tls.handshake_timeout: '10min' is out of range"),
        ("[server]\nlisten = 127.0.0.1:1\nlisten_tls = 127.0.0.1:1\n", "t.conf:3: server.listen_tls: 127.0.0.1:1 is already listed at line 2"),
        ("[websocket]\nproxy_protocol = yes\n", "t.conf:2: websocket.proxy_protocol = yes needs websocket.proxy_from"),
    ])
    func refused(text: String, message: String) {
        #expect(throws: ConfigError.self) { try Config.parse(text, file: "t.conf") }
        do {
            _ = try Config.parse(text, file: "t.conf")
        } catch {
            #expect(error.description.hasPrefix(message), "\(error)")
        }
    }

    @Test func listenTLSNeedsARestart() throws {
        let old = try Config.parse("[tls]\ncert_file = /c\nkey_file = /k\n[json]\nlisten_tls = 127.0.0.1:1\n", file: "a")
        let new = try Config.parse("[tls]\ncert_file = /c2\nkey_file = /k\n[json]\nlisten_tls = 127.0.0.1:2\n", file: "b")
        let plan = old.reloadPlan(to: new, listenOverridden: false, socketActivated: false)
        #expect(plan.needRestart == ["listen_tls"])
        #expect(plan.applied.json.listenTLS == old.json.listenTLS && plan.applied.tls.certFile == "/c2")
    }
}
