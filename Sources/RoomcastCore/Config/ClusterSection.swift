// `[cluster]`: rooms that span daemons through Redis pub/sub.

/// Where the Redis of `[cluster]` is: a numeric TCP address or a Unix
/// socket. No host names: hiredis resolves them with a blocking
/// getaddrinfo(3), and the event loop must never wait for DNS.
public enum RedisAddress: Equatable, Hashable, Sendable, CustomStringConvertible {
    /// A numeric IPv4 or IPv6 address (canonical, without brackets) and a port 1 ... 65535.
    case tcp(host: String, port: UInt16, isIPv6: Bool)
    /// An absolute path of at most 107 bytes (`sun_path`).
    case unix(path: String)

    /// Parses `IPv4:PORT`, `[IPv6]:PORT` or `unix:/PATH`; nil for anything
    /// else, host names included.
    public static func parse(_ s: String) -> RedisAddress? {
        if s.hasPrefix("unix:") {
            let path = String(s.dropFirst(5))
            guard path.hasPrefix("/"), path.utf8.count <= 107, !path.utf8.contains(0) else { return nil }
            return .unix(path: path)
        }
        guard let a = ListenAddress.parse(s), a.port != 0 else { return nil }
        return .tcp(host: a.host, port: a.port, isIPv6: a.isIPv6)
    }

    /// `127.0.0.1:6379`, `[::1]:6379` or `unix:/run/redis/redis.sock`; accepted by ``parse(_:)``.
    public var description: String {
        switch self {
        case .tcp(let host, let port, let v6): v6 ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .unix(let path): "unix:" + path
        }
    }
}

extension Config {
    /// `[cluster]`: rooms that span daemons through Redis pub/sub
    /// (docs/cluster.md). Off unless `redis` is set.
    public struct Cluster: Equatable, Sendable {
        /// `redis`: the Redis every daemon of the cluster uses; nil (default): off.
        public var redis: RedisAddress?
        /// `name`: the cluster's name in its channel names
        /// (`roomcast:NAME:room:ROOM`), so that several clusters can share
        /// one Redis. 1 ... 64 bytes of `A-Z a-z 0-9 - _ .`; default `main`.
        public var name: String
        /// `timeout`: a Redis that answers nothing (not even our heartbeat)
        /// for this long is given up and reconnected; 100ms ... 1min,
        /// default 2s. Heartbeats go out every quarter of it.
        public var timeoutMs: UInt64
        /// `restart_grace`: how long the other daemons wait, in ms, for this
        /// one to be heard again after it handed its clients over (every
        /// SIGTERM under systemd, which does not tell a restart from a
        /// stop: docs/operations/restarts.md, "Restarts"); past it they take it as
        /// stopped and its users leave their rooms there. It is sent with
        /// the hand-over, so each daemon states its own. 100ms ... 1min,
        /// default 1s (two restarts 50 ms apart were heard again 0.7 s
        /// after the first hand-over on a loaded machine: docs/cluster.md).
        public var restartGraceMs: UInt64 = 1_000
        /// `max_output_bytes`: output held for Redis and not yet written,
        /// above which frames are not published (counted as dropped).
        /// 64K ... 1G, default 4M.
        public var maxOutputBytes: Int
    }
}

extension SectionSpec {
    /// `[cluster]`: its keys, in the order of config/roomcastd.conf.
    static let cluster = SectionSpec(section: "cluster", keys: [
        KeySpec(name: "redis") { c, v throws(ValueError) in
            guard let address = RedisAddress.parse(v) else {
                throw ValueError(reason: "\(quote(v)) is not a Redis address (expected IPv4:PORT, [IPv6]:PORT or unix:/PATH, "
                    + "e.g. 127.0.0.1:6379; host names are not resolved: the event loop never waits for DNS)")
            }
            c.cluster.redis = address
        },
        KeySpec(name: "name") { c, v throws(ValueError) in
            let allowed = v.utf8.allSatisfy { b in
                (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2D || b == 0x5F || b == 0x2E
            }
            guard !v.isEmpty, v.utf8.count <= 64, allowed else {
                throw ValueError(reason: "\(quote(v)) is not a cluster name (1 to 64 of A-Z a-z 0-9 - _ .)")
            }
            c.cluster.name = v
        },
        KeySpec(name: "timeout") { c, v throws(ValueError) in c.cluster.timeoutMs = try duration(v, 100...60_000) },
        KeySpec(name: "restart_grace") { c, v throws(ValueError) in c.cluster.restartGraceMs = try duration(v, 100...60_000) },
        KeySpec(name: "max_output_bytes") { c, v throws(ValueError) in
            c.cluster.maxOutputBytes = try size(v, (64 << 10)...(1 << 30))
        },
    ])
}
