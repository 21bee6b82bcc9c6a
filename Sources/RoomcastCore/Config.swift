// Typed configuration of roomcastd: defaults, parsing of /etc/roomcastd.conf
// (INI syntax, see INI.swift) and validation. The shipped, commented file is
// config/roomcastd.conf; a test keeps it in sync with `Config.knownKeys`.

// MARK: - Errors

/// A configuration problem, located as precisely as possible.
public struct ConfigError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The file name as given to ``Config/parse(_:file:)`` or ``Config/load(path:)``.
    public var file: String
    /// 1-based line number, or nil when the problem is not tied to a line
    /// (unreadable file, or a cross-key rule broken by default values).
    public var line: Int?
    /// Human-readable explanation, e.g.
    /// `heartbeat.timeout: '30x' is not a duration (e.g. 100ms, 30s, 5min)`.
    public var reason: String

    public init(file: String, line: Int?, reason: String) {
        self.file = file
        self.line = line
        self.reason = reason
    }

    /// `FILE:LINE: REASON`, or `FILE: REASON` without a line.
    public var description: String {
        if let line { "\(file):\(line): \(reason)" } else { "\(file): \(reason)" }
    }
}

// MARK: - Listen addresses

/// A numeric IP address and TCP port to listen on. No host names: the daemon
/// must not depend on DNS at boot.
public struct ListenAddress: Equatable, Hashable, Sendable, CustomStringConvertible {
    /// Numeric address without brackets, in the canonical form of
    /// `inet_ntop(3)` (e.g. `0.0.0.0`, `::1`).
    public var host: String
    /// TCP port; 0 asks the kernel for an ephemeral port (useful in tests).
    public var port: UInt16
    /// True for an IPv6 address.
    public var isIPv6: Bool

    public init(host: String, port: UInt16, isIPv6: Bool) {
        self.host = host
        self.port = port
        self.isIPv6 = isIPv6
    }

    /// Parses `1.2.3.4:PORT` or `[IPv6]:PORT` (e.g. `[::1]:9898`, `[::]:0`),
    /// port 0...65535 in decimal. The address is checked as `inet_pton(3)` would
    /// and stored canonicalised. Returns nil for anything else, including
    /// host names, an IPv6 address without brackets and IPv6 zone ids.
    public static func parse(_ s: String) -> ListenAddress? {
        guard let (host, port, bracketed) = splitHostPort(s),
              let canonical = canonicalAddress(String(host), v6: bracketed)
        else { return nil }
        return ListenAddress(host: canonical, port: port, isIPv6: bracketed)
    }

    /// Whether binding both would fail with EADDRINUSE: the same fixed port
    /// and family, and the same host or a wildcard (`0.0.0.0`, `::`) on
    /// either side. IPv4 and IPv6 never overlap: IPv6 listeners are
    /// `IPV6_V6ONLY` (ipv6(7)). Port 0 (ephemeral) never overlaps.
    public func overlaps(_ other: ListenAddress) -> Bool {
        guard port != 0, port == other.port, isIPv6 == other.isIPv6 else { return false }
        let wildcard = isIPv6 ? "::" : "0.0.0.0"
        return host == other.host || host == wildcard || other.host == wildcard
    }

    /// `1.2.3.4:9898` or `[::1]:9898`; accepted by ``parse(_:)``.
    public var description: String {
        isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)"
    }
}

/// Splits `HOST:PORT` or `[HOST]:PORT` (the brackets IPv6 needs). The port
/// is 0 ... 65535 in decimal, at most 5 digits; the host is non-empty, has no
/// NUL, and has no `:` unless bracketed. Shared by the daemon's listen
/// addresses and the client's `--server`.
/// - Returns: the host (without brackets), the port, and whether the host
///   was bracketed; nil for anything else.
public func splitHostPort(_ s: String) -> (host: Substring, port: UInt16, bracketed: Bool)? {
    let host: Substring
    let portPart: Substring
    let bracketed = s.hasPrefix("[")
    if bracketed {
        guard let close = s.firstIndex(of: "]") else { return nil }
        host = s[s.index(after: s.startIndex)..<close]
        let rest = s[s.index(after: close)...]
        guard rest.hasPrefix(":") else { return nil }
        portPart = rest.dropFirst()
    } else {
        guard let colon = s.lastIndex(of: ":") else { return nil }
        host = s[..<colon]
        portPart = s[s.index(after: colon)...]
        if host.contains(":") { return nil }
    }
    let digits = Array(portPart.utf8)
    guard !host.isEmpty, !host.utf8.contains(0), digits.count <= 5,
          let (port, end) = scanDigits(digits, from: 0), end == digits.count, port <= 65535
    else { return nil }
    return (host, UInt16(port), bracketed)
}

/// Validates a numeric address and returns the form inet_ntop(3) prints.
private func canonicalAddress(_ host: String, v6: Bool) -> String? {
    IPAddressText.canonical(host, ipv6: v6)
}

// MARK: - Log settings

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

// MARK: - Config

/// The complete, validated configuration of roomcastd. Durations are in
/// milliseconds, sizes in bytes.
public struct Config: Equatable, Sendable {
    /// `[server]`
    public struct Server: Equatable, Sendable {
        /// `listen`, repeatable. Default `0.0.0.0:9898`. If the file has any
        /// `listen` line, the default is replaced, not extended.
        public var listen: [ListenAddress]
        /// `max_clients`: simultaneous connections, 1 ... 1048576 (the
        /// kernel's default `fs.nr_open`). Default 10000.
        public var maxClients: Int
        /// `default_room`: room of a client that has not joined one yet.
        /// Non-empty, at most 255 bytes of UTF-8. Default `lobby`.
        public var defaultRoom: String
        /// `max_clients_per_ip`: simultaneous connections from one IP
        /// address, 0 ... 1048576; 0 = no limit (default).
        public var maxClientsPerIP: Int
    }

    /// `[protocol]` (docs/protocol.md §1, §2).
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
    }

    /// `[heartbeat]`
    public struct Heartbeat: Equatable, Sendable {
        /// `timeout`: close a client silent for this long; 0 = never.
        /// 0 ... 24h, default 30s.
        public var timeoutMs: UInt64
        /// `tick`: timer granularity, 1ms ... 10s and below `timeout` when
        /// that is not 0. Default 100ms.
        public var tickMs: UInt64
    }

    /// `[limits]`: per-client output queue (slow consumers).
    public struct Limits: Equatable, Sendable {
        /// `output_soft_bytes`: queue size above which the soft timer runs.
        /// Default 256K; must not exceed `output_hard_bytes`.
        public var outputSoftBytes: Int
        /// `output_soft_seconds` (a duration despite the name): how long the
        /// queue may stay above the soft size before the client is closed.
        /// 0 ... 24h, default 10s.
        public var outputSoftMs: UInt64
        /// `output_hard_bytes`: queue size that closes the client at once.
        /// Default 4M; at least `max_frame_bytes` + 6 so one frame of the
        /// maximum size can always be queued.
        public var outputHardBytes: Int
        /// `frames_per_second`: frames a client may send per second (token
        /// bucket); frames over it are dropped and count as violations.
        /// 0 = no limit (default).
        public var framesPerSecond: Int
        /// `frames_burst`: bucket size for `frames_per_second`; 0 = one
        /// second's worth (default).
        public var framesBurst: Int
        /// `bytes_per_second`: bytes (headers included) a client may send per
        /// second, as above. 0 = no limit (default).
        public var bytesPerSecond: Int
        /// `bytes_burst`: bucket size for `bytes_per_second`, at least one
        /// frame of `max_frame_bytes`; 0 = one second's worth (default).
        public var bytesBurst: Int
    }

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

    /// `[json]`: the second listener protocol, the JSON chat room
    /// (docs/protocol.md §7): frames of a u32 little-endian length and a JSON body.
    public struct JSON: Equatable, Sendable {
        /// `listen`, repeatable; none by default, so the listener is off.
        public var listen: [ListenAddress]
        /// `max_frame_bytes`: largest accepted JSON body, 1 ... 1G. Default 64K.
        public var maxFrameBytes: Int
        /// `heartbeat_timeout`: close a JSON client silent this long; 0 = never
        /// (default: JSON clients send no heartbeat).
        public var heartbeatTimeoutMs: UInt64
        /// `tcp_keepalive`: idle time before TCP keepalive probes on JSON
        /// connections, so dead peers are still found; 0 = off. Default 60s.
        public var tcpKeepaliveMs: UInt64
    }

    public var server: Server
    public var `protocol`: ProtocolSettings
    public var heartbeat: Heartbeat
    public var limits: Limits
    public var log: Log
    public var json: JSON

    /// The values used for keys the file does not set. config/roomcastd.conf
    /// lists the same values (checked by a test).
    public static let defaults = Config(
        server: Server(
            listen: [ListenAddress(host: "0.0.0.0", port: 9898, isIPv6: false)],
            maxClients: 10_000,
            defaultRoom: "lobby",
            maxClientsPerIP: 0),
        protocol: ProtocolSettings(
            byteOrder: .little, maxFrameBytes: 64 << 10,
            joinType: 0, leaveType: 1, heartbeatType: 8,
            echo: true, validate: true, maxViolations: 3, maxRoomBytes: 255),
        heartbeat: Heartbeat(timeoutMs: 30_000, tickMs: 100),
        limits: Limits(outputSoftBytes: 256 << 10, outputSoftMs: 10_000, outputHardBytes: 4 << 20,
                       framesPerSecond: 0, framesBurst: 0, bytesPerSecond: 0, bytesBurst: 0),
        log: Log(level: .info, target: .auto, statsIntervalMs: 60_000),
        json: JSON(listen: [], maxFrameBytes: 64 << 10, heartbeatTimeoutMs: 0, tcpKeepaliveMs: 60_000))

    /// Every section and its keys, in the order of config/roomcastd.conf.
    public static let sectionOrder: [String] = specs.map(\.section)

    /// Section name → key names the parser accepts (all lowercase,
    /// case-sensitive).
    public static let knownKeys: [String: [String]] =
        Dictionary(uniqueKeysWithValues: specs.map { ($0.section, $0.keys.map(\.name)) })

    /// Parses config text, starting from ``defaults``.
    ///
    /// - Parameters:
    ///   - text: INI text (see ``INIDocument``); an empty text gives the defaults.
    /// - Parameter file: used in error messages only.
    /// - Throws: ``ConfigError`` for the first problem: INI syntax, unknown
    ///   section or key (with a suggestion when one is close), a key given
    ///   twice (only `server.listen` repeats), a bad or out-of-range value,
    ///   or a broken cross-key rule (reported at the later of the keys
    ///   involved, or with a nil line if all come from the defaults).
    public static func parse(_ text: String, file: String) throws(ConfigError) -> Config {
        let doc = try INIDocument.parse(text, file: file)
        var config = Config.defaults
        var seen: [String: Int] = [:]  // "section.key" → first line
        var listen: [ListenAddress: Int] = [:]  // over server.listen and json.listen
        var listenReplaced = false
        for item in doc.items {
            switch item {
            case .section(let name, let line):
                guard knownKeys[name] != nil else {
                    throw ConfigError(file: file, line: line, reason: "unknown section '[\(name)]'"
                        + suggestion(name, among: sectionOrder, format: { "[\($0)]" })
                        + " (known: " + sectionOrder.map { "[\($0)]" }.joined(separator: ", ") + ")")
                }
            case .entry(let e):
                let name = "\(e.section).\(e.key)"
                func fail(_ reason: String) -> ConfigError {
                    ConfigError(file: file, line: e.line, reason: reason)
                }
                guard let spec = specs.first(where: { $0.section == e.section })?
                    .keys.first(where: { $0.name == e.key })
                else { throw fail(unknownKeyReason(e.section, e.key)) }
                if e.key == "listen" && (e.section == "server" || e.section == "json") {
                    guard let address = ListenAddress.parse(e.value) else {
                        throw fail("\(name): \(quote(e.value)) is not a listen address "
                            + "(expected IPv4:PORT or [IPv6]:PORT, e.g. 0.0.0.0:9898 or [::]:9898)")
                    }
                    if let (other, first) = listen.first(where: { $0.key.overlaps(address) }) {
                        throw fail("\(name): \(address) " + (other == address ? "is already listed at line \(first)"
                            : "overlaps \(other) at line \(first) (a wildcard address takes the port on every address)"))
                    }
                    if e.section == "json" {
                        config.json.listen.append(address)
                    } else {
                        if !listenReplaced { config.server.listen = []; listenReplaced = true }
                        config.server.listen.append(address)
                    }
                    listen[address] = listen[address] ?? e.line
                    seen[name] = seen[name] ?? e.line
                    continue
                }
                if let first = seen[name] {
                    throw fail("\(name): duplicate key, already set at line \(first) "
                        + "(only listen may repeat)")
                }
                seen[name] = e.line
                do {
                    try spec.apply(&config, e.value)
                } catch {
                    throw fail("\(name): \(error.reason)")
                }
            }
        }
        try config.checkRules(file: file, lines: seen)
        return config
    }

    /// Parses the bytes of a config file (reading it is the caller's job:
    /// `Config.load(path:)` in RoomcastServer).
    ///
    /// - Throws: ``ConfigError`` with the first line that is not valid
    ///   UTF-8, otherwise as ``parse(_:file:)``.
    public static func parse(bytes: [UInt8], file: String) throws(ConfigError) -> Config {
        guard let text = String(validating: bytes, as: UTF8.self) else {
            var line = 1
            for chunk in bytes.split(separator: 0x0A, omittingEmptySubsequences: false) {
                if String(validating: chunk, as: UTF8.self) == nil { break }
                line += 1
            }
            throw ConfigError(file: file, line: line, reason: "invalid UTF-8")
        }
        return try parse(text, file: file)
    }

    /// Cross-key rules; the line is the latest line among the keys involved.
    private func checkRules(file: String, lines: [String: Int]) throws(ConfigError) {
        func fail(_ keys: [String], _ reason: String) -> ConfigError {
            ConfigError(file: file, line: keys.compactMap { lines[$0] }.max(), reason: reason)
        }
        let p = self.protocol
        let types = [("protocol.join_type", p.joinType), ("protocol.leave_type", p.leaveType),
                     ("protocol.heartbeat_type", p.heartbeatType)]
        for i in types.indices {
            for j in types.indices where j > i && types[i].1 == types[j].1 {
                let (a, b) = (lines[types[i].0] ?? 0) <= (lines[types[j].0] ?? 0)
                    ? (types[i].0, types[j].0) : (types[j].0, types[i].0)
                throw fail([a, b], "\(b): \(types[j].1) is the same as \(a); "
                    + "join_type, leave_type and heartbeat_type must differ")
            }
        }
        if server.defaultRoom.utf8.count > p.maxRoomBytes {
            throw fail(["server.default_room", "protocol.max_room_bytes"],
                       "server.default_room is \(server.defaultRoom.utf8.count) bytes, over protocol.max_room_bytes "
                       + "(\(p.maxRoomBytes)): a join naming the default room would be refused")
        }
        if heartbeat.timeoutMs != 0 && heartbeat.tickMs >= heartbeat.timeoutMs {
            throw fail(["heartbeat.timeout", "heartbeat.tick"],
                       "heartbeat.tick (\(formatDuration(ms: heartbeat.tickMs))) must be less than "
                       + "heartbeat.timeout (\(formatDuration(ms: heartbeat.timeoutMs))) unless timeout is 0")
        }
        if limits.outputSoftBytes > limits.outputHardBytes {
            throw fail(["limits.output_soft_bytes", "limits.output_hard_bytes"],
                       "limits.output_soft_bytes (\(formatSize(limits.outputSoftBytes))) must not exceed "
                       + "limits.output_hard_bytes (\(formatSize(limits.outputHardBytes)))")
        }
        if limits.outputHardBytes < p.maxFrameBytes + 6 {
            throw fail(["limits.output_hard_bytes", "protocol.max_frame_bytes"],
                       "limits.output_hard_bytes (\(formatSize(limits.outputHardBytes))) must be at least "
                       + "protocol.max_frame_bytes + 6 (\(p.maxFrameBytes + 6)) so one frame of the "
                       + "maximum size can always be queued")
        }
        // A bucket smaller than one frame of the maximum size would refuse
        // such frames forever (the JSON limit counts when JSON is listened on).
        let burst = limits.bytesBurst != 0 ? limits.bytesBurst : limits.bytesPerSecond
        let largest = max(p.maxFrameBytes + 6, json.listen.isEmpty ? 0 : json.maxFrameBytes + 4)
        if limits.bytesPerSecond != 0 && burst < largest {
            throw fail(["limits.bytes_per_second", "limits.bytes_burst", "protocol.max_frame_bytes", "json.max_frame_bytes"],
                       "limits.bytes_burst (or bytes_per_second when the burst is 0) is \(formatSize(burst)): it must hold "
                       + "one frame of max_frame_bytes (\(largest) with its header)")
        }
        if limits.outputHardBytes < json.maxFrameBytes + 4 {
            throw fail(["limits.output_hard_bytes", "json.max_frame_bytes"],
                       "limits.output_hard_bytes (\(formatSize(limits.outputHardBytes))) must be at least "
                       + "json.max_frame_bytes + 4 (\(json.maxFrameBytes + 4))")
        }
        if json.heartbeatTimeoutMs != 0 && heartbeat.tickMs >= json.heartbeatTimeoutMs {
            throw fail(["json.heartbeat_timeout", "heartbeat.tick"],
                       "heartbeat.tick (\(formatDuration(ms: heartbeat.tickMs))) must be less than "
                       + "json.heartbeat_timeout (\(formatDuration(ms: json.heartbeatTimeoutMs))) unless it is 0")
        }
        if json.tcpKeepaliveMs % 1000 != 0 {
            throw fail(["json.tcp_keepalive"], "json.tcp_keepalive must be whole seconds (TCP_KEEPIDLE counts seconds)")
        }
    }
}

// MARK: - Key table

/// Reason of a bad value, without the `section.key: ` prefix.
struct ValueError: Error {
    var reason: String
}

struct KeySpec: Sendable {
    var name: String
    var apply: @Sendable (inout Config, String) throws(ValueError) -> Void
}

struct SectionSpec: Sendable {
    var section: String
    var keys: [KeySpec]
}

private let day: UInt64 = 86_400_000

/// The single source of truth for sections, keys, order, parsing and ranges.
let specs: [SectionSpec] = [
    SectionSpec(section: "server", keys: [
        KeySpec(name: "listen") { _, _ throws(ValueError) in },  // handled in Config.parse
        KeySpec(name: "max_clients") { c, v throws(ValueError) in
            c.server.maxClients = try integer(v, 1...1_048_576)
        },
        KeySpec(name: "default_room") { c, v throws(ValueError) in
            guard !v.isEmpty else { throw ValueError(reason: "must not be empty") }
            guard v.utf8.count <= 255 else {
                throw ValueError(reason: "value is \(v.utf8.count) bytes long, at most 255 allowed")
            }
            c.server.defaultRoom = v
        },
        KeySpec(name: "max_clients_per_ip") { c, v throws(ValueError) in
            c.server.maxClientsPerIP = try integer(v, 0...1_048_576)
        },
    ]),
    SectionSpec(section: "protocol", keys: [
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
    ]),
    SectionSpec(section: "heartbeat", keys: [
        KeySpec(name: "timeout") { c, v throws(ValueError) in c.heartbeat.timeoutMs = try duration(v, 0...day) },
        KeySpec(name: "tick") { c, v throws(ValueError) in c.heartbeat.tickMs = try duration(v, 1...10_000) },
    ]),
    SectionSpec(section: "limits", keys: [
        KeySpec(name: "output_soft_bytes") { c, v throws(ValueError) in
            c.limits.outputSoftBytes = try size(v, 0...Int.max)
        },
        KeySpec(name: "output_soft_seconds") { c, v throws(ValueError) in
            c.limits.outputSoftMs = try duration(v, 0...day)
        },
        KeySpec(name: "output_hard_bytes") { c, v throws(ValueError) in
            c.limits.outputHardBytes = try size(v, 1...Int.max)
        },
        KeySpec(name: "frames_per_second") { c, v throws(ValueError) in
            c.limits.framesPerSecond = try integer(v, 0...100_000_000)
        },
        KeySpec(name: "frames_burst") { c, v throws(ValueError) in
            c.limits.framesBurst = try integer(v, 0...100_000_000)
        },
        KeySpec(name: "bytes_per_second") { c, v throws(ValueError) in
            c.limits.bytesPerSecond = try size(v, 0...(1 << 40))
        },
        KeySpec(name: "bytes_burst") { c, v throws(ValueError) in
            c.limits.bytesBurst = try size(v, 0...(1 << 40))
        },
    ]),
    SectionSpec(section: "json", keys: [
        KeySpec(name: "listen") { _, _ throws(ValueError) in },  // handled in Config.parse
        KeySpec(name: "max_frame_bytes") { c, v throws(ValueError) in
            c.json.maxFrameBytes = try size(v, 1...(1 << 30))
        },
        KeySpec(name: "heartbeat_timeout") { c, v throws(ValueError) in
            c.json.heartbeatTimeoutMs = try duration(v, 0...day)
        },
        KeySpec(name: "tcp_keepalive") { c, v throws(ValueError) in
            c.json.tcpKeepaliveMs = try duration(v, 0...(2 * 3_600_000))
        },
    ]),
    SectionSpec(section: "log", keys: [
        KeySpec(name: "level") { c, v throws(ValueError) in c.log.level = try choice(v) },
        KeySpec(name: "target") { c, v throws(ValueError) in c.log.target = try choice(v) },
        KeySpec(name: "stats_interval") { c, v throws(ValueError) in
            c.log.statsIntervalMs = try duration(v, 0...day)
            if (1..<1_000).contains(c.log.statsIntervalMs) {
                throw ValueError(reason: "\(quote(v)) is too short: 0 (off) or at least 1s (a statistics line every few ms floods the log)")
            }
        },
    ]),
]

// MARK: - Value parsers

/// Quotes a value for an error message, shortening very long ones and
/// escaping control characters (a NUL would end the message early on a
/// terminal or in fputs(3); an ESC would drive the terminal).
func quote(_ v: String) -> String {
    var shown = ""
    for u in v.unicodeScalars {
        switch u.value {
        case 0..<0x20, 0x7F...0x9F:  // C0, DEL, C1 (U+009B is a CSI too)
            let hex = String(u.value, radix: 16)
            shown += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
        default:
            shown.unicodeScalars.append(u)
        }
    }
    return shown.utf8.count <= 60 ? "'\(shown)'" : "'\(shown.prefix(40))…' (\(v.utf8.count) bytes)"
}

private func integer(_ v: String, _ range: ClosedRange<Int>) throws(ValueError) -> Int {
    let b = Array(v.utf8)
    let allDigits = !b.isEmpty && b.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
    guard allDigits else { throw ValueError(reason: "\(quote(v)) is not a non-negative integer") }
    let n = scanDigits(b, from: 0)?.0 ?? UInt64.max  // nil: overflow, so out of range
    guard n <= UInt64(Int.max), range.contains(Int(n)) else {
        let hi = range.upperBound == Int.max ? "" : " \(range.upperBound)"
        throw ValueError(reason: "\(quote(v)) is out of range (\(range.lowerBound) ..\(hi))")
    }
    return Int(n)
}

private func size(_ v: String, _ range: ClosedRange<Int>) throws(ValueError) -> Int {
    guard let n = parseSize(v) else {
        var t = Substring(v).drop { $0 == " " || $0 == "\t" }
        while t.last == " " || t.last == "\t" { t = t.dropLast() }
        if let l = t.last, "KMG".contains(l) { t = t.dropLast() }
        let wellFormed = !t.isEmpty && t.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
        throw ValueError(reason: wellFormed
            ? "\(quote(v)) is too large"
            : "\(quote(v)) is not a size (bytes, optionally with K, M or G = 1024-based, e.g. 64K)")
    }
    guard range.contains(n) else {
        let hi = range.upperBound == Int.max ? "" : " \(formatSize(range.upperBound))"
        throw ValueError(reason: "\(quote(v)) is out of range (\(formatSize(range.lowerBound)) ..\(hi))")
    }
    return n
}

private func duration(_ v: String, _ range: ClosedRange<UInt64>) throws(ValueError) -> UInt64 {
    let n: UInt64
    switch scanDuration(v) {
    case .value(let ms): n = ms
    case .tooLarge: throw ValueError(reason: "\(quote(v)) is too large")
    case .invalid:
        throw ValueError(reason: "\(quote(v)) is not a duration (e.g. 100ms, 30s, 5min, 1h, 1min 30s; "
            + "a bare number is seconds)")
    }
    guard range.contains(n) else {
        throw ValueError(reason: "\(quote(v)) is out of range "
            + "(\(formatDuration(ms: range.lowerBound)) .. \(formatDuration(ms: range.upperBound)))")
    }
    return n
}

/// Booleans as systemd spells them, case-insensitive.
private func boolean(_ v: String) throws(ValueError) -> Bool {
    switch v.lowercased() {
    case "yes", "true", "on", "1": return true
    case "no", "false", "off", "0": return false
    default: throw ValueError(reason: "\(quote(v)) is not a boolean (yes/no, true/false, on/off, 1/0)")
    }
}

private func choice<T: RawRepresentable & CaseIterable>(_ v: String) throws(ValueError) -> T
where T.RawValue == String {
    guard let t = T(rawValue: v) else {
        throw ValueError(reason: "\(quote(v)) is not one of "
            + T.allCases.map(\.rawValue).joined(separator: ", "))
    }
    return t
}

// MARK: - Suggestions

private func unknownKeyReason(_ section: String, _ key: String) -> String {
    let keys = Config.knownKeys[section] ?? []
    let hint = suggestion(key, among: keys, format: { $0 })
    var reason = "unknown key '\(key)' in [\(section)]" + hint
    if hint.isEmpty,
       let home = Config.sectionOrder.first(where: { Config.knownKeys[$0]!.contains(key) }) {
        reason += " (it belongs in [\(home)])"
    }
    return reason
}

/// " (did you mean 'x'?)" if a candidate is 1-2 edits away or differs only
/// in case; empty otherwise.
private func suggestion(_ word: String, among candidates: [String], format: (String) -> String) -> String {
    let best = candidates
        .map { ($0, $0 == word.lowercased() ? 0 : editDistance(Array(word.utf8), Array($0.utf8))) }
        .filter { $0.1 <= 2 }
        .min { $0.1 < $1.1 }
    return best.map { " (did you mean '\(format($0.0))'?)" } ?? ""
}

/// Levenshtein distance; inputs here are short (a key against known keys),
/// longer words are not compared.
private func editDistance(_ a: [UInt8], _ b: [UInt8]) -> Int {
    if a.count > 64 || b.count > 64 { return Int.max }
    if a.isEmpty { return b.count }
    var prev = Array(0...b.count)
    for i in 1...a.count {
        var cur = [i] + Array(repeating: 0, count: b.count)
        for j in stride(from: 1, through: b.count, by: 1) {
            cur[j] = Swift.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
        }
        prev = cur
    }
    return prev[b.count]
}

// MARK: - Reload

/// What a reload (SIGHUP) applies: the new file's settings, except those
/// that only a restart can change, which keep their running values.
public struct ReloadPlan: Equatable, Sendable {
    /// The config to run with from now on.
    public var applied: Config
    /// Keys whose new value waits for a restart, in a fixed order
    /// (`server.listen`, `json.listen`, `protocol.byte_order`, `log.target`),
    /// only those that changed (and, for the listen keys, only where the
    /// file's value is in use: not replaced by `--listen`, not under socket
    /// activation).
    public var needRestart: [String]
}

extension Config {
    /// The plan for replacing this running config by `new` (read from the
    /// file on SIGHUP). Listen addresses, the byte order and the log target
    /// need a restart: sockets are bound and clients speak one byte order
    /// from the start, and the log sink is chosen once.
    /// - Parameters:
    ///   - listenOverridden: `--listen` replaced `[server] listen` at start.
    ///   - socketActivated: the listeners came from systemd; no listen key is used.
    public func reloadPlan(to new: Config, listenOverridden: Bool, socketActivated: Bool) -> ReloadPlan {
        var applied = new
        var needRestart: [String] = []
        if !listenOverridden && !socketActivated && new.server.listen != server.listen { needRestart.append("server.listen") }
        if !socketActivated && new.json.listen != json.listen { needRestart.append("json.listen") }
        applied.server.listen = server.listen
        applied.json.listen = json.listen
        if new.protocol.byteOrder != self.protocol.byteOrder {
            needRestart.append("protocol.byte_order")
            applied.protocol.byteOrder = self.protocol.byteOrder
        }
        if new.log.target != log.target {
            needRestart.append("log.target")
            applied.log.target = log.target
        }
        return ReloadPlan(applied: applied, needRestart: needRestart)
    }
}
