// A misbehaving Redis for the cluster tests: a TCP server on a loopback
// port that reads RESP commands (arrays of bulk strings, as every client
// sends them) and answers each as its current `Behaviour` says: an extra
// reply, a reply of the wrong shape, bytes that are no RESP at all, or a
// reply cut off by a close. A thread accepts, one thread per connection
// answers; `stop()` closes everything and frees the port for a real
// redis-server.
import Foundation
import Glibc
import Synchronization

final class FakeRedis: Sendable {
    enum Behaviour: String, Sendable, CaseIterable {
        /// Every command answered right, then one reply nobody asked for
        /// (hiredis 0.14's async layer asserts on it).
        case extraReply
        /// PING answered; each SUBSCRIBE confirmation an array of 2, the second an integer.
        case wrongShape
        /// Bytes that are not RESP (`?` is no reply type).
        case garbage
        /// The first bytes of the right reply, then a close.
        case closeMidReply
    }

    let port: UInt16
    private let listener: Int32
    private let behaviour: Mutex<Behaviour>
    private let stopped = Mutex(false)
    /// Connections accepted, and commands seen (their first word, uppercased).
    private let accepted = Mutex(0)
    private let seen = Mutex<[String]>([])
    private let open = Mutex<[Int32]>([])

    /// Listens on 127.0.0.1:`port` (0: a free one).
    init(port: UInt16 = 0, _ behaviour: Behaviour) throws {
        self.behaviour = Mutex(behaviour)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: \(errnoText())") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let r = try withSocketAddress(host: "127.0.0.1", port: port) { _, sa, len in bind(fd, sa, len) }
        guard r == 0, listen(fd, 64) == 0 else { let e = errno; close(fd); throw HarnessError("bind/listen: \(errnoText(e))") }
        var tv = timeval(tv_sec: 0, tv_usec: 50_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let address = localAddress(of: fd)
        self.port = UInt16(address[address.index(after: address.lastIndex(of: ":")!)...])!
        listener = fd
        Thread.detachNewThread { [self] in self.acceptLoop() }
    }

    deinit { stop() }

    /// `host:port` as `[cluster] redis` takes it.
    var address: String { "127.0.0.1:\(port)" }
    var connections: Int { accepted.withLock { $0 } }
    var commands: [String] { seen.withLock { $0 } }

    /// What every later command gets.
    func behave(_ b: Behaviour) { behaviour.withLock { $0 = b } }

    /// Closes the listener and every connection (the threads end within 50 ms).
    func stop() {
        let first = stopped.withLock { s in defer { s = true }; return !s }
        guard first else { return }
        shutdown(listener, Int32(SHUT_RDWR))
        open.withLock { fds in for fd in fds { shutdown(fd, Int32(SHUT_RDWR)) } }
        usleep(120_000)
        close(listener)
    }

    private func acceptLoop() {
        while !stopped.withLock({ $0 }) {
            let fd = accept(listener, nil, nil)
            guard fd >= 0 else { continue }
            var tv = timeval(tv_sec: 0, tv_usec: 50_000)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            accepted.withLock { $0 += 1 }
            open.withLock { $0.append(fd) }
            Thread.detachNewThread { [self] in self.serve(fd) }
        }
    }

    private func serve(_ fd: Int32) {
        defer {
            open.withLock { $0.removeAll { $0 == fd } }
            close(fd)
        }
        var input: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while !stopped.withLock({ $0 }) {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { return }
            if n < 0 { if errno == EAGAIN || errno == EINTR { continue } else { return } }
            input += buffer[0..<n]
            while let (command, used) = Self.parseCommand(input) {
                input.removeFirst(used)
                guard let name = command.first?.uppercased() else { continue }
                seen.withLock { $0.append(name) }
                let (reply, then) = answer(name, Array(command.dropFirst()))
                _ = reply.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if then { return }
            }
        }
    }

    /// The bytes for one command, and whether to close after them.
    private func answer(_ name: String, _ args: [String]) -> ([UInt8], close: Bool) {
        let right: String
        switch name {
        case "PING": right = "+PONG\r\n"
        case "SUBSCRIBE": right = args.map { "*3\r\n$9\r\nsubscribe\r\n$\($0.utf8.count)\r\n\($0)\r\n:1\r\n" }.joined()
        case "UNSUBSCRIBE": right = args.map { "*3\r\n$11\r\nunsubscribe\r\n$\($0.utf8.count)\r\n\($0)\r\n:0\r\n" }.joined()
        case "HGETALL": right = "*0\r\n"  // no moderation stored
        default: right = ":0\r\n"  // PUBLISH: nobody listens
        }
        switch behaviour.withLock({ $0 }) {
        case .extraReply:
            return (Array((right + "+OK\r\n").utf8), false)
        case .wrongShape:
            if name == "SUBSCRIBE" {
                return (Array(args.map { "*2\r\n$9\r\nsubscribe\r\n:\($0.utf8.count)\r\n" }.joined().utf8), false)
            }
            return (Array(right.utf8), false)
        case .garbage:
            return (Array("?garbage\r\n".utf8), false)
        case .closeMidReply:
            return (Array(right.utf8.prefix(max(1, right.utf8.count / 2))), true)
        }
    }

    /// One `*N\r\n$L\r\nbytes\r\n...` command from the front of `input`
    /// and the bytes it used; nil until it is whole.
    static func parseCommand(_ input: [UInt8]) -> ([String], Int)? {
        var i = 0
        func line() -> String? {
            guard let end = input[i...].firstIndex(of: 0x0D), end + 1 < input.count else { return nil }
            let s = String(decoding: input[i..<end], as: UTF8.self)
            i = end + 2
            return s
        }
        guard let head = line(), head.first == "*", let count = Int(head.dropFirst()) else { return nil }
        var parts: [String] = []
        for _ in 0..<count {
            guard let l = line(), l.first == "$", let length = Int(l.dropFirst()), i + length + 2 <= input.count else { return nil }
            parts.append(String(decoding: input[i..<i + length], as: UTF8.self))
            i += length + 2
        }
        return (parts, i)
    }
}
