/// An incremental UTF-8 validator (RFC 3629 §4, the well-formed byte
/// sequences): fed a text message fragment by fragment, it rejects a bad
/// byte at the fragment that holds it, even when the sequence it belongs to
/// began in an earlier fragment (RFC 6455 §8.1: an endpoint fails the
/// connection as soon as the text it has received is not valid UTF-8).
///
/// A plain value of 3 bytes: the state between fragments travels with the
/// rest of a connection's decoder state. O(n) per byte fed, no allocation.
public struct UTF8Validator: Equatable, Sendable {
    /// Continuation bytes still owed by the sequence in progress (0 ... 3).
    public private(set) var owed: UInt8 = 0
    /// The range the next continuation byte must fall in; narrower than
    /// 0x80 ... 0xBF right after E0, ED, F0 and F4 (no overlong forms, no
    /// surrogates, nothing above U+10FFFF).
    private var low: UInt8 = 0x80
    private var high: UInt8 = 0xBF

    public init() {}

    /// The state as 3 bytes (continuation bytes owed, then the low and high
    /// bound of the next one), for a restart (`HandOverState`).
    public var packed: [UInt8] { [owed, low, high] }

    /// A state from ``packed``; nil when the bytes are not a state the
    /// validator can be in (owed above 3, bounds outside 0x80 ... 0xBF).
    public init?(packed: [UInt8]) {
        guard packed.count == 3, packed[0] <= 3, packed[1] >= 0x80, packed[1] <= packed[2], packed[2] <= 0xBF else { return nil }
        (owed, low, high) = (packed[0], packed[1], packed[2])
    }

    /// Whether the bytes fed so far end on a character boundary (a complete
    /// text message must).
    public var isComplete: Bool { owed == 0 }

    /// Feeds `bytes`.
    /// - Returns: false at the first byte that cannot continue valid UTF-8
    ///   (the validator is then in an undefined state and must be discarded).
    public mutating func feed(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var i = 0
        let n = bytes.count
        while i < n {
            let b = bytes[i]
            if owed == 0 {
                // Fast path: a run of ASCII.
                if b < 0x80 { i += 1; continue }
                switch b {
                case 0xC2...0xDF: owed = 1; low = 0x80; high = 0xBF
                case 0xE0: owed = 2; low = 0xA0; high = 0xBF
                case 0xE1...0xEC, 0xEE...0xEF: owed = 2; low = 0x80; high = 0xBF
                case 0xED: owed = 2; low = 0x80; high = 0x9F
                case 0xF0: owed = 3; low = 0x90; high = 0xBF
                case 0xF1...0xF3: owed = 3; low = 0x80; high = 0xBF
                case 0xF4: owed = 3; low = 0x80; high = 0x8F
                default: return false  // 80...C1 (continuation or overlong lead), F5...FF
                }
            } else {
                guard b >= low && b <= high else { return false }
                owed -= 1
                low = 0x80
                high = 0xBF
            }
            i += 1
        }
        return true
    }

    /// Feeds `bytes` (an array).
    public mutating func feed(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { feed($0) }
    }
}
