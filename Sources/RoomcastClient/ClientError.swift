import Glibc
import RoomcastIO

/// Why a client call failed or a connection ended. `description` is one line
/// meant for a person (e.g. `cannot connect to 127.0.0.1:9898: Connection refused`).
public enum ClientError: Error, Equatable, Sendable, CustomStringConvertible {
    /// `getaddrinfo(3)` could not resolve the host; `message` is gai_strerror's text.
    case resolve(host: String, message: String)
    /// connect(2) to `address` failed with `errno` (ECONNREFUSED, ENETUNREACH, ...).
    case connect(address: String, errno: Int32)
    /// No connection to `address` within the configured connect timeout, in ms.
    case connectTimeout(address: String, ms: UInt64)
    /// The daemon closed the connection (EOF).
    case closedByPeer
    /// The daemon sent a header claiming a body over `limit` bytes (docs/protocol/ltb.md §1).
    case frameTooLarge(claimed: UInt32, limit: Int)
    /// A system call failed with `errno` (read, send, epoll_ctl, ...).
    case system(call: String, errno: Int32)
    /// A frame was offered while the client is not connected.
    case notConnected
    /// Text or a gift was offered before any `join` told the client who it is.
    case notJoined
    /// A body of `bytes` bytes is over the configured `maxFrameBytes`.
    case bodyTooLarge(bytes: Int, limit: Int)
    /// TLS failed (a CA file OpenSSL refuses, a certificate that does not
    /// verify, a handshake or record error); `reason` is OpenSSL's.
    case tls(reason: String)

    init(_ error: SystemError) { self = .system(call: error.call, errno: error.errno) }

    /// One line for a person, without a trailing newline.
    public var description: String {
        switch self {
        case .resolve(let host, let message): "cannot resolve \(host): \(message)"
        case .connect(let address, let errno): "cannot connect to \(address): \(strerrorString(errno))"
        case .connectTimeout(let address, let ms): "cannot connect to \(address): no answer within \(ms) ms"
        case .closedByPeer: "the daemon closed the connection"
        case .frameTooLarge(let claimed, let limit): "the daemon sent a frame of \(claimed) bytes (limit \(limit); not a roomcastd, or another byte order?)"
        case .system(let call, let errno): "\(call): \(strerrorString(errno))"
        case .notConnected: "not connected"
        case .notJoined: "not joined: join a room first"
        case .bodyTooLarge(let bytes, let limit): "message of \(bytes) bytes is over the \(limit)-byte frame limit"
        case .tls(let reason): "TLS: \(reason)"
        }
    }
}

func strerrorString(_ errno: Int32) -> String { String(cString: strerror(errno)) }
