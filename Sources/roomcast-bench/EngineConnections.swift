@preconcurrency import COpenSSL
import CShim
@preconcurrency import Glibc
import RoomcastCore

// The load generator's connections: connect, TLS handshake, hello, close (Engine.swift holds its state).
extension Engine {
    /// Adds a connection slot (not yet connected); returns its id.
    @discardableResult
    func add(role: Role, index: Int = 0, room: Int = 0) -> Int {
        precondition(count < capacity)
        let id = count
        count += 1
        conns[id].role = role
        conns[id].index = Int32(index)
        conns[id].room = Int32(room)
        if role == .publisher && o.api {
            publisherIDs.append(id)
            apiRequests.append(APIPublishRequest(wire: wire, publisher: index, room: o.room, key: apiKey, idempotency: o.idempotency, run: runID))
        } else if role == .publisher {
            publisherIDs.append(id)
            let channel = o.room
            let (bytes, at) = wire.dataTemplate(publisher: index, channel: channel)
            let t = UnsafeMutableRawPointer.allocate(byteCount: bytes.count, alignment: 8)
            bytes.withUnsafeBytes { t.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
            templates.append(t)
            payloadAt = at
            messageLen = bytes.count
        }
        return id
    }

    /// Allows connects up to slot `limit` (exclusive).
    func launch(upTo limit: Int) {
        launchLimit = min(limit, count)
        startConnects()
    }

    var allLaunchedOpen: Bool { launchNext >= launchLimit && inflight == 0 }

    /// Starts at most `connectBurst` connects per loop iteration, so a storm
    /// never stalls the probe room's sends and reads for long.
    func startConnects() {
        var budget = Self.connectBurst
        while budget > 0 && launchNext < launchLimit && (inflightLimit == 0 || inflight < inflightLimit) {
            budget -= 1
            let id = launchNext
            launchNext += 1
            connect(id)
        }
    }

    func connect(_ id: Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { fatal("socket: \(String(cString: strerror(errno))) (\(count) connections)") }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        if o.receiveBuffer > 0 {
            // Before connect(2): the window scale is agreed in the handshake.
            var size = Int32(clamping: o.receiveBuffer)
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var target = conns[id].role == .publisher ? (o.api ? apiAddress : addresses[0]) : addresses[id % addresses.count]
        if conns[id].role == .member, let port = o.webSocketPort {
            target.sin_port = port.bigEndian
            conns[id].webSocket = .upgrading
        }
        let rc = withUnsafePointer(to: &target) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if rc < 0 && errno != EINPROGRESS {
            let e = errno
            close(fd)
            fatal("connect to \(o.host):\(o.port): \(String(cString: strerror(e)))")
        }
        conns[id].fd = fd
        conns[id].state = .connecting
        inflight += 1
        var ev = epoll_event(events: EPOLLOUT.rawValue, data: epoll_data_t(u64: UInt64(id)))
        guard epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0 else { fatal("epoll_ctl: \(String(cString: strerror(errno)))") }
    }

    /// `--tls`: a handshake step; done, the connection opens as a plain one does.
    func handshake(_ id: Int) {
        let c = conns + id
        ERR_clear_error()
        let r = SSL_do_handshake(c.pointee.ssl)
        if r == 1 {
            opened(id)
            return
        }
        let e = SSL_get_error(c.pointee.ssl, r)
        guard e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE else {
            fatal("TLS handshake with \(o.host):\(o.port) failed (SSL_get_error \(e), errno \(errno))")
        }
        var ev = epoll_event(events: e == SSL_ERROR_WANT_READ ? EPOLLIN.rawValue : EPOLLOUT.rawValue, data: epoll_data_t(u64: UInt64(id)))
        epoll_ctl(epfd, EPOLL_CTL_MOD, c.pointee.fd, &ev)
    }

    func finishConnect(_ id: Int) {
        let c = conns + id
        var err: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(c.pointee.fd, SOL_SOCKET, SO_ERROR, &err, &len)
        inflight -= 1
        if err != 0 {
            // Refused or reset while connecting (e.g. the backlog overflowed): retry a few times.
            connectErrors += 1
            if firstError == nil { firstError = "connect: \(String(cString: strerror(err)))" }
            close(c.pointee.fd)
            c.pointee.fd = -1
            c.pointee.state = .free
            guard c.pointee.retries < 5 else { fatal("connect to \(o.host):\(o.port) failed 6 times: \(String(cString: strerror(err)))") }
            c.pointee.retries += 1
            connect(id)
            return
        }
        if o.tls {
            guard let ssl = SSL_new(tlsContext), SSL_set_fd(ssl, c.pointee.fd) == 1 else { fatal("SSL_new failed") }
            SSL_set_connect_state(ssl)
            c.pointee.ssl = ssl
            c.pointee.state = .handshaking
            handshake(id)
            return
        }
        opened(id)
    }

    func opened(_ id: Int) {
        let c = conns + id
        c.pointee.state = .open
        openCount[c.pointee.role == .extra ? 1 : 0] += 1
        var ev = epoll_event(events: EPOLLIN.rawValue | EPOLLRDHUP.rawValue, data: epoll_data_t(u64: UInt64(id)))
        epoll_ctl(epfd, EPOLL_CTL_MOD, c.pointee.fd, &ev)
        if c.pointee.webSocket == .upgrading {
            Self.upgradeRequest.withUnsafeBytes { queue(id, $0.baseAddress!, $0.count) }
            flush(id)
            return
        }
        // An API publisher is no member: it joins nothing, and sends its first request in sendDue.
        if c.pointee.role == .publisher && o.api { return }
        sendHello(id)
    }

    /// The join (or SUBSCRIBE) that starts a connection's part in the workload.
    func sendHello(_ id: Int) {
        let hello = wire.handshake(name: name(of: id), room: roomName(of: id), publisher: conns[id].role == .publisher)
        if !hello.isEmpty {
            hello.withUnsafeBytes { sendMessage(id, $0.baseAddress!, $0.count) }
            flush(id)
        }
    }

    /// The WebSocket upgrade of a member (RFC 6455 §4.1), asking for roomcast.ltb.v1.
    static let upgradeRequest = Array(("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        + "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + "Sec-WebSocket-Protocol: roomcast.ltb.v1\r\n\r\n").utf8)

    func name(of id: Int) -> String {
        switch conns[id].role {
        case .publisher: "pub\(conns[id].index)"
        case .member: "m\(id)"
        case .extra: "x\(id)"
        }
    }

    /// The room / channel of a connection; nil: it does not join.
    func roomName(of id: Int) -> String? {
        if conns[id].role != .extra { return o.room }
        return o.roomSize == 0 ? nil : "\(o.room)-x\(conns[id].room)"
    }

    func serverClosed(_ id: Int, _ why: String) {
        let c = conns + id
        guard c.pointee.state == .open else { return }
        closedByServer += 1
        if firstError == nil { firstError = "connection \(name(of: id)) closed by the server: \(why)" }
        openCount[c.pointee.role == .extra ? 1 : 0] -= 1
        if let ssl = c.pointee.ssl { SSL_free(ssl); c.pointee.ssl = nil }
        close(c.pointee.fd)
        c.pointee.state = .closed
        c.pointee.fd = -1
    }

    var firstProblem: String? { firstError }

    /// Closes every connection (RST: no TIME_WAIT left on the client side).
    func closeAll() {
        for id in 0..<count where conns[id].fd >= 0 {
            var l = linger(l_onoff: 1, l_linger: 0)
            setsockopt(conns[id].fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
            if let ssl = conns[id].ssl { SSL_free(ssl); conns[id].ssl = nil }
            close(conns[id].fd)
            conns[id].fd = -1
            conns[id].state = .closed
        }
    }
}
