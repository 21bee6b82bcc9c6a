@preconcurrency import Glibc

/// The daemon's own count of deliveries, read from its API (docs/api.md,
/// `GET /metrics`) over a short blocking connection of its own, between two
/// phases of a run: `roomcast_frames_delivered_total{type="text"}`, the text
/// frames it queued for a recipient. A run's members receive nothing else
/// of type text, so over a whole run the two counts must be equal.
struct APIProbe {
    let host: String
    let port: UInt16
    let key: String
    static let series = "roomcast_frames_delivered_total{type=\"text\"}"

    /// The counter now; nil (and `error` set) when the API does not answer
    /// within 5 s or the answer has no such sample.
    func deliveredText(error: inout String?) -> UInt64? {
        guard let text = get("/metrics", error: &error) else { return nil }
        guard let v = prometheusSample(text, series: Self.series) else {
            error = "GET /metrics has no sample \(Self.series)"
            return nil
        }
        return v
    }

    /// The body of a 200 answer to `GET path`; nil and `error` otherwise.
    func get(_ path: String, error: inout String?) -> String? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { error = "socket: \(String(cString: strerror(errno)))"; return nil }
        defer { close(fd) }
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host, &a.sin_addr) == 1 else { error = "bad IPv4 address '\(host)'"; return nil }
        let rc = withUnsafePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { error = "connect to the API on \(host):\(port): \(String(cString: strerror(errno)))"; return nil }
        let request = Array("GET \(path) HTTP/1.1\r\nHost: \(host)\r\nAuthorization: Bearer \(key)\r\nConnection: close\r\n\r\n".utf8)
        var sent = 0
        while sent < request.count {
            let n = request[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { error = "send to the API: \(String(cString: strerror(errno)))"; return nil }
            sent += n
        }
        var buf: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let answer = buf.withUnsafeBytes { HTTPAnswer.parse($0) }
            switch answer {
            case .answer(let status, let at, let length, _):
                guard status == 200 else {
                    error = "GET \(path) answered \(status): \(String(decoding: buf[at..<(at + length)], as: UTF8.self).prefix(200))"
                    return nil
                }
                return String(decoding: buf[at..<(at + length)], as: UTF8.self)
            case .malformed(let why):
                error = "GET \(path): \(why)"
                return nil
            case .incomplete:
                break
            }
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                error = n == 0 ? "GET \(path): the API closed the connection mid-answer" : "GET \(path): \(String(cString: strerror(errno)))"
                return nil
            }
            buf += chunk[0..<n]
        }
    }
}
