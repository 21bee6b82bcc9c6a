// What /metrics counts frames by (docs/api.md, "Metrics"): the kinds of
// docs/protocol/ltb.md §2, found from a frame's type with a few comparisons
// (no dictionary on the path of every frame).

/// A frame's kind for counting: the control codes, text, gift, notice, or opaque.
public enum FrameKind: Int, CaseIterable, Sendable {
    case join, leave, heartbeat, text, gift, notice, opaque

    /// The `type` label of the metric.
    public var label: String {
        switch self {
        case .join: "join"
        case .leave: "leave"
        case .heartbeat: "heartbeat"
        case .text: "text"
        case .gift: "gift"
        case .notice: "notice"
        case .opaque: "opaque"
        }
    }

    /// The kind of frame type `type` under the control codes of `[protocol]`
    /// (text 2 and gift 3 are fixed, §2).
    @inline(__always)
    /// The text and gift types, fixed by docs/protocol/ltb.md §3 (not configurable).
    public static let textType: UInt16 = 2
    public static let giftType: UInt16 = 3

    public static func of(_ type: UInt16, join: UInt16, leave: UInt16, heartbeat: UInt16, notice: UInt16) -> FrameKind {
        if type == textType { return .text }
        if type == join { return .join }
        if type == leave { return .leave }
        if type == heartbeat { return .heartbeat }
        if type == giftType { return .gift }
        if type == notice { return .notice }
        return .opaque
    }
}

/// Counters per `FrameKind`, plain integers in a fixed tuple-like array.
public struct FrameKindCounts: Equatable, Sendable {
    public private(set) var values = [UInt64](repeating: 0, count: FrameKind.allCases.count)
    public init() {}
    @inline(__always)
    public mutating func add(_ kind: FrameKind, _ n: UInt64 = 1) { values[kind.rawValue] &+= n }
    public subscript(_ kind: FrameKind) -> UInt64 { values[kind.rawValue] }
}

/// Why a client connection ended, for `roomcast_disconnects_total{reason}`.
public enum DisconnectReason: Int, CaseIterable, Sendable {
    /// The client closed (EOF, or FIN then its owed output flushed).
    case peerClosed
    /// A read or write failed (a reset, a broken TLS session).
    case error
    /// No frame for `heartbeat.timeout` (§5).
    case heartbeatTimeout
    /// `protocol.max_violations` bad frames (§9).
    case violations
    /// A frame over `max_frame_bytes` (§9).
    case frameTooLarge
    /// A slow consumer: over `output_hard_bytes`, or `output_soft_bytes` too long (§6).
    case slowConsumer
    /// Its owed output not taken within the drain timeout.
    case drainTimeout
    /// Removed by the backend (`POST .../kick`, docs/api.md).
    case kicked
    /// Removed by a ban (`PUT .../bans/{sub}`, docs/api.md).
    case banned
    /// Its token ran out without a renewal (§13).
    case tokenExpired
    /// The daemon stopped, or restarted a TLS client (§16).
    case stopping
    case other

    public var label: String {
        switch self {
        case .peerClosed: "peer_closed"
        case .error: "error"
        case .heartbeatTimeout: "heartbeat_timeout"
        case .violations: "violations"
        case .frameTooLarge: "frame_too_large"
        case .slowConsumer: "slow_consumer"
        case .drainTimeout: "drain_timeout"
        case .kicked: "kicked"
        case .banned: "banned"
        case .tokenExpired: "token_expired"
        case .stopping: "stopping"
        case .other: "other"
        }
    }

    /// The reason of a close the server did not mark with one, from its log text.
    public static func classify(_ text: String, warning: String?) -> DisconnectReason {
        if warning == "output_hard_limit" || text.hasPrefix("slow consumer") { return .slowConsumer }
        if text == "closed by peer" || text == "closed" { return .peerClosed }
        if text.hasPrefix("daemon stopping") || text.hasPrefix("restart:") { return .stopping }
        if text.hasPrefix("drain timeout") { return .drainTimeout }
        if text.hasPrefix("frame length") || has(text, "max_message_bytes") { return .frameTooLarge }
        if has(text, "bad frames") || has(text, "max_violations") { return .violations }
        if text.hasPrefix("read:") || text.hasPrefix("send:") || text.hasPrefix("SSL_") || has(text, "reset") { return .error }
        return .other
    }

    /// Whether `needle`'s UTF-8 bytes occur in `text`'s. A plain byte
    /// search: `StringProtocol.contains(_:)` goes through the
    /// _StringProcessing module, and three such calls made one disconnect
    /// cost about 81,000 instructions (callgrind, `make bench-profile`).
    static func has(_ text: String, _ needle: String) -> Bool {
        let t = Array(text.utf8), n = Array(needle.utf8)
        guard !n.isEmpty else { return true }
        guard n.count <= t.count else { return false }
        return (0...(t.count - n.count)).contains { i in
            var j = 0
            while j < n.count && t[i + j] == n[j] { j += 1 }
            return j == n.count
        }
    }
}
