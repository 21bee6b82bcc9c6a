import Glibc
import RoomcastCore

// KeyStore.swift: reading `[auth] key_file` (roomcastd.conf(5)) at start
// and on SIGHUP, with the checks a file of secrets needs.

/// The text of a file of secrets (`[auth] key_file`, `[api] key_file`), with the
/// checks such a file needs: a regular file, owned by `owner` (the service
/// user), not readable or writable by group or others (mode & 0o077, as ssh(1)
/// refuses a private key), at most 1 MiB, UTF-8.
/// - Parameter what: how the reason names the file ("the key file").
/// - Throws: `ConfigError` naming `path`, its reason never quoting the content.
func readSecretFile(_ path: String, owner: uid_t, what: String) throws(ConfigError) -> String {
    func fail(_ reason: String) -> ConfigError { ConfigError(file: path, line: nil, reason: reason) }
    let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY)
    guard fd >= 0 else { throw fail("cannot open \(what): \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0 else { throw fail("fstat: \(String(cString: strerror(errno)))") }
    guard st.st_mode & S_IFMT == S_IFREG else { throw fail("not a regular file") }
    guard st.st_uid == owner else {
        throw fail("owned by uid \(st.st_uid), not by the service user (uid \(owner)); chown it")
    }
    guard st.st_mode & 0o077 == 0 else {
        throw fail("mode \(String(st.st_mode & 0o777, radix: 8)) lets group or others at the keys; chmod 600 (or 400) it")
    }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        guard n >= 0 else { throw fail("read: \(String(cString: strerror(errno)))") }
        if n == 0 { break }
        bytes.append(contentsOf: chunk[0..<n])
        guard bytes.count <= 1 << 20 else { throw fail("over 1 MiB: not a key file") }
    }
    guard let text = String(validating: bytes, as: UTF8.self) else { throw fail("not valid UTF-8") }
    return text
}

enum KeyStore {
    /// Reads and parses the key file at `path`.
    /// - Parameter owner: the uid that must own the file (the service user:
    ///   the daemon's effective uid).
    /// - Throws: `ConfigError` naming the file: it cannot be opened, is not
    ///   a regular file, is owned by another user, can be read or written by
    ///   group or others (mode & 0o077, as ssh(1) refuses a private key),
    ///   is not UTF-8, or a line is bad (TokenKeySet.parse), or OpenSSL
    ///   refuses an Ed25519 key. No reason quotes a key.
    static func load(path: String, owner: uid_t = geteuid()) throws(ConfigError) -> VerifyingKeys {
        func fail(_ reason: String) -> ConfigError { ConfigError(file: path, line: nil, reason: reason) }
        let text = try readSecretFile(path, owner: owner, what: "the key file")
        let set = try TokenKeySet.parse(text, file: path)
        do {
            return try VerifyingKeys(set)
        } catch {
            throw fail(error.description)
        }
    }
}
