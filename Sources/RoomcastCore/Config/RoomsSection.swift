// `[rooms]`: what a room hears of its own audience: viewer counts
// (docs/protocol/notices.md §13, notice `viewers`) and the joins and leaves of its
// members (§4).

extension Config {
    /// `[rooms]` (roomcastd.conf(5)).
    public struct Rooms: Equatable, Sendable {
        /// `counts`: how often a room whose viewer count changed gets the
        /// notice `viewers`, in ms (a bare number is seconds); 0 = never.
        /// 0 or 1 s ... 1 h, whole seconds. Default 5 s.
        public var countsMs: UInt64 = 5_000
        /// `announce_joins`: joins and leaves (synthesized ones too) reach
        /// the room's members and the other daemons. With `no`, a join
        /// comes back to its sender only (with `protocol.echo`), and a room
        /// of 100,000 shows counts instead of a join per viewer. Default yes.
        public var announceJoins = true
        /// `history`: the last text and gift frames each room keeps for
        /// the members who join it later (docs/protocol/positions.md §4, "Recent
        /// lines on join"), 0 ... 10,000 frames. Default 0 (off).
        public var history = 0
        /// `history_bytes`: the most one room's history holds, in bytes of
        /// whole frames, 1 KiB ... 64 MiB. Default 256 KiB.
        public var historyBytes = 262_144

        public init() {}
    }
}

extension SectionSpec {
    /// `[rooms]`: its keys, in the order of config/roomcastd.conf.
    static let rooms = SectionSpec(section: "rooms", keys: [
        KeySpec(name: "counts") { c, v throws(ValueError) in
            let ms = try duration(v, 0...3_600_000)
            guard ms == 0 || (ms >= 1_000 && ms % 1_000 == 0) else {
                throw ValueError(reason: "\(quote(v)) must be 0 (off) or whole seconds from 1s")
            }
            c.rooms.countsMs = ms
        },
        KeySpec(name: "announce_joins") { c, v throws(ValueError) in
            c.rooms.announceJoins = try boolean(v)
        },
        KeySpec(name: "history") { c, v throws(ValueError) in
            c.rooms.history = try integer(v, 0...10_000)
        },
        KeySpec(name: "history_bytes") { c, v throws(ValueError) in
            c.rooms.historyBytes = try size(v, 1_024...67_108_864)
        },
    ])
}
