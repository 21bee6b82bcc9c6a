// TLS in the daemon (docs/protocol/tls.md §16): Python `ssl` clients and
// `openssl s_client` against the real roomcastd, certificates made by
// `openssl req` in a temporary directory. The peers are
// Reference/tls_peer.py (one case per run, bounded in time).
import Foundation
import Glibc
import RoomcastCore
import Testing

/// Certificates for one test: a self-signed server certificate (CN and SAN
/// localhost, 127.0.0.1), and on demand a CA with a client certificate.
struct TestCertificates {
    let dir: TempDirectory
    var cert: String { dir.path + "/cert.pem" }
    var key: String { dir.path + "/key.pem" }

    init() throws {
        dir = try TempDirectory()
        try Self.selfSigned(cert: cert, key: key)
    }

    static func selfSigned(cert: String, key: String, cn: String = "localhost") throws {
        let r = try runProcess("/usr/bin/openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                                             "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=\(cn)",
                                             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        guard r.status == 0 else { throw HarnessError("openssl req: \(r.err)") }
        chmod(key, 0o600)
    }

    /// A CA (`name`-ca.pem) and a client certificate it signed (`name`.pem, `name`-key.pem).
    func clientCA(_ name: String) throws -> (ca: String, cert: String, key: String) {
        let p = dir.path + "/" + name
        try Self.selfSigned(cert: p + "-ca.pem", key: p + "-ca-key.pem", cn: name + " CA")
        for args in [["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", p + "-key.pem",
                      "-out", p + ".csr", "-subj", "/CN=\(name) client"],
                     ["x509", "-req", "-in", p + ".csr", "-CA", p + "-ca.pem", "-CAkey", p + "-ca-key.pem", "-CAcreateserial",
                      "-out", p + ".pem", "-days", "1"]] {
            let r = try runProcess("/usr/bin/openssl", args)
            guard r.status == 0 else { throw HarnessError("openssl \(args[0]): \(r.err)") }
        }
        return (p + "-ca.pem", p + ".pem", p + "-key.pem")
    }
}

/// Runs one case of tls_peer.py and returns its JSON answer.
private func peer(_ name: String, _ params: [String: Any]) throws -> [String: Any] {
    let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Reference/tls_peer.py").path
    let spec = String(decoding: try JSONSerialization.data(withJSONObject: params), as: UTF8.self)
    let r = try runProcess("/usr/bin/python3", [script, name, spec])
    guard r.status == 0, let line = r.out.split(separator: "\n").last,
          let answer = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
        throw HarnessError("tls_peer.py \(name) exited with \(r.status): \(r.out) \(r.err)")
    }
    return answer
}

@Suite("TLS listeners (OpenSSL 3) against Python ssl and openssl s_client")
struct TLSIntegrationTests {
    static func settings(_ certs: TestCertificates, _ extra: [String: String] = [:]) -> [String: String] {
        ["json.listen": "127.0.0.1:0", "json.listen_tls": "127.0.0.1:0", "server.listen_tls": "127.0.0.1:0",
         "tls.cert_file": certs.cert, "tls.key_file": certs.key].merging(extra) { $1 }
    }

    @Test("TLS and plain clients share a room; a 40 KB message crosses as several records; STATUS counts TLS clients")
    func chat() throws {
        let certs = try TestCertificates()
        let d = try Daemon(Self.settings(certs))
        let tls = try #require(d.tlsPorts["json"]), plain = try #require(d.jsonPort)
        #expect(d.tlsPorts["ltb"] != nil)
        let r = try peer("chat", ["ca": certs.cert, "tls": Int(tls), "plain": Int(plain)])
        #expect(r["version"] as? String == "TLSv1.3")
        let expected: [[AnyHashable]] = [["msg", "alice", 5], ["msg", "alice", 40000]]
        #expect((r["b"] as? [[AnyHashable]]) == expected, "TLS recipient: \(r)")
        #expect((r["c"] as? [[AnyHashable]]) == expected, "plain recipient: \(r)")
        #expect((r["a"] as? [[AnyHashable]])?.last == ["msg", "carol", 4], "plain to TLS: \(r)")
        #expect(d.notify.wait({ $0.contains("TLS: ") && $0.contains("2 handshakes") }) != nil,
                "STATUS: \(d.notify.all.map(\.lines).suffix(3))")
    }

    @Test("hostile: plaintext, a stalled handshake, TLS 1.0, a renegotiation each cost their sender only")
    func hostile() throws {
        let certs = try TestCertificates()
        let d = try Daemon(Self.settings(certs, ["tls.handshake_timeout": "1s"]))
        let tls = try #require(d.tlsPorts["json"])
        let r = try peer("hostile", ["ca": certs.cert, "tls": Int(tls), "timeout_s": 1])
        #expect(r["before"] as? Bool == true && r["during"] as? Bool == true && r["after"] as? Bool == true,
                "the good clients kept chatting: \(r)")
        let plaintext = try #require(r["plaintext_closed_s"] as? Double, "plaintext left open: \(r)")
        #expect(plaintext < 1)
        #expect(d.stderr.wait(forLineWith: ["REASON=tls_handshake", "wrong version number"]))
        let stall = try #require(r["stall_closed_s"] as? Double, "stalled handshake left open: \(r)")
        #expect(stall >= 0.9 && stall < 4, "closed after handshake_timeout (1 s): \(stall) s")
        #expect(d.stderr.wait(forLineWith: ["REASON=tls_handshake_timeout", "no TLS handshake within tls.handshake_timeout (1s)"]))
        #expect(r["tls10_refused"] as? Bool == true, "TLS 1.0: \(r["tls10_output"] ?? "")")
        #expect(d.stderr.wait(forLineWith: ["REASON=tls_handshake", "unsupported protocol"]))
        #expect(r["reneg_ended"] as? Bool == true && (r["reneg_output"] as? String)?.contains("no renegotiation") == true,
                "renegotiation: \(r["reneg_output"] ?? "")")
        #expect(d.notify.wait({ $0.contains("TLS: ") && $0.contains("2 failed, 1 timed out") }) != nil,
                "STATUS: \(d.notify.all.map(\.lines).suffix(2))")
        #expect(d.child.process.isRunning)
    }

    @Test("client_auth = required: a certificate from another CA, or none, is refused; one from ca_file is accepted")
    func clientCertificates() throws {
        let certs = try TestCertificates()
        let good = try certs.clientCA("good"), other = try certs.clientCA("other")
        let d = try Daemon(Self.settings(certs, ["tls.client_auth": "required", "tls.ca_file": good.ca]))
        let tls = Int(try #require(d.tlsPorts["json"]))
        let ok = try peer("connect", ["ca": certs.cert, "tls": tls, "cert": good.cert, "key": good.key])
        #expect(ok["joined"] as? Bool == true, "\(ok)")
        let wrong = try peer("connect", ["ca": certs.cert, "tls": tls, "cert": other.cert, "key": other.key])
        #expect(wrong["joined"] as? Bool == false, "\(wrong)")
        #expect(d.stderr.wait(forLineWith: ["REASON=tls_handshake", "certificate verify failed"]))
        let none = try peer("connect", ["ca": certs.cert, "tls": tls])
        #expect(none["joined"] as? Bool == false, "\(none)")
        #expect(d.stderr.wait(forLineWith: ["REASON=tls_handshake", "peer did not return a certificate"]))
        let again = try peer("connect", ["ca": certs.cert, "tls": tls, "cert": good.cert, "key": good.key])
        #expect(again["joined"] as? Bool == true, "the refusals cost nobody else: \(again)")
    }

    @Test("proxy_protocol on a listen_tls listener: the PROXY header, then the handshake, in one segment; addr is the header's")
    func proxyBeforeTLS() throws {
        let certs = try TestCertificates()
        let d = try Daemon(Self.settings(certs, ["json.proxy_protocol": "yes", "json.proxy_from": "127.0.0.1"]))
        let r = try peer("proxy", ["ca": certs.cert, "tls": Int(try #require(d.tlsPorts["json"]))])
        #expect(r["addr"] as? String == "10.1.2.3:5555", "\(r)")
        #expect(r["version"] as? String == "TLSv1.3")
    }

    @Test("SIGHUP with a new certificate while 1,000 TLS clients chat: none dropped, new clients see it; a bad file keeps it")
    func reloadWhileChatting() throws {
        let certs = try TestCertificates()
        let next = (cert: certs.dir.path + "/next.pem", key: certs.dir.path + "/next-key.pem")
        try TestCertificates.selfSigned(cert: next.cert, key: next.key)
        let d = try Daemon(Self.settings(certs, ["log.level": "info", "server.max_clients": "2000"]))
        let tls = Int(try #require(d.tlsPorts["json"]))
        let caOld = certs.dir.path + "/old-ca.pem"
        try FileManager.default.copyItem(atPath: certs.cert, toPath: caOld)
        let r = try peer("reload", ["tls": tls, "n": 1000, "pid": Int(d.child.pid), "ca_old": caOld, "ca_new": next.cert,
                                    "cert": certs.cert, "key": certs.key, "new_cert": next.cert, "new_key": next.key])
        #expect(r["closed"] as? Int == 0 && r["missing"] as? Int == 0, "every client stayed and got every round: \(r)")
        #expect(r["new_cert_seen"] as? Bool == true && r["old_ca_accepted_after"] as? Bool == false, "\(r)")
        #expect(d.stderr.wait(forLineWith: ["TLS certificate reloaded from \(certs.cert)"], timeout: .seconds(30)))
        // A bad file: the running certificate stays, and the log says why.
        try "not a certificate\n".write(toFile: certs.cert, atomically: true, encoding: .utf8)
        kill(d.child.pid, SIGHUP)
        #expect(d.stderr.wait(forLineWith: ["TLS reload failed, keeping the certificate in use", "tls.cert_file", "no start line"], timeout: .seconds(30)))
        let probe = try peer("connect", ["ca": next.cert, "tls": tls])
        #expect(probe["joined"] as? Bool == true, "\(probe)")
        #expect(!d.stderr.current.contains("PRIVATE KEY"), "no key material in the log")
    }

    @Test("a certificate or key OpenSSL refuses, or a key file others can read, stops the start with the file's line and the reason")
    func badFilesRefuseTheStart() throws {
        let certs = try TestCertificates()
        let dir = try TempDirectory()
        let garbage = try TestKeys.writeKeyFile(dir, "-----BEGIN PRIVATE KEY-----\nc2VjcmV0IGtleSBieXRlcw==\n-----END PRIVATE KEY-----\n",
                                                            name: "garbage.pem")
        let other = (cert: dir.path + "/o.pem", key: dir.path + "/o-key.pem")
        try TestCertificates.selfSigned(cert: other.cert, key: other.key)
        // The real key, readable by everyone: refused as [auth] key_file is, before OpenSSL sees it.
        let readable = try TestKeys.writeKeyFile(dir, String(decoding: try #require(FileManager.default.contents(atPath: certs.key)), as: UTF8.self),
                                                             name: "readable-key.pem", mode: 0o644)
        for (key, cert, needle) in [(garbage, certs.cert, ":5: tls.key_file: \(garbage): "),
                                    (readable, certs.cert, ":5: tls.key_file: \(readable): mode 644 lets group or others at the keys"),
                                    (certs.key, garbage, ":4: tls.cert_file: \(garbage): "),
                                    (other.key, certs.cert, ":5: tls.key_file: \(other.key): error:05800074:x509 certificate routines::key values mismatch")] {
            let conf = try dir.write("r.conf", "[server]\nlisten = 127.0.0.1:0\n[tls]\ncert_file = \(cert)\nkey_file = \(key)\n"
                                     + "[json]\nlisten_tls = 127.0.0.1:0\n")
            let r = try runRoomcastd(["--config", conf])
            #expect(r.status == 78, "\(r.stderr)")
            #expect(r.stderr.contains(needle), "\(r.stderr)")
            #expect(!r.stderr.contains("c2VjcmV0"), "key bytes never reach the log")
        }
    }

    /// Socket activation (roomcastd(8)): the names `tls`, `json-tls` and
    /// `websocket-tls` are TLS listeners of their dialect, with `[tls]`'s
    /// certificate and no `listen_tls` in the file (systemd holds the sockets).
    @Test("socket activation: sockets named tls, json-tls and websocket-tls are TLS listeners with [tls]'s certificate, no listen_tls needed")
    func socketActivationNames() throws {
        let certs = try TestCertificates()
        let ports = try (0..<4).map { _ in try freeLoopbackPort() }
        let d = try Daemon(["tls.cert_file": certs.cert, "tls.key_file": certs.key],
                           socketActivation: [("ltb", ports[0]), ("tls", ports[1]), ("json-tls", ports[2]), ("websocket-tls", ports[3])])
        #expect(d.stderr.wait(for: "Listening on 127.0.0.1:\(ports[3])"), "systemd-socket-activate: \(d.stderr.current)")
        _ = try TestClient(host: "127.0.0.1", port: ports[0], owner: d)  // starts the daemon
        for (port, name) in zip(ports, ["ltb", "ltb+tls", "json+tls", "websocket+tls"]) {
            #expect(d.stderr.wait(forLineWith: ["listening on 127.0.0.1:\(port) (\(name))"]), "\(name): \(d.stderr.current.suffix(800))")
        }
        #expect(!d.stderr.current.contains("tls_not_configured"), "\(d.stderr.current.suffix(800))")
        // Clients over these sockets under the real systemd: systemd/test-systemd.py, "TLS listeners through sockets named ...".
    }

    @Test("roomcast speaks TLS: --ca-file verifies, --tls alone refuses a self-signed certificate, --insecure does not check")
    func commandLineClient() throws {
        let certs = try TestCertificates()
        let d = try Daemon(Self.settings(certs))
        let port = try #require(d.tlsPorts["ltb"])
        let listener = try RoomcastCommand(["listen", "--ca-file", certs.cert, "-s", "localhost:\(port)", "-n", "bob"])
        #expect(listener.waitForStderr("listening in the default room as bob"), "\(listener.stderr)")
        let sent = try RoomcastCommand(["send", "--ca-file", certs.cert, "-s", "localhost:\(port)", "-n", "alice", "text", "hello over TLS"]).finish()
        #expect(sent.status == 0, "\(sent.stderr)")
        #expect(listener.waitForStdout("alice: hello over TLS"), "\(listener.stdout)")
        let refused = try RoomcastCommand(["send", "--tls", "-s", "localhost:\(port)", "-n", "eve", "text", "x"]).finish(seconds: 30)
        #expect(refused.status == 1 && refused.stderr.contains("TLS: handshake with localhost:\(port): self-signed certificate"), "\(refused.stderr)")
        let insecure = try RoomcastCommand(["send", "--insecure", "-s", "127.0.0.1:\(port)", "-n", "mallory", "text", "unchecked"]).finish()
        #expect(insecure.status == 0, "\(insecure.stderr)")
        #expect(listener.waitForStdout("mallory: unchecked"))
        #expect(!listener.stdout.contains("eve"), "the refused client never joined")
    }
}
