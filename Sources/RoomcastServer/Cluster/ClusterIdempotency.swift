import RoomcastCore

// ClusterIdempotency.swift: Idempotency-Keys claimed cluster-wide (docs/api.md
// "Idempotency-Key", docs/cluster.md). Before a keyed publish is relayed, its
// key is claimed on the publisher with
//
//     SET roomcast:NAME:idem:KEY FINGERPRINT NX PX 300000 GET
//
// (Redis >= 7.0: NX with GET). nil: this daemon claimed it and relays; a
// string: another request has it, and the value says whose (the request's
// SHA-256 in hex) and, once answered, its `delivered` count, written with
// `SET ... XX KEEPTTL` after the relay. The API's answer waits for the reply
// without blocking the loop (APIIdempotency.swift parks the connection). A
// Redis that is down, refuses the claim or does not answer within
// `cluster.timeout` (the connection is then dropped as for any command)
// leaves the key to this daemon's cache: counted
// (`roomcast_idempotency_cluster_fallbacks_total`) and logged, rate-limited.

/// What an Idempotency-Key's value in Redis holds: the fingerprint of the
/// request that claimed it and, once that request was answered, its
/// `delivered` count. Encoded as 64 lowercase hex digits, then a space and
/// 1 ... 10 decimal digits once answered; anything else is not ours.
struct IdempotencyClaimValue: Equatable {
    /// The request's SHA-256, 32 bytes.
    var fingerprint: [UInt8]
    /// The first reply's count; nil: still in progress.
    var delivered: UInt64?

    /// The longest value of ours, in bytes.
    static let maxBytes = 64 + 1 + 10

    init(fingerprint: [UInt8], delivered: UInt64?) {
        self.fingerprint = fingerprint
        self.delivered = delivered
    }

    /// Reads a value from Redis; nil when it is not one a daemon of ours writes.
    init?(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count == 64 || (bytes.count >= 66 && bytes.count <= Self.maxBytes && bytes[64] == 0x20) else { return nil }
        var fp: [UInt8] = []
        fp.reserveCapacity(32)
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case 0x30...0x39: c - 0x30
            case 0x61...0x66: c - 0x61 + 10
            default: nil
            }
        }
        for i in stride(from: 0, to: 64, by: 2) {
            guard let hi = nibble(bytes[i]), let lo = nibble(bytes[i + 1]) else { return nil }
            fp.append(hi << 4 | lo)
        }
        fingerprint = fp
        guard bytes.count > 64 else { delivered = nil; return }
        var n: UInt64 = 0
        for c in bytes[65...] {
            guard c >= 0x30 && c <= 0x39 else { return nil }
            n = n * 10 + UInt64(c - 0x30)
        }
        guard n <= UInt64(UInt32.max) else { return nil }
        delivered = n
    }

    /// The bytes stored in Redis.
    var encoded: [UInt8] {
        let digits: [UInt8] = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(Self.maxBytes)
        for b in fingerprint { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 15)]) }
        if let delivered { out.append(0x20); out += Array(String(delivered).utf8) }
        return out
    }
}

/// How a claim ended (`Server.claimAnswered`).
enum IdempotencyClaimOutcome: Equatable {
    /// This daemon holds the key: relay.
    case claimed
    /// Another request holds it (this daemon's or another's).
    case taken(IdempotencyClaimValue)
    /// The key holds something no daemon of ours writes (refused, counted).
    case notOurs
    /// No answer to rely on (Redis down, refused, too slow): the local cache decides.
    case failed(String)
}

extension ClusterLink {
    /// How long a claim is kept in Redis, in ms (the local cache's 5 minutes).
    static let claimKeepMs = IdempotencyCache.keepMs

    /// `roomcast:NAME:idem:KEY`.
    func idempotencyKey(_ key: String) -> [UInt8] { Array("roomcast:\(settings.name):idem:".utf8) + Array(key.utf8) }

    /// Sends the claim of `key` for the request of `fingerprint` (32 bytes);
    /// its answer comes to `host.claimAnswered(token, _)`.
    /// - Returns: false when it cannot be sent (publisher not ready, or its
    ///   output over `max_output_bytes`): the caller falls back at once.
    func claimIdempotency(_ key: String, fingerprint: [UInt8], token: UInt64) -> Bool {
        guard publisher.state == .ready, fingerprint.count == 32,
              publisher.pendingOutput + 512 <= settings.maxOutputBytes else { return false }
        publisher.command([Array("SET".utf8), idempotencyKey(key), IdempotencyClaimValue(fingerprint: fingerprint, delivered: nil).encoded,
                           Array("NX".utf8), Array("PX".utf8), Array(String(Self.claimKeepMs).utf8), Array("GET".utf8)], .claim)
        claimWaits.append(token)
        return true
    }

    /// The claimed request was answered: its count goes with the key (the
    /// time left stays), so a retry on any daemon gets that reply.
    func finishClaim(_ key: String, fingerprint: [UInt8], delivered: UInt64) {
        guard publisher.state == .ready else { return }
        publisher.command([Array("SET".utf8), idempotencyKey(key), IdempotencyClaimValue(fingerprint: fingerprint, delivered: delivered).encoded,
                           Array("XX".utf8), Array("KEEPTTL".utf8)], .claimStore)
    }

    /// The claimed request relayed nothing (refused after all): the key is
    /// free again, as without a cluster (only relayed publishes are remembered).
    func releaseClaim(_ key: String) {
        guard publisher.state == .ready else { return }
        publisher.command([Array("DEL".utf8), idempotencyKey(key)], .claimStore)
    }

    /// Redis's reply to the oldest claim: nil (claimed) or the value there.
    func redisClaimAnswered(_ value: UnsafeRawBufferPointer?) {
        guard let token = popClaim() else { return }
        let outcome: IdempotencyClaimOutcome
        if let value {
            if let v = IdempotencyClaimValue(value) {
                outcome = .taken(v)
            } else {
                refuse(.idempotency, "the \(value.count)-byte value of an Idempotency-Key that no daemon of ours wrote")
                outcome = .notOurs
            }
        } else {
            outcome = .claimed
        }
        host.claimAnswered(token, outcome)
    }

    /// Redis answered a claim (or its store) with an error (Redis before
    /// 7.0 refuses NX with GET, an ACL, out of memory).
    func redisClaimRefused(_ text: String, claim: Bool) {
        logger.peerWarning(reason: "cluster_error", nowMs: nowMs, "cluster: Redis refused an Idempotency-Key \(claim ? "claim (SET NX GET, Redis >= 7.0)" : "update"): \(text)",
                           ["REDIS": address.description, "DETAIL": text])
        if claim, let token = popClaim() { host.claimAnswered(token, .failed("Redis refused the claim: \(text)")) }
    }

    /// The publisher is lost (closed, timed out): every claim waiting is
    /// served by the local cache.
    func failClaims(_ reason: String) {
        while let token = popClaim() { host.claimAnswered(token, .failed(reason)) }
        claimWaits.removeAll(keepingCapacity: true)
        claimWaitsHead = 0
    }

    /// Claims waiting for their reply.
    var claimsWaiting: Int { claimWaits.count - claimWaitsHead }

    private func popClaim() -> UInt64? {
        guard claimWaitsHead < claimWaits.count else { return nil }
        let token = claimWaits[claimWaitsHead]
        claimWaitsHead += 1
        if claimWaitsHead == claimWaits.count {
            claimWaits.removeAll(keepingCapacity: true)
            claimWaitsHead = 0
        }
        return token
    }
}
