import Glibc
import RoomcastCore

/// The figures of one run, in the order they are printed: a human table,
/// or one JSON object (`--json`) for scripts.
struct Report {
    enum Value {
        case int(Int)
        case double(Double, digits: Int)
        case string(String)
        case bool(Bool)
        case ints([Int])
        case null
    }

    private(set) var entries: [(key: String, label: String, value: Value, unit: String)] = []

    mutating func add(_ key: String, _ label: String, _ value: Value, _ unit: String = "") {
        entries.append((key, label, value, unit))
    }

    func json() -> String {
        var parts: [String] = []
        for e in entries { parts.append("\"\(e.key)\": \(Self.jsonValue(e.value))") }
        return "{" + parts.joined(separator: ", ") + "}"
    }

    func table() -> String {
        let width = entries.map { $0.label.count }.max() ?? 0
        var lines: [String] = []
        for e in entries {
            let v = Self.text(e.value)
            lines.append(e.label + String(repeating: " ", count: width - e.label.count) + "  " + v + (e.unit.isEmpty ? "" : " " + e.unit))
        }
        return lines.joined(separator: "\n")
    }

    private static func jsonValue(_ v: Value) -> String {
        switch v {
        case .int(let n): return String(n)
        case .double(let d, let digits): return d.isFinite ? fixed(d, digits) : "null"
        case .string(let s): return jsonStringLiteral(s)
        case .bool(let b): return b ? "true" : "false"
        case .ints(let a): return "[" + a.map(String.init).joined(separator: ", ") + "]"
        case .null: return "null"
        }
    }

    private static func text(_ v: Value) -> String {
        switch v {
        case .int(let n): return grouped(n)
        case .double(let d, let digits): return digits == 0 && abs(d) < 9e18 ? grouped(Int(d.rounded())) : fixed(d, digits)
        case .string(let s): return s
        case .bool(let b): return b ? "yes" : "no"
        case .ints(let a): return a.map(grouped).joined(separator: ", ")
        case .null: return "-"
        }
    }
}

/// `d` with `digits` decimals, without Foundation.
func fixed(_ d: Double, _ digits: Int) -> String {
    guard d.isFinite else { return "nan" }
    var scale = 1.0
    for _ in 0..<digits { scale *= 10 }
    let negative = d < 0
    let scaled = (abs(d) * scale).rounded()
    guard scaled < 9e18 else { return String(d) }
    let n = UInt64(scaled)
    let whole = n / UInt64(scale)
    var s = (negative ? "-" : "") + String(whole)
    if digits > 0 {
        let frac = String(n % UInt64(scale))
        s += "." + String(repeating: "0", count: digits - frac.count) + frac
    }
    return s
}

/// 1234567 as "1,234,567".
func grouped(_ n: Int) -> String {
    let digits = String(abs(n))
    var out = ""
    for (i, c) in digits.enumerated() {
        if i > 0 && (digits.count - i) % 3 == 0 { out += "," }
        out.append(c)
    }
    return (n < 0 ? "-" : "") + out
}
