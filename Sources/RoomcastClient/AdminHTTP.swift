import Glibc
import RoomcastIO

// AdminHTTP.swift: one request to the backend API and its answer, over TCP
// or a Unix socket (`roomcast admin`): a blocking client with one deadline
// for the whole exchange; `Connection: close`, the body framed by
// `Content-Length` as the daemon always sends it (docs/api.md).

/// An answer of the API.
public struct AdminResponse: Equatable, Sendable {
    public var status: Int
    public var body: String
}

/// Why no answer came.
public struct AdminTransportError: Error, CustomStringConvertible {
    public var description: String
    public init(description: String) { self.description = description }
}

public enum AdminHTTP {
    /// The largest answer read, in bytes (a page of 1000 rooms of 255 bytes fits).
    static let maxResponseBytes = 16 << 20

    /// Sends `request` to `endpoint` and reads the answer within `timeoutMs`.
    /// - Throws: ``AdminTransportError`` (cannot connect, timeout, a malformed answer).
    public static func send(_ request: AdminRequest, to endpoint: AdminEndpoint, key: String?, timeoutMs: UInt64) throws(AdminTransportError) -> AdminResponse {
        let deadline = now() + Int64(timeoutMs)
        let fd = try connect(endpoint, deadline: deadline)
        defer { close(fd) }
        let bytes = request.serialized(host: endpoint.hostHeader, key: key)
        var off = 0
        while off < bytes.count {
            try wait(fd, Int16(POLLOUT), deadline: deadline)
            let n = bytes[off...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                throw AdminTransportError(description: "send: \(String(cString: strerror(errno)))")
            }
            off += n
        }
        var got: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            if let answer = try parse(got) { return answer }
            guard got.count <= maxResponseBytes else { throw AdminTransportError(description: "the answer is over \(maxResponseBytes) bytes") }
            try wait(fd, Int16(POLLIN), deadline: deadline)
            let n = recv(fd, &buffer, buffer.count, 0)
            if n < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                throw AdminTransportError(description: "recv: \(String(cString: strerror(errno)))")
            }
            if n == 0 { throw AdminTransportError(description: got.isEmpty ? "the API closed the connection without an answer" : "the answer was cut short") }
            got += buffer[0..<n]
        }
    }

    /// A whole answer in `bytes`, nil while incomplete (a `100 Continue` is skipped).
    /// - Throws: ``AdminTransportError`` for a status line or header that is not HTTP/1.1.
    static func parse(_ bytes: [UInt8]) throws(AdminTransportError) -> AdminResponse? {
        var start = 0
        while true {
            guard let end = find([13, 10, 13, 10], in: bytes, from: start) else { return nil }
            let head = String(decoding: bytes[start..<end], as: UTF8.self)
            let lines = head.split(separator: "\r\n", omittingEmptySubsequences: false)
            let statusParts = lines[0].split(separator: " ", maxSplits: 2)
            guard statusParts.count >= 2, statusParts[0].hasPrefix("HTTP/1."), let status = Int(statusParts[1]) else {
                throw AdminTransportError(description: "not an HTTP answer: \(lines[0].prefix(80))")
            }
            if status == 100 { start = end + 4; continue }
            var length = 0
            for line in lines.dropFirst() {
                let kv = line.split(separator: ":", maxSplits: 1)
                if kv.count == 2, kv[0].lowercased() == "content-length" {
                    guard let n = Int(String(kv[1].filter { $0 != " " && $0 != "\t" })), n >= 0 else { throw AdminTransportError(description: "a bad Content-Length") }
                    length = n
                }
            }
            guard bytes.count >= end + 4 + length else { return nil }
            return AdminResponse(status: status, body: String(decoding: bytes[(end + 4)..<(end + 4 + length)], as: UTF8.self))
        }
    }

    private static func find(_ needle: [UInt8], in bytes: [UInt8], from: Int) -> Int? {
        guard bytes.count >= needle.count + from else { return nil }
        var i = from
        while i + needle.count <= bytes.count {
            if bytes[i] == needle[0] && bytes[i..<(i + needle.count)].elementsEqual(needle) { return i }
            i += 1
        }
        return nil
    }

    private static func now() -> Int64 {
        var t = timespec()
        clock_gettime(CLOCK_MONOTONIC, &t)
        return Int64(t.tv_sec) * 1000 + Int64(t.tv_nsec) / 1_000_000
    }

    private static func wait(_ fd: Int32, _ events: Int16, deadline: Int64) throws(AdminTransportError) {
        while true {
            let left = deadline - now()
            guard left > 0 else { throw AdminTransportError(description: "no answer within the timeout") }
            var p = pollfd(fd: fd, events: events, revents: 0)
            let r = poll(&p, 1, Int32(min(left, 60_000)))
            if r > 0 { return }
            if r < 0 && errno != EINTR { throw AdminTransportError(description: "poll: \(String(cString: strerror(errno)))") }
        }
    }

    private static func connect(_ endpoint: AdminEndpoint, deadline: Int64) throws(AdminTransportError) -> Int32 {
        let fd: Int32
        var r: Int32
        let address: SocketAddress
        switch endpoint {
        case .unix(let path):
            guard let a = SocketAddress.unix(path: path) else { throw AdminTransportError(description: "unix:\(path): the path is too long") }
            address = a
        case .tcp(let host, let port):
            // RoomcastIO's resolver, as the cluster's Redis link uses: a host
            // inet_pton cannot read is an error, not a connect to 0.0.0.0.
            guard let a = try? SocketAddress.resolve(host: host, port: port).first else {
                throw AdminTransportError(description: "\(host): not an address")
            }
            address = a
        }
        fd = socket(address.family, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue | SOCK_NONBLOCK.rawValue), 0)
        r = fd < 0 ? -1 : address.withSockaddr { Glibc.connect(fd, $0, $1) }
        guard fd >= 0 else { throw AdminTransportError(description: "socket: \(String(cString: strerror(errno)))") }
        if r != 0 && errno == EINPROGRESS {
            do { try wait(fd, Int16(POLLOUT), deadline: deadline) } catch { close(fd); throw error }
            var e: Int32 = 0
            var len = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len)
            r = e == 0 ? 0 : -1
            errno = e
        }
        guard r == 0 else {
            let text = String(cString: strerror(errno))
            close(fd)
            throw AdminTransportError(description: "cannot connect to the API: \(text)")
        }
        return fd
    }
}
