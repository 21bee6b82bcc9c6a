// base64url without padding (RFC 4648 §5; RFC 7515 §2 "Base64url Encoding"):
// the encoding of every part of a compact JWS and of the keys in
// `[auth] key_file`.

/// Encodes and decodes base64url without `=` padding (RFC 4648 §5, RFC 7515 §2).
public enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// The value of one base64url character, or nil for any other byte
    /// (`+`, `/` and `=` included: those are base64, not base64url).
    @inline(__always)
    static func value(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): c - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): c - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0") + 52
        case UInt8(ascii: "-"): 62
        case UInt8(ascii: "_"): 63
        default: nil
        }
    }

    /// Decodes unpadded base64url text.
    /// - Returns: the bytes, or nil when `text` has a character outside the
    ///   base64url alphabet (padding included), a length of 4n+1 characters
    ///   (no byte string encodes to that), or non-zero bits after the last
    ///   byte (RFC 4648 §3.5: a canonical encoding leaves them zero, so one
    ///   token has exactly one spelling).
    public static func decode(_ text: some Collection<UInt8>) -> [UInt8]? {
        let n = text.count
        if n % 4 == 1 { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(n * 3 / 4)
        var acc: UInt32 = 0
        var bits = 0
        for c in text {
            guard let v = value(c) else { return nil }
            acc = (acc << 6) | UInt32(v)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits)))
                acc &= (1 << UInt32(bits)) - 1
            }
        }
        if acc != 0 { return nil }
        return out
    }

    /// Decodes unpadded base64url text given as a String (see `decode(_:)`).
    public static func decode(_ text: String) -> [UInt8]? {
        decode(Array(text.utf8))
    }

    /// Encodes `bytes` as base64url without padding.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var acc: UInt32 = 0
        var bits = 0
        for b in bytes {
            acc = (acc << 8) | UInt32(b)
            bits += 8
            while bits >= 6 {
                bits -= 6
                out.append(alphabet[Int((acc >> UInt32(bits)) & 63)])
            }
            acc &= (1 << UInt32(bits)) - 1
        }
        if bits > 0 { out.append(alphabet[Int((acc << UInt32(6 - bits)) & 63)]) }
        return String(decoding: out, as: UTF8.self)
    }
}
