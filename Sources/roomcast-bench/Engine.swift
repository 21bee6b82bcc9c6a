@preconcurrency import COpenSSL
import CShim
@preconcurrency import Glibc
import RoomcastCore

/// A connection's part in the workload.
enum Role: UInt8 {
    /// Sends data frames; in the room (roomcast) but never counted as a recipient.
    case publisher
    /// Receives data frames: every one it gets is a delivery.
    case member
    /// Idle or storm connection (group 1): joins its own small room, heartbeats.
    case extra
}

enum ConnState: UInt8 { case free, connecting, handshaking, open, closed }

/// A member's WebSocket phase (`--websocket-port`; RFC 6455 §4): none (LTB),
/// waiting for the 101 answer, or exchanging frames.
enum WebSocketPhase: UInt8 { case none, upgrading, open }

/// One client connection. Kept in a raw array: the hot loop touches it
/// through a pointer, with no ARC, no copy-on-write and no exclusivity checks.
struct Conn {
    var fd: Int32 = -1
    var role = Role.member
    var state = ConnState.free
    var writeArmed = false
    var webSocket = WebSocketPhase.none
    var retries: UInt8 = 0
    /// Publisher index (publishers), room number within the group (extras).
    var index: Int32 = 0
    var room: Int32 = 0
    /// Bytes of an incomplete message kept between reads.
    var carry: UnsafeMutableRawPointer?
    var carryLen = 0
    var carryCap = 0
    /// Output not yet accepted by the kernel.
    var out: UnsafeMutableRawPointer?
    var outStart = 0
    var outLen = 0
    var outCap = 0
    /// `--tls`: the OpenSSL session (`SSL *`).
    var ssl: OpaquePointer?
}

/// The single-threaded epoll load generator (level-triggered, one read per
/// readiness event into one 256 KiB scratch buffer, one clock read per read).
final class Engine {
    let o: Options
    let wire: Wire
    private let epfd: Int32
    let capacity: Int
    let conns: UnsafeMutablePointer<Conn>
    private(set) var count = 0
    private let scratch: UnsafeMutableRawPointer
    private let scratchCap: Int
    private let eventCap = 1024
    private let events: UnsafeMutablePointer<epoll_event>
    private var address = sockaddr_in()
    /// One per `--port` (the first is `address`): members are spread over them.
    private var addresses: [sockaddr_in] = []
    private let heartbeatBytes: [UInt8]
    static let connectBurst = 64

    // Publishers (closed-loop window state: ring of per-frame receipt counts).
    private(set) var publisherIDs: [Int] = []
    private var templates: [UnsafeMutableRawPointer] = []
    private var payloadAt = 0
    private var messageLen = 0
    private var nextSeq: UnsafeMutablePointer<UInt64>
    private var oldest: UnsafeMutablePointer<UInt64>
    private var ring: UnsafeMutablePointer<Int32>
    private let ringSize: Int
    /// Recipients of each data frame (members of the main room).
    var recipients: Int32 = 0

    // API publishers (`--api-port`): one request outstanding per connection.
    private let apiKey: String
    /// This run's part of every Idempotency-Key: a daemon remembers keys for
    /// 5 minutes, and a second run's keys must not be the first run's.
    private let runID = UInt64.random(in: 1...UInt64.max)
    private var apiRequests: [APIPublishRequest] = []
    private var apiAddress = sockaddr_in()
    /// Whether publisher p's request awaits its answer, and when it was sent (ns).
    private let awaiting: UnsafeMutablePointer<Bool>
    private let requestSentNs: UnsafeMutablePointer<UInt64>
    /// Publishes answered 200 (all, and while measuring), answered otherwise.
    private(set) var apiOK: UInt64 = 0
    private(set) var measuredPublishes: UInt64 = 0
    private(set) var apiErrors: UInt64 = 0
    /// 200 answers whose `{"delivered": N}` was not the room's members.
    private(set) var deliveredMismatch: UInt64 = 0
    /// Request latency: the request's send to its whole answer (measured requests).
    var requestHist = Histogram()

    // Connecting.
    private var launchNext = 0
    private var launchLimit = 0
    private(set) var inflight = 0
    var inflightLimit = 512
    private(set) var openCount = [0, 0]
    private(set) var connectErrors = 0
    private(set) var closedByServer = 0
    private var firstError: String?

    // Set-up confirmations: join frames received (roomcast), subscribe replies (Redis).
    private(set) var joinsReceived = [0, 0]
    private(set) var subscribed = [0, 0]

    // Load.
    var sending = false
    var framesLimit: UInt64 = .max
    private(set) var framesSent: UInt64 = 0
    private var rateStartNs: UInt64 = 0
    private var rateSent: UInt64 = 0
    private(set) var maxSendLagNs: UInt64 = 0
    private(set) var maxTurnNs: UInt64 = 0
    private(set) var deliveries: UInt64 = 0
    private(set) var measuredDeliveries: UInt64 = 0
    private(set) var completedFrames: UInt64 = 0
    var measuring = false
    var inStorm = false
    var hist = Histogram()
    var stormHist = Histogram()
    private(set) var publisherReceipts: UInt64 = 0
    private(set) var otherFrames: UInt64 = 0
    private(set) var pongs: UInt64 = 0
    private(set) var serverErrors: UInt64 = 0
    private(set) var bytesIn: UInt64 = 0
    /// read(2) calls that returned data, and their bytes, while measuring:
    /// how the server's writes reach the generator (many small ones cost it more).
    private(set) var measuredReads: UInt64 = 0
    private(set) var measuredBytesIn: UInt64 = 0
    /// Next sequence number each member expects from each publisher
    /// ([member id * publishers + publisher]).
    private let nextExpected: UnsafeMutablePointer<UInt64>
    /// Data frames that arrived out of order, twice, after a gap, or from no publisher.
    private(set) var orderErrors: UInt64 = 0

    // Heartbeats.
    private var heartbeatStartNs: UInt64 = 0
    private var heartbeatCursor = 0
    private var heartbeatsDone: UInt64 = 0
    private(set) var heartbeatsSent: UInt64 = 0
    private var lastPeriodicNs: UInt64 = 0

    /// - Parameters: `apiKey`, the bearer key of the `--api-port` publishers.
    init(_ o: Options, capacity: Int, apiKey: String = "") {
        self.o = o
        self.apiKey = apiKey
        self.wire = Wire(o)
        self.capacity = capacity
        epfd = epoll_create1(Int32(EPOLL_CLOEXEC))
        precondition(epfd >= 0, "epoll_create1 failed")
        conns = .allocate(capacity: max(1, capacity))
        conns.initialize(repeating: Conn(), count: max(1, capacity))
        scratchCap = max(o.readSize, 4 * (o.size + 256)) + o.size + 256
        scratch = .allocate(byteCount: scratchCap, alignment: 16)
        events = .allocate(capacity: eventCap)
        events.initialize(repeating: epoll_event(), count: eventCap)
        heartbeatBytes = wire.heartbeat()
        let p = max(1, o.publishers)
        ringSize = o.window
        nextSeq = .allocate(capacity: p); nextSeq.initialize(repeating: 0, count: p)
        oldest = .allocate(capacity: p); oldest.initialize(repeating: 0, count: p)
        ring = .allocate(capacity: p * ringSize); ring.initialize(repeating: 0, count: p * ringSize)
        let members = o.publishers > 0 ? max(1, capacity) * p : 1
        nextExpected = .allocate(capacity: members); nextExpected.initialize(repeating: 0, count: members)
        awaiting = .allocate(capacity: p); awaiting.initialize(repeating: false, count: p)
        requestSentNs = .allocate(capacity: p); requestSentNs.initialize(repeating: 0, count: p)
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = o.port.bigEndian
        guard inet_pton(AF_INET, o.host, &address.sin_addr) == 1 else { fatal("bad IPv4 address '\(o.host)'") }
        addresses = (o.ports.isEmpty ? [o.port] : o.ports).map { port in
            var a = address
            a.sin_port = port.bigEndian
            return a
        }
        apiAddress = address
        apiAddress.sin_port = (o.apiPort ?? o.port).bigEndian
    }

    // MARK: - Connections

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
    private func startConnects() {
        var budget = Self.connectBurst
        while budget > 0 && launchNext < launchLimit && (inflightLimit == 0 || inflight < inflightLimit) {
            budget -= 1
            let id = launchNext
            launchNext += 1
            connect(id)
        }
    }

    private func connect(_ id: Int) {
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

    /// `--tls`: one client context for every connection (no verification).
    private lazy var tlsContext: OpaquePointer = {
        guard let ctx = SSL_CTX_new(TLS_client_method()) else { fatal("SSL_CTX_new failed") }
        // SSL_write retried from the same bytes at a moved address (the output buffer grows).
        _ = SSL_CTX_ctrl(ctx, SSL_CTRL_MODE, Int(SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE), nil)
        return ctx
    }()

    /// `--tls`: a handshake step; done, the connection opens as a plain one does.
    private func handshake(_ id: Int) {
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

    private func finishConnect(_ id: Int) {
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

    private func opened(_ id: Int) {
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
    private func sendHello(_ id: Int) {
        let hello = wire.handshake(name: name(of: id), room: roomName(of: id), publisher: conns[id].role == .publisher)
        if !hello.isEmpty {
            hello.withUnsafeBytes { sendMessage(id, $0.baseAddress!, $0.count) }
            flush(id)
        }
    }

    /// The WebSocket upgrade of a member (RFC 6455 §4.1), asking for roomcast.ltb.v1.
    private static let upgradeRequest = Array(("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        + "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + "Sec-WebSocket-Protocol: roomcast.ltb.v1\r\n\r\n").utf8)

    private func name(of id: Int) -> String {
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

    private func serverClosed(_ id: Int, _ why: String) {
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

    // MARK: - Output

    @inline(__always)
    private func reserve(_ id: Int, _ n: Int) -> UnsafeMutableRawPointer {
        let c = conns + id
        if c.pointee.outStart == c.pointee.outLen { c.pointee.outStart = 0; c.pointee.outLen = 0 }
        let need = c.pointee.outLen + n
        if need > c.pointee.outCap {
            let live = c.pointee.outLen - c.pointee.outStart
            let cap = max(need - c.pointee.outStart, 2 * c.pointee.outCap, 256)
            let p = UnsafeMutableRawPointer.allocate(byteCount: cap, alignment: 16)
            if let old = c.pointee.out {
                p.copyMemory(from: old + c.pointee.outStart, byteCount: live)
                old.deallocate()
            }
            c.pointee.out = p
            c.pointee.outCap = cap
            c.pointee.outStart = 0
            c.pointee.outLen = live
        }
        let at = c.pointee.out! + c.pointee.outLen
        c.pointee.outLen += n
        return at
    }

    private func queue(_ id: Int, _ bytes: UnsafeRawPointer, _ n: Int) {
        reserve(id, n).copyMemory(from: bytes, byteCount: n)
    }

    /// Queues one LTB frame (or RESP command): as it is, or on an open WebSocket
    /// as one masked binary message (RFC 6455 §5.2; opcode 2, FIN). The mask key is
    /// zero, which leaves the payload as it is: any key is valid, and a server
    /// cannot tell (§5.3 asks clients for unpredictable keys against proxies'
    /// cache poisoning, which loopback does not have).
    private func sendMessage(_ id: Int, _ bytes: UnsafeRawPointer, _ n: Int, opcode: UInt8 = 2) {
        if conns[id].webSocket == .open {
            var head: [UInt8] = [0x80 | opcode]
            if n < 126 { head.append(0x80 | UInt8(n)) } else if n < 65536 {
                head += [0x80 | 126, UInt8(n >> 8), UInt8(n & 0xFF)]
            } else {
                head.append(0x80 | 127)
                for shift in stride(from: 56, through: 0, by: -8) { head.append(UInt8((n >> shift) & 0xFF)) }
            }
            head += [0, 0, 0, 0]
            head.withUnsafeBytes { queue(id, $0.baseAddress!, $0.count) }
        }
        queue(id, bytes, n)
    }

    private func pending(_ id: Int) -> Int { conns[id].outLen - conns[id].outStart }

    private func flush(_ id: Int) {
        let c = conns + id
        guard c.pointee.state == .open else { return }
        while c.pointee.outStart < c.pointee.outLen {
            if let ssl = c.pointee.ssl {
                ERR_clear_error()
                let n = SSL_write(ssl, c.pointee.out! + c.pointee.outStart, Int32(c.pointee.outLen - c.pointee.outStart))
                if n > 0 { c.pointee.outStart += Int(n); continue }
                let e = SSL_get_error(ssl, n)
                if e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ {
                    if !c.pointee.writeArmed { setWrite(id, true) }
                    return
                }
                serverClosed(id, "SSL_write: error \(e)")
                return
            }
            let n = send(c.pointee.fd, c.pointee.out! + c.pointee.outStart, c.pointee.outLen - c.pointee.outStart, Int32(MSG_NOSIGNAL))
            if n > 0 { c.pointee.outStart += n; continue }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                if !c.pointee.writeArmed { setWrite(id, true) }
                return
            }
            serverClosed(id, "send: \(String(cString: strerror(errno)))")
            return
        }
        c.pointee.outStart = 0
        c.pointee.outLen = 0
        if c.pointee.writeArmed { setWrite(id, false) }
    }

    private func setWrite(_ id: Int, _ on: Bool) {
        conns[id].writeArmed = on
        var ev = epoll_event(events: EPOLLIN.rawValue | EPOLLRDHUP.rawValue | (on ? EPOLLOUT.rawValue : 0),
                             data: epoll_data_t(u64: UInt64(id)))
        epoll_ctl(epfd, EPOLL_CTL_MOD, conns[id].fd, &ev)
    }

    // MARK: - Event loop

    /// One epoll_wait (at most `timeoutMs`) and the work it brings, then the
    /// timers (heartbeats, open-loop sends) and closed-loop sends.
    func pump(timeoutMs: Int32) {
        var timeout = timeoutMs
        if sending, let rate = o.rate, o.publishers > 0 {
            let next = rateStartNs &+ UInt64(Double(rateSent + 1) * 1e9 / rate)
            let now = monotonicNs()
            timeout = next <= now ? 0 : min(timeout, Int32((next - now + 999_999) / 1_000_000))
        }
        if launchNext < launchLimit && (inflightLimit == 0 || inflight < inflightLimit) { timeout = 0 }
        let n = epoll_wait(epfd, events, Int32(eventCap), timeout)
        if n < 0 && errno != EINTR { fatal("epoll_wait: \(String(cString: strerror(errno)))") }
        let turnStart = monotonicNs()
        defer {
            // The longest turn of this loop: a send lag much longer than this
            // means the generator was not running (preempted), not busy.
            let turn = monotonicNs() &- turnStart
            if measuring && turn > maxTurnNs { maxTurnNs = turn }
        }
        if n > 0 {
            for i in 0..<Int(n) {
                let ev = events[i]
                let id = Int(truncatingIfNeeded: ev.data.u64)
                let bits = ev.events
                let c = conns + id
                switch c.pointee.state {
                case .connecting:
                    finishConnect(id)
                case .handshaking:
                    handshake(id)
                case .open:
                    if bits & (EPOLLIN.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue | EPOLLRDHUP.rawValue) != 0 { readConn(id) }
                    if bits & EPOLLOUT.rawValue != 0 && c.pointee.state == .open { flush(id) }
                default:
                    break
                }
            }
        }
        if sending { sendDue() }
        if launchNext < launchLimit { startConnects() }
        let now = monotonicNs()
        if now &- lastPeriodicNs >= 5_000_000 {
            lastPeriodicNs = now
            heartbeats(now: now)
        }
    }

    /// Pumps until `done()` or `seconds` pass; returns whether `done()` held.
    @discardableResult
    func run(seconds: Double, until done: () -> Bool = { false }) -> Bool {
        let end = monotonicNs() &+ UInt64(seconds * 1e9)
        while true {
            if done() { return true }
            let now = monotonicNs()
            if now >= end { return false }
            pump(timeoutMs: Int32(min(10, max(0, (end - now) / 1_000_000))))
        }
    }

    // MARK: - Reading

    private func readConn(_ id: Int) {
        let c = conns + id
        let keep = c.pointee.carryLen
        if keep > 0 { scratch.copyMemory(from: c.pointee.carry!, byteCount: keep) }
        var n: Int
        let ask = min(o.readSize, scratchCap - keep)
        if let ssl = c.pointee.ssl {
            // Records until OpenSSL wants the socket (what it holds wakes no epoll).
            n = 0
            while n < ask {
                ERR_clear_error()
                let r = SSL_read(ssl, scratch + keep + n, Int32(ask - n))
                if r > 0 { n += Int(r); continue }
                let e = SSL_get_error(ssl, r)
                if e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE { break }
                if n == 0 { serverClosed(id, "SSL_read: error \(e)"); return }
                break
            }
            if n == 0 { return }
        } else {
            repeat { n = read(c.pointee.fd, scratch + keep, ask) } while n < 0 && errno == EINTR
        }
        if n <= 0 {
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
            serverClosed(id, n == 0 ? "end of file" : "read: \(String(cString: strerror(errno)))")
            return
        }
        bytesIn &+= UInt64(n)
        if measuring { measuredReads &+= 1; measuredBytesIn &+= UInt64(n) }
        let have = keep + n
        let now = monotonicNs()
        let used: Int
        switch (o.target, c.pointee.webSocket) {
        case (.roomcast, .none) where o.api && c.pointee.role == .publisher: used = parseAnswers(id, have, now: now)
        case (.roomcast, .none): used = parseLTB(id, have, now: now)
        case (.roomcast, _): used = parseWebSocket(id, have, now: now)
        case (.redis, _): used = parseRESP(id, have, now: now)
        }
        let rest = have - used
        if rest > 0 {
            if rest > c.pointee.carryCap {
                c.pointee.carry?.deallocate()
                let cap = max(rest, 256)
                c.pointee.carry = .allocate(byteCount: cap, alignment: 16)
                c.pointee.carryCap = cap
            }
            c.pointee.carry!.copyMemory(from: scratch + used, byteCount: rest)
        }
        c.pointee.carryLen = rest
    }

    /// Consumes whole LTB frames from the scratch buffer; returns the bytes used.
    private func parseLTB(_ id: Int, _ have: Int, now: UInt64) -> Int {
        var off = 0
        while have - off >= 6 {
            let length = Int(UInt32(littleEndian: scratch.loadUnaligned(fromByteOffset: off, as: UInt32.self)))
            if have - off - 6 < length { break }
            handleLTB(id, at: off, length: length, now: now)
            off += 6 + length
        }
        return off
    }

    /// One whole LTB frame at `off` of the scratch buffer (`length`: its body's bytes).
    @inline(__always)
    private func handleLTB(_ id: Int, at off: Int, length: Int, now: UInt64) {
        let type = UInt16(littleEndian: scratch.loadUnaligned(fromByteOffset: off + 4, as: UInt16.self))
        if length > o.maxFrameBytes { fatal("server sent a frame of \(length) bytes (type \(type))") }
        let role = conns[id].role
        if type == wire.dataType {
            if role == .member {
                deliverPayload(id, UnsafeRawPointer(scratch + off + 6 + wire.payloadOffset), binary: wire.body == .opaque, now: now)
            } else {
                publisherReceipts &+= 1
            }
        } else if type == Wire.joinType {
            joinsReceived[role == .extra ? 1 : 0] += 1
        } else {
            otherFrames &+= 1
        }
    }

    /// An API publisher's answers (HTTP/1.1, one per request): a 200 counts
    /// one publish, its latency, and whether `delivered` was every member;
    /// anything else is an error. Either way the next request may go.
    private func parseAnswers(_ id: Int, _ have: Int, now: UInt64) -> Int {
        let p = Int(conns[id].index)
        var off = 0
        while off < have {
            let answer = HTTPAnswer.parse(UnsafeRawBufferPointer(start: scratch + off, count: have - off))
            switch answer {
            case .incomplete:
                return off
            case .malformed(let why):
                serverClosed(id, "the API's answer: \(why)")
                return have
            case .answer(let status, let bodyAt, let bodyLength, let end):
                guard awaiting[p] else {
                    serverClosed(id, "the API answered a request that was not sent")
                    return have
                }
                awaiting[p] = false
                let body = UnsafeRawBufferPointer(start: scratch + off + bodyAt, count: bodyLength)
                if status == 200 {
                    apiOK &+= 1
                    if deliveredCount(body) != Int(recipients) { deliveredMismatch &+= 1 }
                    if measuring {
                        measuredPublishes &+= 1
                        requestHist.record(now &- requestSentNs[p])
                    }
                } else {
                    apiErrors &+= 1
                    if firstError == nil {
                        firstError = "publish answered \(status): \(String(decoding: body.prefix(200), as: UTF8.self))"
                    }
                }
                off += end
            }
        }
        return off
    }

    /// A WebSocket member: first the 101 answer to its upgrade, then whole server
    /// frames (unmasked, RFC 6455 §5.2), each binary message one LTB frame
    /// (roomcast.ltb.v1); pings are answered with pongs. Returns the bytes used.
    private func parseWebSocket(_ id: Int, _ have: Int, now: UInt64) -> Int {
        var off = 0
        if conns[id].webSocket == .upgrading {
            let head = UnsafeRawBufferPointer(start: scratch, count: have)
            guard let end = (0..<max(0, have - 3)).first(where: {
                head[$0] == 13 && head[$0 + 1] == 10 && head[$0 + 2] == 13 && head[$0 + 3] == 10
            }) else {
                if have > 8192 { serverClosed(id, "no end to the upgrade's answer in 8 KiB") }
                return 0
            }
            let answer = String(decoding: head[0..<end], as: UTF8.self)
            guard answer.hasPrefix("HTTP/1.1 101"), answer.lowercased().contains("sec-websocket-protocol: roomcast.ltb.v1") else {
                serverClosed(id, "upgrade refused: \(answer.prefix(80))")
                return have
            }
            conns[id].webSocket = .open
            sendHello(id)
            off = end + 4
        }
        while have - off >= 2 {
            let b0 = scratch.load(fromByteOffset: off, as: UInt8.self)
            var length = Int(scratch.load(fromByteOffset: off + 1, as: UInt8.self) & 0x7F)
            var at = off + 2
            if length == 126 {
                guard have - off >= 4 else { break }
                length = Int(UInt16(bigEndian: scratch.loadUnaligned(fromByteOffset: off + 2, as: UInt16.self)))
                at = off + 4
            } else if length == 127 {
                guard have - off >= 10 else { break }
                length = Int(UInt64(bigEndian: scratch.loadUnaligned(fromByteOffset: off + 2, as: UInt64.self)))
                at = off + 10
            }
            if length > o.maxFrameBytes + 6 { fatal("server sent a WebSocket frame of \(length) bytes") }
            guard have - at >= length else { break }
            switch b0 & 0x0F {
            case 2 where length >= 6: handleLTB(id, at: at, length: length - 6, now: now)
            case 9:
                sendMessage(id, scratch + at, length, opcode: 10)
                if !conns[id].writeArmed { flush(id) }
            case 8:
                serverClosed(id, "WebSocket close \(length >= 2 ? Int(UInt16(bigEndian: scratch.loadUnaligned(fromByteOffset: at, as: UInt16.self))) : 1005)")
                return have
            default: otherFrames &+= 1
            }
            off = at + length
        }
        return off
    }

    /// Records one data frame's payload (publisher, sequence, send time),
    /// binary or hex as the body format says; the same for LTB and RESP.
    @inline(__always)
    private func deliverPayload(_ id: Int, _ p: UnsafeRawPointer, binary: Bool, now: UInt64) {
        if binary {
            deliver(id, Int(UInt32(littleEndian: p.loadUnaligned(as: UInt32.self))),
                    UInt64(littleEndian: p.loadUnaligned(fromByteOffset: 4, as: UInt64.self)),
                    UInt64(littleEndian: p.loadUnaligned(fromByteOffset: 12, as: UInt64.self)), now: now)
        } else {
            deliver(id, Int(loadHex(p, digits: 8)), loadHex(p + 8, digits: 16), loadHex(p + 24, digits: 16), now: now)
        }
    }

    /// Consumes whole RESP replies and pushes; returns the bytes used.
    private func parseRESP(_ id: Int, _ have: Int, now: UInt64) -> Int {
        let role = conns[id].role
        let base = UnsafeRawPointer(scratch)
        let binary = wire.body == .opaque
        let payloadOffset = wire.payloadOffset
        var off = 0
        while off < have {
            let first = base.load(fromByteOffset: off, as: UInt8.self)
            if first == UInt8(ascii: "*") {
                // An array of bulk strings / integers: message, subscribe, pong pushes.
                guard let (count, afterHeader) = respLine(base, off + 1, have) else { break }
                var at = afterHeader
                var kindStart = -1, kindLen = 0, lastStart = -1, lastLen = 0
                var complete = true
                for e in 0..<max(0, count) {
                    guard at < have else { complete = false; break }
                    let t = base.load(fromByteOffset: at, as: UInt8.self)
                    guard let (value, afterLine) = respLine(base, at + 1, have) else { complete = false; break }
                    if t == UInt8(ascii: "$") {
                        let end = afterLine + max(0, value) + 2
                        guard end <= have else { complete = false; break }
                        if e == 0 { kindStart = afterLine; kindLen = value }
                        lastStart = afterLine; lastLen = value
                        at = end
                    } else {
                        at = afterLine   // ':' integer (subscriber count)
                    }
                }
                guard complete else { break }
                off = at
                if kindLen == 7 && base.load(fromByteOffset: kindStart, as: UInt8.self) == UInt8(ascii: "m") {
                    if role == .member, lastLen >= payloadOffset + (binary ? Wire.binaryPayloadSize : Wire.hexPayloadSize) {
                        deliverPayload(id, base + lastStart + payloadOffset, binary: binary, now: now)
                    } else {
                        publisherReceipts &+= 1
                    }
                } else if kindLen == 9 && base.load(fromByteOffset: kindStart, as: UInt8.self) == UInt8(ascii: "s") {
                    subscribed[role == .extra ? 1 : 0] += 1
                } else if kindLen == 4 && base.load(fromByteOffset: kindStart, as: UInt8.self) == UInt8(ascii: "p") {
                    pongs &+= 1
                } else {
                    otherFrames &+= 1
                }
            } else if first == UInt8(ascii: ":") || first == UInt8(ascii: "+") || first == UInt8(ascii: "-") {
                guard let nl = lineEnd(base, off, have) else { break }
                if first == UInt8(ascii: "-") {
                    serverErrors &+= 1
                    if firstError == nil {
                        firstError = "redis: " + String(decoding: UnsafeRawBufferPointer(start: base + off, count: nl - off), as: UTF8.self)
                    }
                } else if first == UInt8(ascii: "+") {
                    pongs &+= 1
                }
                off = nl + 2
            } else {
                fatal("unexpected RESP byte \(first) from the server")
            }
        }
        return off
    }

    /// Index of the "\r" of the line starting at `from`, or nil if incomplete.
    @inline(__always)
    private func lineEnd(_ base: UnsafeRawPointer, _ from: Int, _ have: Int) -> Int? {
        var i = from
        while i + 1 < have {
            if base.load(fromByteOffset: i, as: UInt8.self) == 13 { return i }
            i += 1
        }
        return nil
    }

    /// A RESP decimal integer line at `from` ("-1", "42") and the offset after its CRLF.
    @inline(__always)
    private func respLine(_ base: UnsafeRawPointer, _ from: Int, _ have: Int) -> (Int, Int)? {
        var i = from
        var v = 0
        var negative = false
        while i < have {
            let c = base.load(fromByteOffset: i, as: UInt8.self)
            if c == 13 {
                guard i + 1 < have else { return nil }
                return (negative ? -v : v, i + 2)
            }
            if c == UInt8(ascii: "-") { negative = true } else { v = v &* 10 &+ Int(c &- 48) }
            i += 1
        }
        return nil
    }

    @inline(__always)
    private func deliver(_ member: Int, _ pub: Int, _ seq: UInt64, _ sentNs: UInt64, now: UInt64) {
        deliveries &+= 1
        // Per-sender order (docs/protocol/rooms.md §4): each member must see each
        // publisher's sequence numbers 0, 1, 2... with no gap, repeat or swap.
        if pub >= 0 && pub < o.publishers {
            let k = member * o.publishers + pub
            if nextExpected[k] != seq { orderErrors &+= 1 }
            nextExpected[k] = seq &+ 1
        } else {
            orderErrors &+= 1
        }
        if measuring {
            measuredDeliveries &+= 1
            let lat = now &- sentNs
            let v = lat > (1 << 62) ? 0 : lat   // a clock read racing the send: count as 0
            hist.record(v)
            if inStorm { stormHist.record(v) }
        }
        guard o.closedLoop, !o.api, pub >= 0, pub < o.publishers else { return }
        let base = pub * ringSize
        let slot = Int(seq % UInt64(ringSize))
        ring[base + slot] &+= 1
        if seq == oldest[pub] && ring[base + slot] == recipients {
            // Slide the window past every frame that all members now have.
            var s = seq
            while s < nextSeq[pub] {
                let k = base + Int(s % UInt64(ringSize))
                guard ring[k] == recipients else { break }
                ring[k] = 0
                s += 1
                completedFrames &+= 1
            }
            oldest[pub] = s
        }
    }

    // MARK: - Sending

    func startSending() {
        rateStartNs = monotonicNs()
        rateSent = 0
        sending = true
    }

    /// Frames not yet delivered to every member (closed loop).
    var outstanding: UInt64 {
        var n: UInt64 = 0
        if o.api {
            for p in 0..<o.publishers where awaiting[p] { n += 1 }
            return n
        }
        for p in 0..<o.publishers { n += nextSeq[p] - oldest[p] }
        return n
    }

    private func sendDue() {
        let now = monotonicNs()
        if o.api {
            for p in 0..<o.publishers where !awaiting[p] && nextSeq[p] < framesLimit {
                let id = publisherIDs[p]
                guard conns[id].state == .open else { continue }
                writeRequest(p, id, now: now)
                flush(id)
            }
            return
        }
        if let rate = o.rate {
            let due = UInt64(Double(now &- rateStartNs) * rate / 1e9)
            if due <= rateSent { return }
            let lag = now &- (rateStartNs &+ UInt64(Double(rateSent + 1) * 1e9 / rate))
            if lag < (1 << 62) && lag > maxSendLagNs { maxSendLagNs = lag }
            while rateSent < due {
                let p = Int(rateSent % UInt64(o.publishers))
                rateSent += 1
                guard nextSeq[p] < framesLimit else { continue }
                let id = publisherIDs[p]
                guard conns[id].state == .open else { continue }
                writeFrame(p, id, now: now)
            }
            for p in 0..<o.publishers where pending(publisherIDs[p]) > 0 && !conns[publisherIDs[p]].writeArmed {
                flush(publisherIDs[p])
            }
            return
        }
        for p in 0..<o.publishers {
            let id = publisherIDs[p]
            guard conns[id].state == .open, pending(id) == 0 else { continue }
            let limit = min(oldest[p] + UInt64(ringSize), framesLimit)
            guard nextSeq[p] < limit else { continue }
            while nextSeq[p] < limit { writeFrame(p, id, now: now) }
            flush(id)
        }
    }

    @inline(__always)
    private func writeFrame(_ p: Int, _ id: Int, now: UInt64) {
        let seq = nextSeq[p]
        nextSeq[p] = seq + 1
        framesSent &+= 1
        let dst = reserve(id, messageLen)
        dst.copyMemory(from: templates[p], byteCount: messageLen)
        let at = dst + payloadAt
        if wire.body == .opaque {
            at.storeBytes(of: seq.littleEndian, toByteOffset: 4, as: UInt64.self)
            at.storeBytes(of: now.littleEndian, toByteOffset: 12, as: UInt64.self)
        } else {
            storeHex(seq, digits: 16, at: at + 8)
            storeHex(now, digits: 16, at: at + 24)
        }
    }

    /// Publisher p's next request, its sequence and send time stamped in.
    private func writeRequest(_ p: Int, _ id: Int, now: UInt64) {
        let seq = nextSeq[p]
        nextSeq[p] = seq + 1
        framesSent &+= 1
        awaiting[p] = true
        requestSentNs[p] = now
        let r = apiRequests[p]
        let dst = reserve(id, r.bytes.count)
        r.bytes.withUnsafeBytes { dst.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        storeHex(seq, digits: 16, at: dst + r.sequenceAt)
        storeHex(now, digits: 16, at: dst + r.timeAt)
        if let k = r.keySequenceAt { storeHex(seq, digits: 16, at: dst + k) }
    }

    // MARK: - Heartbeats

    func startHeartbeats() {
        heartbeatStartNs = monotonicNs()
        heartbeatsDone = 0
    }

    /// Each open connection sends one heartbeat per period, spread evenly.
    private func heartbeats(now: UInt64) {
        guard o.heartbeat > 0, heartbeatStartNs > 0, count > 0 else { return }
        let due = UInt64(Double(now &- heartbeatStartNs) / (o.heartbeat * 1e9) * Double(count))
        var budget = 4096
        while heartbeatsDone < due && budget > 0 {
            heartbeatsDone += 1
            budget -= 1
            let id = heartbeatCursor
            heartbeatCursor = (heartbeatCursor + 1) % count
            // A WebSocket member sends nothing between its upgrade and the 101 answer.
            // An API connection speaks HTTP: its requests keep it open.
            guard conns[id].state == .open, conns[id].webSocket != .upgrading,
                  !(o.api && conns[id].role == .publisher) else { continue }
            heartbeatsSent += 1
            heartbeatBytes.withUnsafeBytes { sendMessage(id, $0.baseAddress!, $0.count) }
            if !conns[id].writeArmed { flush(id) }
        }
    }
}

func fatal(_ message: String) -> Never {
    fputs("roomcast-bench: \(message)\n", stderr)
    exit(1)
}
