// The hand-over state's Idempotency-Key entries (record tag 0x4901; the
// format: HandOverState.swift). One record per key the API remembers
// (docs/api.md "Idempotency-Key"), so that a backend's retry after a restart
// gets the first reply instead of relaying a second paid gift. Its table is
// `idempotency` in HandOverStateTables.swift; a reader before it skips the
// tag (as every unknown record) and starts with an empty cache.
extension HandOverState {
    /// One remembered publish: its key, the SHA-256 fingerprint of its
    /// request (method, path, body; never the body), what it answered, and
    /// the time it is still remembered, as a duration (no clock reading).
    public struct IdempotencyEntry: Equatable, Sendable {
        /// The `Idempotency-Key` header's bytes, 1 ... `maxKeyBytes`.
        public var key: [UInt8]
        /// The request's SHA-256, `fingerprintBytes` bytes.
        public var fingerprint: [UInt8]
        /// The first reply's `delivered` count.
        public var delivered: UInt64
        /// Time left before it is forgotten, in ms, at most `maxRemainingMs`.
        public var remainingMs: UInt32

        /// An entry as `IdempotencyCache.carried` writes it (not checked: `isWellFormed`).
        public init(key: [UInt8], fingerprint: [UInt8], delivered: UInt64, remainingMs: UInt32) {
            self.key = key
            self.fingerprint = fingerprint
            self.delivered = delivered
            self.remainingMs = remainingMs
        }

        /// The longest key, in bytes (the API's bound, docs/api.md).
        public static let maxKeyBytes = 255
        /// A fingerprint's size: SHA-256's, in bytes.
        public static let fingerprintBytes = 32
        /// The longest time left, in ms: the 5 minutes a key is kept.
        public static let maxRemainingMs: UInt32 = 5 * 60_000
        /// Entries a reader takes at most (the API's cache capacity).
        public static let maxEntries = 100_000

        /// Whether a decoded entry is one a writer of ours could have written.
        public var isWellFormed: Bool {
            (1...Self.maxKeyBytes).contains(key.count) && fingerprint.count == Self.fingerprintBytes
                && remainingMs > 0 && remainingMs <= Self.maxRemainingMs
        }
    }

    /// At least the bytes of the idempotency records: a record header and
    /// four fields each.
    public static func idempotencyBytesBound(_ entries: [IdempotencyEntry]) -> Int {
        entries.reduce(0) { $0 + 6 + 4 * 6 + $1.key.count + $1.fingerprint.count + 8 + 4 }
    }
}
