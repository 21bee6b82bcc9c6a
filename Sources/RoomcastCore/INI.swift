// A small INI reader with the syntax systemd users know. Written by hand
// instead of using libinih: Debian's libinih silently splits lines longer than
// 200 characters and honours inline `;` comments.

/// One `key = value` line of an INI file.
public struct INIEntry: Equatable, Sendable {
    /// Name of the enclosing `[section]`, as written (case-sensitive).
    public var section: String
    /// Key with surrounding spaces and tabs removed (case-sensitive).
    public var key: String
    /// Value with surrounding spaces and tabs removed; may be empty. A `#` or
    /// `;` inside it is kept: there are no inline comments.
    public var value: String
    /// 1-based line number.
    public var line: Int

    public init(section: String, key: String, value: String, line: Int) {
        self.section = section
        self.key = key
        self.value = value
        self.line = line
    }
}

/// A meaningful line of an INI file, in file order.
public enum INIItem: Equatable, Sendable {
    /// A `[name]` header at a 1-based line. A section may appear more than
    /// once; its keys then accumulate.
    case section(name: String, line: Int)
    /// A `key = value` line.
    case entry(INIEntry)
}

/// The syntax-level content of an INI file: no knowledge of which sections
/// or keys exist (that is ``Config``'s job).
///
/// Syntax:
/// - lines end with LF or CRLF; a leading UTF-8 byte order mark is ignored;
///   lines have no length limit;
/// - blank lines and lines whose first non-blank character is `#` or `;` are
///   comments (full-line only);
/// - `[name]` opens a section; nothing may follow the `]`;
/// - `key = value`, split at the first `=`, key and value trimmed of spaces
///   and tabs; every key must come after a section header.
public struct INIDocument: Equatable, Sendable {
    /// Section headers and entries in file order.
    public var items: [INIItem]

    /// Only the `key = value` entries, in file order.
    public var entries: [INIEntry] {
        items.compactMap { if case .entry(let e) = $0 { e } else { nil } }
    }

    public init(items: [INIItem]) { self.items = items }

    /// Parses INI text.
    ///
    /// - Parameters:
    ///   - text: the file content.
    ///   - file: name used in error messages only.
    /// - Throws: ``ConfigError`` with the 1-based line number for a malformed
    ///   section header, a line without `=`, an empty key, or a key before
    ///   any section header.
    public static func parse(_ text: String, file: String) throws(ConfigError) -> INIDocument {
        var bytes = Array(text.utf8)[...]
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes = bytes.dropFirst(3) }
        var items: [INIItem] = []
        var section: String?
        var lineNumber = 0
        for rawLine in bytes.split(separator: 0x0A, omittingEmptySubsequences: false) {
            lineNumber += 1
            var line = rawLine
            if line.last == 0x0D { line = line.dropLast() }
            line = trimBlanks(line)
            guard let first = line.first else { continue }
            if first == UInt8(ascii: "#") || first == UInt8(ascii: ";") { continue }
            func fail(_ reason: String) -> ConfigError {
                ConfigError(file: file, line: lineNumber, reason: reason)
            }
            if first == UInt8(ascii: "[") {
                guard line.last == UInt8(ascii: "]"), line.count >= 2 else {
                    throw fail("malformed section header: expected '[name]' alone on the line")
                }
                let inner = trimBlanks(line.dropFirst().dropLast())
                guard !inner.isEmpty,
                      !inner.contains(UInt8(ascii: "[")), !inner.contains(UInt8(ascii: "]"))
                else { throw fail("malformed section header: expected '[name]' alone on the line") }
                let name = String(decoding: inner, as: UTF8.self)
                section = name
                items.append(.section(name: name, line: lineNumber))
                continue
            }
            guard let eq = line.firstIndex(of: UInt8(ascii: "=")) else {
                throw fail("expected 'key = value', '[section]' or a comment starting with '#' or ';'")
            }
            let key = String(decoding: trimBlanks(line[..<eq]), as: UTF8.self)
            let value = String(decoding: trimBlanks(line[(eq + 1)...]), as: UTF8.self)
            guard !key.isEmpty else { throw fail("missing key name before '='") }
            guard let section else {
                throw fail("key '\(key)' is outside any section (add a '[section]' line above it)")
            }
            items.append(.entry(INIEntry(section: section, key: key, value: value, line: lineNumber)))
        }
        return INIDocument(items: items)
    }
}

private func trimBlanks(_ s: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
    var s = s
    while let f = s.first, f == 0x20 || f == 0x09 { s = s.dropFirst() }
    while let l = s.last, l == 0x20 || l == 0x09 { s = s.dropLast() }
    return s
}
