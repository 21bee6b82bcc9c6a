import COpenSSL
import RoomcastCrypto
import RoomcastCore

// TokenVerifier.swift: the signature check of a signed join, with OpenSSL's
// libcrypto (HMAC-SHA256, RFC 7518 §3.2; Ed25519, RFC 8037 §3.1 and
// RFC 8032), and the whole verification of a token against the key set:
// parts, alg against the key's, signature, claims, clock.

/// A key of the key set, ready for OpenSSL: an Ed25519 key is parsed into
/// an `EVP_PKEY` once, when the key file is read, not on every join.
final class VerifyingKey {
    let key: TokenKey
    private let pkey: OpaquePointer?

    /// - Returns: nil when OpenSSL refuses the Ed25519 key bytes.
    init?(_ key: TokenKey) {
        self.key = key
        switch key.algorithm {
        case .hs256:
            pkey = nil
        case .edDSA:
            guard let p = key.key.withUnsafeBufferPointer({
                EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nil, $0.baseAddress, $0.count)
            }) else { return nil }
            pkey = p
        }
    }

    deinit {
        if let pkey { EVP_PKEY_free(pkey) }
    }

    /// Whether `signature` is this key's signature of `input`. HS256: the
    /// HMAC-SHA256 of `input`, compared with CRYPTO_memcmp (constant time);
    /// EdDSA: EVP_DigestVerify with no digest (Ed25519 hashes internally).
    func verifies(_ signature: [UInt8], of input: [UInt8]) -> Bool {
        switch key.algorithm {
        case .hs256:
            guard signature.count == 32, let mac = hmacSHA256(key: key.key, data: input) else { return false }
            return mac.withUnsafeBytes { m in signature.withUnsafeBytes { s in CRYPTO_memcmp(m.baseAddress, s.baseAddress, 32) == 0 } }
        case .edDSA:
            guard signature.count == 64, let pkey, let ctx = EVP_MD_CTX_new() else { return false }
            defer { EVP_MD_CTX_free(ctx) }
            guard EVP_DigestVerifyInit(ctx, nil, nil, nil, pkey) == 1 else { return false }
            let result = signature.withUnsafeBufferPointer { s in
                input.withUnsafeBufferPointer { d in EVP_DigestVerify(ctx, s.baseAddress, s.count, d.baseAddress, d.count) }
            }
            ERR_clear_error()
            return result == 1
        }
    }
}

/// The keys of `[auth] key_file`, ready to verify (KeyStore.swift reads them).
public typealias AuthKeys = VerifyingKeys

/// The keys of `[auth] key_file`, ready to verify (KeyStore.swift reads them).
public final class VerifyingKeys {
    let keys: [VerifyingKey]

    /// - Throws: `TokenError.malformed` naming an Ed25519 key OpenSSL refuses.
    public init(_ set: TokenKeySet) throws(TokenError) {
        var keys: [VerifyingKey] = []
        for k in set.keys {
            guard let v = VerifyingKey(k) else { throw .malformed("OpenSSL refuses the Ed25519 key '\(k.id)'") }
            keys.append(v)
        }
        self.keys = keys
    }

    /// Verifies `token` completely (docs/protocol/tokens.md §13): three base64url
    /// parts, `alg` not `none`, a key with the header's `kid`, `alg` equal
    /// to that key's algorithm, the signature, the claims' JSON, then `exp`
    /// and `nbf` against `nowSeconds` with TokenClaims.leewaySeconds.
    /// - Throws: `TokenError` saying which check failed.
    public func verify(_ token: some Collection<UInt8>, nowSeconds: Int64) throws(TokenError) -> TokenClaims {
        let jws = try CompactJWS(token)
        guard let key = keys.first(where: { sameBytes($0.key.id, jws.keyID) }) else { throw .unknownKey(kid: jws.keyID) }
        guard jws.algorithm == key.key.algorithm.rawValue else {
            throw .algorithmMismatch(kid: jws.keyID, alg: jws.algorithm, keyAlg: key.key.algorithm)
        }
        guard key.verifies(jws.signature, of: jws.signingInput) else { throw .badSignature(kid: jws.keyID) }
        let claims = try TokenClaims(json: jws.payload)
        try claims.checkTime(now: nowSeconds)
        return claims
    }
}
