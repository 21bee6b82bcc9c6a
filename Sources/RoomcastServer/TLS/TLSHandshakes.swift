import COpenSSL
import Glibc
import RoomcastCore
import RoomcastIO
import RoomcastCrypto

/// The daemon's TLS state (`[tls]`, docs/protocol/tls.md §16): the context new
/// connections are made from, the handshakes in progress, the connections
/// whose OpenSSL buffers hold bytes epoll cannot see, and the counters of
/// STATUS and the stats line.
struct TLSState {
    /// The current context (nil: no `listen_tls`). Replaced on SIGHUP.
    var context: TLSContext?
    var pending = PendingTLSHandshakes()
    /// TLS connections whose last read stopped at the per-wakeup bound with
    /// bytes still inside OpenSSL (SSL_has_pending(3)): read again next turn,
    /// since no readiness event will come for them.
    var readAgain: [Int] = []
    /// Handshakes completed, failed (bad hello, wrong version, refused
    /// certificate, plaintext) and timed out (`handshake_timeout`), since start.
    var handshakes: UInt64 = 0
    var failures: UInt64 = 0
    var timeouts: UInt64 = 0
    /// Open TLS connections, and those whose sends the kernel encrypts (kTLS).
    var connections = 0
    var kernelTLS = 0

    /// `TLS: 3 clients (0 kTLS), 5 handshakes, 1 failed, 0 timed out`.
    var summary: String {
        "TLS: \(plural(connections, "client")) (\(kernelTLS) kTLS), \(plural(Int(handshakes), "handshake")), "
            + "\(failures) failed, \(timeouts) timed out"
    }
}

/// Connections accepted on a `listen_tls` listener whose handshake is not
/// done. Not clients yet: no slot in the connection table, no room, no
/// heartbeat; each has `handshake_timeout` to finish.
struct PendingTLSHandshakes {
    struct Pending {
        var fd: Int32
        var ssl: OpaquePointer
        var dialect: Dialect
        /// The client's address (a PROXY header's, behind a proxy).
        var address: String
        /// Bytes read before the handshake (after a PROXY header) are fed to
        /// OpenSSL from a memory BIO first; then the socket's BIO takes over.
        var prefix: OpaquePointer?
        var registration: Registration?
    }

    /// In accept order: in deadline order while `handshake_timeout` does not
    /// shrink on a reload (DeadlineSlots).
    var slots = DeadlineSlots<Pending>()
    var count: Int { slots.count }

    mutating func add(_ p: Pending, deadline: UInt64) -> Int { slots.add(p, deadline: deadline) }
    /// Frees `slot`; its descriptor and SSL are the caller's.
    mutating func remove(_ slot: Int) -> Pending? { slots.remove(slot) }
    mutating func nextDeadline() -> UInt64? { slots.nextDeadline() }
    mutating func expired(now: UInt64) -> [Int] { slots.expired(now: now) }
}

extension Server {
    /// An admitted connection on a `listen_tls` listener: its handshake
    /// starts (and goes as far as the bytes already here allow).
    /// - Parameter prefix: bytes read from the socket before (after a PROXY header).
    func startHandshake(_ fd: Int32, _ dialect: Dialect, address: String, prefix: ArraySlice<UInt8> = [], now: UInt64) {
        guard let context = tls.context else { Sys.close(fd); return }
        if table.count + tls.pending.count + listeners.pending.count >= config.server.maxClients {
            logger.peerWarning(reason: "max_clients", nowMs: now,
                               "refused \(address): server.max_clients (\(config.server.maxClients)) reached",
                               ["CLIENT_ADDR": address])
            Sys.close(fd)
            return
        }
        ERR_clear_error()
        guard let ssl = SSL_new(context.ctx), SSL_set_fd(ssl, fd) == 1 else {
            logger.error("cannot start TLS for \(address): \(openSSLErrorReason())", ["CLIENT_ADDR": address, "REASON": "tls_failed"])
            Sys.close(fd)
            return
        }
        SSL_set_accept_state(ssl)
        var memory: OpaquePointer?
        if !prefix.isEmpty {
            memory = prefix.withUnsafeBytes { roomcast_tls_prefix_bio($0.baseAddress, Int32($0.count)) }
            guard let memory else {
                SSL_free(ssl)
                Sys.close(fd)
                return
            }
            BIO_up_ref(memory)  // one reference for SSL_set0_rbio, one kept to see when it is read
            SSL_set0_rbio(ssl, memory)
        }
        let slot = tls.pending.add(.init(fd: fd, ssl: ssl, dialect: dialect, address: address, prefix: memory),
                                   deadline: now + context.handshakeTimeoutMs)
        do {
            tls.pending.slots[slot]!.registration = try selector.register(fd, .tlsHandshake(slot))
        } catch {
            logger.error("cannot watch \(address)", ["CLIENT_ADDR": address, "REASON": "epoll_failed", "DETAIL": error.description])
            dropHandshake(slot)
            return
        }
        continueHandshake(slot)
    }

    /// One step of the handshake of `slot` (SSL_do_handshake(3)): done, it
    /// becomes a client; wanting a read or a write, it waits for that; any
    /// other outcome costs this client only.
    func continueHandshake(_ slot: Int) {
        guard let p = tls.pending.slots[slot] else { return }
        if let memory = p.prefix, roomcast_tls_bio_pending(memory) == 0 {
            // What came with the PROXY header is read: the socket from now on.
            SSL_set_fd(p.ssl, p.fd)
            BIO_free(memory)
            tls.pending.slots[slot]!.prefix = nil
        }
        ERR_clear_error()
        let r = SSL_do_handshake(p.ssl)
        if r == 1 {
            finishHandshake(slot)
            return
        }
        let e = SSL_get_error(p.ssl, r)
        if e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE {
            if let memory = tls.pending.slots[slot]!.prefix, roomcast_tls_bio_pending(memory) == 0 {
                continueHandshake(slot)  // the prefix ran out mid-record: the rest is on the socket
                return
            }
            if let reg = p.registration {
                try? selector.setInterest(reg, readable: e == SSL_ERROR_WANT_READ, writable: e == SSL_ERROR_WANT_WRITE)
            }
            return
        }
        let why: String
        switch e {
        case SSL_ERROR_ZERO_RETURN: why = "closed during the TLS handshake"
        case SSL_ERROR_SYSCALL:
            let code = errno
            ERR_clear_error()
            why = code == 0 ? "closed during the TLS handshake" : "TLS handshake: \(SystemError("read", errno: code).description)"
        default: why = "TLS handshake failed: \(openSSLErrorReason())"
        }
        tls.failures &+= 1
        logger.peerWarning(reason: "tls_handshake", nowMs: clock(), "\(p.address): \(why); closing",
                           ["CLIENT_ADDR": p.address, "DETAIL": why])
        dropHandshake(slot)
    }

    /// The handshake of `slot` is done: the connection becomes a client of
    /// its dialect, its SSL beside its descriptor.
    private func finishHandshake(_ slot: Int) {
        let p = tls.pending.remove(slot)!
        if let r = p.registration { selector.deregister(r) }
        if let memory = p.prefix { BIO_free(memory) }
        let now = clock()
        tls.handshakes &+= 1
        guard admit(p.address, now: now) else {
            closeTLS(p.ssl, p.fd)
            return
        }
        Socket.configureClient(p.fd, dialect: p.dialect, config: config)
        guard let id = open(fd: p.fd, dialect: p.dialect, address: p.address, now: now, tls: p.ssl) else {
            SSL_free(p.ssl)
            return
        }
        if logger.enabled(.debug) {
            let version = String(cString: SSL_get_version(p.ssl))
            let cipher = SSL_get_current_cipher(p.ssl).map { String(cString: SSL_CIPHER_get_name($0)) } ?? "?"
            logger.debug("TLS handshake done: \(version), \(cipher)", ["CLIENT_ADDR": p.address])
        }
        // Application data that came with the client's Finished is already
        // inside OpenSSL: no readiness event will announce it.
        readTLS(id, p.ssl)
    }

    /// Closes handshakes that ran past `handshake_timeout`.
    func expireHandshakes(now: UInt64) {
        for slot in tls.pending.expired(now: now) {
            guard let p = tls.pending.slots[slot] else { continue }
            tls.timeouts &+= 1
            let why = "no TLS handshake within tls.handshake_timeout (\(formatDuration(ms: tls.context?.handshakeTimeoutMs ?? 0)))"
            logger.peerWarning(reason: "tls_handshake_timeout", nowMs: now, "\(p.address): \(why); closing",
                               ["CLIENT_ADDR": p.address, "DETAIL": why])
            dropHandshake(slot)
        }
    }

    /// Frees a handshake in progress and closes its socket (no close_notify:
    /// there is no session).
    func dropHandshake(_ slot: Int) {
        guard let p = tls.pending.remove(slot) else { return }
        if let r = p.registration { selector.deregister(r) }
        if let memory = p.prefix { BIO_free(memory) }
        SSL_free(p.ssl)
        Sys.close(p.fd)
    }

    /// Every handshake in progress (stop, hand-over).
    func dropAllHandshakes() {
        for slot in tls.pending.slots.indices { dropHandshake(slot) }
    }

    /// SIGHUP: a new context from the files for new connections; a file
    /// OpenSSL refuses keeps the one in use, and the log says why.
    func reloadTLS() {
        guard tls.context != nil else { return }
        do {
            tls.context = try TLSContext(config.tls)
            logger.info("TLS certificate reloaded from \(config.tls.certFile) (new connections)", ["CERT_FILE": config.tls.certFile])
        } catch {
            logger.error("TLS reload failed, keeping the certificate in use: \(error)",
                         ["REASON": "tls_reload_failed", "DETAIL": error.description])
        }
    }
}
