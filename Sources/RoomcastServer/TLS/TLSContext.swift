import COpenSSL
import Glibc
import RoomcastCore
import RoomcastCrypto

/// One OpenSSL `SSL_CTX` made from `[tls]` (SSL_CTX_new(3)): the certificate
/// chain, its key, the client-certificate policy and the protocol floor.
/// Every connection accepted while it is current is made from it; a reload
/// (SIGHUP) makes a new one and the old one lives on, inside OpenSSL's
/// reference count, for the connections made from it (SSL_new(3) takes a
/// reference).
public final class TLSContext {
    let ctx: OpaquePointer
    /// SSL_MODE_RELEASE_BUFFERS: each connection frees its record buffers
    /// whenever they are empty. Measured (make bench-tls, 1,000 members,
    /// 64 B): the same server CPU per delivery as keeping them and freeing
    /// idle ones on the 1 s sweep (SSL_free_buffers), and 15.8 KiB per idle
    /// TLS connection instead of 19.6 KiB (glibc keeps what the sweep frees).
    static let releaseBuffers: Int32 = 1

    /// `[tls] handshake_timeout`, in ms.
    let handshakeTimeoutMs: UInt64

    /// Loads the files named in `settings`.
    /// - Throws: ``TLSContext/LoadError`` naming the key (`tls.cert_file`, ...)
    ///   and OpenSSL's reason (ERR_error_string_n(3), e.g. `PEM routines::no
    ///   start line`): reasons name files and routines, never key bytes.
    init(_ settings: Config.TLS) throws(LoadError) {
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_server_method()) else { throw LoadError(key: "tls", reason: openSSLErrorReason()) }
        self.ctx = ctx
        self.handshakeTimeoutMs = settings.handshakeTimeoutMs
        let floor = settings.minVersion == .tls13 ? TLS1_3_VERSION : TLS1_2_VERSION
        guard roomcast_tls_configure(ctx, floor, Self.releaseBuffers) == 1 else { throw LoadError(key: "tls.min_version", reason: openSSLErrorReason()) }
        guard SSL_CTX_use_certificate_chain_file(ctx, settings.certFile) == 1 else {
            throw LoadError(key: "tls.cert_file", reason: "\(settings.certFile): " + openSSLErrorReason())
        }
        try Self.usePrivateKey(ctx, path: settings.keyFile)
        guard SSL_CTX_check_private_key(ctx) == 1 else {
            throw LoadError(key: "tls.key_file", reason: "\(settings.keyFile) is not the key of \(settings.certFile): " + openSSLErrorReason())
        }
        if settings.clientAuth != .none {
            guard SSL_CTX_load_verify_file(ctx, settings.caFile) == 1, let names = SSL_load_client_CA_file(settings.caFile) else {
                throw LoadError(key: "tls.ca_file", reason: "\(settings.caFile): " + openSSLErrorReason())
            }
            SSL_CTX_set_client_CA_list(ctx, names)
            let mode = settings.clientAuth == .required ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER
            SSL_CTX_set_verify(ctx, mode, nil)
        }
    }

    deinit { SSL_CTX_free(ctx) }

    /// Reads `[tls] key_file` with the checks `[auth] key_file` gets
    /// (`readSecretFile`: a regular file owned by the service user, mode
    /// 0600 or 0400, at most 1 MiB), then hands its PEM to OpenSSL
    /// (PEM_read_bio_PrivateKey(3), SSL_CTX_use_PrivateKey(3)). A file that
    /// systemd's `LoadCredential=` placed in `$CREDENTIALS_DIRECTORY` passes:
    /// systemd 252 makes it mode 0400, owned by the service's (dynamic) user
    /// (systemd.exec(5), "Credentials").
    /// - Throws: ``LoadError`` for `tls.key_file`: the file's problem (a reason
    ///   naming owner or mode, never its bytes) or OpenSSL's.
    static func usePrivateKey(_ ctx: OpaquePointer, path: String, owner: uid_t = geteuid()) throws(LoadError) {
        let text: String
        do {
            text = try readSecretFile(path, owner: owner, what: "the TLS key file")
        } catch {
            throw LoadError(key: "tls.key_file", reason: "\(path): \(error.reason)")
        }
        let key: OpaquePointer? = text.utf8CString.withUnsafeBufferPointer { pem in
            guard let bio = BIO_new_mem_buf(pem.baseAddress, Int32(pem.count - 1)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let key else { throw LoadError(key: "tls.key_file", reason: "\(path): " + openSSLErrorReason()) }
        defer { EVP_PKEY_free(key) }  // SSL_CTX_use_PrivateKey takes its own reference
        guard SSL_CTX_use_PrivateKey(ctx, key) == 1 else {
            throw LoadError(key: "tls.key_file", reason: "\(path): " + openSSLErrorReason())
        }
    }

    /// A file of `[tls]` that OpenSSL refused.
    struct LoadError: Error, CustomStringConvertible {
        /// The key whose file failed, e.g. `tls.key_file`.
        var key: String
        var reason: String
        var description: String { "\(key): \(reason)" }
    }

}

extension Server {
    /// Loads `[tls]` when any `listen_tls` is set, or when systemd passes a
    /// TLS listener (`FileDescriptorName=tls`, `json-tls`, `websocket-tls`,
    /// roomcastd(8)) and `[tls]` names a certificate (at start, beside `loadKeys`).
    /// - Parameter socketNames: the names of the sockets systemd passed
    ///   (sd_listen_fds_with_names(3)); empty without socket activation.
    /// - Returns: nil when no listener speaks TLS.
    /// - Throws: `ConfigError` at the line of the key whose file OpenSSL
    ///   refused (or, for `key_file`, that group or others can read), with
    ///   the reason: the start is refused (exit 78).
    public static func loadTLS(_ config: Config, file: String, socketNames: [String] = []) throws(ConfigError) -> TLSContext? {
        let activated = socketNames.contains { $0 == "tls" || $0.hasSuffix("-tls") } && !config.tls.certFile.isEmpty
        guard !config.allTLSListen.isEmpty || activated else { return nil }
        do {
            return try TLSContext(config.tls)
        } catch {
            let name = error.key.split(separator: ".").last.map(String.init) ?? ""
            throw ConfigError(file: file, line: config.tls.lines[name], reason: error.description)
        }
    }
}
