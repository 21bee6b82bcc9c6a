// `[auth] key_file` (roomcastd.conf(5)): the keys that verify signed joins.
//
//     # KID  ALG    KEY (base64url, no padding)
//     app-2026-11  HS256  q0Xy...      the shared secret, at least 32 bytes
//     app-2026-12  EdDSA  11qYAYKx...  the 32-byte Ed25519 public key
//
// Reading the file (and checking its owner and mode) is RoomcastServer's
// job; this is the parser.

/// One key of the key file.
public struct TokenKey: Equatable, Sendable {
    /// The `kid` a token's header names it by (bytes compared).
    public var id: String
    /// The only algorithm a token signed with this key may claim (RFC 8725 §3.1).
    public var algorithm: TokenAlgorithm
    /// HS256: the secret; EdDSA: the 32-byte public key.
    public var key: [UInt8]

    public init(id: String, algorithm: TokenAlgorithm, key: [UInt8]) {
        self.id = id
        self.algorithm = algorithm
        self.key = key
    }

    /// Never the key bytes: a key must not reach a log line by accident.
    public static func == (a: TokenKey, b: TokenKey) -> Bool {
        sameBytes(a.id, b.id) && a.algorithm == b.algorithm && a.key == b.key
    }
}

extension TokenKey: CustomStringConvertible {
    /// `KID (ALG)`, never the key.
    public var description: String { "\(id) (\(algorithm.rawValue))" }
}

/// The parsed key file: kid → key.
public struct TokenKeySet: Equatable, Sendable {
    /// In file order.
    public private(set) var keys: [TokenKey]

    public init(keys: [TokenKey]) {
        self.keys = keys
    }

    /// The key named `kid` (bytes compared), if any.
    public func key(_ kid: String) -> TokenKey? {
        keys.first { sameBytes($0.id, kid) }
    }

    /// Shortest HS256 secret, in bytes: RFC 7518 §3.2 wants a key at least as
    /// long as the hash output (SHA-256: 32 bytes).
    public static let minSecretBytes = 32
    /// Ed25519 public keys are 32 bytes (RFC 8032 §5.1.5).
    public static let ed25519KeyBytes = 32

    /// Parses a key file: one `KID ALG KEY` per line, fields separated by
    /// spaces or tabs, `#` comments (to the end of the line) and blank lines.
    /// - Throws: `ConfigError` at the first bad line: a line without exactly
    ///   three fields, an `ALG` other than `HS256`/`EdDSA`, a `KEY` that is
    ///   not unpadded base64url, an HS256 secret under 32 bytes, an EdDSA key
    ///   that is not 32 bytes, a kid given twice; and a file with no key.
    ///   The reason never quotes a key.
    public static func parse(_ text: String, file: String) throws(ConfigError) -> TokenKeySet {
        var keys: [TokenKey] = []
        var lineNumber = 0
        // "\r\n" is one Character: split on both, so CRLF files count lines right.
        for rawLine in text.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r\n" }) {
            lineNumber += 1
            func fail(_ reason: String) -> ConfigError { ConfigError(file: file, line: lineNumber, reason: reason) }
            var line = Substring(rawLine)
            if let hash = line.firstIndex(of: "#") { line = line[..<hash] }
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" })
            if fields.isEmpty { continue }
            guard fields.count == 3 else {
                throw fail("expected 'KID ALG KEY' (3 fields), found \(fields.count)")
            }
            let kid = String(fields[0])
            guard let algorithm = TokenAlgorithm(rawValue: String(fields[1])) else {
                throw fail("key '\(clipForLog(kid, maxBytes: 64))': algorithm '\(clipForLog(String(fields[1]), maxBytes: 32))' "
                           + "is not HS256 or EdDSA")
            }
            guard let key = Base64URL.decode(Array(fields[2].utf8)) else {
                throw fail("key '\(clipForLog(kid, maxBytes: 64))': KEY is not base64url without padding (RFC 7515 §2)")
            }
            switch algorithm {
            case .hs256 where key.count < minSecretBytes:
                throw fail("key '\(clipForLog(kid, maxBytes: 64))': an HS256 secret of \(key.count) bytes is too short "
                           + "(at least \(minSecretBytes), RFC 7518 §3.2)")
            case .edDSA where key.count != ed25519KeyBytes:
                throw fail("key '\(clipForLog(kid, maxBytes: 64))': an Ed25519 public key is \(ed25519KeyBytes) bytes, "
                           + "this one \(key.count)")
            default:
                break
            }
            if keys.contains(where: { sameBytes($0.id, kid) }) {
                throw fail("key '\(clipForLog(kid, maxBytes: 64))' is listed twice")
            }
            keys.append(TokenKey(id: kid, algorithm: algorithm, key: key))
        }
        guard !keys.isEmpty else { throw ConfigError(file: file, line: nil, reason: "no key (expected lines of 'KID ALG KEY')") }
        return TokenKeySet(keys: keys)
    }
}
