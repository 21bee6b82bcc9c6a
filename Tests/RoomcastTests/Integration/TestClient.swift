// A small blocking client over real loopback sockets, and the frames the
// integration tests send (built with the proto2 codec of RoomcastCore).
import Glibc
import RoomcastCore
import Testing

/// A failure of the test harness itself (not an assertion about the daemon).
struct HarnessError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

extension Duration {
    /// Whole milliseconds (rounded down).
    var ms: Int { Int(components.seconds) * 1000 + Int(components.attoseconds / 1_000_000_000_000_000) }
}

/// CLOCK_MONOTONIC in milliseconds (the clock of MONOTONIC_USEC, too).
func monotonicMs() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

/// Sleeps the calling thread (tests are synchronous; keep sleeps short).
func pause(_ d: Duration) {
    usleep(useconds_t(d.ms * 1000))
}

/// `strerror(errno)` for messages.
func errnoText(_ e: Int32 = errno) -> String { String(cString: strerror(e)) }

/// Calls `body` with the socket address of a numeric IPv4 or IPv6 `host` and `port`.
func withSocketAddress<R>(host: String, port: UInt16,
                          _ body: (Int32, UnsafePointer<sockaddr>, socklen_t) throws -> R) throws -> R {
    if host.contains(":") {
        var a = sockaddr_in6()
        a.sin6_family = sa_family_t(AF_INET6)
        a.sin6_port = port.bigEndian
        guard inet_pton(AF_INET6, host, &a.sin6_addr) == 1 else { throw HarnessError("bad IPv6 address \(host)") }
        return try withUnsafePointer(to: &a) {
            try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { try body(AF_INET6, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
        }
    }
    var a = sockaddr_in()
    a.sin_family = sa_family_t(AF_INET)
    a.sin_port = port.bigEndian
    guard inet_pton(AF_INET, host, &a.sin_addr) == 1 else { throw HarnessError("bad IPv4 address \(host)") }
    return try withUnsafePointer(to: &a) {
        try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { try body(AF_INET, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
}

/// The text of a NUL-terminated C string held in an array.
private func cString(_ chars: [CChar]) -> String {
    String(decoding: chars.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// The local address of socket `fd` as the daemon logs a peer: `1.2.3.4:P` or `[::1]:P`.
func localAddress(of fd: Int32) -> String {
    var storage = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    _ = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
    var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
    if Int32(storage.ss_family) == AF_INET6 {
        return withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
                var a = sin6.pointee.sin6_addr
                inet_ntop(AF_INET6, &a, &text, socklen_t(text.count))
                return "[" + cString(text) + "]:" + String(UInt16(bigEndian: sin6.pointee.sin6_port))
            }
        }
    }
    return withUnsafePointer(to: &storage) {
        $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
            var a = sin.pointee.sin_addr
            inet_ntop(AF_INET, &a, &text, socklen_t(text.count))
            return cString(text) + ":" + String(UInt16(bigEndian: sin.pointee.sin_port))
        }
    }
}

/// A loopback TCP port that was free a moment ago (bound to port 0, then closed).
func freeLoopbackPort() throws -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw HarnessError("socket: \(errnoText())") }
    defer { close(fd) }
    let r = try withSocketAddress(host: "127.0.0.1", port: 0) { _, sa, len in bind(fd, sa, len) }
    guard r == 0 else { throw HarnessError("bind: \(errnoText())") }
    let address = localAddress(of: fd)
    return UInt16(address[address.index(after: address.lastIndex(of: ":")!)...])!
}

/// A blocking TCP client of the daemon. Every wait is bounded by a timeout;
/// received bytes go through RoomcastCore's `FrameDecoder`, so any split of
/// the daemon's writes is reassembled. Closes its socket on deinit.
final class TestClient {
    private(set) var fd: Int32
    /// This end's address, as the daemon names the client in its log (`CLIENT_ADDR`).
    let address: String
    private var decoder = FrameDecoder(byteOrder: .little, maxFrameBytes: 16 << 20)
    /// The daemon closed the connection (EOF or reset) and every frame before it was taken.
    private var peerClosed = false
    private var buffer = [UInt8](repeating: 0, count: 64 * 1024)

    /// Keeps the daemon this client talks to alive at least as long as the client.
    private let owner: AnyObject?

    /// Connects to `host:port`.
    /// - Parameters:
    ///   - receiveBuffer: for a slow consumer that never reads: SO_RCVBUF,
    ///     and a 536-byte TCP_MAXSEG so the daemon's kernel send buffer (which
    ///     loopback's 64 KiB segments would autotune to megabytes) stays
    ///     small and the backlog builds up in the daemon's output queue.
    ///   - sourceIP: a local address to connect from (e.g. `127.0.0.2`, any of
    ///     127.0.0.0/8 works on loopback), to look like another host.
    ///   - owner: kept alive with the client (its `Daemon`).
    convenience init(host: String, port: UInt16, receiveBuffer: Int? = nil, sourceIP: String? = nil, owner: AnyObject? = nil) throws {
        try self.init(host: host, port: port, receiveBuffer: receiveBuffer, maxSegment: 536, sourceIP: sourceIP, owner: owner)
    }

    /// The same, with `maxSegment` the TCP_MAXSEG set with `receiveBuffer`, in bytes.
    init(host: String, port: UInt16, receiveBuffer: Int?, maxSegment: Int32, sourceIP: String? = nil, owner: AnyObject? = nil) throws {
        self.owner = owner
        let family: Int32 = host.contains(":") ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: \(errnoText())") }
        if var size = receiveBuffer.map(Int32.init) {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
            var segment = maxSegment
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_MAXSEG, &segment, socklen_t(MemoryLayout<Int32>.size))
        }
        if let sourceIP {
            let b = try withSocketAddress(host: sourceIP, port: 0) { _, sa, len in bind(fd, sa, len) }
            guard b == 0 else {
                close(fd)
                throw HarnessError("bind to \(sourceIP): \(errnoText())")
            }
        }
        let r = try withSocketAddress(host: host, port: port) { _, sa, len in connect(fd, sa, len) }
        guard r == 0 else {
            let e = errno
            close(fd)
            throw HarnessError("connect to \(host):\(port): \(errnoText(e))")
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        self.fd = fd
        self.address = localAddress(of: fd)
    }

    deinit { if fd >= 0 { close(fd) } }

    /// TCP_NODELAY on or off (on by default). Off, like a phone client that
    /// never set it: Nagle's algorithm holds a second small write until the
    /// first is acknowledged (tcp(7)).
    func setNoDelay(_ on: Bool) {
        var value: Int32 = on ? 1 : 0
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &value, socklen_t(MemoryLayout<Int32>.size))
    }

    /// Sends EOF (shutdown of the write side); the socket stays readable.
    func hangUp() { shutdown(fd, Int32(SHUT_WR)) }

    /// Closes abruptly with a TCP reset (SO_LINGER 0); nothing can be read afterwards.
    func reset() {
        var l = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
        close(fd)
        fd = -1
    }

    /// Writes all of `bytes` (blocking).
    func sendRaw(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw HarnessError("send from \(address): \(errnoText())")
            }
            offset += n
        }
    }

    /// Writes one whole frame (see `Wire` for building them).
    func send(_ frame: [UInt8]) throws { try sendRaw(frame) }

    /// The next frame from the daemon, or nil when none is complete within
    /// `timeout` or the connection is closed.
    func receiveFrame(timeout: Duration = .seconds(5)) -> Frame? {
        let deadline = monotonicMs() + Int64(timeout.ms)
        while true {
            do {
                if let frame = try decoder.next() { return frame }
            } catch {
                Issue.record("client \(address) could not decode the daemon's stream: \(error)")
                return nil
            }
            if peerClosed { return nil }
            let left = max(0, deadline - monotonicMs())
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&p, 1, Int32(left))
            if ready == 0 { return nil }
            if ready < 0 { if errno == EINTR { continue }; return nil }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n > 0 {
                decoder.append(buffer[0..<n])
            } else if n == 0 || (errno != EAGAIN && errno != EINTR) {
                peerClosed = true  // EOF, or ECONNRESET and the like
            }
        }
    }

    /// Up to `count` frames, stopping early when `timeout` (for all of them) runs out.
    func receiveFrames(_ count: Int, timeout: Duration = .seconds(5)) -> [Frame] {
        let deadline = monotonicMs() + Int64(timeout.ms)
        var frames: [Frame] = []
        while frames.count < count {
            let left = max(0, deadline - monotonicMs())
            guard let f = receiveFrame(timeout: .milliseconds(left)) else { break }
            frames.append(f)
        }
        return frames
    }

    /// Records an issue if a frame arrives within `within`.
    func expectNoFrame(within: Duration = .milliseconds(300), _ what: String = "",
                       sourceLocation: SourceLocation = #_sourceLocation) {
        if let f = receiveFrame(timeout: within) {
            Issue.record("\(address) received an unexpected frame of type \(f.type), \(f.body.count) body bytes \(what)",
                         sourceLocation: sourceLocation)
        }
    }

    /// Whether the daemon closes this connection within `within`; frames
    /// still in flight before the close are discarded.
    func isClosed(within: Duration) -> Bool {
        let deadline = monotonicMs() + Int64(within.ms)
        while !peerClosed {
            let left = deadline - monotonicMs()
            if left <= 0 { return false }
            _ = receiveFrame(timeout: .milliseconds(left))
        }
        return true
    }

    /// Records an issue unless the daemon closes this connection within `within`.
    func expectClosed(within: Duration = .seconds(3), _ what: String = "",
                      sourceLocation: SourceLocation = #_sourceLocation) {
        if !isClosed(within: within) {
            Issue.record("\(address) was not closed by the daemon within \(within) \(what)", sourceLocation: sourceLocation)
        }
    }

    /// Records an issue if the daemon closed this connection (checked by a short read).
    func expectOpen(sourceLocation: SourceLocation = #_sourceLocation) {
        if isClosed(within: .milliseconds(1)) {
            Issue.record("\(address) was closed by the daemon", sourceLocation: sourceLocation)
        }
    }
}

/// Frames as the original clients send them (little-endian LTB, default types).
enum Wire {
    static let join: UInt16 = 0, leave: UInt16 = 1, text: UInt16 = 2, gift: UInt16 = 3, heartbeat: UInt16 = 8, notice: UInt16 = 9
    /// A type the daemon treats as opaque (relayed unchanged).
    static let opaque: UInt16 = 42

    /// One frame: header + body.
    static func frame(_ type: UInt16, _ body: [UInt8]) -> [UInt8] {
        FrameCodec.encode(type: type, body: body, byteOrder: .little)
    }

    /// A user; `room` nil means the default room.
    static func user(_ name: String, room: String? = nil) -> UserInfo {
        UserInfo(level: 3, name: name, iconURL: "https://img.example/\(name).png", room: room)
    }

    static func join(_ u: UserInfo) -> [UInt8] { frame(join, u.serialized()) }
    static func leave(_ u: UserInfo) -> [UInt8] { frame(leave, u.serialized()) }
    static func text(_ u: UserInfo, _ s: String) -> [UInt8] { frame(text, ChatMessage(user: u, text: s).serialized()) }
    static func gift(_ u: UserInfo, _ name: String, count: Int32 = 1) -> [UInt8] {
        frame(gift, GiftMessage(user: u, giftname: name, giftURL: "https://img.example/\(name).gif", giftcount: count).serialized())
    }
    /// The original clients' heartbeat: type 8, the UTF-8 text below.
    static let heartbeatFrame = frame(heartbeat, Array("this is a heartBeat message ".utf8))
}

extension Frame {
    /// The frame as it was on the wire (little-endian), for byte-for-byte comparisons.
    var wire: [UInt8] { FrameCodec.encode(type: type, body: body, byteOrder: .little) }
}
