import CShim
import CSystemd
import Glibc
import RoomcastIO

/// The daemon's side of the service manager's interfaces (sd-daemon(3)):
/// readiness and status notifications, the watchdog, socket activation.
/// Read once at start-up, before anything could start a thread
/// (notes/systemd.md §1: the environment is not thread-safe).
public struct Systemd {
    /// Sends `state` (newline-separated `KEY=VALUE`, sd_notify(3)) to
    /// `$NOTIFY_SOCKET`; a no-op when not run by systemd.
    public func notify(_ state: String) {
        guard notifySocket else { return }
        if let channel, channel.send(state) { return }
        _ = sd_notify(0, state)
    }

    /// Whether `$NOTIFY_SOCKET` was set at start.
    public let notifySocket: Bool

    /// The watchdog interval: `WATCHDOG_USEC` in µs when the watchdog is
    /// enabled for this process (`sd_watchdog_enabled(3)`), else nil.
    public let watchdogUsec: UInt64?

    /// Listening sockets passed by socket activation (sd_listen_fds(3)), in
    /// the order of the .socket unit, with their `FileDescriptorName=`.
    public let listenFDs: [(fd: Int32, name: String)]

    /// The socket notifications go out on, opened at start and kept:
    /// sd_notify(3) opens a new one per call, which fails silently with
    /// EMFILE, so a daemon out of descriptors would stop its watchdog pings
    /// and be killed for it. nil: an address only sd_notify knows (vsock).
    var channel: NotifyChannel? = nil

    /// Reads the environment once. `LISTEN_*` variables are unset (so no child
    /// could inherit them) and the passed descriptors made close-on-exec.
    public static func fromEnvironment() -> Systemd {
        let notify = getenv("NOTIFY_SOCKET") != nil
        var usec: UInt64 = 0
        let watchdog = sd_watchdog_enabled(0, &usec) > 0 && usec > 0 ? usec : nil
        var names: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = nil
        let n = sd_listen_fds_with_names(1, &names)
        var fds: [(Int32, String)] = []
        if n > 0 {
            for i in 0..<Int(n) {
                var name = "unknown"
                if let names, let p = names[i] {
                    name = String(cString: p)
                    free(p)
                }
                fds.append((SD_LISTEN_FDS_START + Int32(i), name))
            }
        }
        free(names)
        let channel = getenv("NOTIFY_SOCKET").flatMap { NotifyChannel(address: String(cString: $0)) }
        return Systemd(notifySocket: notify, watchdogUsec: watchdog, listenFDs: fds, channel: channel)
    }

    /// Whether `fd` is a listening stream socket of the IP family (sd_is_socket_inet(3)).
    static func isListeningInetSocket(_ fd: Int32) -> Bool {
        sd_is_socket_inet(fd, Int32(AF_UNSPEC), Int32(SOCK_STREAM.rawValue), 1, 0) > 0
    }
}

/// An AF_UNIX datagram socket for `$NOTIFY_SOCKET` (a path, or `@name` in
/// the abstract namespace), created once; each notification is one sendto(2)
/// with no descriptor to allocate.
final class NotifyChannel {
    private let fd: Int32
    private var address = sockaddr_un()
    private let length: socklen_t

    init?(address text: String) {
        var path = Array(text.utf8)
        guard let first = path.first, first == UInt8(ascii: "/") || first == UInt8(ascii: "@") else { return nil }
        if first == UInt8(ascii: "@") { path[0] = 0 }
        // A path needs its NUL terminator inside sun_path; an abstract name does not.
        guard path.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: path) }
        length = socklen_t(MemoryLayout<sa_family_t>.size + path.count + (first == UInt8(ascii: "@") ? 0 : 1))
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
    }

    deinit { Sys.close(fd) }

    /// Sends `state` as one datagram; false if it could not be sent.
    func send(_ state: String) -> Bool {
        var message = Array(state.utf8)
        let n = message.withUnsafeMutableBytes { bytes in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL), $0, length)
                }
            }
        }
        return n == message.count
    }
}
