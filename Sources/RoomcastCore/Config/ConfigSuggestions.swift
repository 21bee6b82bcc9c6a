// "Did you mean" for unknown sections and keys.

/// Why a key is refused: with a close spelling, or the section it belongs in.
func unknownKeyReason(_ section: String, _ key: String) -> String {
    let keys = Config.knownKeys[section] ?? []
    let hint = suggestion(key, among: keys, format: { $0 })
    var reason = "unknown key '\(key)' in [\(section)]" + hint
    if hint.isEmpty,
       let home = Config.sectionOrder.first(where: { Config.knownKeys[$0]!.contains(key) }) {
        reason += " (it belongs in [\(home)])"
    }
    return reason
}

/// " (did you mean 'x'?)" if a candidate is 1-2 edits away or differs only
/// in case; empty otherwise.
func suggestion(_ word: String, among candidates: [String], format: (String) -> String) -> String {
    let best = candidates
        .map { ($0, $0 == word.lowercased() ? 0 : editDistance(Array(word.utf8), Array($0.utf8))) }
        .filter { $0.1 <= 2 }
        .min { $0.1 < $1.1 }
    return best.map { " (did you mean '\(format($0.0))'?)" } ?? ""
}

/// Levenshtein distance; inputs here are short (a key against known keys),
/// longer words are not compared.
private func editDistance(_ a: [UInt8], _ b: [UInt8]) -> Int {
    if a.count > 64 || b.count > 64 { return Int.max }
    if a.isEmpty { return b.count }
    var prev = Array(0...b.count)
    for i in 1...a.count {
        var cur = [i] + Array(repeating: 0, count: b.count)
        for j in stride(from: 1, through: b.count, by: 1) {
            cur[j] = Swift.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
        }
        prev = cur
    }
    return prev[b.count]
}
