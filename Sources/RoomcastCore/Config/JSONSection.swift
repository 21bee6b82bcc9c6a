// `[json]`: the JSON dialect's listeners and limits (docs/protocol/json.md §7).

extension Config {
    /// `[json]`: the second listener protocol, the JSON chat room
    /// (docs/protocol/json.md §7): frames of a u32 little-endian length and a JSON body.
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
        /// `proxy_protocol` and `proxy_from` for the JSON listeners (ProxyKeys.swift).
        public var proxy: ProxySettings = .off
        /// `listen_tls`, repeatable: the JSON dialect over TLS (`[tls]`); none by default.
        public var listenTLS: [ListenAddress] = []
    }
}

extension SectionSpec {
    /// `[json]`: its keys, in the order of config/roomcastd.conf.
    static let json = SectionSpec(section: "json", keys: [
        KeySpec(name: "listen") { _, _ throws(ValueError) in },  // handled in Config.parse
        KeySpec(name: "listen_tls") { _, _ throws(ValueError) in },  // handled in Config.parse
        KeySpec(name: "max_frame_bytes") { c, v throws(ValueError) in
            c.json.maxFrameBytes = try size(v, 1...(1 << 30))
        },
        KeySpec(name: "heartbeat_timeout") { c, v throws(ValueError) in
            c.json.heartbeatTimeoutMs = try duration(v, 0...oneDayMs)
        },
        KeySpec(name: "tcp_keepalive") { c, v throws(ValueError) in
            c.json.tcpKeepaliveMs = try duration(v, 0...(2 * 3_600_000))
        },
    ] + Config.ProxySettings.keys(\.json.proxy))
}

extension Config {
    /// `[json]`'s rules: the JSON timeout above the tick, keepalive in whole seconds.
    func checkJSONRules(_ rule: RuleContext) throws(ConfigError) {
        try json.proxy.check("json", rule)
        try webSocket.proxy.check("websocket", rule)
        if json.heartbeatTimeoutMs != 0 && heartbeat.tickMs >= json.heartbeatTimeoutMs {
            throw rule.fail(["json.heartbeat_timeout", "heartbeat.tick"],
                            "heartbeat.tick (\(formatDuration(ms: heartbeat.tickMs))) must be less than "
                            + "json.heartbeat_timeout (\(formatDuration(ms: json.heartbeatTimeoutMs))) unless it is 0")
        }
        if json.tcpKeepaliveMs % 1000 != 0 {
            throw rule.fail(["json.tcp_keepalive"], "json.tcp_keepalive must be whole seconds (TCP_KEEPIDLE counts seconds)")
        }
    }
}
