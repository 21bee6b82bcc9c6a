import Testing
@testable import RoomcastCore

/// Requests with bodies on a persistent connection (RFC 9112 §6, §9.3):
/// Content-Length framing, the 64 KiB bound, refused transfer codings,
/// keep-alive, pipelining and partial reads.
@Suite struct HTTPRequestReaderTests {
    /// Every whole request in `text`, read `chunk` bytes at a time as a
    /// connection would (the buffer keeps what a request did not consume).
    static func read(_ text: String, chunk: Int = .max, maxBody: Int = 64 * 1024)
        -> (requests: [(HTTPRequest, String, Bool)], continues: Int, error: HTTPError?, left: Int) {
        let bytes = Array(text.utf8)
        var reader = HTTPRequestReader(maxBodyBytes: maxBody)
        var buffer: [UInt8] = []
        var out: [(HTTPRequest, String, Bool)] = []
        var continues = 0
        var offset = 0
        while offset < bytes.count {
            let n = min(chunk, bytes.count - offset)
            buffer += bytes[offset..<offset + n]
            offset += n
            loop: while true {
                switch buffer.withUnsafeBytes({ reader.next($0) }) {
                case .needMore(let c):
                    if c { continues += 1 }
                    break loop
                case .error(let e):
                    return (out, continues, e, buffer.count)
                case .request(let r, let body, let consumed, let keepAlive):
                    out.append((r, String(decoding: buffer[body], as: UTF8.self), keepAlive))
                    buffer.removeFirst(consumed)
                }
            }
        }
        return (out, continues, nil, buffer.count)
    }

    static func post(_ body: String, _ extra: String = "") -> String {
        "POST /v1/rooms/r/publish HTTP/1.1\r\nHost: a\r\nContent-Length: \(body.utf8.count)\r\n\(extra)\r\n\(body)"
    }

    @Test(arguments: [1, 3, 1000])
    func bodyByContentLength(chunk: Int) {
        let r = Self.read(Self.post(#"{"type":"text","text":"hi"}"#), chunk: chunk)
        #expect(r.error == nil && r.left == 0)
        #expect(r.requests.count == 1)
        #expect(r.requests.first?.0.method == "POST")
        #expect(r.requests.first?.1 == #"{"type":"text","text":"hi"}"#)
        #expect(r.requests.first?.2 == true)
    }

    /// Pipelined: three requests in one read come out in order, bodies
    /// apart, and `Connection: close` on the last is reported.
    @Test(arguments: [1, 7, 10_000])
    func pipelined(chunk: Int) {
        let text = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n" + Self.post("abc") + Self.post("de", "Connection: close\r\n")
        let r = Self.read(text, chunk: chunk)
        #expect(r.error == nil && r.left == 0)
        #expect(r.requests.map(\.0.path) == ["/healthz", "/v1/rooms/r/publish", "/v1/rooms/r/publish"])
        #expect(r.requests.map(\.1) == ["", "abc", "de"])
        #expect(r.requests.map(\.2) == [true, true, false])
    }

    @Test func partialBodyWaits() {
        let r = Self.read("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n12345")
        #expect(r.requests.isEmpty && r.error == nil)
    }

    @Test func expectContinueOncePerRequest() {
        let r = Self.read("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n12", chunk: 1)
        #expect(r.continues == 1)
        let done = Self.read("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n12")
        #expect(done.continues == 0 && done.requests.count == 1)
    }

    @Test(arguments: [
        ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 65537\r\n\r\n", 413),
        ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 411),
        ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 411),
        ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
        ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
        ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", 400),
        ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", 400),
        ("GARBAGE\r\n\r\n", 400),
        ("GET / HTTP/1.0\r\n\r\n", 400),
    ] as [(String, Int)])
    func refused(text: String, status: Int) {
        #expect(Self.read(text).error?.status == status, "\(text)")
    }

    /// The body bound is checked from the header, before any body byte is held.
    @Test func tooLargeRefusedBeforeTheBody() {
        let r = Self.read("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n", maxBody: 100)
        #expect(r.error?.status == 413)
        #expect(Self.read("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n" + String(repeating: "x", count: 100), maxBody: 100).requests.count == 1)
    }

    /// Repeated equal lengths are one length (RFC 9112 §6.3 item 5).
    @Test func equalLengthsAccepted() {
        let r = Self.read("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nok")
        #expect(r.requests.map(\.1) == ["ok"])
    }

    /// A good request followed by garbage: the first is answered, the
    /// garbage refused on its own.
    @Test func garbageAfterAGoodRequest() {
        let r = Self.read("GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n\u{1}\u{2}junk\r\n\r\n")
        #expect(r.requests.count == 1)
        #expect(r.error?.status == 400)
    }
}
