import Glibc

/// A socket address: the bytes of a `sockaddr_in` or `sockaddr_in6` (as
/// getaddrinfo(3) returns it), or of a `sockaddr_un` (`unix(path:)`).
package struct SocketAddress: Equatable, Sendable {
    /// `AF_INET`, `AF_INET6` or `AF_UNIX`.
    package var family: Int32
    package var bytes: [UInt8]

    /// The addresses of `host` and `port` for a TCP socket, in
    /// getaddrinfo(3)'s order, without duplicates.
    /// - Parameters:
    ///   - numericHost: refuse host names (`AI_NUMERICHOST`): nothing is
    ///     looked up, so the call never blocks.
    ///   - passive: for bind(2) rather than connect(2) (`AI_PASSIVE`).
    /// - Throws: `ResolveError` with gai_strerror(3)'s text.
    package static func resolve(host: String, port: UInt16, numericHost: Bool = false, passive: Bool = false) throws(ResolveError) -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_NUMERICSERV | (numericHost ? AI_NUMERICHOST : 0) | (passive ? AI_PASSIVE : 0)
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(host, String(port), &hints, &list)
        guard rc == 0 else { throw ResolveError(message: String(cString: gai_strerror(rc))) }
        defer { freeaddrinfo(list) }
        var result: [SocketAddress] = []
        var next = list
        while let info = next {
            if let addr = info.pointee.ai_addr, info.pointee.ai_family == AF_INET || info.pointee.ai_family == AF_INET6 {
                let address = SocketAddress(family: info.pointee.ai_family,
                                            bytes: Array(UnsafeRawBufferPointer(start: addr, count: Int(info.pointee.ai_addrlen))))
                if !result.contains(address) { result.append(address) }
            }
            next = info.pointee.ai_next
        }
        guard !result.isEmpty else { throw ResolveError(message: "no IPv4 or IPv6 address") }
        return result
    }

    /// Calls `body` with the address as a `sockaddr` pointer and its length.
    package func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        bytes.withUnsafeBytes { body($0.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t($0.count)) }
    }
}

extension SocketAddress {
    /// The Unix-domain address of `path` (unix(7)): a file system path, or
    /// an abstract name written with a leading `@` (its first byte becomes
    /// NUL). The bytes are the family and the path with its terminating NUL
    /// (none for an abstract name), the length bind(2) and connect(2) take.
    /// - Returns: nil when the path does not fit `sun_path` (108 bytes with
    ///   the NUL; an abstract name 108 without) or is empty.
    package static func unix(path: String) -> SocketAddress? {
        var name = Array(path.utf8)
        guard let first = name.first else { return nil }
        let abstract = first == UInt8(ascii: "@")
        if abstract { name[0] = 0 } else { name.append(0) }
        var un = sockaddr_un()
        guard name.count <= MemoryLayout.size(ofValue: un.sun_path) else { return nil }
        un.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &un.sun_path) { $0.copyBytes(from: name) }
        let length = MemoryLayout<sa_family_t>.size + name.count
        return SocketAddress(family: AF_UNIX, bytes: withUnsafeBytes(of: &un) { Array($0.prefix(length)) })
    }
}

/// getaddrinfo(3) failed; `message` is gai_strerror(3)'s text.
package struct ResolveError: Error, Equatable {
    package var message: String
}

extension SocketAddress {
    /// The address of a socket (getsockname(2)) or its peer (getpeername(2)).
    package static func of(_ fd: Int32, peer: Bool = false) -> SocketAddress? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { peer ? getpeername(fd, $0, &length) : getsockname(fd, $0, &length) }
        }
        guard rc == 0 else { return nil }
        return SocketAddress(storage, length: length)
    }

    /// The address in `storage` (as accept(2) fills it), if IPv4 or IPv6.
    package init?(_ storage: sockaddr_storage, length: socklen_t = socklen_t(MemoryLayout<sockaddr_storage>.size)) {
        let family = Int32(storage.ss_family)
        let size = family == AF_INET ? MemoryLayout<sockaddr_in>.size : family == AF_INET6 ? MemoryLayout<sockaddr_in6>.size : 0
        guard size > 0, Int(length) >= size else { return nil }
        self.family = family
        bytes = withUnsafeBytes(of: storage) { Array($0.prefix(size)) }
    }

    /// `1.2.3.4:P` or `[::1]:P`; an IPv4-mapped IPv6 address (a dual-stack
    /// socket's IPv4 peer) is shown as plain IPv4; a Unix-domain one as
    /// `unix:PATH` (`unix:@NAME` when abstract).
    package var text: String {
        if family == AF_UNIX {
            var name = Array(bytes.dropFirst(MemoryLayout<sa_family_t>.size))
            if name.first == 0 { name[0] = UInt8(ascii: "@") } else if name.last == 0 { name.removeLast() }
            return "unix:" + String(decoding: name, as: UTF8.self)
        }
        return bytes.withUnsafeBytes { raw -> String in
            func ntop(_ family: Int32, _ addr: UnsafeRawPointer) -> String {
                withUnsafeTemporaryAllocation(of: CChar.self, capacity: Int(INET6_ADDRSTRLEN) + 1) { buf in
                    guard let p = inet_ntop(family, addr, buf.baseAddress, socklen_t(buf.count)) else { return "?" }
                    return String(cString: p)
                }
            }
            if family == AF_INET6 {
                let sa = raw.loadUnaligned(as: sockaddr_in6.self)
                let port = String(UInt16(bigEndian: sa.sin6_port))
                var a = sa.sin6_addr
                return withUnsafeBytes(of: &a) { b in
                    if b[0..<10].allSatisfy({ $0 == 0 }) && b[10] == 0xff && b[11] == 0xff {
                        return "\(b[12]).\(b[13]).\(b[14]).\(b[15]):" + port
                    }
                    return "[" + ntop(AF_INET6, b.baseAddress!) + "]:" + port
                }
            }
            let sa = raw.loadUnaligned(as: sockaddr_in.self)
            var a = sa.sin_addr
            return ntop(AF_INET, &a) + ":" + String(UInt16(bigEndian: sa.sin_port))
        }
    }
}
