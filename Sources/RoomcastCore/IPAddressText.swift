/// Numeric IPv4 and IPv6 addresses as text, parsed and printed exactly as
/// glibc's inet_pton(3) and inet_ntop(3) do, in plain Swift: the core uses
/// no C library. A test compares both directions with glibc on fixed and
/// random inputs.
///
/// Rules (inet_pton(3)): IPv4 is four decimal parts 0-255 with no leading
/// zeros; IPv6 is up to eight groups of 1-4 hex digits, one `::` for a run
/// of zero groups, and an IPv4 tail in the last 32 bits. Printing follows
/// RFC 5952 as glibc does: lowercase, no leading zeros, the longest run of
/// two or more zero groups (the first, if tied) as `::`, and `::a.b.c.d` or
/// `::ffff:a.b.c.d` for IPv4-compatible and IPv4-mapped addresses.
public enum IPAddressText {
    /// The 4 bytes of a dotted-quad IPv4 address, or nil.
    public static func parseIPv4(_ text: some StringProtocol) -> [UInt8]? {
        parseIPv4(Array(text.utf8)[...])
    }

    private static func parseIPv4(_ s: ArraySlice<UInt8>) -> [UInt8]? {
        var bytes: [UInt8] = [0]
        var sawDigit = false
        for ch in s {
            if ch >= 0x30 && ch <= 0x39 {
                let value = Int(bytes[bytes.count - 1]) * 10 + Int(ch - 0x30)
                if sawDigit && bytes[bytes.count - 1] == 0 { return nil }  // a leading zero
                if value > 255 { return nil }
                bytes[bytes.count - 1] = UInt8(value)
                sawDigit = true
            } else if ch == UInt8(ascii: ".") && sawDigit {
                if bytes.count == 4 { return nil }
                bytes.append(0)
                sawDigit = false
            } else {
                return nil
            }
        }
        return bytes.count == 4 && sawDigit ? bytes : nil
    }

    /// The 16 bytes of an IPv6 address, or nil (no brackets, no zone id).
    public static func parseIPv6(_ text: some StringProtocol) -> [UInt8]? {
        let s = Array(text.utf8)
        var out: [UInt8] = []
        var doubleColonAt: Int?
        var i = 0
        guard !s.isEmpty else { return nil }
        if s[0] == UInt8(ascii: ":") {
            guard s.count > 1, s[1] == UInt8(ascii: ":") else { return nil }
            i = 1
        }
        var groupStart = i
        var digits = 0
        var value = 0
        while i < s.count {
            let ch = s[i]
            i += 1
            if let digit = hexValue(ch) {
                if digits == 4 { return nil }
                value = value << 4 | digit
                digits += 1
                continue
            }
            if ch == UInt8(ascii: ":") {
                groupStart = i
                if digits == 0 {
                    if doubleColonAt != nil { return nil }
                    doubleColonAt = out.count
                    continue
                }
                if i == s.count { return nil }  // a trailing single ':'
                if out.count + 2 > 16 { return nil }
                out += [UInt8(value >> 8), UInt8(value & 0xFF)]
                digits = 0
                value = 0
                continue
            }
            if ch == UInt8(ascii: "."), out.count + 4 <= 16, let v4 = parseIPv4(s[groupStart...]) {
                out += v4
                digits = 0
                break
            }
            return nil
        }
        if digits > 0 {
            if out.count + 2 > 16 { return nil }
            out += [UInt8(value >> 8), UInt8(value & 0xFF)]
        }
        if let at = doubleColonAt {
            if out.count == 16 { return nil }  // '::' standing for no group at all
            out.insert(contentsOf: repeatElement(0, count: 16 - out.count), at: at)
        }
        return out.count == 16 ? out : nil
    }

    /// `a.b.c.d` for 4 bytes.
    public static func formatIPv4(_ b: some Collection<UInt8>) -> String {
        b.map { String($0) }.joined(separator: ".")
    }

    /// The RFC 5952 form glibc's inet_ntop(3) prints for 16 bytes.
    public static func formatIPv6(_ bytes: [UInt8]) -> String {
        precondition(bytes.count == 16)
        let words = (0..<8).map { Int(bytes[2 * $0]) << 8 | Int(bytes[2 * $0 + 1]) }
        var best = (base: -1, length: 0)
        var current = (base: -1, length: 0)
        for i in 0..<8 {
            if words[i] == 0 {
                current = current.base == -1 ? (i, 1) : (current.base, current.length + 1)
            } else if current.base != -1 {
                if best.base == -1 || current.length > best.length { best = current }
                current.base = -1
            }
        }
        if current.base != -1 && (best.base == -1 || current.length > best.length) { best = current }
        if best.base != -1 && best.length < 2 { best.base = -1 }
        var out = ""
        for i in 0..<8 {
            if best.base != -1 && i >= best.base && i < best.base + best.length {
                if i == best.base { out += ":" }
                continue
            }
            if i != 0 { out += ":" }
            if i == 6 && best.base == 0 && (best.length == 6 || (best.length == 5 && words[5] == 0xFFFF)) {
                out += formatIPv4(bytes[12...])
                return out
            }
            out += String(words[i], radix: 16)
        }
        if best.base != -1 && best.base + best.length == 8 { out += ":" }
        return out
    }

    /// The address in canonical form (as inet_ntop prints what inet_pton
    /// reads), or nil if `text` is not a numeric address of that family.
    public static func canonical(_ text: String, ipv6: Bool) -> String? {
        if ipv6 { return parseIPv6(text).map(formatIPv6) }
        return parseIPv4(text).map(formatIPv4)
    }

    private static func hexValue(_ ch: UInt8) -> Int? {
        switch ch {
        case 0x30...0x39: Int(ch - 0x30)
        case 0x61...0x66: Int(ch - 0x61 + 10)
        case 0x41...0x46: Int(ch - 0x41 + 10)
        default: nil
        }
    }
}
