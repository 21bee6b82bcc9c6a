import CShim
import Glibc

// Descriptors passed over AF_UNIX sockets (SCM_RIGHTS) and sealed memfds:
// the kernel side of the connection hand-over across restarts. The C half is in
// CShim (handover.c): CMSG_* and memfd_create(2) do not import.
extension Sys {
    /// The most descriptors one sendmsg(2) may carry (SCM_MAX_FD: 253 works,
    /// 254 is EINVAL, measured on Linux 6.18).
    package static let maxDescriptorsPerMessage = Int(CSHIM_MAX_FDS_PER_MESSAGE)

    /// One sendmsg(2) of `bytes` carrying `fds`, to `address` (nil: the
    /// socket's peer). MSG_NOSIGNAL always; pass MSG_DONTWAIT in `flags` for
    /// a blocking socket.
    /// - Returns: `.done(bytes sent)`, `.wouldBlock`, or `.failed(errno)`.
    package static func sendDescriptors(_ sock: Int32, _ bytes: UnsafeRawBufferPointer, _ fds: [Int32],
                                        to address: UnsafePointer<sockaddr>? = nil, length: socklen_t = 0, flags: Int32 = 0) -> IOResult {
        let n = fds.withUnsafeBufferPointer {
            cshim_send_fds(sock, address, length, bytes.baseAddress, bytes.count, $0.baseAddress, Int32($0.count), flags)
        }
        if n >= 0 { return .done(n) }
        return errno == EAGAIN ? .wouldBlock : .failed(errno)
    }

    /// One recvmsg(2) into `buffer` with up to `maxDescriptorsPerMessage`
    /// descriptors, received close-on-exec and appended to `fds`.
    /// `truncated`: the kernel had more descriptors than fitted and closed them.
    /// - Returns: `.done(bytes)`, `.endOfFile`, `.wouldBlock`, or `.failed(errno)`.
    package static func receiveDescriptors(_ sock: Int32, into buffer: UnsafeMutableRawBufferPointer, fds: inout [Int32],
                                           truncated: inout Bool, flags: Int32 = 0) -> IOResult {
        var received = [Int32](repeating: -1, count: maxDescriptorsPerMessage)
        var count: Int32 = 0
        var cut: Int32 = 0
        let n = received.withUnsafeMutableBufferPointer {
            cshim_recv_fds(sock, buffer.baseAddress, buffer.count, $0.baseAddress, Int32($0.count), &count, &cut, flags)
        }
        if n < 0 { return errno == EAGAIN ? .wouldBlock : .failed(errno) }
        fds += received[0..<Int(count)]
        if cut != 0 { truncated = true }
        return n == 0 && count == 0 ? .endOfFile : .done(n)
    }

    /// A memfd holding `bytes`, sealed against writes, growth and shrinking:
    /// written once, then nobody who gets hold of it can change it.
    /// - Throws: `SystemError` from memfd_create(2), write(2) or fcntl(2).
    package static func sealedMemfd(_ name: String, _ bytes: [UInt8]) throws(SystemError) -> Int32 {
        let fd = try blocking("memfd_create") { cshim_memfd_create(name) }
        do throws(SystemError) {
            let written = bytes.withUnsafeBytes { writeAll(fd, $0) }
            guard written == bytes.count else { throw SystemError("write to memfd \(name)", errno: errno == 0 ? EIO : errno) }
            _ = try blocking("fcntl(F_ADD_SEALS)") { cshim_memfd_seal(fd) }
            return fd
        } catch {
            close(fd)
            throw error
        }
    }

    /// A memfd of `size` bytes that can grow (not sealed), for state written as it changes.
    /// - Throws: `SystemError` from memfd_create(2) or ftruncate(2).
    package static func memfd(_ name: String, size: Int) throws(SystemError) -> Int32 {
        let fd = try blocking("memfd_create") { cshim_memfd_create(name) }
        do throws(SystemError) {
            _ = try blocking("ftruncate") { ftruncate(fd, off_t(size)) }
            return fd
        } catch {
            close(fd)
            throw error
        }
    }
}

extension Sys {
    /// mmap(2) of `size` bytes of `fd`, shared and writable (a memfd that
    /// outlives the process: what is written stays for the next one).
    /// - Throws: `SystemError` from mmap(2).
    package static func mapShared(_ fd: Int32, size: Int) throws(SystemError) -> UnsafeMutableRawPointer {
        guard let p = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), p != UnsafeMutableRawPointer(bitPattern: -1) else {
            throw SystemError("mmap", errno: errno)
        }
        return p
    }

    /// munmap(2) of a mapping made by `mapShared`.
    package static func unmap(_ p: UnsafeMutableRawPointer, size: Int) {
        _ = munmap(p, size)
    }

    /// shutdown(2) of both directions: ends a connection even while another
    /// copy of its descriptor exists (systemd's fd store, a box), which
    /// close(2) alone would not. ENOTCONN (a peer already gone) is fine.
    package static func shutdownBoth(_ fd: Int32) {
        _ = Glibc.shutdown(fd, Int32(SHUT_RDWR))
    }

    /// After `shutdownBoth`: reads and drops what the socket had received
    /// and nobody read, into `buffer`, at most `limit` bytes. The memory of
    /// a receive queue goes back to the kernel only when the last copy of
    /// the socket closes; a copy parked elsewhere (a box) would keep it.
    /// TCP answers data arriving after shutdown(SHUT_RD) with a reset
    /// (Linux `tcp_rcv_state_process`), so the queue does not refill.
    /// - Returns: the bytes dropped.
    package static func discardInput(_ fd: Int32, buffer: UnsafeMutableRawBufferPointer, limit: Int) -> Int {
        var dropped = 0
        while dropped < limit {
            let n = recv(fd, buffer.baseAddress, min(buffer.count, limit - dropped), Int32(MSG_DONTWAIT))
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            dropped += n
        }
        return dropped
    }

    /// The bytes of a socket's send queue the peer has not acknowledged
    /// (SIOCOUTQ, tcp(7)); 0 when unknown.
    package static func unsentBytes(_ fd: Int32) -> Int {
        max(0, Int(cshim_unsent_bytes(fd)))
    }
}
