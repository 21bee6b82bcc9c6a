// Signed joins (docs/protocol/tokens.md §13): a compact JWS (RFC 7515 §7.1)
// carrying a JWT (RFC 7519). This file cuts a token into its parts and
// reads its header and claims; it checks the claims against a clock it is
// given. The signature is checked by the daemon with OpenSSL
// (RoomcastServer/Auth/TokenVerifier.swift): nothing here trusts a token.

/// The signature algorithms a key may have (RFC 7518 §3.2; RFC 8037 §3.1).
public enum TokenAlgorithm: String, Sendable, CaseIterable {
    /// HMAC with SHA-256: the key is the shared secret.
    case hs256 = "HS256"
    /// Ed25519: the key is the 32-byte public key.
    case edDSA = "EdDSA"
}

/// What a token grants beyond its identity (docs/protocol/tokens.md §13).
public enum TokenRole: String, Sendable, Equatable {
    case viewer, moderator, owner
}

/// Why a token is refused. `code` is what the client is told (the Notice
/// code, docs/protocol/tokens.md §13) and `reason` what the log says: neither
/// contains the token or its signature.
public enum TokenError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Not three base64url parts, bad JSON, a claim of the wrong type, a missing `sub` or `exp`.
    case malformed(String)
    /// The header says `"alg": "none"` (RFC 7518 §3.6): never accepted.
    case algorithmNone
    /// No key with the header's `kid`.
    case unknownKey(kid: String)
    /// The header's `alg` is not the algorithm of the key its `kid` names.
    case algorithmMismatch(kid: String, alg: String, keyAlg: TokenAlgorithm)
    /// The signature does not verify with the key.
    case badSignature(kid: String)
    /// `exp` (seconds since the epoch) is more than the leeway before `now`.
    case expired(exp: Int64, now: Int64)
    /// `nbf` is more than the leeway after `now`.
    case notYetValid(nbf: Int64, now: Int64)
    /// The join names a room the token's `rooms` do not include.
    case roomForbidden(room: String)

    /// The Notice code (docs/protocol/notices.md §13): `token_expired` for an
    /// expired token, `room_forbidden` for a room outside `rooms`,
    /// `token_invalid` for everything else.
    public var code: String {
        switch self {
        case .expired: "token_expired"
        case .roomForbidden: "room_forbidden"
        default: "token_invalid"
        }
    }

    /// One line for the log and the notice's text (no token bytes in it).
    public var description: String {
        switch self {
        case .malformed(let why): "malformed token: \(why)"
        case .algorithmNone: "alg 'none' is never accepted"
        case .unknownKey(let kid): "no key with kid '\(clipForLog(kid, maxBytes: 64))'"
        case .algorithmMismatch(let kid, let alg, let keyAlg):
            "alg '\(clipForLog(alg, maxBytes: 32))' is not the algorithm of key '\(clipForLog(kid, maxBytes: 64))' (\(keyAlg.rawValue))"
        case .badSignature(let kid): "signature does not verify with key '\(clipForLog(kid, maxBytes: 64))'"
        case .expired(let exp, let now): "expired: exp \(exp) is \(now - exp) s ago (leeway \(TokenClaims.leewaySeconds) s)"
        case .notYetValid(let nbf, let now): "not valid yet: nbf \(nbf) is \(nbf - now) s ahead (leeway \(TokenClaims.leewaySeconds) s)"
        case .roomForbidden(let room): "room '\(clipForLog(room, maxBytes: 64))' is not in the token's rooms"
        }
    }
}

/// A compact JWS cut into its parts (RFC 7515 §7.1), header read, nothing verified.
public struct CompactJWS: Sendable {
    /// Longest token accepted, in bytes: claims are small, and a token is
    /// parsed on every join.
    public static let maxBytes = 8192

    /// The header's `alg`.
    public var algorithm: String
    /// The header's `kid`: which key of `[auth] key_file` signed it.
    public var keyID: String
    /// The bytes the signature covers: `BASE64URL(header) '.' BASE64URL(payload)`.
    public var signingInput: [UInt8]
    /// The decoded payload (the claims' JSON).
    public var payload: [UInt8]
    /// The decoded signature.
    public var signature: [UInt8]

    /// Cuts `token` into its three parts and reads the header.
    /// - Throws: `TokenError.malformed` (not three base64url parts, over
    ///   `maxBytes`, a header that is not a JSON object with string `alg`
    ///   and `kid`, a `crit` header RFC 7515 §4.1.11 would have us
    ///   understand), `.algorithmNone` for `alg: none`.
    public init(_ token: some Collection<UInt8>) throws(TokenError) {
        guard token.count <= Self.maxBytes else { throw .malformed("over \(Self.maxBytes) bytes") }
        let bytes = Array(token)
        let parts = bytes.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw .malformed("\(parts.count) dot-separated parts, a compact JWS has 3") }
        guard let header = Base64URL.decode(parts[0]) else { throw .malformed("header is not base64url") }
        guard let payload = Base64URL.decode(parts[1]) else { throw .malformed("payload is not base64url") }
        guard let signature = Base64URL.decode(parts[2]) else { throw .malformed("signature is not base64url") }
        let json: JSONValue
        do { json = try parseJSON(header) } catch { throw .malformed("header: \(error)") }
        guard case .object = json else { throw .malformed("header is not a JSON object") }
        guard case .string(let alg)? = json["alg"] else { throw .malformed("header has no string 'alg'") }
        if alg == "none" { throw .algorithmNone }
        guard case .string(let kid)? = json["kid"] else { throw .malformed("header has no string 'kid'") }
        if json["crit"] != nil { throw .malformed("header has 'crit', which is not supported") }
        algorithm = alg
        keyID = kid
        signingInput = Array(bytes[..<parts[1].endIndex])
        self.payload = payload
        self.signature = signature
    }
}

/// The verified claims a connection keeps (docs/protocol/tokens.md §13); never the token.
public struct TokenClaims: Equatable, Sendable {
    /// Seconds of clock skew allowed on `exp` and `nbf` (docs/protocol/tokens.md §13).
    public static let leewaySeconds: Int64 = 30

    /// `sub`: the account id; compared as bytes.
    public var sub: String
    /// `exp`, seconds since the epoch (fractions dropped).
    public var exp: Int64
    /// `nbf`, seconds since the epoch.
    public var nbf: Int64?
    /// `name`: what UserInfo.name must say (nil: it must say `sub`).
    public var name: String?
    /// `level`: what UserInfo.level must say (nil: anything).
    public var level: Int32?
    /// `icon`: what UserInfo.iconURL must say (nil: anything).
    public var icon: String?
    /// `rooms`: the rooms it may join; `"*"` any. Nil: only the default room.
    public var rooms: [String]?
    /// `role`, default viewer.
    public var role: TokenRole
    /// `may`: frame types the client may send (text 2, gift 3, an opaque
    /// type by its number). Nil: the daemon's default for the role.
    public var may: [UInt16]?

    public init(sub: String, exp: Int64, nbf: Int64? = nil, name: String? = nil, level: Int32? = nil, icon: String? = nil,
                rooms: [String]? = nil, role: TokenRole = .viewer, may: [UInt16]? = nil) {
        self.sub = sub
        self.exp = exp
        self.nbf = nbf
        self.name = name
        self.level = level
        self.icon = icon
        self.rooms = rooms
        self.role = role
        self.may = may
    }

    /// The name every UserInfo of this connection must carry: `name`, else `sub`.
    public var displayName: String { name ?? sub }

    /// Reads the claims' JSON (RFC 7519 §4). Unknown claims (`iat`, `iss`,
    /// `jti` ...) are ignored; `iat` is never a reason to refuse.
    /// - Throws: `TokenError.malformed` when the payload is not a JSON
    ///   object, `sub` (string) or `exp` (number) is missing, or a known
    ///   claim has the wrong type or an unknown value (a `role` other than
    ///   viewer/moderator/owner, a `may` entry that is neither `text`,
    ///   `gift` nor a number 0 ... 65535).
    public init(json payload: [UInt8]) throws(TokenError) {
        let json: JSONValue
        do { json = try parseJSON(payload) } catch { throw .malformed("claims: \(error)") }
        guard case .object = json else { throw .malformed("claims are not a JSON object") }
        guard case .string(let sub)? = json["sub"] else { throw .malformed("claim 'sub' is missing or not a string") }
        guard let exp = try Self.date(json, "exp") else { throw .malformed("claim 'exp' is missing") }
        self.init(sub: sub, exp: exp)
        nbf = try Self.date(json, "nbf")
        name = try Self.string(json, "name")
        icon = try Self.string(json, "icon")
        if let v = json["level"] {
            guard case .number(let n) = v, n >= Double(Int32.min), n <= Double(Int32.max), Double(Int32(n)) == n else {
                throw .malformed("claim 'level' is not an int32")
            }
            level = Int32(n)
        }
        if let v = json["rooms"] {
            guard case .array(let items) = v else { throw .malformed("claim 'rooms' is not a list") }
            var rooms: [String] = []
            for item in items {
                guard case .string(let r) = item else { throw .malformed("claim 'rooms' has an entry that is not a string") }
                rooms.append(r)
            }
            self.rooms = rooms
        }
        if let r = try Self.string(json, "role") {
            guard let role = TokenRole(rawValue: r) else {
                throw .malformed("claim 'role' is '\(clipForLog(r, maxBytes: 32))', not viewer, moderator or owner")
            }
            self.role = role
        }
        if let v = json["may"] {
            guard case .array(let items) = v else { throw .malformed("claim 'may' is not a list") }
            var may: [UInt16] = []
            for item in items {
                switch item {
                case .string(let s):
                    guard let t = frameTypeName(s) else {
                        throw .malformed("claim 'may' names '\(clipForLog(s, maxBytes: 32))', not text, gift or a type number")
                    }
                    may.append(t)
                case .number(let n) where n >= 0 && n <= 65535 && Double(UInt16(n)) == n:
                    may.append(UInt16(n))
                default:
                    throw .malformed("claim 'may' has an entry that is neither a name nor a type number 0 ... 65535")
                }
            }
            self.may = may
        }
    }

    private static func string(_ json: JSONValue, _ key: String) throws(TokenError) -> String? {
        guard let v = json[key] else { return nil }
        guard case .string(let s) = v else { throw .malformed("claim '\(key)' is not a string") }
        return s
    }

    /// A NumericDate (RFC 7519 §2): seconds since the epoch, fractions dropped.
    private static func date(_ json: JSONValue, _ key: String) throws(TokenError) -> Int64? {
        guard let v = json[key] else { return nil }
        guard case .number(let n) = v, n.isFinite, abs(n) < 1e15 else { throw .malformed("claim '\(key)' is not a NumericDate") }
        let t = Int64(n)  // toward zero; the standard library's rounded() would need libm
        return Double(t) > n ? t - 1 : t
    }

    /// Checks `exp` and `nbf` against `now` (seconds since the epoch), each
    /// with `leewaySeconds` (RFC 7519 §4.1.4, §4.1.5); `iat` is not looked at.
    /// - Throws: `TokenError.expired` or `.notYetValid`.
    public func checkTime(now: Int64) throws(TokenError) {
        if now > exp + Self.leewaySeconds { throw .expired(exp: exp, now: now) }
        if let nbf, nbf > now + Self.leewaySeconds { throw .notYetValid(nbf: nbf, now: now) }
    }

    /// Whether the token lets its holder join `room` (bytes compared; `"*"`
    /// any; without `rooms`, only `defaultRoom`).
    public func permits(room: String, defaultRoom: String) -> Bool {
        guard let rooms else { return sameBytes(room, defaultRoom) }
        return rooms.contains { $0 == "*" || sameBytes($0, room) }
    }
}

/// The frame type a `may` entry or `[auth] viewer_may` item names: `text`
/// (2), `gift` (3) or a decimal number 0 ... 65535 (an opaque type).
public func frameTypeName(_ s: String) -> UInt16? {
    switch s {
    case "text": 2
    case "gift": 3
    default: s.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) && !s.isEmpty && s.utf8.count <= 5 ? UInt16(s) : nil
    }
}

extension TokenClaims {
    /// The claims as one JSON object that `init(json:)` reads back to an
    /// equal value: how a restart (HandOverState) carries a connection's
    /// verified identity. Not a token: nothing in it is signed.
    public var json: [UInt8] {
        var parts = ["\"sub\":" + jsonStringLiteral(sub), "\"exp\":\(exp)"]
        if let nbf { parts.append("\"nbf\":\(nbf)") }
        if let name { parts.append("\"name\":" + jsonStringLiteral(name)) }
        if let level { parts.append("\"level\":\(level)") }
        if let icon { parts.append("\"icon\":" + jsonStringLiteral(icon)) }
        if let rooms { parts.append("\"rooms\":[" + rooms.map(jsonStringLiteral).joined(separator: ",") + "]") }
        if role != .viewer { parts.append("\"role\":\"\(role.rawValue)\"") }
        if let may { parts.append("\"may\":[" + may.map(String.init).joined(separator: ",") + "]") }
        return Array(("{" + parts.joined(separator: ",") + "}").utf8)
    }
}
