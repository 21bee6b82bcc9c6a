// roomcast-soak: the clients: roles, connecting, reading, acting, the epoll pump (main.swift holds the run and its state).
import CShim
import Foundation
import Glibc
import RoomcastCore

enum Role: String, CaseIterable { case healthy, chatter, slow, garbage, reconnect, silent }

final class Client {
    let id: Int
    let role: Role
    var fd: Int32 = -1
    var decoder = FrameDecoder(byteOrder: .little, maxFrameBytes: 1 << 20)
    var outbox: [UInt8] = []
    var nextActionMs: Int64 = 0
    var joined = false        // own join echoed back: it is in the room
    var expected: [Int] = []  // per chatter: the next sequence number
    var sent = 0              // chatters: frames sent
    var connects = 0
    var closedByDaemon = 0
    init(id: Int, role: Role) { self.id = id; self.role = role }
    var user: UserInfo { UserInfo(level: 1, name: "\(role.rawValue)\(id)", iconURL: "https://img.example/\(id).png") }
}

func watch(_ c: Client) {
    // Slow readers are read on a timer only (level-triggered EPOLLIN would spin).
    var ev = epoll_event(events: c.role == .slow ? 0 : EPOLLIN.rawValue, data: epoll_data_t(fd: c.fd))
    epoll_ctl(epfd, EPOLL_CTL_ADD, c.fd, &ev)
}

func connectClient(_ c: Client) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { fail("socket: \(String(cString: strerror(errno)))"); return false }
    if c.role == .slow {
        var size: Int32 = 4096
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    }
    var a = sockaddr_in()
    a.sin_family = sa_family_t(AF_INET)
    a.sin_port = port.bigEndian
    a.sin_addr.s_addr = inet_addr("127.0.0.1")
    let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard r == 0 else {
        close(fd)
        if c.role == .healthy || c.role == .chatter { fail("connect \(c.role)\(c.id): \(String(cString: strerror(errno)))") }
        return false
    }
    _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
    var one: Int32 = 1
    setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    c.fd = fd
    c.connects += 1
    c.decoder = FrameDecoder(byteOrder: .little, maxFrameBytes: 1 << 20)
    c.outbox = []
    c.joined = false
    byFD[fd] = c
    watch(c)
    return true
}

func disconnect(_ c: Client, reset: Bool = false) {
    guard c.fd >= 0 else { return }
    if reset {
        var l = linger(l_onoff: 1, l_linger: 0)
        setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
    }
    epoll_ctl(epfd, EPOLL_CTL_DEL, c.fd, nil)
    byFD[c.fd] = nil
    close(c.fd)
    c.fd = -1
}

func send(_ c: Client, _ bytes: [UInt8]) {
    guard c.fd >= 0 else { return }
    c.outbox += bytes
    let n = c.outbox.withUnsafeBytes { Glibc.send(c.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
    if n > 0 { c.outbox.removeFirst(n) }
}

/// The daemon closed `c` (EOF or reset).
func peerClosed(_ c: Client, _ now: Int64) {
    disconnect(c)
    c.closedByDaemon += 1
    switch c.role {
    case .healthy, .chatter: fail("\(c.role)\(c.id) was disconnected by the daemon")
    case .slow, .garbage, .silent: c.nextActionMs = now + Int64.random(in: 200...1000, using: &rng)  // reconnect
    case .reconnect: c.nextActionMs = now + Int64.random(in: 50...500, using: &rng)
    }
}

func readable(_ c: Client, limit: Int, _ now: Int64) {
    var buffer = [UInt8](repeating: 0, count: min(limit, 64 * 1024))
    var total = 0
    while total < limit, c.fd >= 0 {
        let n = buffer.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, min($0.count, limit - total), Int32(MSG_DONTWAIT)) }
        if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) { peerClosed(c, now); return }
        if n < 0 { return }
        total += n
        guard c.role == .healthy || c.role == .chatter else { continue }
        c.decoder.append(buffer[0..<n])
        while true {
            let frame: Frame?
            do { frame = try c.decoder.next() } catch { fail("\(c.role)\(c.id): undecodable stream: \(error)"); disconnect(c); return }
            guard let f = frame else { break }
            if f.type == 0, !c.joined, f.body == c.user.serialized() { c.joined = true }
            guard f.type == chatType, f.body.count == chatBodySize else { otherFramesDelivered += 1; continue }
            let (m, who, seq) = f.body.withUnsafeBytes {
                ($0.loadUnaligned(fromByteOffset: 0, as: UInt64.self), Int($0.loadUnaligned(fromByteOffset: 8, as: UInt32.self)),
                 Int($0.loadUnaligned(fromByteOffset: 12, as: UInt32.self)))
            }
            guard m == magic, who < chatterCount else { otherFramesDelivered += 1; continue }
            chatFramesDelivered += 1
            if seq != c.expected[who] {
                fail("\(c.role)\(c.id): from chatter \(who) got #\(seq), expected #\(c.expected[who]) (\(seq < c.expected[who] ? "duplicate" : "gap"))")
                c.expected[who] = seq + 1
            } else {
                c.expected[who] += 1
            }
        }
    }
}

func garbage() -> [UInt8] {
    switch Int.random(in: 0..<3, using: &rng) {
    case 0: return (0..<64).map { _ in UInt8.random(in: 0...255, using: &rng) }  // a random "header"
    case 1: return Array("GET / HTTP/1.1\r\nHost: soak\r\n\r\n".utf8)
    default:  // three malformed texts: max_violations = 3
        return (0..<3).flatMap { _ in FrameCodec.encode(type: 2, body: [0x0A, 0x05, 0xFF, 0xFF], byteOrder: .little) }
    }
}

/// Timed behaviour of every role.
func act(_ c: Client, _ now: Int64, chatting: Bool) {
    guard now >= c.nextActionMs else { return }
    if c.fd < 0 {
        guard connectClient(c) else { c.nextActionMs = now + 500; return }
        switch c.role {
        case .healthy, .chatter, .slow:
            send(c, FrameCodec.encode(type: 0, body: c.user.serialized(), byteOrder: .little))
            c.nextActionMs = now + 5_000
        case .garbage:
            send(c, garbage())
            c.nextActionMs = now + 5_000
        case .reconnect:
            if Int.random(in: 0..<5, using: &rng) == 0 { send(c, FrameCodec.encode(type: 0, body: c.user.serialized(), byteOrder: .little)) }
            c.nextActionMs = now + Int64.random(in: 100...2000, using: &rng)
        case .silent:
            c.nextActionMs = .max  // until evicted
        }
        return
    }
    switch c.role {
    case .chatter where chatting:
        var body = [UInt8](repeating: 0x2E, count: chatBodySize)
        body.withUnsafeMutableBytes {
            $0.storeBytes(of: magic, toByteOffset: 0, as: UInt64.self)
            $0.storeBytes(of: UInt32(c.id), toByteOffset: 8, as: UInt32.self)
            $0.storeBytes(of: UInt32(c.sent), toByteOffset: 12, as: UInt32.self)
        }
        send(c, FrameCodec.encode(type: chatType, body: body, byteOrder: .little))
        c.sent += 1
        c.nextActionMs = now + 500
    case .healthy, .chatter:
        send(c, FrameCodec.encode(type: 8, body: [], byteOrder: .little))
        c.nextActionMs = now + 5_000
    case .slow:
        readable(c, limit: 200, now)  // 200 bytes per 100 ms: 2 KB/s, below the room's pace
        c.nextActionMs = now + 100
        if c.fd >= 0, now % 5_000 < 100 { send(c, FrameCodec.encode(type: 8, body: [], byteOrder: .little)) }
    case .garbage:
        send(c, garbage())
        c.nextActionMs = now + 2_000
    case .reconnect:
        disconnect(c, reset: Bool.random(using: &rng))
        c.nextActionMs = now + Int64.random(in: 50...500, using: &rng)
    case .silent:
        break
    }
}

func pump(untilMs end: Int64, chatting: Bool, act doAct: Bool = true) {
    var events = [epoll_event](repeating: epoll_event(), count: 1024)
    var lastScan: Int64 = 0
    while nowMs() < end {
        let n = events.withUnsafeMutableBufferPointer { epoll_wait(epfd, $0.baseAddress, Int32($0.count), 10) }
        let now = nowMs()
        if n > 0 {
            for i in 0..<Int(n) {
                if let c = byFD[events[i].data.fd] { readable(c, limit: 256 * 1024, now) }
            }
        }
        if doAct && now - lastScan >= 10 {
            lastScan = now
            for c in clients { act(c, now, chatting: chatting) }
            for c in clients where !c.outbox.isEmpty && c.fd >= 0 { send(c, []) }
        }
        sampleDaemon(now)
    }
}

func sampleDaemon(_ now: Int64) {
    guard now - lastSample >= 500 else { return }
    lastSample = now
    peakRss = max(peakRss, procField(pid, "VmRSS"))
    if !daemon.isRunning { print("FAIL: roomcastd exited (status \(daemon.terminationStatus))\n\(daemonLog().suffix(3000))"); exit(1) }
}
