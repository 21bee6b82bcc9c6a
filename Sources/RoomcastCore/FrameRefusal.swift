// FrameRefusal.swift: why a client's frame was refused and relayed nowhere,
// for `roomcast_frames_refused_total{reason}` (docs/api.md "Metrics").

/// A refused frame's reason: the code of the notice its sender gets
/// (docs/protocol/tokens.md §13). The relay's own refusals (`RejectionCode`, each a
/// violation toward `protocol.max_violations`) and moderation's (docs/api.md
/// "Moderation": `banned`, `muted`, `slow_mode`, never violations).
public enum FrameRefusal: Int, CaseIterable, Sendable {
    case badFrame, roomTooLong, rateLimit, frameTooLarge
    case tokenRequired, tokenInvalid, tokenExpired, roomForbidden, identityMismatch, notPermitted
    case noticeFromClient
    /// A join of a banned sub to its room.
    case banned
    /// A send by a sub muted in its room.
    case muted
    /// A viewer's text within its room's slow-mode interval.
    case slowMode

    /// The relay's refusal of `code` (one case each).
    public init(_ code: RejectionCode) {
        self = switch code {
        case .badFrame: .badFrame
        case .roomTooLong: .roomTooLong
        case .rateLimit: .rateLimit
        case .frameTooLarge: .frameTooLarge
        case .tokenRequired: .tokenRequired
        case .tokenInvalid: .tokenInvalid
        case .tokenExpired: .tokenExpired
        case .roomForbidden: .roomForbidden
        case .identityMismatch: .identityMismatch
        case .notPermitted: .notPermitted
        case .noticeFromClient: .noticeFromClient
        }
    }

    /// The notice's code, and the metric's `reason` label (snake_case, as `RejectionCode`'s raw values).
    public var label: String {
        switch self {
        case .badFrame: "bad_frame"
        case .roomTooLong: "room_too_long"
        case .rateLimit: "rate_limit"
        case .frameTooLarge: "frame_too_large"
        case .tokenRequired: "token_required"
        case .tokenInvalid: "token_invalid"
        case .tokenExpired: "token_expired"
        case .roomForbidden: "room_forbidden"
        case .identityMismatch: "identity_mismatch"
        case .notPermitted: "not_permitted"
        case .noticeFromClient: "notice_from_client"
        case .banned: "banned"
        case .muted: "muted"
        case .slowMode: "slow_mode"
        }
    }
}

/// Counters per `FrameRefusal`, plain integers in a fixed array.
public struct FrameRefusalCounts: Equatable, Sendable {
    public private(set) var values = [UInt64](repeating: 0, count: FrameRefusal.allCases.count)
    public init() {}
    public mutating func add(_ reason: FrameRefusal) { values[reason.rawValue] &+= 1 }
    public subscript(_ reason: FrameRefusal) -> UInt64 { values[reason.rawValue] }
}
