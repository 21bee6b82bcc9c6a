/// `text` as a JSON string literal (RFC 8259 §7), with the quotes: `"`, `\`
/// and control characters escaped (`\n`, `\r`, `\t`, else `\u00XX`),
/// everything else as it is. One line, whatever the input: the client's
/// `--json` output, the bench's JSON report and the daemon's stderr log
/// lines all use it, so peer-supplied text can never break a line.
public func jsonStringLiteral(_ text: String) -> String {
    var out = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        default:
            if scalar.value < 0x20 {
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
    }
    return out + "\""
}
