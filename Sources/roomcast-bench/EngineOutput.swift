@preconcurrency import COpenSSL
import CShim
@preconcurrency import Glibc
import RoomcastCore

// The load generator's output buffers and flushing (Engine.swift holds its state).
extension Engine {
    @inline(__always)
    func reserve(_ id: Int, _ n: Int) -> UnsafeMutableRawPointer {
        let c = conns + id
        if c.pointee.outStart == c.pointee.outLen { c.pointee.outStart = 0; c.pointee.outLen = 0 }
        let need = c.pointee.outLen + n
        if need > c.pointee.outCap {
            let live = c.pointee.outLen - c.pointee.outStart
            let cap = max(need - c.pointee.outStart, 2 * c.pointee.outCap, 256)
            let p = UnsafeMutableRawPointer.allocate(byteCount: cap, alignment: 16)
            if let old = c.pointee.out {
                p.copyMemory(from: old + c.pointee.outStart, byteCount: live)
                old.deallocate()
            }
            c.pointee.out = p
            c.pointee.outCap = cap
            c.pointee.outStart = 0
            c.pointee.outLen = live
        }
        let at = c.pointee.out! + c.pointee.outLen
        c.pointee.outLen += n
        return at
    }

    func queue(_ id: Int, _ bytes: UnsafeRawPointer, _ n: Int) {
        reserve(id, n).copyMemory(from: bytes, byteCount: n)
    }

    /// Queues one LTB frame (or RESP command): as it is, or on an open WebSocket
    /// as one masked binary message (RFC 6455 §5.2; opcode 2, FIN). The mask key is
    /// zero, which leaves the payload as it is: any key is valid, and a server
    /// cannot tell (§5.3 asks clients for unpredictable keys against proxies'
    /// cache poisoning, which loopback does not have).
    func sendMessage(_ id: Int, _ bytes: UnsafeRawPointer, _ n: Int, opcode: UInt8 = 2) {
        if conns[id].webSocket == .open {
            var head: [UInt8] = [0x80 | opcode]
            if n < 126 { head.append(0x80 | UInt8(n)) } else if n < 65536 {
                head += [0x80 | 126, UInt8(n >> 8), UInt8(n & 0xFF)]
            } else {
                head.append(0x80 | 127)
                for shift in stride(from: 56, through: 0, by: -8) { head.append(UInt8((n >> shift) & 0xFF)) }
            }
            head += [0, 0, 0, 0]
            head.withUnsafeBytes { queue(id, $0.baseAddress!, $0.count) }
        }
        queue(id, bytes, n)
    }

    func pending(_ id: Int) -> Int { conns[id].outLen - conns[id].outStart }

    func flush(_ id: Int) {
        let c = conns + id
        guard c.pointee.state == .open else { return }
        while c.pointee.outStart < c.pointee.outLen {
            if let ssl = c.pointee.ssl {
                ERR_clear_error()
                let n = SSL_write(ssl, c.pointee.out! + c.pointee.outStart, Int32(c.pointee.outLen - c.pointee.outStart))
                if n > 0 { c.pointee.outStart += Int(n); continue }
                let e = SSL_get_error(ssl, n)
                if e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ {
                    if !c.pointee.writeArmed { setWrite(id, true) }
                    return
                }
                serverClosed(id, "SSL_write: error \(e)")
                return
            }
            let n = send(c.pointee.fd, c.pointee.out! + c.pointee.outStart, c.pointee.outLen - c.pointee.outStart, Int32(MSG_NOSIGNAL))
            if n > 0 { c.pointee.outStart += n; continue }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                if !c.pointee.writeArmed { setWrite(id, true) }
                return
            }
            serverClosed(id, "send: \(String(cString: strerror(errno)))")
            return
        }
        c.pointee.outStart = 0
        c.pointee.outLen = 0
        if c.pointee.writeArmed { setWrite(id, false) }
    }

    func setWrite(_ id: Int, _ on: Bool) {
        conns[id].writeArmed = on
        var ev = epoll_event(events: EPOLLIN.rawValue | EPOLLRDHUP.rawValue | (on ? EPOLLOUT.rawValue : 0),
                             data: epoll_data_t(u64: UInt64(id)))
        epoll_ctl(epfd, EPOLL_CTL_MOD, conns[id].fd, &ev)
    }
}
