/// Why the relay dropped a frame; the raw value is the `REASON` code the
/// daemon logs (a stable snake_case code, see Logger.peerWarning).
public enum RejectionCode: String, Sendable {
    /// A body that does not match the proto2 schema (§3), or a malformed JSON command (§7).
    case badFrame = "bad_frame"
    /// A join naming a room longer than `max_room_bytes`.
    case roomTooLong = "room_too_long"
    /// Over `[limits] frames_per_second` or `bytes_per_second` (the server's check).
    case rateLimit = "rate_limit"
    /// A JSON command whose frame would be over a `max_frame_bytes` (the server's check).
    case frameTooLarge = "frame_too_large"
    /// Signed joins (docs/protocol/tokens.md §13): a join without a token where one
    /// is required, or a send by an anonymous reader.
    case tokenRequired = "token_required"
    /// A token that is malformed, badly signed, of the wrong algorithm or key.
    case tokenInvalid = "token_invalid"
    /// A token past `exp` (plus the leeway), or a connection whose token ran out.
    case tokenExpired = "token_expired"
    /// A join naming a room outside the token's `rooms`.
    case roomForbidden = "room_forbidden"
    /// A join, text or gift whose UserInfo is not the token's identity.
    case identityMismatch = "identity_mismatch"
    /// A frame type outside the token's `may`.
    case notPermitted = "not_permitted"
    /// A frame of type `protocol.notice_type` from a client.
    case noticeFromClient = "notice_from_client"
}

/// What the relay did with one frame, for the caller's logs and counters.
public enum RelayEvent: Equatable, Sendable {
    /// A heartbeat: proof of life only, never relayed (§2).
    case heartbeat
    /// Relayed to `recipients` connections (0 when the sender is in no room).
    case relayed(recipients: Int)
    /// A join moved the sender into `room` and was relayed there.
    case joined(name: String, room: String, recipients: Int)
    /// A leave took the sender out of `room` (nil: it was in none).
    case left(room: String?, recipients: Int)
    /// The frame was dropped: `reason` says why and `code` what kind of
    /// problem it is; `violations` counts the sender's bad frames so far;
    /// `disconnect` is true once the count reaches `maxViolations`. The
    /// sender's room and identity are as before the frame.
    case rejected(reason: String, violations: Int, disconnect: Bool, code: RejectionCode)

    /// Names and rooms compare byte for byte (see PeerText.swift).
    public static func == (a: RelayEvent, b: RelayEvent) -> Bool {
        switch (a, b) {
        case (.heartbeat, .heartbeat): true
        case let (.relayed(x), .relayed(y)): x == y
        case let (.joined(n1, r1, x), .joined(n2, r2, y)): sameBytes(n1, n2) && sameBytes(r1, r2) && x == y
        case let (.left(r1, x), .left(r2, y)): sameBytes(r1, r2) && x == y
        case let (.rejected(r1, v1, d1, c1), .rejected(r2, v2, d2, c2)): sameBytes(r1, r2) && v1 == v2 && d1 == d2 && c1 == c2
        default: false
        }
    }
}
