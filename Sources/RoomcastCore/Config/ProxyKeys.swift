// `proxy_protocol` and `proxy_from`: the same two keys in every section that
// owns client listeners (`[server]`, `[json]`, `[websocket]`), each for its own listeners.

extension Config {
    /// A listener section's PROXY protocol settings (docs/protocol/proxy.md,
    /// "PROXY protocol"; HAProxy's proxy-protocol.txt).
    public struct ProxySettings: Equatable, Sendable {
        /// `proxy_protocol`: every connection on these listeners must begin
        /// with a PROXY v1 or v2 header. Default no.
        public var enabled: Bool
        /// `proxy_from`: the proxies allowed to connect (comma-separated
        /// addresses or CIDR prefixes); any other peer is refused at accept.
        /// Must not be empty when `enabled` (refused at start: an empty list
        /// would let anyone claim any address).
        public var from: [IPPrefix]

        public static let off = ProxySettings(enabled: false, from: [])

        /// Whether `ip` (4 or 16 bytes) is an allowed proxy.
        public func allows(_ ip: [UInt8]) -> Bool { from.contains { $0.contains(ip) } }

        /// The two keys of `section`, to append to its `SectionSpec` keys.
        static func keys(_ path: WritableKeyPath<Config, ProxySettings> & Sendable) -> [KeySpec] {
            [
                KeySpec(name: "proxy_protocol") { c, v throws(ValueError) in c[keyPath: path].enabled = try boolean(v) },
                KeySpec(name: "proxy_from") { c, v throws(ValueError) in c[keyPath: path].from = try prefixList(v) },
            ]
        }

        /// `proxy_from`'s value: `ADDR[/PREFIX]` items separated by commas
        /// (spaces around them allowed); empty means none.
        static func prefixList(_ v: String) throws(ValueError) -> [IPPrefix] {
            var out: [IPPrefix] = []
            for item in v.split(separator: ",", omittingEmptySubsequences: false) {
                let t = item.trimmingSpaces
                if t.isEmpty {
                    if v.allSatisfy({ $0 == " " || $0 == "\t" }) { return [] }
                    throw ValueError(reason: "\(quote(v)) has an empty item between commas")
                }
                guard let p = IPPrefix(t) else {
                    throw ValueError(reason: "\(quote(String(t))) is not an IPv4 or IPv6 address or ADDR/PREFIX "
                        + "(e.g. 10.0.0.0/8, fd00::/8; no host bits past the prefix)")
                }
                out.append(p)
            }
            return out
        }

        /// The rule: `proxy_protocol = yes` needs a `proxy_from`.
        func check(_ section: String, _ rule: RuleContext) throws(ConfigError) {
            if enabled && from.isEmpty {
                throw rule.fail(["\(section).proxy_protocol", "\(section).proxy_from"],
                                "\(section).proxy_protocol = yes needs \(section).proxy_from (the addresses of the proxies "
                                + "allowed to send the header): without it anyone could claim any client address")
            }
        }
    }
}

extension Substring {
    fileprivate var trimmingSpaces: Substring {
        var s = self
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return s
    }
}
