import RoomcastCore
import RoomcastIO

/// Where the daemon listens: a host (IPv4, IPv6 or a name) and a TCP port.
public struct ServerAddress: Equatable, Hashable, Sendable, CustomStringConvertible {
    /// A numeric address (`127.0.0.1`, `::1`) or a host name, without brackets.
    public var host: String
    /// TCP port.
    public var port: UInt16

    /// An address as is (no validation; a bad host fails at connect time with `ClientError.resolve`).
    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    /// The daemon's default address, `127.0.0.1:9898`.
    public static let `default` = ServerAddress(host: "127.0.0.1", port: 9898)

    /// Parses `HOST:PORT` or `[IPv6]:PORT` (`127.0.0.1:9898`, `[::1]:9898`,
    /// `localhost:9898`). Returns nil without a port, for a port over 65535,
    /// or for an IPv6 address without brackets.
    public static func parse(_ text: String) -> ServerAddress? {
        splitHostPort(text).map { ServerAddress(host: String($0.host), port: $0.port) }
    }

    /// `127.0.0.1:9898` or `[::1]:9898`; accepted by `parse(_:)`.
    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// The socket addresses of the host, in getaddrinfo(3)'s order. Blocks
    /// while a host name is looked up (numeric addresses never block).
    /// - Throws: `ClientError.resolve` with getaddrinfo's message.
    func resolve() throws(ClientError) -> [SocketAddress] {
        do {
            return try SocketAddress.resolve(host: host, port: port)
        } catch {
            throw .resolve(host: host, message: error.message)
        }
    }
}
