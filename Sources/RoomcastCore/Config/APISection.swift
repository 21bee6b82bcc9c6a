// `[api]`: the backend's HTTP API (docs/api.md): where it listens, who may use it.

/// One address of `[api] listen`: a numeric TCP address, or a Unix socket
/// whose peers are checked by their credentials (SO_PEERCRED, unix(7)).
public enum APIListenAddress: Equatable, Hashable, Sendable, CustomStringConvertible {
    case tcp(ListenAddress)
    /// An absolute path of at most 107 bytes (`sun_path`, unix(7)).
    case unix(path: String)

    /// Parses `IPv4:PORT`, `[IPv6]:PORT` or `unix:/PATH`; nil for anything else.
    public static func parse(_ s: String) -> APIListenAddress? {
        if s.hasPrefix("unix:") {
            let path = String(s.dropFirst(5))
            guard path.hasPrefix("/"), path.utf8.count <= 107, !path.utf8.contains(0) else { return nil }
            return .unix(path: path)
        }
        return ListenAddress.parse(s).map { .tcp($0) }
    }

    /// `127.0.0.1:9899` or `unix:/run/roomcastd/api.sock`; accepted by ``parse(_:)``.
    public var description: String {
        switch self {
        case .tcp(let a): a.description
        case .unix(let path): "unix:" + path
        }
    }
}

extension Config {
    /// `[api]` (docs/api.md, roomcastd.conf(5)): off unless `listen` is set.
    public struct API: Equatable, Sendable {
        /// `listen`: TCP addresses and `unix:/PATH` sockets, comma-separated
        /// or repeated; none by default (the API is off).
        public var listen: [APIListenAddress]
        /// `key_file`: bearer keys, one a line (`#` comments and blank lines
        /// ignored), at least 16 bytes each; re-read on SIGHUP. Needed by a
        /// TCP listener; refused when group or others may read it.
        public var keyFile: String
        /// `max_connections`: open API connections at most, 1 ... 10000;
        /// default 64. One more is closed at accept.
        public var maxConnections: Int
        /// `allow_uids`: uids whose peers the Unix socket serves besides root
        /// and the daemon's own user; comma-separated, default none.
        public var allowUIDs: [UInt32]
        /// `allow_gids`: primary gids whose peers the Unix socket serves;
        /// comma-separated, default none.
        public var allowGIDs: [UInt32]
        /// `public_metrics`: `GET /healthz` and `GET /metrics` need no key
        /// (and no allowed uid); default no.
        public var publicMetrics: Bool
    }
}

extension SectionSpec {
    /// `[api]`: its keys, in the order of config/roomcastd.conf.
    static let api = SectionSpec(section: "api", keys: [
        KeySpec(name: "listen") { _, _ throws(ValueError) in },  // handled in Config.parse
        KeySpec(name: "key_file") { c, v throws(ValueError) in
            guard v.isEmpty || v.hasPrefix("/") else { throw ValueError(reason: "\(quote(v)) is not an absolute path") }
            c.api.keyFile = v
        },
        KeySpec(name: "max_connections") { c, v throws(ValueError) in c.api.maxConnections = try integer(v, 1...10_000) },
        KeySpec(name: "allow_uids") { c, v throws(ValueError) in c.api.allowUIDs = try ids(v) },
        KeySpec(name: "allow_gids") { c, v throws(ValueError) in c.api.allowGIDs = try ids(v) },
        KeySpec(name: "public_metrics") { c, v throws(ValueError) in c.api.publicMetrics = try boolean(v) },
    ])
}

/// A comma-separated list of numeric uids or gids, 0 ... 4294967294 (no
/// names: the daemon does not read /etc/passwd); empty: none.
/// - Throws: ``ValueError`` naming the first bad item.
func ids(_ v: String) throws(ValueError) -> [UInt32] {
    var list: [UInt32] = []
    for raw in v.split(separator: ",") {
        var t = raw.drop { $0 == " " || $0 == "\t" }
        while t.last == " " || t.last == "\t" { t = t.dropLast() }
        let n: Int
        do { n = try integer(String(t), 0...4_294_967_294) } catch {
            throw ValueError(reason: "\(quote(String(t))) is not a numeric id 0 ... 4294967294 (names are not looked up)")
        }
        if !list.contains(UInt32(n)) { list.append(UInt32(n)) }
    }
    return list
}

extension Config {
    /// `[api]`'s rules: a TCP listener needs `key_file` (nothing else tells
    /// a backend from anybody who can reach the port); a Unix socket is
    /// guarded by its peers' credentials alone.
    func checkAPIRules(_ rule: RuleContext) throws(ConfigError) {
        let tcp = api.listen.contains { if case .tcp = $0 { true } else { false } }
        if tcp && api.keyFile.isEmpty {
            throw rule.fail(["api.listen", "api.key_file"],
                            "api.listen on TCP needs api.key_file (the bearer keys backends present); use unix:/PATH for a socket checked by uid")
        }
    }
}
