import COpenSSL
import Glibc
import RoomcastIO
import RoomcastCrypto

// ClientTLS.swift: the client's side of docs/protocol/tls.md §16 with OpenSSL
// (SSL_connect(3), SSL_read(3), SSL_write(3), SSL_get_error(3)), on the
// client's own non-blocking loop: the handshake after TCP connects, then
// records both ways.

extension RoomcastClient {
    /// Starts the handshake on the connected socket; a CA file OpenSSL
    /// refuses ends the attempt with `.tls`.
    func startTLS() {
        guard let settings = configuration.tls else { return didConnect() }
        ERR_clear_error()
        if tlsContext == nil {
            guard let ctx = SSL_CTX_new(TLS_client_method()) else { return connectionEnded(.tls(reason: openSSLErrorReason())) }
            // SSL_write is retried from the same bytes at a moved address when
            // the output buffer grows (SSL_write(3)).
            _ = SSL_CTX_ctrl(ctx, SSL_CTRL_MODE, Int(SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE), nil)
            _ = SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, Int(TLS1_2_VERSION), nil)
            if settings.verify {
                let loaded = settings.caFile.map { SSL_CTX_load_verify_file(ctx, $0) } ?? SSL_CTX_set_default_verify_paths(ctx)
                guard loaded == 1 else {
                    SSL_CTX_free(ctx)
                    return connectionEnded(.tls(reason: "\(settings.caFile ?? "the system's CAs"): " + openSSLErrorReason()))
                }
                SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
            }
            tlsContext = ctx
        }
        guard let ssl = SSL_new(tlsContext), SSL_set_fd(ssl, fd) == 1 else { return connectionEnded(.tls(reason: openSSLErrorReason())) }
        let name = settings.serverName ?? configuration.server.host
        _ = roomcast_tls_set_server_name(ssl, name)
        if settings.verify { _ = SSL_set1_host(ssl, name) }
        SSL_set_connect_state(ssl)
        self.ssl = ssl
        handshaking = true
        continueTLS()
    }

    /// One handshake step: done, the client is connected; otherwise it
    /// waits for the socket, or the attempt ends with OpenSSL's reason.
    func continueTLS() {
        guard let ssl, let watchID else { return }
        ERR_clear_error()
        let r = SSL_do_handshake(ssl)
        if r == 1 {
            handshaking = false
            return didConnect()
        }
        let e = SSL_get_error(ssl, r)
        if e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE {
            do {
                try loop.update(watchID, readable: e == SSL_ERROR_WANT_READ, writable: e == SSL_ERROR_WANT_WRITE)
            } catch {
                connectionEnded(error)
            }
            return
        }
        let verify = SSL_get_verify_result(ssl)
        let reason = verify != X509_V_OK ? String(cString: X509_verify_cert_error_string(verify)) : openSSLErrorReason()
        connectionEnded(.tls(reason: "handshake with \(configuration.server): \(reason)"))
    }

    /// One SSL_read into `scratch`, as `Sys.read` reports a read.
    func tlsRead(_ ssl: OpaquePointer) -> IOResult {
        ERR_clear_error()
        let n = scratch.withUnsafeMutableBytes { SSL_read(ssl, $0.baseAddress, Int32($0.count)) }
        if n > 0 { return .done(Int(n)) }
        return ioResult(ssl, n)
    }

    /// One SSL_write of `bytes` (after WANT_WRITE the next call starts with
    /// the same bytes: `flush` keeps `outputStart` until they are taken).
    func tlsWrite(_ ssl: OpaquePointer, _ bytes: UnsafeRawBufferPointer) -> IOResult {
        ERR_clear_error()
        let n = SSL_write(ssl, bytes.baseAddress, Int32(clamping: bytes.count))
        if n > 0 { return .done(Int(n)) }
        return ioResult(ssl, n)
    }

    private func ioResult(_ ssl: OpaquePointer, _ n: Int32) -> IOResult {
        switch SSL_get_error(ssl, n) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: return .wouldBlock
        case SSL_ERROR_ZERO_RETURN: return .endOfFile  // close_notify
        case SSL_ERROR_SYSCALL:
            let e = errno
            ERR_clear_error()
            return e == 0 ? .endOfFile : .failed(e)
        default:
            tlsError = .tls(reason: openSSLErrorReason())
            return .failed(EPROTO)
        }
    }

    /// Records OpenSSL holds after a bounded read: read on in the next loop turn.
    func readLater() {
        let gen = generation
        loop.schedule(afterMs: 0) { [weak self] in
            guard let self, self.generation == gen, self.ssl != nil else { return }
            self.readAvailableNow()
        }
    }

}
