/// The relay rules that can change on reload (docs/protocol/ §2-§4).
public struct RelaySettings: Equatable, Sendable {
    public var byteOrder: ByteOrder
    public var joinType: UInt16
    public var leaveType: UInt16
    public var heartbeatType: UInt16
    /// Text (2) and gift (3) are fixed (docs/protocol/ltb.md §2).
    public var textType: UInt16 = 2
    public var giftType: UInt16 = 3
    /// Send frames back to their sender too (docs/protocol/rooms.md §4).
    public var echo: Bool
    /// Check join/leave/text/gift bodies against the proto2 schema (§3).
    public var validate: Bool
    /// Bad frames after which the sender is disconnected (>= 1).
    public var maxViolations: Int
    /// The room a connection is in after accept and after a join without `room`.
    public var defaultRoom: String
    /// Longest `room` a join may name, in bytes of UTF-8 (`[protocol]
    /// max_room_bytes`); a longer one is a violation and the join is refused.
    public var maxRoomBytes: Int
    /// The type of server notices (`[protocol] notice_type`,
    /// docs/protocol/tokens.md §13): a client sending one is refused.
    public var noticeType: UInt16
    /// Whether a new connection is a member of the default room at once
    /// (§4). False when `[auth] required = yes` and `anonymous = none`: a
    /// client without a token hears nothing (§13).
    public var admitsToDefaultRoom: Bool
    /// `[rooms] announce_joins`: joins and leaves, synthesized ones too,
    /// reach the room and the observer (§4). False: a join goes back to its
    /// sender only (with `echo`), a leave (sent or synthesized) nowhere.
    public var announceJoins = true
    /// `[rooms] history`: the text and gift frames each room keeps for the
    /// members who join it later (§4, "Recent lines on join"); 0: none, and
    /// no notice `history`.
    public var historyFrames = 0
    /// `[rooms] history_bytes`: the most a room's history holds, in bytes
    /// of whole frames (headers included).
    public var historyBytes = 262_144

    public init(byteOrder: ByteOrder = .little, joinType: UInt16 = 0, leaveType: UInt16 = 1, heartbeatType: UInt16 = 8,
                echo: Bool = true, validate: Bool = true, maxViolations: Int = 3, defaultRoom: String = "lobby",
                maxRoomBytes: Int = 255, noticeType: UInt16 = 9, admitsToDefaultRoom: Bool = true) {
        self.noticeType = noticeType
        self.admitsToDefaultRoom = admitsToDefaultRoom
        self.byteOrder = byteOrder
        self.joinType = joinType
        self.leaveType = leaveType
        self.heartbeatType = heartbeatType
        self.echo = echo
        self.validate = validate
        self.maxViolations = maxViolations
        self.defaultRoom = defaultRoom
        self.maxRoomBytes = maxRoomBytes
    }

    /// Byte-wise, like every peer-visible string (see PeerText.swift): a
    /// default room respelled in another normalization form is a change.
    public static func == (a: RelaySettings, b: RelaySettings) -> Bool {
        a.byteOrder == b.byteOrder && a.joinType == b.joinType && a.leaveType == b.leaveType
            && a.heartbeatType == b.heartbeatType && a.textType == b.textType && a.giftType == b.giftType
            && a.echo == b.echo && a.validate == b.validate && a.maxViolations == b.maxViolations
            && sameBytes(a.defaultRoom, b.defaultRoom) && a.maxRoomBytes == b.maxRoomBytes
            && a.noticeType == b.noticeType && a.admitsToDefaultRoom == b.admitsToDefaultRoom && a.announceJoins == b.announceJoins
            && a.historyFrames == b.historyFrames && a.historyBytes == b.historyBytes
    }
}

extension RelaySettings {
    /// The relay rules of a config (`[protocol]` and `server.default_room`).
    public init(_ config: Config) {
        self.init(byteOrder: config.protocol.byteOrder, joinType: config.protocol.joinType, leaveType: config.protocol.leaveType,
                  heartbeatType: config.protocol.heartbeatType, echo: config.protocol.echo, validate: config.protocol.validate,
                  maxViolations: config.protocol.maxViolations, defaultRoom: config.server.defaultRoom,
                  maxRoomBytes: config.protocol.maxRoomBytes, noticeType: config.protocol.noticeType,
                  admitsToDefaultRoom: !(config.auth.required && config.auth.anonymous == .none))
        announceJoins = config.rooms.announceJoins
        historyFrames = config.rooms.history
        historyBytes = config.rooms.historyBytes
    }
}
