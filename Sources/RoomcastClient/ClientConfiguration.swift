/// Frame types of the messages the client sends and decodes (docs/protocol/ltb.md §2).
/// The control codes are configurable per daemon listener, so they are here too.
public struct MessageTypes: Equatable, Sendable {
    /// Join, body `UserInfo` (default 0; the daemon's `join_type`).
    public var join: UInt16 = 0
    /// Leave, body `UserInfo` (default 1; the daemon's `leave_type`).
    public var leave: UInt16 = 1
    /// Text, body `ChatMessage` (2).
    public var text: UInt16 = 2
    /// Gift, body `GiftMessage` (3).
    public var gift: UInt16 = 3
    /// Heartbeat, body ignored, never relayed (default 8; the daemon's `heartbeat_type`).
    public var heartbeat: UInt16 = 8
    /// Server notice, body `Notice`, sent by the daemon only: why it refused a
    /// frame (default 9; the daemon's `notice_type`, docs/protocol/notices.md §13).
    public var notice: UInt16 = 9
    /// The original phone clients' codes, roomcastd's defaults.
    public init() {}
}

/// When and how often to reconnect after a drop: exponential backoff with
/// jitter, like the original phone clients (docs/protocol/clients.md §8).
///
/// Retry n (counting from 0) waits `min(maxDelayMs, initialDelayMs · 2^n)`
/// scaled by a random factor in [0.5, 1] ("equal jitter"), so a daemon restart
/// does not bring every client back in the same millisecond. The count goes
/// back to 0 once a connection has lasted `stableAfterMs`.
public struct ReconnectPolicy: Equatable, Sendable {
    /// Reconnect after a connection that was established drops.
    public var enabled = true
    /// Also keep retrying when the very first connection attempt fails
    /// (false: report `.closed` at once, e.g. for one-shot tools).
    public var retryInitialConnect = true
    /// First delay, in ms (default 500).
    public var initialDelayMs: UInt64 = 500
    /// Largest delay, in ms (default 30 000).
    public var maxDelayMs: UInt64 = 30_000
    /// A connection that lasted this long, in ms, resets the backoff (default 60 000).
    public var stableAfterMs: UInt64 = 60_000

    /// Backoff from 0.5 s to 30 s, reset after a stable minute; retries the first connect too.
    public init() {}

    /// No reconnection at all: a drop or a failed connect closes the client.
    public static var never: ReconnectPolicy {
        var policy = ReconnectPolicy()
        policy.enabled = false
        policy.retryInitialConnect = false
        return policy
    }

    /// The delay before retry `attempt` (0 for the first retry), in ms.
    /// - Parameter jitter: a number in [0, 1]; 0 gives half the backoff, 1 the whole.
    public func delayMs(attempt: Int, jitter: Double) -> UInt64 {
        var backoff = max(1, initialDelayMs)
        for _ in 0..<max(0, min(attempt, 63)) where backoff < maxDelayMs { backoff = backoff.multipliedReportingOverflow(by: 2).partialValue }
        backoff = min(backoff, maxDelayMs)
        let factor = 0.5 + 0.5 * min(1, max(0, jitter))
        return max(1, UInt64((Double(backoff) * factor).rounded()))
    }
}

/// TLS to a `listen_tls` listener (docs/protocol/tls.md §16), with OpenSSL.
public struct ClientTLS: Equatable, Sendable {
    /// PEM file of the CAs that may sign the daemon's certificate; nil: the
    /// system's trust store (SSL_CTX_set_default_verify_paths(3)).
    public var caFile: String?
    /// Check the certificate and its name (default). False (`--insecure`)
    /// accepts any certificate: for tests only.
    public var verify = true
    /// The name sent (SNI) and checked against the certificate; nil: the
    /// host of the server address.
    public var serverName: String?

    public init(caFile: String? = nil, verify: Bool = true, serverName: String? = nil) {
        self.caFile = caFile
        self.verify = verify
        self.serverName = serverName
    }
}

/// Everything a `RoomcastClient` needs to know before it connects.
public struct ClientConfiguration: Sendable {
    /// The daemon's address (default `127.0.0.1:9898`).
    public var server: ServerAddress
    /// Byte order of frame headers; must match the daemon's listener (docs/protocol/ltb.md §1).
    public var byteOrder: ByteOrder = .little
    /// Largest body sent or accepted, in bytes (the daemon's default `max_frame_bytes`, 64 KiB).
    public var maxFrameBytes: Int = 64 * 1024
    /// Interval between heartbeats while connected, in ms (default 10 000 as
    /// the original phone clients; 0 sends none). Keep it under the daemon's
    /// `heartbeat.timeout` (docs/protocol/rooms.md §5).
    public var heartbeatIntervalMs: UInt64 = 10_000
    /// Body of a heartbeat frame: the original clients' text; the daemon never decodes it.
    public var heartbeatBody: [UInt8] = Array("this is a heartBeat message ".utf8)
    /// Time allowed for one connection attempt (all resolved addresses), in ms.
    public var connectTimeoutMs: UInt64 = 10_000
    /// Reconnection after a drop.
    public var reconnect = ReconnectPolicy()
    /// Frame types (docs/protocol/ltb.md §2).
    public var types = MessageTypes()
    /// The signed-join token sent in every join (and rejoin) as UserInfo
    /// field 5 (docs/protocol/tokens.md §13) when the joined user carries none;
    /// never in texts or gifts. Nil: no token. Renew it before its `exp` by
    /// setting a new one and joining again.
    public var token: String?
    /// TLS; nil (default): plain TCP.
    public var tls: ClientTLS?

    /// The defaults above, for the daemon at `server`.
    public init(server: ServerAddress = .default) {
        self.server = server
    }
}
