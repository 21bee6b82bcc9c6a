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

// MARK: - Config

/// The complete, validated configuration of roomcastd. Durations are in
/// milliseconds, sizes in bytes.
public struct Config: Equatable, Sendable {
    public var server: Server
    public var `protocol`: ProtocolSettings
    public var heartbeat: Heartbeat
    public var limits: Limits
    public var log: Log
    public var json: JSON
    public var webSocket: WebSocket
    public var cluster: Cluster
    public var auth: Auth
    public var api: API
    /// `[tls]` (TLSSection.swift).
    public var tls = TLS()
    /// Where the file gave each TCP listen address (ListenAddress.swift).
    /// Not a setting: equality ignores it.
    public var listenSites = ListenSites()
    /// `[rooms]` (RoomsSection.swift).
    public var rooms = Rooms()

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
            echo: true, validate: true, maxViolations: 3, maxRoomBytes: 255, noticeType: 9),
        heartbeat: Heartbeat(timeoutMs: 30_000, tickMs: 100),
        limits: Limits(outputSoftBytes: 256 << 10, outputSoftMs: 10_000, outputHardBytes: 4 << 20,
                       framesPerSecond: 0, framesBurst: 0, bytesPerSecond: 0, bytesBurst: 0),
        log: Log(level: .info, target: .auto, statsIntervalMs: 60_000),
        json: JSON(listen: [], maxFrameBytes: 64 << 10, heartbeatTimeoutMs: 0, tcpKeepaliveMs: 60_000),
        webSocket: WebSocket(listen: [], allowedOrigins: [], maxMessageBytes: 64 << 10, pingIntervalMs: 25_000,
                             echo: false, page: false, pageDir: ""),
        cluster: Cluster(redis: nil, name: "main", timeoutMs: 2_000, maxOutputBytes: 4 << 20),
        auth: Auth(keyFile: "", required: false, anonymous: .none, viewerMay: [2]),
        api: API(listen: [], keyFile: "", maxConnections: 64, allowUIDs: [], allowGIDs: [], publicMetrics: false))

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
        var listen: [ListenAddress: Int] = [:]  // over every section's listen and listen_tls
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
                if e.key == "listen" && e.section == "api" {
                    // Comma-separated or repeated; TCP ports are checked against every listener's.
                    for item in e.value.split(separator: ",", omittingEmptySubsequences: false) {
                        let text = trimmed(item)
                        guard let address = APIListenAddress.parse(text) else {
                            throw fail("\(name): \(quote(text)) is not a listen address "
                                + "(expected IPv4:PORT, [IPv6]:PORT or unix:/PATH, e.g. 127.0.0.1:9899 or unix:/run/roomcastd/api.sock)")
                        }
                        if config.api.listen.contains(address) {
                            throw fail("\(name): \(address) is listed twice")
                        }
                        if case .tcp(let tcp) = address {
                            if let (other, first) = listen.first(where: { $0.key.overlaps(tcp) }) {
                                throw fail("\(name): \(tcp) " + (other == tcp ? "is already listed at line \(first)"
                                    : "overlaps \(other) at line \(first) (a wildcard address takes the port on every address)"))
                            }
                            listen[tcp] = listen[tcp] ?? e.line
                            config.listenSites.add(tcp, key: name, line: e.line)
                        }
                        config.api.listen.append(address)
                    }
                    seen[name] = seen[name] ?? e.line
                    continue
                }
                if (e.key == "listen" || e.key == "listen_tls") && (e.section == "server" || e.section == "json" || e.section == "websocket") {
                    guard let address = ListenAddress.parse(e.value) else {
                        throw fail("\(name): \(quote(e.value)) is not a listen address "
                            + "(expected IPv4:PORT or [IPv6]:PORT, e.g. 0.0.0.0:9898 or [::]:9898)")
                    }
                    if let (other, first) = listen.first(where: { $0.key.overlaps(address) }) {
                        throw fail("\(name): \(address) " + (other == address ? "is already listed at line \(first)"
                            : "overlaps \(other) at line \(first) (a wildcard address takes the port on every address)"))
                    }
                    if e.key == "listen_tls" {
                        switch e.section {
                        case "json": config.json.listenTLS.append(address)
                        case "websocket": config.webSocket.listenTLS.append(address)
                        default: config.server.listenTLS.append(address)
                        }
                    } else if e.section == "json" {
                        config.json.listen.append(address)
                    } else if e.section == "websocket" {
                        config.webSocket.listen.append(address)
                    } else {
                        if !listenReplaced { config.server.listen = []; listenReplaced = true }
                        config.server.listen.append(address)
                    }
                    listen[address] = listen[address] ?? e.line
                    config.listenSites.add(address, key: name, line: e.line)
                    seen[name] = seen[name] ?? e.line
                    continue
                }
                if let first = seen[name] {
                    throw fail("\(name): duplicate key, already set at line \(first) "
                        + "(only listen may repeat)")
                }
                seen[name] = e.line
                if e.section == "tls" { config.tls.lines[e.key] = e.line }
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
    /// Cross-key rules, each section's in its file, in the order of
    /// config/roomcastd.conf; the line is the latest among the keys involved.
    private func checkRules(file: String, lines: [String: Int]) throws(ConfigError) {
        let rule = RuleContext(file: file, lines: lines)
        try checkProtocolRules(rule)
        try checkServerRules(rule)
        try checkHeartbeatRules(rule)
        try checkLimitsRules(rule)
        try checkJSONRules(rule)
        try checkAuthRules(rule)
        try checkAPIRules(rule)
        try checkTLSRules(rule)
    }
}

// MARK: - Key table

/// Without leading and trailing spaces and tabs.
func trimmed(_ s: Substring) -> String {
    var t = s.drop { $0 == " " || $0 == "\t" }
    while t.last == " " || t.last == "\t" { t = t.dropLast() }
    return String(t)
}

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

/// Where a cross-key rule is reported: the file, and the line of each key it set.
struct RuleContext {
    var file: String
    /// `section.key` → the line that set it (keys left at their default have none).
    var lines: [String: Int]

    /// The error of a broken rule, at the latest line among `keys` (nil when
    /// all of them come from the defaults).
    func fail(_ keys: [String], _ reason: String) -> ConfigError {
        ConfigError(file: file, line: keys.compactMap { lines[$0] }.max(), reason: reason)
    }
}

/// The single source of truth for sections, keys and their order; each
/// section's keys, parsing and ranges are in its own file (ServerSection.swift ...).
let specs: [SectionSpec] = [.server, .protocol, .heartbeat, .limits, .json, .webSocket, .log, .cluster, .auth, .api, .tls, .rooms]
