// Listen addresses: numeric IP and port, no host names.

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

/// The TCP listen addresses a config file gave, in file order, each with
/// its key and line: `[server]`, `[json]` and `[websocket]` `listen` and
/// `listen_tls`, and `[api] listen`'s TCP addresses. Not a setting: two
/// values are always equal, so that moving a line changes no reload plan.
public struct ListenSites: Equatable, Sendable {
    /// One address of the file: `key` is `section.key` (`json.listen_tls`),
    /// `line` 1-based.
    public struct Site: Equatable, Sendable {
        public var address: ListenAddress
        public var key: String
        public var line: Int
    }

    public private(set) var sites: [Site] = []

    public init() {}

    mutating func add(_ address: ListenAddress, key: String, line: Int) {
        sites.append(Site(address: address, key: key, line: line))
    }

    public static func == (a: ListenSites, b: ListenSites) -> Bool { true }
}

extension Config {
    /// Checks the command line's `--listen` addresses, which replace
    /// `[server] listen` (roomcastd(8)), against each other and against every
    /// other TCP listener of the file (``ListenSites``: the `listen_tls` of
    /// `[server]`, `[json]` and `[websocket]`, their `listen`, `[api] listen`),
    /// with the rule of ``ListenAddress/overlaps(_:)``: each address is bound
    /// once (bind(2) fails with EADDRINUSE otherwise).
    /// - Parameters:
    ///   - override: the `--listen` addresses, in command-line order.
    ///   - file: the config file's name, for the error.
    /// - Throws: ``ConfigError`` at the file's line when a `--listen` address
    ///   collides with one of the file's, naming its key; without a line when
    ///   two `--listen` addresses collide.
    public func checkListenOverride(_ override: [ListenAddress], file: String) throws(ConfigError) {
        func problem(_ a: ListenAddress, _ b: ListenAddress) -> String {
            a == b ? "listen address \(a) is given twice"
                : "listen addresses \(a) and \(b) overlap (a wildcard address takes the port on every address)"
        }
        for (i, address) in override.enumerated() {
            if let earlier = override[..<i].first(where: { $0.overlaps(address) }) {
                throw ConfigError(file: file, line: nil, reason: problem(earlier, address) + " (--listen must differ from itself)")
            }
            let others = listenSites.sites.filter { $0.key != "server.listen" }
            if let site = others.first(where: { $0.address.overlaps(address) }) {
                throw ConfigError(file: file, line: site.line, reason: "\(site.key): " + problem(address, site.address)
                    + " (--listen replaces [server] listen and must differ from every other listener of the file)")
            }
        }
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
