import CShim
import CSystemd
import Glibc
import RoomcastIO

/// The daemon's side of the service manager's interfaces (sd-daemon(3)):
/// readiness and status notifications, the watchdog, socket activation.
/// Read once at start-up, before anything could start a thread
/// (getenv(3) is not thread-safe, and nothing else runs yet).
public struct Systemd {
    /// Sends `state` (newline-separated `KEY=VALUE`, sd_notify(3)) to
    /// `$NOTIFY_SOCKET`; a no-op when not run by systemd. Never blocks: when
    /// PID 1 is busy and the socket's queue is full, what must still go out
    /// is kept (merged, see `PendingNotifications`) and sent by `flushPending()`.
    public func notify(_ state: String) {
        guard notifySocket else { return }
        if let channel {
            channel.notify(state)
        } else {
            // An address NotifyChannel cannot open (e.g. `vsock:`): libsystemd's
            // own socket, which is blocking, so this call may wait for PID 1.
            _ = sd_notify(0, state)
        }
    }

    /// Retries notifications that found no room. The event loop calls it
    /// every iteration: a branch when nothing is pending, else one sendto(2)
    /// per datagram until the socket's queue is full again.
    public func flushPending() {
        if let channel, channel.hasPending { channel.flush() }
    }

    /// Whether notifications wait for `flushPending`.
    public var hasPending: Bool { channel?.hasPending ?? false }

    /// At exit: retries what is still pending every 10 ms until it is sent
    /// or `timeoutMs` passes, so a STOPPING=1 or a failure's STATUS= and
    /// ERRNO= get out unless PID 1 stays busy that long.
    public func flushBeforeExit(timeoutMs: UInt64) {
        guard let channel else { return }
        let deadlineMs = monotonicMilliseconds() + timeoutMs
        while true {
            channel.flush()
            if !channel.hasPending || monotonicMilliseconds() >= deadlineMs { return }
            usleep(10_000)
        }
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
    /// and be killed for it; and it sends in blocking mode, so a busy PID 1
    /// would stop the event loop. nil: an address only sd_notify knows (vsock).
    var channel: NotifyChannel? = nil

    /// Descriptors systemd passed back from its fd store under one of our
    /// own names (`HandOverName`: hand-over boxes and states, stored
    /// listeners), in LISTEN_FDS order but kept apart from `listenFDs`.
    public var storedFDs: [(fd: Int32, name: String)] = []

    /// `$FDSTORE`: the unit's `FileDescriptorStoreMax=` (systemd 254 sets it;
    /// on 252 the unit sets it itself, `Environment=FDSTORE=`); 0: no fd
    /// store, so nothing can be handed over across a restart.
    public var fdStoreMax = 0

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
        let fdStoreMax = getenv("FDSTORE").flatMap { Int(String(cString: $0)) } ?? 0
        return Systemd(notifySocket: notify, watchdogUsec: watchdog, listenFDs: fds.filter { !HandOverName.isStored($0.1) }, channel: channel,
                       storedFDs: fds.filter { HandOverName.isStored($0.1) }, fdStoreMax: max(0, fdStoreMax))
    }

    /// Whether `fd` is a listening stream socket of the IP family (sd_is_socket_inet(3)).
    static func isListeningInetSocket(_ fd: Int32) -> Bool {
        sd_is_socket_inet(fd, Int32(AF_UNSPEC), Int32(SOCK_STREAM.rawValue), 1, 0) > 0
    }
}

/// An AF_UNIX datagram socket for `$NOTIFY_SOCKET` (a path, or `@name` in
/// the abstract namespace), created once and non-blocking; each notification
/// is one sendto(2) with no descriptor to allocate. When the socket's queue is
/// full (EAGAIN: PID 1 busy; `net.unix.max_dgram_qlen` datagrams, 512 under
/// systemd, 10 on a default kernel), the notification is kept in `pending`
/// and sent by `flush()` once there is room, older ones first.
final class NotifyChannel {
    private let fd: Int32
    private let address: SocketAddress
    private(set) var pending = PendingNotifications()

    init?(address text: String) {
        guard let first = text.utf8.first, first == UInt8(ascii: "/") || first == UInt8(ascii: "@"),
              let address = SocketAddress.unix(path: text) else { return nil }
        self.address = address
        guard let fd = try? Sys.blocking("socket", { socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_CLOEXEC.rawValue | SOCK_NONBLOCK.rawValue), 0) }) else { return nil }
        self.fd = fd
    }

    deinit { Sys.close(fd) }

    var hasPending: Bool { !pending.isEmpty }

    /// Sends `state` now if nothing older is pending and there is room, else
    /// merges it into `pending`.
    func notify(_ state: String) {
        if hasPending { flush() }
        if !hasPending, send(state) != .wouldBlock { return }
        pending.add(state)
    }

    /// Sends pending datagrams, in order, until none is left or the queue is full.
    func flush() {
        while let datagram = pending.next {
            if send(datagram) == .wouldBlock { return }
            pending.removeNext()
        }
    }

    enum Outcome { case sent, wouldBlock, failed }

    /// One non-blocking datagram carrying `fds` (SCM_RIGHTS, at most 253),
    /// for FDSTORE=1 and BARRIER=1 (what sd_pid_notify_with_fds(3) sends,
    /// without its blocking). Never kept: on `.wouldBlock` (PID 1 busy, or
    /// older notifications still pending, which go first) the caller retries.
    func send(_ state: String, fds: [Int32]) -> Outcome {
        if hasPending { flush() }
        guard !hasPending else { return .wouldBlock }
        let message = Array(state.utf8)
        let result = message.withUnsafeBytes { bytes in
            address.withSockaddr { Sys.sendDescriptors(fd, bytes, fds, to: $0, length: $1, flags: Int32(MSG_DONTWAIT)) }
        }
        switch result {
        case .done: return .sent
        case .wouldBlock: return .wouldBlock
        case .failed(let e) where e == ENOBUFS || e == ENOMEM: return .wouldBlock
        default: return .failed
        }
    }

    /// One non-blocking datagram. `.failed` (nobody bound: ENOENT,
    /// ECONNREFUSED; or EMSGSIZE) is final, as for sd_notify(3): retrying
    /// would not help. ENOBUFS and ENOMEM are retried like EAGAIN.
    private func send(_ state: String) -> Outcome {
        var message = Array(state.utf8)
        do {
            let r = try Sys.call("sendto") {
                message.withUnsafeMutableBytes { bytes in
                    address.withSockaddr { sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT), $0, $1) }
                }
            }
            guard case .done = r else { return .wouldBlock }
            return .sent
        } catch {
            return error.errno == ENOBUFS || error.errno == ENOMEM ? .wouldBlock : .failed
        }
    }
}

/// Notifications owed to PID 1, merged so that a long stall costs little
/// memory and few datagrams once it reads again:
/// - `STATUS=`: only the newest line is kept;
/// - `WATCHDOG=1`: one pending ping (a missed one is simply sent late, and
///   the event loop's next tick adds nothing new);
/// - everything else of a notification (`READY=1`, `RELOADING=1` with its
///   `MONOTONIC_USEC=`, `STOPPING=1`, `ERRNO=`, ...) stays one datagram, in
///   order: PID 1 applies only the last of READY/RELOADING/STOPPING within
///   one datagram, so they must not be merged with each other. A reload that
///   completed while PID 1 was not reading (`RELOADING=1` then `READY=1`,
///   both pending) is dropped when a newer `RELOADING=1` arrives: it would
///   only be superseded.
/// STATUS= and WATCHDOG=1 travel with the last of those datagrams (or alone).
struct PendingNotifications: Equatable {
    /// The notifications that keep their order, each one datagram.
    private(set) var ordered: [String] = []
    /// The newest `STATUS=` line.
    private(set) var status: String?
    private(set) var watchdog = false

    /// A bound for `ordered`, far above what the daemon sends (READY, one
    /// reload pair, STOPPING): past it the oldest is dropped.
    static let maxOrdered = 16

    var isEmpty: Bool { ordered.isEmpty && status == nil && !watchdog }

    mutating func add(_ state: String) {
        var rest: [Substring] = []
        for line in state.split(separator: "\n") {
            if line.hasPrefix("STATUS=") {
                status = String(line)
            } else if line == "WATCHDOG=1" {
                watchdog = true
            } else {
                rest.append(line)
            }
        }
        guard !rest.isEmpty else { return }
        if rest.contains("RELOADING=1"), let i = ordered.indices.dropLast().last(where: {
            Self.assigns(ordered[$0], "RELOADING=1") && Self.assigns(ordered[$0 + 1], "READY=1") && !Self.assigns(ordered[$0 + 1], "RELOADING=1")
        }) {
            ordered.removeSubrange(i...(i + 1))
        }
        ordered.append(rest.joined(separator: "\n"))
        if ordered.count > Self.maxOrdered { ordered.removeFirst() }
    }

    /// The datagram to send next, if any.
    var next: String? {
        guard ordered.count <= 1 else { return ordered[0] }
        var lines = ordered
        if let status { lines.append(status) }
        if watchdog { lines.append("WATCHDOG=1") }
        return lines.isEmpty ? nil : lines.joined(separator: "\n")
    }

    /// `next` was sent (or failed for good): forget it.
    mutating func removeNext() {
        if ordered.count <= 1 {
            self = PendingNotifications()
        } else {
            ordered.removeFirst()
        }
    }

    private static func assigns(_ datagram: String, _ line: String) -> Bool {
        datagram.split(separator: "\n").contains { $0 == line }
    }
}
