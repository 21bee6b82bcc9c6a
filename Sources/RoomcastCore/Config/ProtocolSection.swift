// `[protocol]`: the LTB framing and message types (docs/protocol/ltb.md §1, §2).

extension Config {
    /// `[protocol]` (docs/protocol/ltb.md §1, §2).
    public struct ProtocolSettings: Equatable, Sendable {
        /// `byte_order`: `little` (default) or `big`.
        public var byteOrder: ByteOrder
        /// `max_frame_bytes`: largest accepted body, 1 ... 1G. Default 64K.
        public var maxFrameBytes: Int
        /// `join_type`, default 0. The three control types lie in
        /// 0 ... 65535 and must differ.
        public var joinType: UInt16
        /// `leave_type`, default 1.
        public var leaveType: UInt16
        /// `heartbeat_type`, default 8.
        public var heartbeatType: UInt16
        /// `echo`: relay a message back to its sender too. Default yes.
        public var echo: Bool
        /// `validate`: decode join/leave/text/gift bodies and count
        /// malformed ones as violations. Default yes.
        public var validate: Bool
        /// `max_violations`: violations before the client is closed, >= 1.
        /// Default 3.
        public var maxViolations: Int
        /// `max_room_bytes`: longest `room` a join may name, in bytes of
        /// UTF-8, 1 ... 64K. Default 255 (as `default_room`, which must fit
        /// in it). A longer one is a violation; the client stays where it was.
        public var maxRoomBytes: Int
        /// `notice_type`, default 9: the type of the notices the server sends
        /// (docs/protocol/tokens.md §13), a control code that differs from the
        /// other three. Frames of this type from clients are refused.
        public var noticeType: UInt16
    }
}

extension SectionSpec {
    /// `[protocol]`: its keys, in the order of config/roomcastd.conf.
    static let `protocol` = SectionSpec(section: "protocol", keys: [
        KeySpec(name: "byte_order") { c, v throws(ValueError) in c.protocol.byteOrder = try choice(v) },
        KeySpec(name: "max_frame_bytes") { c, v throws(ValueError) in
            c.protocol.maxFrameBytes = try size(v, 1...(1 << 30))
        },
        KeySpec(name: "join_type") { c, v throws(ValueError) in
            c.protocol.joinType = UInt16(try integer(v, 0...65535))
        },
        KeySpec(name: "leave_type") { c, v throws(ValueError) in
            c.protocol.leaveType = UInt16(try integer(v, 0...65535))
        },
        KeySpec(name: "heartbeat_type") { c, v throws(ValueError) in
            c.protocol.heartbeatType = UInt16(try integer(v, 0...65535))
        },
        KeySpec(name: "echo") { c, v throws(ValueError) in c.protocol.echo = try boolean(v) },
        KeySpec(name: "validate") { c, v throws(ValueError) in c.protocol.validate = try boolean(v) },
        KeySpec(name: "max_violations") { c, v throws(ValueError) in
            c.protocol.maxViolations = try integer(v, 1...Int.max)
        },
        KeySpec(name: "max_room_bytes") { c, v throws(ValueError) in
            c.protocol.maxRoomBytes = try size(v, 1...(64 << 10))
        },
        KeySpec(name: "notice_type") { c, v throws(ValueError) in
            c.protocol.noticeType = UInt16(try integer(v, 0...65535))
        },
    ])
}

extension Config {
    /// `[protocol]`'s rules: the four control codes differ.
    func checkProtocolRules(_ rule: RuleContext) throws(ConfigError) {
        let p = self.protocol
        let types = [("protocol.join_type", p.joinType), ("protocol.leave_type", p.leaveType),
                     ("protocol.heartbeat_type", p.heartbeatType), ("protocol.notice_type", p.noticeType)]
        for i in types.indices {
            for j in types.indices where j > i && types[i].1 == types[j].1 {
                let (a, b) = (rule.lines[types[i].0] ?? 0) <= (rule.lines[types[j].0] ?? 0)
                    ? (types[i].0, types[j].0) : (types[j].0, types[i].0)
                throw rule.fail([a, b], "\(b): \(types[j].1) is the same as \(a); "
                    + "join_type, leave_type, heartbeat_type and notice_type must differ")
            }
        }
    }
}
