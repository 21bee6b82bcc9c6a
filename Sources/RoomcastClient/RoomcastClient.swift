@_exported import RoomcastCore
import CShim
import COpenSSL
import Glibc
import RoomcastIO

/// A roomcast client connection (docs/protocol/): connects to the daemon, joins
/// a room, sends text, gifts, leaves and opaque frames, decodes what the room
/// relays, sends heartbeats, and reconnects after a drop (then joins the same
/// room again).
///
/// Threading: driven by one `EventLoop` on one thread. Create the client, call
/// its methods and run the loop on that thread; the handlers are called from
/// the loop's `run`/`runOnce`, never from a method you call (so a handler may
/// call any method, including `close()`). Several clients may share a loop.
///
/// Sending is non-blocking: frames are written at once as far as the socket
/// takes them and the rest is written when it becomes writable. Frames that
/// are still queued when the connection drops are lost (the daemon relays
/// nothing half-written); `join` is the exception, since it is sent again on
/// every reconnect.
public final class RoomcastClient {
    /// Where the connection is in its life cycle.
    public enum State: Equatable, Sendable {
        /// Created; `connect()` not called yet.
        case idle
        /// Resolving and connecting.
        case connecting
        /// Connected: frames can be sent.
        case connected
        /// Waiting for the next attempt after a drop.
        case waitingToReconnect
        /// `finish()` was called: writing what is queued, then closing.
        case finishing
        /// Stopped for good.
        case closed
    }

    /// The settings given at creation; fixed for the client's life.
    public let configuration: ClientConfiguration
    /// The current state.
    public private(set) var state: State = .idle
    /// Who the client is, from the last `join`; nil before the first one.
    public private(set) var user: UserInfo?
    /// True from `join` until `leave`: the client wants to be in `user.room`
    /// and joins it again after a reconnect.
    public private(set) var isJoined = false
    /// Bytes queued for the daemon and not yet accepted by the kernel.
    public var pendingOutputBytes: Int { output.count - outputStart }

    let loop: EventLoop
    private let onEvent: (ClientEvent) -> Void
    private let onStatus: (ClientStatus) -> Void

    var fd: Int32 = -1
    /// TLS (`configuration.tls`): this connection's session, and whether its
    /// handshake is still going (the state is `.connecting` until it is done).
    var ssl: OpaquePointer?
    var handshaking = false
    /// The TLS error behind the last `.failed` of a TLS read or write.
    var tlsError: ClientError?
    /// The OpenSSL context of every connection of this client (ClientTLS.swift).
    var tlsContext: OpaquePointer?
    var watchID: WatchID?
    private var writeArmed = false
    private var decoder: FrameDecoder
    private var output: [UInt8] = []
    private var outputStart = 0
    var scratch: [UInt8]
    /// Bumped whenever the socket goes away, so work scheduled for an old
    /// socket (deferred failures, handlers mid-batch) can tell it is stale.
    var generation: UInt64 = 0

    private var addresses: [SocketAddress] = []
    private var addressIndex = 0
    private var connectedAddress = ""
    private var connectedAtMs: UInt64?
    private var everConnected = false
    private var retries = 0
    private var joinSentThisConnection = false
    private var joinSentEver = false
    private var failing = false

    private var heartbeatTimer: TimerID?
    private var connectTimer: TimerID?
    private var reconnectTimer: TimerID?
    private var random = SystemRandomNumberGenerator()

    private static let readSize = 64 * 1024
    private static let readsPerWakeup = 4

    /// - Parameters:
    ///   - loop: the event loop that drives this client (see the type's threading note).
    ///   - configuration: address, byte order, heartbeat, reconnect policy.
    ///   - onEvent: called for every frame the daemon relays, in arrival order.
    ///   - onStatus: connection life-cycle changes (for logs or a status line).
    public init(loop: EventLoop, configuration: ClientConfiguration,
                onEvent: @escaping (ClientEvent) -> Void,
                onStatus: @escaping (ClientStatus) -> Void = { _ in }) {
        self.loop = loop
        self.configuration = configuration
        self.onEvent = onEvent
        self.onStatus = onStatus
        self.decoder = FrameDecoder(byteOrder: configuration.byteOrder, maxFrameBytes: configuration.maxFrameBytes)
        self.scratch = [UInt8](repeating: 0, count: Self.readSize)
    }

    deinit {
        if let watchID { loop.unwatch(watchID) }
        if let ssl { SSL_free(ssl) }
        if fd >= 0 { Sys.close(fd) }
        if let tlsContext { SSL_CTX_free(tlsContext) }
    }

    // MARK: - Public operations

    /// Starts connecting (asynchronously: watch `onStatus`). Does nothing
    /// unless the client is `idle` or `closed`.
    public func connect() {
        guard state == .idle || state == .closed else { return }
        retries = 0
        everConnected = false
        failing = false
        startAttempt()
    }

    /// Joins a room as `user` (`user.room` nil: the daemon's default room).
    /// If not connected yet, the join goes out as soon as the connection is
    /// up; after a reconnect it is sent again (`.rejoined`).
    /// - Throws: `ClientError.bodyTooLarge` if the encoded `UserInfo` is over `maxFrameBytes`.
    public func join(_ user: UserInfo) throws(ClientError) {
        let body = user.serialized()
        try checkSize(body)
        self.user = user
        isJoined = true
        joinSentThisConnection = false
        if state == .connected { sendJoin(rejoin: false) }
    }

    /// Leaves the room (docs/protocol/rooms.md §4: the connection stays open, receives
    /// nothing and keeps sending heartbeats) and stops rejoining after reconnects.
    /// - Throws: `ClientError.notJoined` without a previous `join`,
    ///   `ClientError.notConnected` when not connected (the wish to be in the room is dropped anyway).
    public func leave() throws(ClientError) {
        guard let user else { throw .notJoined }
        let wasJoined = isJoined
        isJoined = false
        guard state == .connected else { throw .notConnected }
        if wasJoined { try enqueue(type: configuration.types.leave, body: user.serialized()) }
    }

    /// Sends a text message as the joined user.
    /// - Throws: `ClientError.notJoined`, `.notConnected`, or `.bodyTooLarge`.
    public func sendText(_ text: String) throws(ClientError) {
        guard var user else { throw .notJoined }
        user.token = nil  // a token travels in joins only (docs/protocol/tokens.md §13)
        try enqueue(type: configuration.types.text, body: ChatMessage(user: user, text: text).serialized())
    }

    /// Sends a gift of `count` × `name` (picture at `url`) as the joined user.
    /// - Throws: `ClientError.notJoined`, `.notConnected`, or `.bodyTooLarge`.
    public func sendGift(name: String, url: String, count: Int32) throws(ClientError) {
        guard var user else { throw .notJoined }
        user.token = nil
        let gift = GiftMessage(user: user, giftname: name, giftURL: url, giftcount: count)
        try enqueue(type: configuration.types.gift, body: gift.serialized())
    }

    /// Sends any frame as is: an opaque type the daemon relays unchanged, or a
    /// control frame built by the caller. No identity is needed.
    /// - Throws: `ClientError.notConnected` or `.bodyTooLarge`.
    public func sendFrame(type: UInt16, body: [UInt8]) throws(ClientError) {
        try enqueue(type: type, body: body)
    }

    /// Ends the connection gracefully: writes what is queued, shuts down the
    /// sending side, and closes when the daemon closes its side (it does after
    /// reading everything before our FIN, so every frame sent was processed),
    /// or after `timeoutMs` (default 2 000) at the latest. Events that arrive
    /// meanwhile are still delivered. Then status `.closed`. When not
    /// connected, the same as `close()`.
    public func finish(timeoutMs: UInt64 = 2_000) {
        guard state == .connected else {
            if state != .finishing { close() }
            return
        }
        state = .finishing
        if let t = heartbeatTimer { loop.cancel(t); heartbeatTimer = nil }
        let gen = generation
        loop.schedule(afterMs: timeoutMs) { [weak self] in
            guard let self, self.generation == gen, self.state == .finishing else { return }
            self.close()
        }
        if pendingOutputBytes == 0 { shutdownWrite() }
    }

    /// Closes at once, dropping queued output, and stops reconnecting. Status `.closed`.
    public func close() {
        guard state != .closed else { return }
        teardown()
        if let t = reconnectTimer { loop.cancel(t); reconnectTimer = nil }
        state = .closed
        onStatus(.closed)
    }

    // MARK: - Connecting

    private func startAttempt() {
        state = .connecting
        onStatus(.connecting(server: configuration.server.description, attempt: retries + 1))
        do {
            addresses = try configuration.server.resolve()
        } catch {
            connectionEnded(error)
            return
        }
        addressIndex = 0
        connectTimer = loop.schedule(afterMs: configuration.connectTimeoutMs) { [weak self] in
            guard let self, self.state == .connecting else { return }
            self.connectTimer = nil
            self.connectionEnded(.connectTimeout(address: self.configuration.server.description,
                                                 ms: self.configuration.connectTimeoutMs))
        }
        tryNextAddress(lastError: nil)
    }

    /// Tries `addresses[addressIndex...]` in turn until one connects or is pending.
    private func tryNextAddress(lastError: ClientError?) {
        var lastError = lastError
        while addressIndex < addresses.count {
            let address = addresses[addressIndex]
            addressIndex += 1
            let text = format(address)
            let sock: Int32
            do {
                sock = try Sys.blocking("socket") { socket(address.family, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0) }
            } catch {
                lastError = .system(call: "socket", errno: error.errno)
                continue
            }
            Sys.setOption(sock, Int32(IPPROTO_TCP), TCP_NODELAY, 1)  // chat lines are small; no Nagle delay
            let err: Int32
            do {
                _ = try Sys.blocking("connect") { address.withSockaddr { Glibc.connect(sock, $0, $1) } }
                err = 0
            } catch {
                err = error.errno
            }
            if err == 0 || err == EINPROGRESS {
                fd = sock
                connectedAddress = text
                do {
                    watchID = try loop.watch(sock, readable: false, writable: true) { [weak self] readiness in
                        self?.handle(readiness)
                    }
                    writeArmed = true
                } catch {
                    Sys.close(sock)
                    fd = -1
                    lastError = error
                    continue
                }
                if err == 0 { connected() }
                return
            }
            Sys.close(sock)
            lastError = .connect(address: text, errno: err)
        }
        connectionEnded(lastError ?? .connect(address: configuration.server.description, errno: ECONNREFUSED))
    }

    /// TCP is up: the TLS handshake first when configured (ClientTLS.swift).
    private func connected() {
        if configuration.tls != nil { startTLS() } else { didConnect() }
    }

    func didConnect() {
        if let t = connectTimer { loop.cancel(t); connectTimer = nil }
        state = .connected
        everConnected = true
        connectedAtMs = loop.nowMs
        decoder = FrameDecoder(byteOrder: configuration.byteOrder, maxFrameBytes: configuration.maxFrameBytes)
        updateInterest()
        scheduleHeartbeat()
        let gen = generation
        onStatus(.connected(address: connectedAddress))
        guard gen == generation, state == .connected else { return }
        // A join sent on an earlier connection makes this an automatic rejoin.
        if isJoined && !joinSentThisConnection { sendJoin(rejoin: joinSentEver) }
    }

    private func sendJoin(rejoin: Bool) {
        guard let user else { return }
        joinSentThisConnection = true
        joinSentEver = true
        do {
            var join = user
            if join.token == nil { join.token = configuration.token }
            try enqueue(type: configuration.types.join, body: join.serialized())
        } catch {
            return  // only .notConnected is possible here, and the caller checked
        }
        onStatus(rejoin ? .rejoined(user) : .joined(user))
    }

    // MARK: - I/O

    private func handle(_ readiness: IOReadiness) {
        switch state {
        case .connecting:
            var socketError: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            do {
                _ = try Sys.blocking("getsockopt(SO_ERROR)") { getsockopt(fd, SOL_SOCKET, SO_ERROR, &socketError, &length) }
            } catch {
                socketError = error.errno
            }
            let error = socketError
            if handshaking {
                continueTLS()
            } else if error == 0 {
                connected()
            } else {
                let text = connectedAddress
                closeSocket()
                tryNextAddress(lastError: .connect(address: text, errno: error))
            }
        case .connected, .finishing:
            if readiness.contains(.writable) { flush() }
            if readiness.contains(.readable) || readiness.contains(.hangup) { readAvailable() }
        default:
            break
        }
    }

    func readAvailableNow() { readAvailable() }

    private func readAvailable() {
        let gen = generation
        for _ in 0..<Self.readsPerWakeup {
            let result = ssl.map { tlsRead($0) } ?? scratch.withUnsafeMutableBytes { Sys.read(fd, $0.baseAddress!, $0.count) }
            switch result {
            case .done(let n):
                decoder.append(scratch[0..<n])
                deliverFrames(generation: gen)
                guard gen == generation else { return }
                if n < Self.readSize && ssl == nil { return }
            case .wouldBlock:
                return
            case .endOfFile:
                if state == .finishing { close() } else { connectionEnded(.closedByPeer) }
                return
            case .failed(let e):
                if state == .finishing { close() } else { connectionEnded(tlsError ?? .system(call: "read", errno: e)) }
                return
            }
        }
        if let ssl, SSL_has_pending(ssl) == 1 { readLater() }  // records inside OpenSSL wake no epoll
    }

    private func deliverFrames(generation gen: UInt64) {
        while gen == generation {
            let frame: Frame?
            do {
                frame = try decoder.next()
            } catch {
                connectionEnded(.frameTooLarge(claimed: error.claimed, limit: error.limit))
                return
            }
            guard let frame else { return }
            if let event = decode(frame) { onEvent(event) }
        }
    }

    private func decode(_ frame: Frame) -> ClientEvent? {
        let types = configuration.types
        do {
            switch frame.type {
            case types.heartbeat: return nil  // roomcastd never relays them; other servers might echo them
            case types.join: return .join(try UserInfo(protobuf: frame.body))
            case types.leave: return .leave(try UserInfo(protobuf: frame.body))
            case types.notice: return .notice(try Notice(protobuf: frame.body))
            case types.text: return .text(try ChatMessage(protobuf: frame.body))
            case types.gift: return .gift(try GiftMessage(protobuf: frame.body))
            default: return .opaque(type: frame.type, body: frame.body)
            }
        } catch {
            return .malformed(type: frame.type, body: frame.body, error: error)
        }
    }

    private func checkSize(_ body: [UInt8]) throws(ClientError) {
        guard body.count <= configuration.maxFrameBytes else {
            throw .bodyTooLarge(bytes: body.count, limit: configuration.maxFrameBytes)
        }
    }

    private func enqueue(type: UInt16, body: [UInt8]) throws(ClientError) {
        try checkSize(body)
        guard state == .connected, !failing else { throw .notConnected }
        FrameCodec.appendHeader(type: type, length: UInt32(body.count), byteOrder: configuration.byteOrder, to: &output)
        output.append(contentsOf: body)
        flush()
    }

    /// Optimistic write; EPOLLOUT is armed only while the kernel refuses bytes.
    /// A failure is handled on the next loop iteration, so a public method
    /// never calls the handlers itself.
    private func flush() {
        while outputStart < output.count {
            let start = outputStart
            let result = output.withUnsafeBytes { bytes in
                ssl.map { tlsWrite($0, UnsafeRawBufferPointer(rebasing: bytes[start...])) } ?? Sys.send(fd, bytes.baseAddress! + start, bytes.count - start)
            }
            switch result {
            case .done(let n):
                outputStart += n
            case .wouldBlock:
                if !writeArmed { writeArmed = true; updateInterest() }
                return
            case .failed(let e):
                failLater(tlsError ?? .system(call: "send", errno: e))
                return
            case .endOfFile:
                failLater(.closedByPeer)
                return
            }
        }
        output.removeAll(keepingCapacity: output.capacity <= 1 << 20)
        outputStart = 0
        if writeArmed { writeArmed = false; updateInterest() }
        if state == .finishing { shutdownWrite() }
    }

    /// FIN after the last queued byte; a reset peer shows up as EOF or an error on read.
    private func shutdownWrite() {
        if let ssl { _ = SSL_shutdown(ssl) }  // close_notify first (RFC 8446 §6.1)
        _ = try? Sys.blocking("shutdown") { Glibc.shutdown(fd, Int32(SHUT_WR)) }
    }

    private func failLater(_ error: ClientError) {
        guard !failing else { return }
        failing = true
        let gen = generation
        loop.schedule(afterMs: 0) { [weak self] in
            guard let self, self.generation == gen else { return }
            self.connectionEnded(error)
        }
    }

    func updateInterest() {
        guard let watchID else { return }
        do {
            try loop.update(watchID, readable: true, writable: writeArmed)
        } catch {
            failLater(error)
        }
    }

    private func scheduleHeartbeat() {
        guard configuration.heartbeatIntervalMs > 0 else { return }
        let gen = generation
        heartbeatTimer = loop.schedule(afterMs: configuration.heartbeatIntervalMs) { [weak self] in
            guard let self, self.generation == gen, self.state == .connected else { return }
            try? self.enqueue(type: self.configuration.types.heartbeat, body: self.configuration.heartbeatBody)
            self.scheduleHeartbeat()
        }
    }

    // MARK: - Ending

    /// Closes the socket and cancels the per-connection timers.
    private func teardown() {
        closeSocket()
        if let t = heartbeatTimer { loop.cancel(t); heartbeatTimer = nil }
        if let t = connectTimer { loop.cancel(t); connectTimer = nil }
    }

    /// Closes the socket and drops its queued output; timers stay.
    private func closeSocket() {
        generation &+= 1
        if let watchID { loop.unwatch(watchID) }
        watchID = nil
        if let ssl { SSL_free(ssl) }
        ssl = nil
        handshaking = false
        tlsError = nil
        if fd >= 0 { Sys.close(fd) }
        fd = -1
        writeArmed = false
        failing = false
        output.removeAll()
        outputStart = 0
    }

    /// The connection dropped or an attempt failed: report it, then retry or close.
    func connectionEnded(_ error: ClientError) {
        let wasFinishing = state == .finishing
        let now = loop.nowMs
        if let since = connectedAtMs, now >= since, now - since >= configuration.reconnect.stableAfterMs { retries = 0 }
        connectedAtMs = nil
        joinSentThisConnection = false
        teardown()
        onStatus(.disconnected(error))
        guard state != .closed else { return }  // the handler closed us
        let policy = configuration.reconnect
        let retry = !wasFinishing && (everConnected ? policy.enabled : policy.retryInitialConnect)
        guard retry else {
            state = .closed
            onStatus(.closed)
            return
        }
        let delay = policy.delayMs(attempt: retries, jitter: Double.random(in: 0...1, using: &random))
        retries += 1
        state = .waitingToReconnect
        reconnectTimer = loop.schedule(afterMs: delay) { [weak self] in
            guard let self, self.state == .waitingToReconnect else { return }
            self.reconnectTimer = nil
            self.startAttempt()
        }
        onStatus(.reconnecting(delayMs: delay, attempt: retries))
    }

    private func format(_ address: SocketAddress) -> String { address.text }
}
