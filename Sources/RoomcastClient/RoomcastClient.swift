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
    public internal(set) var state: State = .idle
    /// Who the client is, from the last `join`; nil before the first one.
    public internal(set) var user: UserInfo?
    /// True from `join` until `leave`: the client wants to be in `user.room`
    /// and joins it again after a reconnect.
    public internal(set) var isJoined = false
    /// Bytes queued for the daemon and not yet accepted by the kernel.
    public var pendingOutputBytes: Int { output.count - outputStart }

    let loop: EventLoop
    let onEvent: (ClientEvent) -> Void
    let onStatus: (ClientStatus) -> Void

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
    var writeArmed = false
    var decoder: FrameDecoder
    var output: [UInt8] = []
    var outputStart = 0
    var scratch: [UInt8]
    /// Bumped whenever the socket goes away, so work scheduled for an old
    /// socket (deferred failures, handlers mid-batch) can tell it is stale.
    var generation: UInt64 = 0

    var addresses: [SocketAddress] = []
    var addressIndex = 0
    var connectedAddress = ""
    var connectedAtMs: UInt64?
    var everConnected = false
    var retries = 0
    var joinSentThisConnection = false
    var joinSentEver = false
    var failing = false

    var heartbeatTimer: TimerID?
    var connectTimer: TimerID?
    var reconnectTimer: TimerID?
    var random = SystemRandomNumberGenerator()

    static let readSize = 64 * 1024
    static let readsPerWakeup = 4

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

    // MARK: - Ending

    /// Closes the socket and cancels the per-connection timers.
    func teardown() {
        closeSocket()
        if let t = heartbeatTimer { loop.cancel(t); heartbeatTimer = nil }
        if let t = connectTimer { loop.cancel(t); connectTimer = nil }
    }

    /// Closes the socket and drops its queued output; timers stay.
    func closeSocket() {
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

    func format(_ address: SocketAddress) -> String { address.text }
}
