import Glibc
import RoomcastCore
import RoomcastIO

extension Config {
    /// The largest config file read, in bytes (16 MiB).
    public static let maxFileBytes = 16 << 20

    /// Reads and parses a config file (at start and on every SIGHUP).
    ///
    /// - Throws: ``ConfigError`` with a nil line and the `strerror(3)` text if
    ///   the file cannot be opened or read, if it is not a regular file, if
    ///   it is larger than 16 MiB, or (with the line) if it is not valid
    ///   UTF-8; otherwise as `Config.parse(_:file:)`.
    public static func load(path: String) throws(ConfigError) -> Config {
        let bytes: [UInt8]
        do {
            bytes = try Sys.readFile(path, limit: maxFileBytes)
        } catch {
            let reason = switch error {
            case .notRegularFile: "not a regular file"
            case .tooLarge: "file is larger than 16M"
            case .system(let e) where e.call == "open": "cannot open: \(String(cString: strerror(e.errno)))"
            case .system(let e) where e.call == "fstat": "cannot stat: \(String(cString: strerror(e.errno)))"
            case .system(let e): "cannot read: \(String(cString: strerror(e.errno)))"
            }
            throw ConfigError(file: path, line: nil, reason: reason)
        }
        return try parse(bytes: bytes, file: path)
    }
}
