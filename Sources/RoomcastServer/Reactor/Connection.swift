import RoomcastCore

// Connection.swift owns what one client connection is: its life-cycle
// states and which moves between them are legal, the protocol it speaks,
// and its per-connection bookkeeping. It performs no I/O and never changes
// a state itself: `ConnectionTable.transition` is the one setter.

/// Where a connection is in its life (memcached's `conn_states`).
///
///     open ──EOF, stop──▶ draining ──flushed, deadline──▶ closing ──reap──▶ (slot free)
///       └──────────── error, eviction, violation ───────────▶┘
enum ConnectionState: Equatable {
    /// Reading frames and receiving relayed ones.
    case open
    /// No more reading (the peer sent EOF, or the daemon is stopping): what
    /// is already owed is flushed until `Connection.drainDeadlineMs`, then it closes.
    case draining
    /// Marked for close with a reason; reaped at the end of the loop
    /// iteration, never inside its own callback.
    case closing

    /// Whether a connection in this state may move to `next`. A connection
    /// never goes back: open → draining → closing, or open → closing.
    func canMove(to next: ConnectionState) -> Bool {
        switch (self, next) {
        case (.open, .draining), (.open, .closing), (.draining, .closing): true
        default: false
        }
    }
}

/// The protocol a listener speaks.
enum Dialect: Equatable {
    /// Length-type-body frames with proto2 bodies (docs/protocol/ltb.md §1-§3).
    case ltb
    /// Length + JSON frames (docs/protocol/json.md §7).
    case json
    /// RFC 6455 WebSocket: an HTTP upgrade, then frames carrying JSON or LTB
    /// messages (docs/protocol/websocket.md §15).
    case webSocket

    /// `ltb`, `json` or `websocket`: the `PROTOCOL` journal field, the
    /// socket-activation name (`FileDescriptorName=`) and the fd-store name.
    var name: String {
        switch self {
        case .ltb: "ltb"
        case .json: "json"
        case .webSocket: "websocket"
        }
    }
}

/// A WebSocket connection's protocol state (RFC 6455): the upgrade in
/// progress, then the chosen subprotocol and the frame decoder.
struct WebSocketSession {
    enum Phase {
        /// Reading the HTTP request head (bounded to 8 KiB, 5 s).
        case upgrading(HTTPRequestParser)
        /// Upgraded: frames both ways.
        case open
    }
    var phase: Phase = .upgrading(HTTPRequestParser())
    /// The subprotocol spoken once open (`roomcast.json.v1` when none was offered).
    var subprotocol: WebSocketSubprotocol = .json
    /// Connected to `/echo`: every message goes back to its sender, no room.
    var echo = false
    /// Client frames: reassembly, UTF-8, close codes.
    var decoder: WebSocketDecoder

    var isOpen: Bool {
        if case .open = phase { return true }
        return false
    }
}

/// Why a connection is closed, for the log.
struct CloseReason: Equatable {
    /// What happened, e.g. `closed by peer`, `read: Connection reset by peer`.
    var text: String
    /// The `REASON` code when the close is the peer's fault and worth a
    /// (rate-limited) warning at reap time, e.g. `output_hard_limit`; nil:
    /// logged at debug.
    var warning: String? = nil
}

/// One client connection's cold state: everything but what a broadcast
/// touches (that is its `Outbox`). It knows nothing of rooms (the relay owns
/// those by connection id).
struct Connection {
    let fd: Int32
    let dialect: Dialect
    /// The peer, `1.2.3.4:P` or `[::1]:P`; the `CLIENT_ADDR` journal field.
    let address: String
    /// A JSON client's nickname once it sent `nickname` (docs/protocol/json.md §7).
    var nickname: String?
    /// Rate limits (`[limits] frames_per_second`, `bytes_per_second`); nil: off.
    var frameBucket: TokenBucket?
    var byteBucket: TokenBucket?
    /// A partial frame carried over between reads (grows with bytes
    /// received, never with the length a header claims).
    var input: [UInt8] = []
    /// While draining: when the flush of owed output gives up, in ms.
    var drainDeadlineMs: UInt64 = 0
    /// Set with the move to `.closing`.
    var closeReason: CloseReason?
    /// Why it ends, when the server decided it (a kick, an eviction, an
    /// expiry) and the close text would not say; else the text is classified.
    var disconnectReason: DisconnectReason?
    /// What its last accepted token proved (docs/protocol/tokens.md §13); nil: no token.
    var auth: AuthSession?
    /// When its last text passed slow mode, in ms (Moderation/Moderation.swift).
    var lastTextMs: UInt64?
    /// A WebSocket connection's protocol state; nil for the other dialects.
    var webSocket: WebSocketSession?
    /// The OpenSSL session (`SSL *`) of a connection from a `listen_tls`
    /// listener, past its handshake (TLS/); nil: plain TCP.
    var tls: OpaquePointer?
    /// Its last SSL_read(3) wanted the socket writable (TLSConnection.swift).
    var tlsReadWantsWrite = false

    /// The peer's IP address alone (`1.2.3.4`, `[::1]`), for `max_clients_per_ip`.
    var ip: Substring { Self.ip(of: address) }

    /// The IP part of a `1.2.3.4:P` or `[::1]:P` peer address.
    static func ip(of address: String) -> Substring {
        address[..<(address.lastIndex(of: ":") ?? address.endIndex)]
    }

    init(fd: Int32, dialect: Dialect, address: String) {
        self.fd = fd
        self.dialect = dialect
        self.address = address
    }
}
