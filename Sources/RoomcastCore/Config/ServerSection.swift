// `[server]`: listeners (the LTB dialect), client counts, the default room.

extension Config {
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
        /// `proxy_protocol` and `proxy_from` for the LTB listeners (ProxyKeys.swift).
        public var proxy: ProxySettings = .off
        /// `listen_tls`, repeatable: LTB over TLS (`[tls]`); none by default.
        public var listenTLS: [ListenAddress] = []
    }
}

extension SectionSpec {
    /// `[server]`: its keys, in the order of config/roomcastd.conf.
    static let server = SectionSpec(section: "server", keys: [
        KeySpec(name: "listen") { _, _ throws(ValueError) in },  // handled in Config.parse
        KeySpec(name: "listen_tls") { _, _ throws(ValueError) in },  // handled in Config.parse
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
    ] + Config.ProxySettings.keys(\.server.proxy))
}

extension Config {
    /// `[server]`'s rules across sections.
    func checkServerRules(_ rule: RuleContext) throws(ConfigError) {
        try server.proxy.check("server", rule)
        if server.defaultRoom.utf8.count > self.protocol.maxRoomBytes {
            throw rule.fail(["server.default_room", "protocol.max_room_bytes"],
                            "server.default_room is \(server.defaultRoom.utf8.count) bytes, over protocol.max_room_bytes "
                            + "(\(self.protocol.maxRoomBytes)): a join naming the default room would be refused")
        }
    }
}
