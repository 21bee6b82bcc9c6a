// The value parsers every section's keys share: integers, sizes, durations,
// booleans and choices, each with the reason a bad value is refused.

/// One day in ms, the longest duration most keys take.
let oneDayMs: UInt64 = 86_400_000

/// Quotes a value for an error message, shortening very long ones and
/// escaping control characters (a NUL would end the message early on a
/// terminal or in fputs(3); an ESC would drive the terminal).
func quote(_ v: String) -> String {
    var shown = ""
    for u in v.unicodeScalars {
        switch u.value {
        case 0..<0x20, 0x7F...0x9F:  // C0, DEL, C1 (U+009B is a CSI too)
            let hex = String(u.value, radix: 16)
            shown += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
        default:
            shown.unicodeScalars.append(u)
        }
    }
    return shown.utf8.count <= 60 ? "'\(shown)'" : "'\(shown.prefix(40))…' (\(v.utf8.count) bytes)"
}

/// A decimal integer in `range`.
/// - Throws: ``ValueError`` naming the value and the range.
func integer(_ v: String, _ range: ClosedRange<Int>) throws(ValueError) -> Int {
    let b = Array(v.utf8)
    let allDigits = !b.isEmpty && b.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
    guard allDigits else { throw ValueError(reason: "\(quote(v)) is not a non-negative integer") }
    let n = scanDigits(b, from: 0)?.0 ?? UInt64.max  // nil: overflow, so out of range
    guard n <= UInt64(Int.max), range.contains(Int(n)) else {
        let hi = range.upperBound == Int.max ? "" : " \(range.upperBound)"
        throw ValueError(reason: "\(quote(v)) is out of range (\(range.lowerBound) ..\(hi))")
    }
    return Int(n)
}

/// A size in bytes (`64K`, `4M`: 1024-based; Units.swift) in `range`.
/// - Throws: ``ValueError`` naming the value and the range.
func size(_ v: String, _ range: ClosedRange<Int>) throws(ValueError) -> Int {
    guard let n = parseSize(v) else {
        var t = Substring(v).drop { $0 == " " || $0 == "\t" }
        while t.last == " " || t.last == "\t" { t = t.dropLast() }
        if let l = t.last, "KMG".contains(l) { t = t.dropLast() }
        let wellFormed = !t.isEmpty && t.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
        throw ValueError(reason: wellFormed
            ? "\(quote(v)) is too large"
            : "\(quote(v)) is not a size (bytes, optionally with K, M or G = 1024-based, e.g. 64K)")
    }
    guard range.contains(n) else {
        let hi = range.upperBound == Int.max ? "" : " \(formatSize(range.upperBound))"
        throw ValueError(reason: "\(quote(v)) is out of range (\(formatSize(range.lowerBound)) ..\(hi))")
    }
    return n
}

/// A duration in ms (`100ms`, `30s`, `1min 30s`; Units.swift) in `range`.
/// - Throws: ``ValueError`` naming the value and the range.
func duration(_ v: String, _ range: ClosedRange<UInt64>) throws(ValueError) -> UInt64 {
    let n: UInt64
    switch scanDuration(v) {
    case .value(let ms): n = ms
    case .tooLarge: throw ValueError(reason: "\(quote(v)) is too large")
    case .invalid:
        throw ValueError(reason: "\(quote(v)) is not a duration (e.g. 100ms, 30s, 5min, 1h, 1min 30s; "
            + "a bare number is seconds)")
    }
    guard range.contains(n) else {
        throw ValueError(reason: "\(quote(v)) is out of range "
            + "(\(formatDuration(ms: range.lowerBound)) .. \(formatDuration(ms: range.upperBound)))")
    }
    return n
}

/// Booleans as systemd spells them, case-insensitive.
func boolean(_ v: String) throws(ValueError) -> Bool {
    switch v.lowercased() {
    case "yes", "true", "on", "1": return true
    case "no", "false", "off", "0": return false
    default: throw ValueError(reason: "\(quote(v)) is not a boolean (yes/no, true/false, on/off, 1/0)")
    }
}

/// One of the raw values of `T`.
/// - Throws: ``ValueError`` listing the choices.
func choice<T: RawRepresentable & CaseIterable>(_ v: String) throws(ValueError) -> T
where T.RawValue == String {
    guard let t = T(rawValue: v) else {
        throw ValueError(reason: "\(quote(v)) is not one of "
            + T.allCases.map(\.rawValue).joined(separator: ", "))
    }
    return t
}
