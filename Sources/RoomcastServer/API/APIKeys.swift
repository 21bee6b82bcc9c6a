import COpenSSL
import Glibc
import RoomcastCore

// APIKeys.swift: the bearer keys of `[api] key_file` (docs/api.md,
// roomcastd.conf(5)), read at start and on SIGHUP with the checks a file of
// secrets needs, and compared in constant time.

/// The keys a backend may present as `Authorization: Bearer KEY`.
struct APIKeys {
    /// Shortest key accepted, in bytes: a guessable key is refused at start.
    static let minimumBytes = 16
    private(set) var keys: [[UInt8]]

    init(keys: [[UInt8]]) { self.keys = keys }

    /// Whether `presented` is one of the keys. Every key is compared with
    /// CRYPTO_memcmp(3) over the longer length (no early exit on the first
    /// differing byte, nor on the first key that matches), so the time taken
    /// tells nothing of a key's bytes.
    func accepts(_ presented: [UInt8]) -> Bool {
        var matched = false
        for key in keys {
            let n = max(key.count, presented.count)
            var a = key + [UInt8](repeating: 0, count: n - key.count)
            var b = presented + [UInt8](repeating: 0, count: n - presented.count)
            let same = CRYPTO_memcmp(&a, &b, n) == 0 && key.count == presented.count
            matched = matched || same
        }
        return matched
    }

    /// Parses the text of a key file: one key a line, surrounding spaces
    /// ignored, blank lines and `#` comments skipped.
    /// - Throws: `ConfigError` with the line of a key shorter than
    ///   ``minimumBytes`` or holding a space or control character (a header
    ///   value could not carry it); no reason quotes a key. A file without
    ///   keys is refused too.
    static func parse(_ text: String, file: String) throws(ConfigError) -> APIKeys {
        var keys: [[UInt8]] = []
        // Split on the bytes: "\r\n" is one Character, never equal to "\n".
        for (i, raw) in text.utf8.split(separator: 0x0A, omittingEmptySubsequences: false).enumerated() {
            let line = Substring(String(decoding: raw, as: UTF8.self)).trimmingCharacters()
            if line.isEmpty || line.hasPrefix("#") { continue }
            let bytes = Array(line.utf8)
            guard bytes.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
                throw ConfigError(file: file, line: i + 1, reason: "a key must be printable ASCII without spaces (it travels in an HTTP header)")
            }
            guard bytes.count >= minimumBytes else {
                throw ConfigError(file: file, line: i + 1, reason: "a key must be at least \(minimumBytes) bytes (this one has \(bytes.count))")
            }
            keys.append(bytes)
        }
        guard !keys.isEmpty else { throw ConfigError(file: file, line: nil, reason: "no key in the file") }
        return APIKeys(keys: keys)
    }

    /// Reads and parses the key file at `path`.
    /// - Parameter owner: the uid that must own the file (the daemon's effective uid).
    /// - Throws: `ConfigError` naming the file: it cannot be opened, is not a
    ///   regular file, is owned by another user, can be read or written by
    ///   group or others (mode & 0o077, as `[auth] key_file`), is over 1 MiB,
    ///   is not UTF-8, or a line is bad (``parse(_:file:)``).
    static func load(path: String, owner: uid_t = geteuid()) throws(ConfigError) -> APIKeys {
        let text = try readSecretFile(path, owner: owner, what: "the API key file")
        return try parse(text, file: path)
    }
}

extension Substring {
    /// Without leading and trailing spaces, tabs and CR.
    func trimmingCharacters() -> String {
        let bytes = Array(utf8)
        var start = 0, end = bytes.count
        while start < end, bytes[start] == 0x20 || bytes[start] == 0x09 || bytes[start] == 0x0D { start += 1 }
        while end > start, bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09 || bytes[end - 1] == 0x0D { end -= 1 }
        return String(decoding: bytes[start..<end], as: UTF8.self)
    }
}

/// `[api] key_file` as read at start, for `Server.init` (opaque outside the daemon).
public struct APIKeySet {
    let keys: APIKeys
}

extension Server {
    /// Loads `[api] key_file` at start.
    /// - Throws: `ConfigError` (``APIKeys/load(path:owner:)``): the daemon refuses to start.
    public static func loadAPIKeys(_ config: Config) throws(ConfigError) -> APIKeySet? {
        config.api.keyFile.isEmpty ? nil : APIKeySet(keys: try APIKeys.load(path: config.api.keyFile))
    }

    /// SIGHUP: re-reads `[api] key_file`; a bad one keeps the keys in use and says why (never a key).
    func reloadAPIKeys() {
        guard !config.api.keyFile.isEmpty else {
            api.keys = nil
            return
        }
        do {
            api.keys = try APIKeys.load(path: config.api.keyFile)
            logger.info("API keys reloaded from \(config.api.keyFile): \(api.keys!.keys.count) key(s)", ["KEY_FILE": config.api.keyFile])
        } catch {
            logger.error("API key file reload failed, keeping the keys in use: \(error)",
                         ["REASON": "api_key_file_invalid", "DETAIL": error.description, "KEY_FILE": config.api.keyFile])
        }
    }
}
