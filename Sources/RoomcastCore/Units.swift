// Durations and sizes in the notation systemd users know (systemd.time(7),
// systemd.resource-control(5)), restricted to what roomcastd needs.
// Standard library only; every arithmetic step is overflow-checked so hostile
// input yields nil, never a trap.

/// Parses a duration and returns it in **milliseconds**.
///
/// Accepted forms (after trimming spaces and tabs):
/// - `0` or any bare non-negative integer: seconds, as in systemd.time(7)
///   (`30` is 30 s);
/// - one or more components `<integer><unit>` with unit `ms`, `s`, `min` or
///   `h`, optionally separated by spaces and summed: `100ms`, `1min 30s`,
///   `1h30min`. Spaces between a number and its unit are allowed (`5 min`).
///
/// Fractions, negative numbers, other units and unit-less components in a
/// combination (`1min 30`) are rejected.
///
/// - Returns: the duration in milliseconds, or `nil` if the text is not a
///   duration or the result exceeds `Int64.max` milliseconds (so callers may
///   convert to `Int`/`Int64` without trapping).
public func parseDuration(_ s: String) -> UInt64? {
    if case .value(let ms) = scanDuration(s) { ms } else { nil }
}

/// Outcome of ``scanDuration(_:)``: lets error messages tell a typo from a
/// number that is too large.
enum DurationScan: Equatable {
    case value(UInt64)
    case invalid
    case tooLarge
}

/// The parser behind ``parseDuration(_:)``.
func scanDuration(_ s: String) -> DurationScan {
    let b = Array(s.utf8)
    var i = 0
    var total: UInt64 = 0
    var components = 0
    var overflow = false
    func skipBlanks() { while i < b.count, b[i] == 0x20 || b[i] == 0x09 { i += 1 } }
    skipBlanks()
    if i == b.count { return .invalid }
    while true {
        skipBlanks()
        if i == b.count { break }
        guard i < b.count, b[i] >= 0x30, b[i] <= 0x39 else { return .invalid }
        guard let (n, next) = scanDigits(b, from: i) else { return .tooLarge }
        i = next
        skipBlanks()
        let unitStart = i
        while i < b.count, b[i] >= 0x61, b[i] <= 0x7A { i += 1 }  // a-z
        let unit = String(decoding: b[unitStart..<i], as: UTF8.self)
        let multiplier: UInt64
        switch unit {
        case "ms": multiplier = 1
        case "s": multiplier = 1_000
        case "min": multiplier = 60_000
        case "h": multiplier = 3_600_000
        case "":
            // A bare number is seconds, but only as the whole value.
            skipBlanks()
            guard components == 0, i == b.count else { return .invalid }
            multiplier = 1_000
        default: return .invalid
        }
        let (part, o1) = n.multipliedReportingOverflow(by: multiplier)
        let (sum, o2) = total.addingReportingOverflow(part)
        if o1 || o2 || sum > UInt64(Int64.max) { overflow = true }
        total = sum
        components += 1
    }
    return overflow ? .tooLarge : .value(total)
}

/// Parses a size and returns it in **bytes**.
///
/// Accepted: a non-negative decimal integer with an optional suffix `K`, `M`
/// or `G` (powers of 1024, as systemd does: `64K` = 65536). Surrounding
/// spaces and tabs are trimmed; nothing else is allowed (no `KB`, no
/// lowercase, no fractions, no sign).
///
/// - Returns: the size in bytes, or `nil` if the text is not a size or the
///   result does not fit in `Int` (e.g. `99999999999999999999K`).
public func parseSize(_ s: String) -> Int? {
    var b = Array(s.utf8)[...]
    while let f = b.first, f == 0x20 || f == 0x09 { b = b.dropFirst() }
    while let l = b.last, l == 0x20 || l == 0x09 { b = b.dropLast() }
    var shift = 0
    switch b.last {
    case UInt8(ascii: "K"): shift = 10
    case UInt8(ascii: "M"): shift = 20
    case UInt8(ascii: "G"): shift = 30
    default: break
    }
    if shift > 0 { b = b.dropLast() }
    let digits = Array(b)
    guard let (n, end) = scanDigits(digits, from: 0), end == digits.count else { return nil }
    let (v, o) = n.multipliedReportingOverflow(by: UInt64(1) << UInt64(shift))
    guard !o, v <= UInt64(Int.max) else { return nil }
    return Int(v)
}

/// Formats milliseconds with the largest unit that represents them exactly:
/// `100ms`, `30s`, `5min`, `2h`; `0` for zero. The result is accepted by
/// ``parseDuration(_:)`` and gives back the same value.
public func formatDuration(ms: UInt64) -> String {
    if ms == 0 { return "0" }
    if ms % 3_600_000 == 0 { return "\(ms / 3_600_000)h" }
    if ms % 60_000 == 0 { return "\(ms / 60_000)min" }
    if ms % 1_000 == 0 { return "\(ms / 1_000)s" }
    return "\(ms)ms"
}

/// Formats bytes with the largest 1024-based suffix that represents them
/// exactly: `64K`, `4M`, `1G`, or plain `1000`. Zero and negative values are
/// printed as plain integers. Non-negative results round-trip through
/// ``parseSize(_:)``.
public func formatSize(_ bytes: Int) -> String {
    if bytes <= 0 { return String(bytes) }
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] where bytes % (1 << shift) == 0 {
        return "\(bytes >> shift)\(suffix)"
    }
    return String(bytes)
}

/// Reads a run of ASCII digits starting at `from`; nil if there is none or
/// the number overflows `UInt64`. Returns the value and the index after it.
func scanDigits(_ b: [UInt8], from start: Int) -> (UInt64, Int)? {
    var i = start
    var n: UInt64 = 0
    while i < b.count, b[i] >= 0x30, b[i] <= 0x39 {
        let (m, o1) = n.multipliedReportingOverflow(by: 10)
        let (a, o2) = m.addingReportingOverflow(UInt64(b[i] - 0x30))
        if o1 || o2 { return nil }
        n = a
        i += 1
    }
    return i == start ? nil : (n, i)
}
