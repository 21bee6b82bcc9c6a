import CShim
import CSystemd
import Glibc

/// The daemon's side of the service manager's interfaces (sd-daemon(3)):
/// readiness and status notifications, the watchdog, socket activation.
/// Read once at start-up, before anything could start a thread
/// (notes/systemd.md §1: the environment is not thread-safe).
public struct Systemd {
    /// Sends `state` (newline-separated `KEY=VALUE`, sd_notify(3)) to
    /// `$NOTIFY_SOCKET`; a no-op when not run by systemd.
    public func notify(_ state: String) {
        guard notifySocket else { return }
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
        return Systemd(notifySocket: notify, watchdogUsec: watchdog, listenFDs: fds)
    }

    /// Whether `fd` is a listening stream socket of the IP family (sd_is_socket_inet(3)).
    static func isListeningInetSocket(_ fd: Int32) -> Bool {
        sd_is_socket_inet(fd, Int32(AF_UNSPEC), Int32(SOCK_STREAM.rawValue), 1, 0) > 0
    }
}
