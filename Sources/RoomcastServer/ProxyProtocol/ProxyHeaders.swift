import Glibc
import RoomcastCore
import RoomcastIO

/// Connections accepted on a listener with `proxy_protocol = yes` whose
/// PROXY header (docs/protocol/proxy.md §14) has not arrived yet. They are not
/// clients: no slot in the connection table, no room, no heartbeat, no
/// per-IP count, until the header names the client. Each has
/// `headerTimeoutMs` to send it.
struct PendingProxyHeaders {
    struct Pending {
        var fd: Int32
        var dialect: Dialect
        /// On a `listen_tls` listener: the TLS handshake follows the header.
        var tls: Bool
        /// The proxy's address, `1.2.3.4:P` or `[::1]:P` (what accept(2) saw).
        var proxyAddress: String
        /// The bytes received so far (a header prefix; at most 16 + 65535 bytes,
        /// the longest v2 header, plus what one read brings after it).
        var bytes: [UInt8] = []
        var registration: Registration?
    }

    /// Time to send a complete header, in ms (docs/protocol/proxy.md §14).
    static let headerTimeoutMs: UInt64 = 5_000

    var slots = DeadlineSlots<Pending>()
    var count: Int { slots.count }
    /// The refusals' log lines (`proxy_from`), once a minute per peer IP,
    /// for at most 4,096 of them a minute.
    var refusalLog = RateLimitedLogs<String>()

    mutating func add(_ fd: Int32, _ dialect: Dialect, tls: Bool = false, proxyAddress: String, now: UInt64) -> Int {
        slots.add(Pending(fd: fd, dialect: dialect, tls: tls, proxyAddress: proxyAddress), deadline: now + Self.headerTimeoutMs)
    }

    /// Frees `slot` (its descriptor is the caller's).
    mutating func remove(_ slot: Int) -> Pending? { slots.remove(slot) }
    mutating func nextDeadline() -> UInt64? { slots.nextDeadline() }
    mutating func expired(now: UInt64) -> [Int] { slots.expired(now: now) }
}

extension Server {
    /// The PROXY settings of the listeners that speak `dialect`.
    func proxySettings(_ dialect: Dialect) -> Config.ProxySettings {
        switch dialect {
        case .ltb: config.server.proxy
        case .json: config.json.proxy
        case .webSocket: config.webSocket.proxy
        }
    }

    /// An accepted connection on a `proxy_protocol` listener: refused unless
    /// its peer is in `proxy_from`, else it waits for its header.
    func acceptProxied(_ fd: Int32, _ dialect: Dialect, tls: Bool = false, proxyAddress: String, now: UInt64) {
        let ip = Connection.ip(of: proxyAddress)
        let bare = ip.hasPrefix("[") ? ip.dropFirst().dropLast() : ip
        let bytes = IPAddressText.parseIPv4(bare) ?? IPAddressText.parseIPv6(bare) ?? []
        guard proxySettings(dialect).allows(bytes) else {
            status.proxyRefused &+= 1
            logProxyRefusal(ip, proxyAddress, dialect, now: now)
            Sys.close(fd)
            return
        }
        if table.count + listeners.pending.count >= config.server.maxClients {
            logger.peerWarning(reason: "max_clients", nowMs: now,
                               "refused \(proxyAddress): server.max_clients (\(config.server.maxClients)) reached",
                               ["CLIENT_ADDR": proxyAddress])
            Sys.close(fd)
            return
        }
        let slot = listeners.pending.add(fd, dialect, tls: tls, proxyAddress: proxyAddress, now: now)
        do {
            listeners.pending.slots[slot]!.registration = try selector.register(fd, .proxyHeader(slot))
        } catch {
            logger.error("cannot watch \(proxyAddress)", ["CLIENT_ADDR": proxyAddress, "REASON": "epoll_failed", "DETAIL": error.description])
            _ = listeners.pending.remove(slot)
            Sys.close(fd)
        }
    }

    /// Once per minute per peer IP (a scan from outside must not flood the journal).
    private func logProxyRefusal(_ ip: Substring, _ address: String, _ dialect: Dialect, now: UInt64) {
        guard listeners.pending.refusalLog.mayLog(String(ip), nowMs: now) else { return }
        let section = dialect == .json ? "json" : dialect == .webSocket ? "websocket" : "server"
        logger.warning("refused \(address): not in \(section).proxy_from (logged once a minute per address)",
                       ["CLIENT_ADDR": address, "REASON": "proxy_from"])
    }

    /// Reads what a pending connection sent; a complete header turns it
    /// into a client, whose bytes after the header are its first input.
    func readProxyHeader(_ slot: Int) {
        guard let p = listeners.pending.slots[slot] else { return }
        let result = scratch.withUnsafeMutableBytes { Sys.read(p.fd, $0.baseAddress!, $0.count) }
        let now = clock()
        switch result {
        case .done(let n):
            listeners.pending.slots[slot]!.bytes.append(contentsOf: scratch[0..<n])
        case .wouldBlock:
            return
        case .endOfFile:
            if p.bytes.isEmpty {
                // A proxy's TCP health check: connect, close.
                logger.debug("\(p.proxyAddress) closed before a PROXY header", ["CLIENT_ADDR": p.proxyAddress])
                dropPending(slot)
            } else {
                failProxyHeader(slot, "closed after \(p.bytes.count) bytes of an incomplete PROXY header", now: now)
            }
            return
        case .failed(let e):
            logger.debug("\(p.proxyAddress): \(SystemError("read", errno: e).description) before a PROXY header",
                         ["CLIENT_ADDR": p.proxyAddress])
            dropPending(slot)
            return
        }
        let step = listeners.pending.slots[slot]!.bytes.withUnsafeBytes { ProxyHeader.parse($0) }
        switch step {
        case .needMore:
            return
        case .invalid(let failure):
            failProxyHeader(slot, failure.description, now: now)
        case .header(let header):
            let p = listeners.pending.remove(slot)!
            if let r = p.registration { selector.deregister(r) }
            let address = header.source?.text ?? p.proxyAddress
            guard admit(address, now: now) else {
                Sys.close(p.fd)
                return
            }
            if p.tls {
                // The header comes before the handshake; what followed it is the client's hello.
                logger.debug("PROXY v\(header.version) header from \(p.proxyAddress)", ["CLIENT_ADDR": address, "PROXY_ADDR": p.proxyAddress])
                startHandshake(p.fd, p.dialect, address: address, prefix: p.bytes[header.length...], now: now)
                return
            }
            Socket.configureClient(p.fd, dialect: p.dialect, config: config)
            guard let id = open(fd: p.fd, dialect: p.dialect, address: address, now: now) else { return }
            logger.debug("PROXY v\(header.version) header from \(p.proxyAddress)", ["CLIENT_ADDR": address, "PROXY_ADDR": p.proxyAddress])
            let rest = p.bytes.count - header.length
            if rest > 0 {
                // The client's first bytes came with the header: they are its input.
                scratch.replaceSubrange(0..<rest, with: p.bytes[header.length...])
                consume(id, count: rest)
            }
        }
    }

    /// Closes pending connections whose header is overdue.
    func expireProxyHeaders(now: UInt64) {
        for slot in listeners.pending.expired(now: now) {
            let got = listeners.pending.slots[slot]?.bytes.count ?? 0
            failProxyHeader(slot, "no complete PROXY header within \(formatDuration(ms: PendingProxyHeaders.headerTimeoutMs))"
                            + (got > 0 ? " (\(got) bytes received)" : ""), now: now)
        }
    }

    private func failProxyHeader(_ slot: Int, _ why: String, now: UInt64) {
        guard let p = listeners.pending.slots[slot] else { return }
        status.proxyHeaderFailures &+= 1
        logger.peerWarning(reason: "proxy_header", nowMs: now, "\(p.proxyAddress): \(why); closing",
                           ["CLIENT_ADDR": p.proxyAddress, "DETAIL": why])
        dropPending(slot)
    }

    private func dropPending(_ slot: Int) {
        guard let p = listeners.pending.remove(slot) else { return }
        if let r = p.registration { selector.deregister(r) }
        Sys.close(p.fd)
    }

    /// Closes every pending connection (stop).
    func dropAllPending() {
        for slot in listeners.pending.slots.indices { dropPending(slot) }
    }
}
