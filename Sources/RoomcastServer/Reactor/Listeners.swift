import Glibc
import RoomcastCore
import RoomcastIO

/// The listening sockets: bound from the config or adopted from systemd.
/// `Server`'s listener half (below) owns opening them, accepting with its
/// errno policy, pausing while descriptors run out, and admission
/// (`max_clients`, `max_clients_per_ip`). It hands each admitted socket to
/// `Server.open(fd:dialect:address:)` and touches no established connection.
struct Listeners {
    struct Listener {
        var fd: Int32
        /// `1.2.3.4:P` or `[::1]:P`, as bound.
        var address: String
        var dialect: Dialect
        /// A `listen_tls` listener: each connection does a TLS handshake first.
        var tls = false
        /// Its place in the selector; nil while accepting is paused.
        var registration: Registration?
    }

    var all: [Listener] = []
    /// While out of descriptors: when to try accepting again, in ms.
    var pausedUntil: UInt64?
    /// A pause was logged and its end is not yet.
    var pauseEpisode = false
    /// Connections on `proxy_protocol` listeners still owing their header.
    var pending = PendingProxyHeaders()

    /// Retry delay while accepting is paused for lack of descriptors, in ms.
    static let acceptRetryMs: UInt64 = 100
    /// Accepts per listener wakeup at most (bounded work per event).
    static let acceptsPerWakeup = 64

    /// Every address, space-separated (the `LISTEN` journal field).
    var addresses: String { all.map(\.address).joined(separator: " ") }
}

extension Server {
    /// Binds the configured addresses, or adopts the sockets systemd passed
    /// (socket activation, sd_listen_fds(3)), and watches them.
    /// - Throws: `SystemError` when an address cannot be bound or none is usable.
    func openListeners() throws(SystemError) {
        if clientListenersFromSystemd {
            for (fd, name) in systemd.listenFDs where name != Self.apiSocketName {  // openAPI() takes those
                guard Systemd.isListeningInetSocket(fd) else {
                    logger.warning("ignoring descriptor \(fd) (\(name)) from systemd: not a listening TCP socket")
                    continue
                }
                // Sockets passed by systemd are blocking unless NonBlocking=yes (systemd.socket(5)).
                try Sys.setNonBlocking(fd)
                // FileDescriptorName=json (or websocket) in the .socket unit selects that
                // dialect; a `-tls` suffix (`tls` alone for LTB) a TLS listener (roomcastd(8)).
                let tls = name == "tls" || name.hasSuffix("-tls")
                let base = tls ? String(name.dropLast(name == "tls" ? 3 : 4)) : name
                let dialect: Dialect = base == "json" ? .json : base == "websocket" ? .webSocket : .ltb
                if tls && self.tls.context == nil {
                    logger.warning("ignoring descriptor \(fd) (\(name)) from systemd: a TLS listener, but [tls] has no certificate "
                                   + "(set tls.cert_file and tls.key_file)", ["REASON": "tls_not_configured"])
                    continue
                }
                listeners.all.append(.init(fd: fd, address: Socket.localAddress(fd), dialect: dialect, tls: tls))
            }
            logger.info("using \(listeners.all.count) listening socket(s) from systemd; [server] listen is not used",
                        ["LISTEN": listeners.addresses])
        } else {
            let ltb = options.listenOverride.isEmpty ? config.server.listen : options.listenOverride
            let all = [(ltb, Dialect.ltb, false), (config.json.listen, .json, false), (config.webSocket.listen, .webSocket, false),
                       (config.server.listenTLS, .ltb, true), (config.json.listenTLS, .json, true), (config.webSocket.listenTLS, .webSocket, true)]
            for (addresses, dialect, tls) in all {
                for address in addresses {
                    let fd = if let stored = adoptStoredListener(address, dialect, tls: tls) { stored } else { try Socket.listen(on: address) }
                    listeners.all.append(.init(fd: fd, address: Socket.localAddress(fd), dialect: dialect, tls: tls))
                }
            }
        }
        guard !listeners.all.isEmpty else { throw SystemError("listen: no usable listening socket", errno: EINVAL) }
        try watchListeners()
        for l in listeners.all {
            let protocolName = l.dialect.name + (l.tls ? "+tls" : "")
            logger.info("listening on \(l.address) (\(protocolName))", ["LISTEN": l.address, "PROTOCOL": protocolName])
        }
    }

    /// systemd passed client listeners (socket activation): they replace
    /// the config's addresses. A socket named `api` alone does not.
    var clientListenersFromSystemd: Bool { systemd.listenFDs.contains { $0.name != Self.apiSocketName } }

    /// Registers every listener that is not registered.
    private func watchListeners() throws(SystemError) {
        for i in listeners.all.indices where listeners.all[i].registration == nil {
            listeners.all[i].registration = try selector.register(listeners.all[i].fd, .listener(i))
        }
    }

    /// Accepts up to `acceptsPerWakeup` pending connections on listener `index`.
    func acceptConnections(_ index: Int) {
        guard !stopping, listeners.pausedUntil == nil else { return }
        let listener = listeners.all[index]
        let now = clock()
        for _ in 0..<Listeners.acceptsPerWakeup {
            let accepted: (fd: Int32, peer: sockaddr_storage)
            do {
                guard case .done(let a) = try Sys.accept(listener.fd) else { return }
                accepted = a
            } catch {
                switch error.errno {
                case ECONNABORTED, EPROTO, EPERM:
                    continue  // that peer is gone (accept(2), "Error handling"); the next may be fine
                case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                    pauseAccepting(now: now, error)
                default:
                    logger.error("accept on \(listener.address) failed", ["REASON": "accept_failed", "DETAIL": error.description])
                }
                return
            }
            if listeners.pauseEpisode {
                listeners.pauseEpisode = false
                logger.notice("accepting connections again (\(table.count) clients)")
            }
            let address = Socket.format(accepted.peer)
            if proxySettings(listener.dialect).enabled {
                acceptProxied(accepted.fd, listener.dialect, tls: listener.tls, proxyAddress: address, now: now)
                continue
            }
            guard admit(address, now: now) else {
                Sys.close(accepted.fd)
                continue
            }
            if listener.tls {
                startHandshake(accepted.fd, listener.dialect, address: address, now: now)  // a client once it is done
                continue
            }
            Socket.configureClient(accepted.fd, dialect: listener.dialect, config: config)
            open(fd: accepted.fd, dialect: listener.dialect, address: address, now: now)
        }
    }

    /// `server.max_clients` and `server.max_clients_per_ip`; a refusal is a
    /// (rate-limited) warning. Behind a proxy, `address` is the one its
    /// PROXY header gave.
    func admit(_ address: String, now: UInt64) -> Bool {
        if table.count >= config.server.maxClients {
            logger.peerWarning(reason: "max_clients", nowMs: now,
                               "refused \(address): server.max_clients (\(config.server.maxClients)) reached",
                               ["CLIENT_ADDR": address])
            return false
        }
        let perIP = config.server.maxClientsPerIP
        if perIP > 0, case let ip = Connection.ip(of: address), table.perIP[ip, default: 0] >= perIP {
            logger.peerWarning(reason: "max_clients_per_ip", nowMs: now,
                               "refused \(address): server.max_clients_per_ip (\(perIP)) reached for \(ip)",
                               ["CLIENT_ADDR": address])
            return false
        }
        return true
    }

    /// Out of descriptors: stop watching the listeners (a level-triggered
    /// listener would wake the loop forever) and retry on a timer; logged
    /// once per episode.
    private func pauseAccepting(now: UInt64, _ error: SystemError) {
        listeners.pausedUntil = now + Listeners.acceptRetryMs
        for i in listeners.all.indices {
            if let r = listeners.all[i].registration { selector.deregister(r) }
            listeners.all[i].registration = nil
        }
        if !listeners.pauseEpisode {
            listeners.pauseEpisode = true
            logger.warning("out of file descriptors: accepting paused, retrying every \(formatDuration(ms: Listeners.acceptRetryMs)) (\(table.count) clients)",
                           ["REASON": "out_of_descriptors", "DETAIL": error.description])
        }
    }

    /// The retry timer of a pause: watch the listeners again and accept.
    func resumeAcceptingIfDue(now: UInt64) {
        guard let resume = listeners.pausedUntil, now >= resume else { return }
        listeners.pausedUntil = nil
        do {
            try watchListeners()
        } catch {
            logger.error("cannot watch the listeners", ["REASON": "epoll_failed", "DETAIL": error.description])
        }
        for i in listeners.all.indices { acceptConnections(i) }
    }

    /// Closes every listener (stop): no new connections.
    func closeListeners() {
        dropAllPending()
        dropAllHandshakes()
        for l in listeners.all {
            if let r = l.registration { selector.deregister(r) }
            Sys.close(l.fd)
        }
        listeners = Listeners()
    }
}
