import CShim
import Glibc
import RoomcastCore
import RoomcastIO

/// Socket set-up and address formatting.
enum Socket {
    /// Backlog for listen(2); the kernel caps it at net.core.somaxconn.
    static let backlog: Int32 = 1024

    /// SO_SNDBUF of every client socket (the kernel doubles it: 128 KiB).
    /// Left to autotuning, a client that reads slowly but steadily lets the
    /// kernel queue grow to tcp_wmem's maximum (4 MiB per socket), where the
    /// output limits (PROTOCOL.md §6) never see it: the backlog must build up
    /// in the daemon's own output buffer, which the limits count.
    static let clientSendBuffer: Int32 = 64 * 1024

    /// Creates a non-blocking, close-on-exec TCP socket bound to `address`
    /// and listening. IPv6 sockets are IPv6-only so `0.0.0.0:P` and `[::]:P`
    /// can both be configured.
    /// - Throws: `SystemError` naming the failing call.
    static func listen(on address: ListenAddress) throws(SystemError) -> Int32 {
        let family = address.isIPv6 ? AF_INET6 : AF_INET
        let fd = Glibc.socket(family, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket", errno: errno) }
        do throws(SystemError) {
            _ = Sys.setOption(fd, SOL_SOCKET, SO_REUSEADDR, 1)
            if address.isIPv6 { _ = Sys.setOption(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 1) }
            var storage = sockaddr_storage()
            var length: socklen_t = 0
            if address.isIPv6 {
                var sa = sockaddr_in6()
                sa.sin6_family = sa_family_t(AF_INET6)
                sa.sin6_port = address.port.bigEndian
                guard inet_pton(AF_INET6, address.host, &sa.sin6_addr) == 1 else { throw SystemError("inet_pton", errno: EINVAL) }
                withUnsafeBytes(of: sa) { src in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) } }
                length = socklen_t(MemoryLayout<sockaddr_in6>.size)
            } else {
                var sa = sockaddr_in()
                sa.sin_family = sa_family_t(AF_INET)
                sa.sin_port = address.port.bigEndian
                guard inet_pton(AF_INET, address.host, &sa.sin_addr) == 1 else { throw SystemError("inet_pton", errno: EINVAL) }
                withUnsafeBytes(of: sa) { src in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) } }
                length = socklen_t(MemoryLayout<sockaddr_in>.size)
            }
            let rc = withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(fd, $0, length) }
            }
            guard rc == 0 else { throw SystemError("bind \(address)", errno: errno) }
            guard Glibc.listen(fd, backlog) == 0 else { throw SystemError("listen \(address)", errno: errno) }
            return fd
        } catch {
            Sys.close(fd)
            throw error
        }
    }

    /// Turns on TCP keepalive: probes after `idleMs` of silence, every third
    /// of that, three unanswered probes drop the connection (tcp(7)).
    /// 0 leaves keepalive off.
    static func enableKeepalive(_ fd: Int32, idleMs: UInt64) {
        guard idleMs > 0 else { return }
        let idle = Int32(clamping: max(1, idleMs / 1000))
        _ = Sys.setOption(fd, SOL_SOCKET, SO_KEEPALIVE, 1)
        _ = Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_KEEPIDLE, idle)
        _ = Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_KEEPINTVL, max(1, idle / 3))
        _ = Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_KEEPCNT, 3)
    }

    /// The local address of a socket, as `1.2.3.4:P` or `[::1]:P`.
    static func localAddress(_ fd: Int32) -> String {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return rc == 0 ? format(storage) : "?"
    }

    /// Formats an IPv4 or IPv6 socket address; IPv4-mapped IPv6 addresses
    /// (dual-stack sockets) are shown as plain IPv4.
    static func format(_ storage: sockaddr_storage) -> String {
        var s = storage
        func ntop(_ family: Int32, _ addr: UnsafeRawPointer) -> String {
            withUnsafeTemporaryAllocation(of: CChar.self, capacity: Int(INET6_ADDRSTRLEN) + 1) { buf in
                guard let p = inet_ntop(family, addr, buf.baseAddress, socklen_t(buf.count)) else { return "?" }
                return String(cString: p)
            }
        }
        switch Int32(s.ss_family) {
        case AF_INET:
            return withUnsafePointer(to: &s) {
                $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
                    var a = sin.pointee.sin_addr
                    return ntop(AF_INET, &a) + ":" + String(UInt16(bigEndian: sin.pointee.sin_port))
                }
            }
        case AF_INET6:
            return withUnsafePointer(to: &s) {
                $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
                    var a = sin6.pointee.sin6_addr
                    let port = String(UInt16(bigEndian: sin6.pointee.sin6_port))
                    let isMapped = withUnsafeBytes(of: &a) { b in
                        b[0..<10].allSatisfy { $0 == 0 } && b[10] == 0xff && b[11] == 0xff
                    }
                    if isMapped {
                        let v4 = withUnsafeBytes(of: &a) { b in "\(b[12]).\(b[13]).\(b[14]).\(b[15])" }
                        return v4 + ":" + port
                    }
                    return "[" + ntop(AF_INET6, &a) + "]:" + port
                }
            }
        default:
            return "?"
        }
    }
}
