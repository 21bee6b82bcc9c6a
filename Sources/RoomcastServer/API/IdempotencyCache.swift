import RoomcastCore
import RoomcastCrypto

// IdempotencyCache.swift: publishes by `Idempotency-Key` (docs/api.md; the
// IETF draft "The Idempotency-Key HTTP Header Field", §2.7). A key is
// remembered 5 minutes with the SHA-256 fingerprint of the request that used
// it (method, path, body: never the body itself) and the reply it got. A
// repeat of the same request is not relayed again and gets the first reply;
// the same key with another request (another room, another body) is refused
// with 422 `idempotency_key_reused` and relays nothing. (Before, it got the
// first request's `200 {"delivered": 1}` and was silently dropped: a backend
// numbering keys per room lost gifts while being told they were delivered.)
// The keys go on across a restart (`carried`, `restore`: the hand-over
// state's record 0x4901) with the time each has left; with a cluster they
// are also claimed in Redis (ClusterIdempotency.swift).

/// The replies of publishes by `Idempotency-Key`, bounded and expiring.
struct IdempotencyCache {
    /// How long a key is remembered, in ms.
    static let keepMs: UInt64 = 5 * 60_000
    /// Keys remembered at most; the oldest go first when full.
    static let capacity = HandOverState.IdempotencyEntry.maxEntries
    /// The answer to a key seen with another request (the draft's 422).
    static let mismatchError = APIError(422, "idempotency_key_reused",
                                        "this Idempotency-Key was used with another request (method, path or body) in the last 5 minutes")

    /// The reply of a publish that reached `delivered` members.
    static func reply(delivered: UInt64) -> APIResponse { .json("{\"delivered\": \(delivered)}") }

    /// What a key says about a request.
    enum Lookup: Equatable {
        /// Not seen (or forgotten): serve the request, then `remember`.
        case unseen
        /// Seen with the same fingerprint: its reply's `delivered` count, nothing is relayed again.
        case replay(delivered: UInt64)
        /// Seen with another fingerprint: refuse (422), nothing relayed.
        case mismatch
    }

    private var replies: [String: (fingerprint: [UInt8], delivered: UInt64, expiresMs: UInt64)] = [:]
    /// Keys in the order they expire (each entry's own `expiresMs`).
    private var order: [(key: String, expiresMs: UInt64)] = []
    private var head = 0

    /// Keys remembered now (expired ones not yet dropped included).
    var count: Int { replies.count }

    /// The SHA-256 of `method`, `path` and `body`, each length-prefixed (so
    /// no two requests share one by moving bytes between the parts).
    static func fingerprint(method: String, path: String, body: [UInt8]) -> [UInt8] {
        var input: [UInt8] = []
        input.reserveCapacity(method.utf8.count + path.utf8.count + body.count + 24)
        for part in [Array(method.utf8), Array(path.utf8), body] {
            withUnsafeBytes(of: UInt64(part.count).littleEndian) { input += $0 }
            input += part
        }
        return sha256(input) ?? input  // OpenSSL failing to digest: the input itself still compares exactly
    }

    /// What `key` says about a request of `fingerprint` at `now` (ms).
    mutating func lookup(_ key: String, fingerprint: [UInt8], now: UInt64) -> Lookup {
        expire(now: now)
        guard let kept = replies[key] else { return .unseen }
        return kept.fingerprint == fingerprint ? .replay(delivered: kept.delivered) : .mismatch
    }

    /// The answer to a request of `fingerprint` under `key` at `now` (ms):
    /// the first reply for a repeat, nil for a key not seen (serve the
    /// request, then `remember`).
    /// - Throws: `mismatchError` (422) for the key seen with another request.
    mutating func answer(_ key: String, fingerprint: [UInt8], now: UInt64) throws(APIError) -> APIResponse? {
        switch lookup(key, fingerprint: fingerprint, now: now) {
        case .replay(let delivered): return Self.reply(delivered: delivered)
        case .mismatch: throw Self.mismatchError
        case .unseen: return nil
        }
    }

    /// Remembers the reply (`delivered`) to the request of `fingerprint`
    /// under `key` for `keepMs` (`forMs`: a shorter time left, a restored entry).
    mutating func remember(_ key: String, fingerprint: [UInt8], delivered: UInt64, now: UInt64, forMs: UInt64 = keepMs) {
        expire(now: now)
        if replies.count >= Self.capacity, head < order.count {
            replies[order[head].key] = nil
            head += 1
        }
        let expires = now + min(forMs, Self.keepMs)
        replies[key] = (fingerprint, delivered, expires)
        order.append((key, expires))
    }

    /// What a hand-over carries: every key not yet expired at `now`, oldest
    /// first, with the time it has left (a duration: the next process need
    /// not share this one's clock).
    mutating func carried(now: UInt64) -> [HandOverState.IdempotencyEntry] {
        expire(now: now)
        var out: [HandOverState.IdempotencyEntry] = []
        out.reserveCapacity(replies.count)
        for o in order[head...] {
            guard let kept = replies[o.key], kept.expiresMs == o.expiresMs, kept.expiresMs > now else { continue }
            out.append(.init(key: Array(o.key.utf8), fingerprint: kept.fingerprint, delivered: kept.delivered,
                             remainingMs: UInt32(min(kept.expiresMs - now, Self.keepMs))))
        }
        return out
    }

    /// Takes back what a previous process carried (`carried`), in its order.
    mutating func restore(_ entries: [HandOverState.IdempotencyEntry], now: UInt64) {
        for e in entries where e.isWellFormed {
            remember(String(decoding: e.key, as: UTF8.self), fingerprint: e.fingerprint, delivered: e.delivered,
                     now: now, forMs: UInt64(e.remainingMs))
        }
    }

    private mutating func expire(now: UInt64) {
        while head < order.count, order[head].expiresMs <= now {
            if let kept = replies[order[head].key], kept.expiresMs == order[head].expiresMs { replies[order[head].key] = nil }
            head += 1
        }
        if head > 1024 && head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
    }
}
