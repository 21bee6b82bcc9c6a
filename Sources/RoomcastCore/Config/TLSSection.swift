// `[tls]`: the certificate, key and policy of the `listen_tls` listeners
// (docs/protocol/tls.md §16, roomcastd.conf(5)).

extension Config {
    /// `client_auth`: whether a TLS client must present a certificate
    /// (SSL_CTX_set_verify(3)).
    public enum ClientAuth: String, Equatable, Sendable, CaseIterable {
        /// No certificate is asked for (default).
        case none
        /// One is asked for; a client without one is accepted, a client whose
        /// certificate does not verify against `ca_file` is refused.
        case optional
        /// A certificate that verifies against `ca_file` is required.
        case required
    }

    /// `min_version`: the oldest TLS version accepted (RFC 8446, RFC 5246).
    /// Spelled `1.2` or `1.3` in the file.
    public enum TLSVersion: String, Equatable, Sendable, CaseIterable {
        case tls12 = "1.2"
        case tls13 = "1.3"
    }

    /// `[tls]`: read when any `listen_tls` is set (at start and on SIGHUP).
    public struct TLS: Equatable, Sendable {
        /// `cert_file`: the certificate chain, PEM, leaf first (absolute
        /// path; with systemd, a `LoadCredential=` path). Empty: none.
        public var certFile = ""
        /// `key_file`: the certificate's private key, PEM (absolute path).
        /// Its bytes are never logged.
        public var keyFile = ""
        /// `ca_file`: the CAs that client certificates must chain to, PEM;
        /// needed by `client_auth = optional | required`. Empty: none.
        public var caFile = ""
        /// `client_auth`: default none.
        public var clientAuth = ClientAuth.none
        /// `min_version`: default 1.2 (older versions are always refused).
        public var minVersion = TLSVersion.tls12
        /// `handshake_timeout`: a TLS client that has not finished its
        /// handshake in this time is closed, in ms, 100ms ... 5min. Default 10s.
        public var handshakeTimeoutMs: UInt64 = 10_000
        /// The config file's line of each `[tls]` key set (`cert_file` → 12),
        /// so that a certificate OpenSSL refuses at start is reported at its
        /// line. Not a setting: equality ignores it.
        public var lines: [String: Int] = [:]

        public init() {}

        public static func == (a: TLS, b: TLS) -> Bool {
            (a.certFile, a.keyFile, a.caFile, a.clientAuth, a.minVersion, a.handshakeTimeoutMs)
                == (b.certFile, b.keyFile, b.caFile, b.clientAuth, b.minVersion, b.handshakeTimeoutMs)
        }
    }

    /// Every `listen_tls` address, of every section.
    public var allTLSListen: [ListenAddress] { server.listenTLS + json.listenTLS + webSocket.listenTLS }
}

extension SectionSpec {
    /// `[tls]`: its keys, in the order of config/roomcastd.conf.
    static let tls = SectionSpec(section: "tls", keys: [
        KeySpec(name: "cert_file") { c, v throws(ValueError) in c.tls.certFile = try absolutePath(v) },
        KeySpec(name: "key_file") { c, v throws(ValueError) in c.tls.keyFile = try absolutePath(v) },
        KeySpec(name: "ca_file") { c, v throws(ValueError) in c.tls.caFile = try absolutePath(v) },
        KeySpec(name: "client_auth") { c, v throws(ValueError) in c.tls.clientAuth = try choice(v) },
        KeySpec(name: "min_version") { c, v throws(ValueError) in c.tls.minVersion = try choice(v) },
        KeySpec(name: "handshake_timeout") { c, v throws(ValueError) in
            c.tls.handshakeTimeoutMs = try duration(v, 100...300_000)
        },
    ])
}

/// An empty value or an absolute path.
/// - Throws: ``ValueError`` for a relative path (the daemon's working
///   directory is `/` under systemd: a relative one would mislead).
func absolutePath(_ v: String) throws(ValueError) -> String {
    guard v.isEmpty || v.hasPrefix("/") else { throw ValueError(reason: "\(quote(v)) is not an absolute path") }
    return v
}

extension Config {
    /// `[tls]`'s rules: a `listen_tls` needs `cert_file` and `key_file`;
    /// `client_auth` other than none needs `ca_file`.
    func checkTLSRules(_ rule: RuleContext) throws(ConfigError) {
        let listenKeys = ["server.listen_tls", "json.listen_tls", "websocket.listen_tls"]
        if !allTLSListen.isEmpty && (tls.certFile.isEmpty || tls.keyFile.isEmpty) {
            throw rule.fail(listenKeys + ["tls.cert_file", "tls.key_file"],
                            "listen_tls needs tls.cert_file and tls.key_file (the certificate and its private key, PEM)")
        }
        if tls.clientAuth != .none && tls.caFile.isEmpty {
            throw rule.fail(["tls.client_auth", "tls.ca_file"],
                            "tls.client_auth = \(tls.clientAuth.rawValue) needs tls.ca_file (the CAs client certificates must chain to)")
        }
    }
}
