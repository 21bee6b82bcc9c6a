/// A frame relayed by the daemon, decoded (docs/protocol/ltb.md §2-3). The daemon
/// relays the sender's own frames back to it too (`echo = yes`), so a client
/// sees its own join, text and gift as events.
public enum ClientEvent: Equatable, Sendable {
    /// Someone joined the room: their `UserInfo` (with `room` if they named one).
    case join(UserInfo)
    /// Someone left or disconnected (the daemon synthesizes the latter, docs/protocol/rooms.md §4).
    case leave(UserInfo)
    /// A text message.
    case text(ChatMessage)
    /// A gift.
    case gift(GiftMessage)
    /// A notice from the daemon itself (docs/protocol/notices.md §13): why it refused
    /// one of this client's frames (`token_required`, `identity_mismatch` ...),
    /// and whether and when a retry may succeed.
    case notice(Notice)
    /// A frame of any other type, relayed unchanged by the daemon.
    case opaque(type: UInt16, body: [UInt8])
    /// A join/leave/text/gift frame whose body does not decode (possible only
    /// when the daemon runs with `validate = no`).
    case malformed(type: UInt16, body: [UInt8], error: ProtoError)
}

/// Connection life cycle, reported to the status handler in this order:
/// `connecting`, then `connected` (or `disconnected`), `joined`/`rejoined`,
/// `disconnected`, `reconnecting`, `connecting` again ..., and finally `closed`.
public enum ClientStatus: Equatable, Sendable {
    /// Connection attempt number `attempt` (1-based) to `server` has started.
    case connecting(server: String, attempt: Int)
    /// The TCP connection is up; `address` is the socket address used.
    case connected(address: String)
    /// The join frame for `user` went out (after a `join` call).
    case joined(UserInfo)
    /// After a reconnect, the client joined again as `user` (same room).
    case rejoined(UserInfo)
    /// The connection ended or an attempt failed. Frames queued but not yet
    /// written are lost.
    case disconnected(ClientError)
    /// The next attempt starts in `delayMs` milliseconds.
    case reconnecting(delayMs: UInt64, attempt: Int)
    /// The client stopped: `close()`/`finish()`, or the reconnect policy gave up.
    case closed
}

extension Notice {
    /// The codes of docs/protocol/notices.md's notice table that refuse one of
    /// this client's frames or remove it (`kicked`, `banned`). Every other
    /// code (`history`, `viewers`, `skipped`, `position`, `history_lost`,
    /// `restarting`, and any a later daemon adds) informs and refuses nothing.
    public static let refusalCodes: Set<String> = [
        "token_required", "token_invalid", "token_expired", "room_forbidden", "identity_mismatch",
        "not_permitted", "kicked", "banned", "muted", "slow_mode",
    ]

    /// Whether this notice says a frame was refused (or the client removed):
    /// its `code` is in `refusalCodes`.
    public var isRefusal: Bool { Self.refusalCodes.contains(code) }
}
