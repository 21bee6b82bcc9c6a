// `[log]`: where the log goes and what it keeps.

/// Log severity, ordered from least to most severe (`debug < error`), so a
/// message is emitted when `messageLevel >= config.log.level`.
public enum LogLevel: String, Sendable, Comparable, CaseIterable {
    case debug, info, notice, warning, error

    /// The syslog(3)/journald priority: debug 7, info 6, notice 5,
    /// warning 4, error 3.
    public var syslogPriority: Int32 {
        switch self {
        case .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        }
    }

    public static func < (a: LogLevel, b: LogLevel) -> Bool {
        a.syslogPriority > b.syslogPriority
    }
}

/// Where logs go. `auto` means the journal when stderr is connected to it
/// (`$JOURNAL_STREAM` matches), otherwise stderr.
public enum LogTarget: String, Sendable, CaseIterable {
    case auto, journal, stderr
}

extension Config {
    /// `[log]`
    public struct Log: Equatable, Sendable {
        /// `level`: least severe level logged. Default info.
        public var level: LogLevel
        /// `target`: auto (default), journal or stderr.
        public var target: LogTarget
        /// `stats_interval`: period of the statistics log line; 0 = off.
        /// 0 ... 24h, default 60s.
        public var statsIntervalMs: UInt64
    }
}

extension SectionSpec {
    /// `[log]`: its keys, in the order of config/roomcastd.conf.
    static let log = SectionSpec(section: "log", keys: [
        KeySpec(name: "level") { c, v throws(ValueError) in c.log.level = try choice(v) },
        KeySpec(name: "target") { c, v throws(ValueError) in c.log.target = try choice(v) },
        KeySpec(name: "stats_interval") { c, v throws(ValueError) in
            c.log.statsIntervalMs = try duration(v, 0...oneDayMs)
            if (1..<1_000).contains(c.log.statsIntervalMs) {
                throw ValueError(reason: "\(quote(v)) is too short: 0 (off) or at least 1s (a statistics line every few ms floods the log)")
            }
        },
    ])
}
