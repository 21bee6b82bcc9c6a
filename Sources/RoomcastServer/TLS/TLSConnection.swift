import COpenSSL
import Glibc
import RoomcastCore
import RoomcastIO
import RoomcastCrypto

// TLSConnection.swift: reading, writing and closing an established TLS
// connection with OpenSSL's non-blocking contract (SSL_read(3),
// SSL_write(3), SSL_get_error(3), SSL_shutdown(3)).

enum TLSIO {
    /// Empties this thread's OpenSSL error queue, as SSL_get_error(3) asks
    /// before each SSL_read(3) or SSL_write(3). Peeks first: the queue is
    /// almost always empty (every failure path here clears it), and
    /// ERR_clear_error(3) walks and frees all of its 16 entries each time,
    /// about 800 instructions per call (callgrind, OpenSSL 3.0), where
    /// ERR_peek_error(3) only finds the thread's queue.
    @inline(__always)
    static func clearErrors() {
        if ERR_peek_error() != 0 { ERR_clear_error() }
    }

    /// One SSL_write(3) of `bytes` (at most one record of 16 KiB is taken:
    /// SSL_MODE_ENABLE_PARTIAL_WRITE). After a `.wouldBlock` the next call
    /// must begin with the same bytes, at least as many (OpenSSL holds the
    /// encrypted record; SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER lets them move):
    /// the fan-out keeps what was not reported written at the head of the
    /// connection's queue, so that is what it sends.
    /// - Returns: `.done(n)` plaintext bytes taken; `.wouldBlock` for
    ///   WANT_WRITE (or WANT_READ); `.failed(errno)` otherwise (EPIPE after a
    ///   close_notify or EOF, EPROTO for a TLS error).
    @inline(never)
    static func write(_ ssl: OpaquePointer, _ bytes: UnsafeRawBufferPointer) -> IOResult {
        clearErrors()
        let n = SSL_write(ssl, bytes.baseAddress, Int32(clamping: bytes.count))
        if n > 0 { return .done(Int(n)) }
        switch SSL_get_error(ssl, n) {
        case SSL_ERROR_WANT_WRITE, SSL_ERROR_WANT_READ: return .wouldBlock
        case SSL_ERROR_SYSCALL:
            let e = errno
            ERR_clear_error()
            return .failed(e != 0 ? e : EPIPE)
        case SSL_ERROR_ZERO_RETURN: return .failed(EPIPE)
        default:
            ERR_clear_error()
            return .failed(EPROTO)
        }
    }
}

extension Server {
    /// Reads what TLS connection `id` sent: SSL_read(3) until OpenSSL wants
    /// more from the socket, at most `readsPerWakeup` records per turn (the
    /// rest is read next turn, `TLSState.readAgain`: bytes buffered inside
    /// OpenSSL do not wake epoll). close_notify or EOF ends the connection
    /// as an EOF does; a TLS error closes it.
    func readTLS(_ id: Int, _ ssl: OpaquePointer) {
        for _ in 0..<Self.readsPerWakeup {
            guard table.isOpen(id) else { return }
            TLSIO.clearErrors()
            let n = scratch.withUnsafeMutableBytes { SSL_read(ssl, $0.baseAddress, Int32($0.count)) }
            if n > 0 {
                consume(id, count: Int(n))
                continue
            }
            switch SSL_get_error(ssl, n) {
            case SSL_ERROR_WANT_READ:
                return
            case SSL_ERROR_WANT_WRITE:
                // A record OpenSSL must send before it reads on (an alert, a
                // key update answer): the read resumes when the socket is writable.
                table.slots[id]!.tlsReadWantsWrite = true
                setWriteInterest(id, true)
                return
            case SSL_ERROR_ZERO_RETURN:
                peerClosed(id)
                return
            case SSL_ERROR_SYSCALL:
                let e = errno
                ERR_clear_error()
                if e == 0 { peerClosed(id) } else { table.close(id, SystemError("SSL_read", errno: e).description) }
                return
            default:
                let why = "TLS: \(openSSLErrorReason())"
                logger.peerWarning(reason: "tls_error", nowMs: clock(), "\(table.address(of: id)): \(why); closing",
                                   ["CLIENT_ADDR": table.address(of: id), "DETAIL": why])
                table.close(id, why)
                return
            }
        }
        if table.isOpen(id), SSL_has_pending(ssl) == 1 { tls.readAgain.append(id) }
    }

    /// The connections the last turn left with bytes inside OpenSSL.
    func readTLSAgain() {
        let ids = tls.readAgain
        tls.readAgain.removeAll(keepingCapacity: true)
        for id in ids where table.isOpen(id) && !handOver.pending {
            if let ssl = table.slots[id]!.tls { readTLS(id, ssl) }
        }
    }

    /// The socket of TLS connection `id`, whose read wanted a write, is writable.
    func resumeTLSRead(_ id: Int) {
        table.slots[id]!.tlsReadWantsWrite = false
        if table.fanout.outboxes[id].pending == 0 { setWriteInterest(id, false) }
        if table.isOpen(id), !handOver.pending, let ssl = table.slots[id]!.tls { readTLS(id, ssl) }
    }

    /// Sends close_notify (one non-blocking try: a peer that does not read
    /// loses it, RFC 8446 §6.1 asks no more), frees the SSL and closes the socket.
    func closeTLS(_ ssl: OpaquePointer, _ fd: Int32) {
        ERR_clear_error()
        _ = SSL_shutdown(ssl)
        ERR_clear_error()
        SSL_free(ssl)
        Sys.close(fd)
    }
}

extension Server {
    /// `open` of a connection whose handshake is done: the session goes
    /// beside its descriptor and into its outbox, and is counted.
    func adoptTLS(_ id: Int, _ ssl: OpaquePointer) {
        table.slots[id]!.tls = ssl
        table.fanout.outboxes[id].tls = ssl
        tls.connections += 1
        if roomcast_tls_ktls_send(ssl) == 1 { tls.kernelTLS += 1 }
    }

    /// `release` of a TLS connection: close_notify, SSL freed, socket closed.
    func releaseTLS(_ id: Int, _ ssl: OpaquePointer) {
        forgetTLS(id, ssl)
        closeTLS(ssl, table.slots[id]!.fd)
    }

    /// `id` no longer has its session (the caller frees the SSL): uncounted,
    /// out of the slot and the outbox.
    func forgetTLS(_ id: Int, _ ssl: OpaquePointer) {
        tls.connections -= 1
        if roomcast_tls_ktls_send(ssl) == 1 { tls.kernelTLS -= 1 }
        table.slots[id]!.tls = nil
        table.fanout.outboxes[id].tls = nil
    }
}
