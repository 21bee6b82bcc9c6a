// TLS clients at a restart (docs/protocol/tls.md §16): a TLS session cannot move
// to the next process, so each TLS client gets the notice `restarting` with
// `retry_after_ms`, then close_notify, while plain clients are handed over.
// In-process, as HandOverTests: socketpairs, a fake fd store, a manual
// clock; the TLS client is OpenSSL's, driven by the test.
import COpenSSL
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("TLS clients at a hand-over")
struct TLSHandOverTests {
    @Test("a TLS client gets 'restarting' with retry_after_ms, then close_notify; plain clients are handed over; the journal line counts it")
    func tlsClientsAreToldAndClosed() throws {
        let certs = try TestCertificates()
        var settings = Config.TLS()
        settings.certFile = certs.cert
        settings.keyFile = certs.key
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(HandOverTests.config, clock: clock)
        a.server.tls.context = try TLSContext(settings)
        let plain = a.connect()

        var sv: [Int32] = [-1, -1]
        _ = socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0, &sv)
        a.server.startHandshake(sv[0], .ltb, address: "peer-tls", now: clock.nowMs)
        let ctx = try #require(SSL_CTX_new(TLS_client_method()))
        defer { SSL_CTX_free(ctx) }
        let ssl = try #require(SSL_new(ctx))
        defer { SSL_free(ssl) }
        SSL_set_fd(ssl, sv[1])
        SSL_set_connect_state(ssl)
        var done = false
        for _ in 0..<50 where !(done && a.server.tls.connections == 1) {
            if !done { done = SSL_do_handshake(ssl) == 1 }
            try a.tick()
        }
        try #require(done && a.server.tls.connections == 1, "the handshake completed on both sides")

        let join = HandOverTests.join("tls-alice", room: "lobby")
        #expect(join.withUnsafeBytes { SSL_write(ssl, $0.baseAddress, Int32($0.count)) } == Int32(join.count))
        HandOverTests.send(plain.peer, HandOverTests.join("bob", room: "lobby"))
        try a.tick()
        try a.tick()
        #expect(a.server.relay.roomCount == 1 && a.server.table.count == 2)

        let b = try HandOverTests.handOver(a)
        #expect(b.server.table.count == 1, "only the plain client is handed over")
        #expect(b.server.relay.name(of: b.server.table.ids[0]) == "bob")
        #expect(a.log.contains("1 TLS client closed with close_notify"), "the hand-over's journal line counts it")

        // What the TLS client reads: its room's frames, the notice, then close_notify.
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        var closeNotify = false
        for _ in 0..<100 {
            let n = buffer.withUnsafeMutableBytes { SSL_read(ssl, $0.baseAddress, Int32($0.count)) }
            if n > 0 { bytes += buffer[0..<Int(n)]; continue }
            let e = SSL_get_error(ssl, n)
            if e == SSL_ERROR_ZERO_RETURN { closeNotify = true; break }
            if e != SSL_ERROR_WANT_READ { break }
            usleep(1_000)
        }
        let notices = HandOverTests.frames(bytes).filter { $0.0 == 9 }.compactMap { try? Notice(protobuf: $0.1) }
        #expect(notices.map(\.code) == ["restarting"] && notices.first?.retryAfterMs == 1_000, "\(HandOverTests.frames(bytes).map(\.0))")
        #expect(closeNotify, "close_notify after the notice")
        close(sv[1])
        close(plain.peer)
    }
}
