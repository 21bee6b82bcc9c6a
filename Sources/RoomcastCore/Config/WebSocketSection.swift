// `[websocket]`: the WebSocket listener (RFC 6455) and its limits (docs/protocol/websocket.md §15).

extension Config {
    /// `[websocket]`: the listener browsers reach, speaking RFC 6455 with the
    /// subprotocols `roomcast.json.v1` and `roomcast.ltb.v1` (docs/protocol/websocket.md §15).
    public struct WebSocket: Equatable, Sendable {
        /// `listen`, repeatable; none by default, so the listener is off.
        public var listen: [ListenAddress]
        /// `allowed_origins`: exact `scheme://host[:port]` origins a browser's
        /// upgrade may come from (RFC 6454 §6.1 serialization, compared as
        /// bytes); empty: any. A request without `Origin` is always allowed.
        public var allowedOrigins: [String]
        /// `max_message_bytes`: largest message (all fragments), bytes,
        /// 125 ... 1G; a larger one closes with 1009 (RFC 6455 §7.4.1). Default 64K.
        public var maxMessageBytes: Int
        /// `ping_interval`: the server pings (opcode 9) this often, in ms,
        /// 1s ... 1h, or at half of `heartbeat.timeout` when that is shorter
        /// (``effectivePingIntervalMs(heartbeatTimeoutMs:)``). Default 25s.
        public var pingIntervalMs: UInt64
        /// `echo`: serve `/echo`, every message back to its sender (for
        /// conformance suites); default no.
        public var echo: Bool
        /// `page`: serve the chat page at `/` (and its files) to a plain GET;
        /// default no.
        public var page: Bool
        /// `page_dir`: the directory the page's files are read from, once at
        /// start and again on reload; empty (the default): `share/roomcast/web`
        /// beside the binary's `bin/` (`/usr/share/roomcast/web` for
        /// `/usr/bin/roomcastd`, as `make install` and the .deb lay it out).
        public var pageDir: String
        /// `listen_tls`, repeatable: WebSocket over TLS, `wss://` (`[tls]`); none by default.
        public var listenTLS: [ListenAddress] = []
        /// `proxy_protocol` and `proxy_from` for the WebSocket listeners (ProxyKeys.swift).
        public var proxy: ProxySettings = .off
    }
}

extension SectionSpec {
    /// `[websocket]`: its keys, in the order of config/roomcastd.conf.
    static let webSocket = SectionSpec(section: "websocket", keys: [
        KeySpec(name: "listen") { _, _ throws(ValueError) in },  // handled in Config.parse
        KeySpec(name: "listen_tls") { _, _ throws(ValueError) in },  // handled in Config.parse
        KeySpec(name: "allowed_origins") { c, v throws(ValueError) in
            c.webSocket.allowedOrigins = try origins(v)
        },
        KeySpec(name: "max_message_bytes") { c, v throws(ValueError) in
            c.webSocket.maxMessageBytes = try size(v, 125...(1 << 30))
        },
        KeySpec(name: "ping_interval") { c, v throws(ValueError) in
            c.webSocket.pingIntervalMs = try duration(v, 1_000...3_600_000)
        },
        KeySpec(name: "echo") { c, v throws(ValueError) in c.webSocket.echo = try boolean(v) },
        KeySpec(name: "page") { c, v throws(ValueError) in c.webSocket.page = try boolean(v) },
        KeySpec(name: "page_dir") { c, v throws(ValueError) in
            guard v.isEmpty || v.hasPrefix("/") else {
                throw ValueError(reason: "\(quote(v)) is not an absolute path (e.g. /usr/share/roomcast/web)")
            }
            c.webSocket.pageDir = v
        },
    ] + Config.ProxySettings.keys(\.webSocket.proxy))
}

/// A comma-separated list of origins, each `http://` or `https://` with a
/// host and an optional port, no path and no trailing slash (the serialized
/// form browsers send, RFC 6454 §6.1); empty items are refused.
/// - Throws: ``ValueError`` naming the first bad origin.
func origins(_ v: String) throws(ValueError) -> [String] {
    if v.isEmpty { return [] }
    var list: [String] = []
    for raw in v.split(separator: ",", omittingEmptySubsequences: false) {
        var t = raw.drop { $0 == " " || $0 == "\t" }
        while t.last == " " || t.last == "\t" { t = t.dropLast() }
        let o = String(t)
        let rest: Substring
        if o.hasPrefix("http://") { rest = o.dropFirst(7) } else if o.hasPrefix("https://") { rest = o.dropFirst(8) } else {
            throw ValueError(reason: "\(quote(o)) is not an origin (expected scheme://host[:port], "
                + "e.g. https://example.com or http://127.0.0.1:8080)")
        }
        let hostOK = !rest.isEmpty && rest.utf8.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x61 && b <= 0x7A) || (b >= 0x41 && b <= 0x5A)
                || b == 0x2E || b == 0x2D || b == 0x3A || b == 0x5B || b == 0x5D  // . - : [ ]
        }
        guard hostOK, rest.first != ":" else {
            throw ValueError(reason: "\(quote(o)) is not an origin (expected scheme://host[:port], no path, "
                + "e.g. https://example.com)")
        }
        list.append(o.lowercased())
    }
    return list
}

extension Config.WebSocket {
    /// The interval between server pings, ms: `ping_interval` (default 25 s,
    /// under the 60 s idle timeout of common proxies), or half of
    /// `heartbeat.timeout` when `ping_interval` is not shorter than it (a
    /// client could not answer a ping in time); `timeoutMs` 0 means no timeout.
    public func effectivePingIntervalMs(heartbeatTimeoutMs timeoutMs: UInt64) -> UInt64 {
        timeoutMs == 0 || pingIntervalMs < timeoutMs ? pingIntervalMs : max(1, timeoutMs / 2)
    }
}
