import CShim
import Glibc
import RoomcastCore
import RoomcastIO

/// Socket set-up for listeners and accepted clients.
enum Socket {
    /// Backlog for listen(2); the kernel caps it at net.core.somaxconn.
    static let backlog: Int32 = 1024

    /// SO_SNDBUF of every client socket (the kernel doubles it: 128 KiB).
    /// Left to autotuning, a client that reads slowly but steadily lets the
    /// kernel queue grow to tcp_wmem's maximum (4 MiB per socket), where the
    /// output limits (docs/protocol/rooms.md §6) never see it: the backlog must
    /// build up in the daemon's own output buffer, which the limits count.
    static let clientSendBuffer: Int32 = 64 * 1024

    /// Creates a non-blocking, close-on-exec TCP socket bound to `address`
    /// and listening. IPv6 sockets are IPv6-only so `0.0.0.0:P` and `[::]:P`
    /// can both be configured (ipv6(7), `IPV6_V6ONLY`).
    /// - Throws: `SystemError` naming the failing call (and the address).
    static func listen(on address: ListenAddress) throws(SystemError) -> Int32 {
        let resolved: SocketAddress
        do {
            resolved = try SocketAddress.resolve(host: address.host, port: address.port, numericHost: true, passive: true)[0]
        } catch {
            throw SystemError("getaddrinfo \(address): \(error.message)", errno: EINVAL)
        }
        let fd = try Sys.blocking("socket") {
            Glibc.socket(resolved.family, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
        }
        do throws(SystemError) {
            Sys.setOption(fd, SOL_SOCKET, SO_REUSEADDR, 1)
            if resolved.family == AF_INET6 { Sys.setOption(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 1) }
            _ = try Sys.blocking("bind \(address)") { resolved.withSockaddr { Glibc.bind(fd, $0, $1) } }
            _ = try Sys.blocking("listen \(address)") { Glibc.listen(fd, backlog) }
            return fd
        } catch {
            Sys.close(fd)
            throw error
        }
    }

    /// Options of an accepted client socket: no Nagle delay on relayed
    /// frames, a bounded kernel send buffer, and TCP keepalive for JSON
    /// clients (they send no heartbeats, `json.tcp_keepalive`). Options are
    /// best effort: a socket that refuses one still works.
    ///
    /// A peer whose network vanishes (no FIN, no RST) is found within about
    /// its liveness time even while its room talks: keepalive probes are
    /// never sent while data is unacknowledged, so TCP_USER_TIMEOUT (tcp(7))
    /// bounds how long sent data may stay unacknowledged: `json.tcp_keepalive`
    /// for JSON clients, `heartbeat.timeout` for LTB clients (0: the
    /// kernel's default, about 15 minutes of retransmissions).
    static func configureClient(_ fd: Int32, dialect: Dialect, config: Config) {
        Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        Sys.setOption(fd, SOL_SOCKET, SO_SNDBUF, clientSendBuffer)
        let liveness = dialect == .json ? config.json.tcpKeepaliveMs : config.heartbeat.timeoutMs
        if dialect == .json { enableKeepalive(fd, idleMs: liveness) }
        if liveness > 0 { Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_USER_TIMEOUT, Int32(clamping: liveness)) }
    }

    /// Sends the ACK of what was received without waiting for the delayed-ACK
    /// timer (TCP_QUICKACK, tcp(7)); a no-op on a socket that is not TCP.
    static func acknowledgeNow(_ fd: Int32) {
        Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_QUICKACK, 1)
    }

    /// Turns on TCP keepalive: probes after `idleMs` of silence, every third
    /// of that, three unanswered probes drop the connection (tcp(7)).
    /// 0 leaves keepalive off.
    static func enableKeepalive(_ fd: Int32, idleMs: UInt64) {
        guard idleMs > 0 else { return }
        let idle = Int32(clamping: max(1, idleMs / 1000))
        Sys.setOption(fd, SOL_SOCKET, SO_KEEPALIVE, 1)
        Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_KEEPIDLE, idle)
        Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_KEEPINTVL, max(1, idle / 3))
        Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_KEEPCNT, 3)
    }

    /// The local address of a socket, as `1.2.3.4:P` or `[::1]:P` ("?" if unknown).
    static func localAddress(_ fd: Int32) -> String {
        SocketAddress.of(fd)?.text ?? "?"
    }

    /// The path a Unix stream socket is bound to (getsockname(2), unix(7));
    /// nil for another family, an unbound or an abstract socket.
    static func unixPath(_ fd: Int32) -> String? {
        var addr = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let r = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        guard r == 0, addr.sun_family == sa_family_t(AF_UNIX) else { return nil }
        let pathBytes = Int(length) - MemoryLayout<sa_family_t>.size
        guard pathBytes > 1 else { return nil }
        return withUnsafeBytes(of: &addr.sun_path) { raw in
            let bytes = raw.prefix(min(pathBytes, raw.count))
            guard bytes.first != 0 else { return nil }  // abstract namespace
            return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
    }

    /// A peer address as accept(2) filled it ("?" for a family other than IP).
    static func format(_ storage: sockaddr_storage) -> String {
        SocketAddress(storage)?.text ?? "?"
    }
}
