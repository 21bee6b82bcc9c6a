// `[heartbeat]`: when a silent client is closed (docs/protocol/rooms.md §5).

extension Config {
    /// `[heartbeat]`
    public struct Heartbeat: Equatable, Sendable {
        /// `timeout`: close a client silent for this long; 0 = never.
        /// 0 ... 24h, default 30s.
        public var timeoutMs: UInt64
        /// `tick`: timer granularity, 1ms ... 10s and below `timeout` when
        /// that is not 0. Default 100ms.
        public var tickMs: UInt64
    }
}

extension SectionSpec {
    /// `[heartbeat]`: its keys, in the order of config/roomcastd.conf.
    static let heartbeat = SectionSpec(section: "heartbeat", keys: [
        KeySpec(name: "timeout") { c, v throws(ValueError) in c.heartbeat.timeoutMs = try duration(v, 0...oneDayMs) },
        KeySpec(name: "tick") { c, v throws(ValueError) in c.heartbeat.tickMs = try duration(v, 1...10_000) },
    ])
}

extension Config {
    /// `[heartbeat]`'s rules: the tick is finer than the timeout.
    func checkHeartbeatRules(_ rule: RuleContext) throws(ConfigError) {
        if heartbeat.timeoutMs != 0 && heartbeat.tickMs >= heartbeat.timeoutMs {
            throw rule.fail(["heartbeat.timeout", "heartbeat.tick"],
                            "heartbeat.tick (\(formatDuration(ms: heartbeat.tickMs))) must be less than "
                            + "heartbeat.timeout (\(formatDuration(ms: heartbeat.timeoutMs))) unless timeout is 0")
        }
    }
}
