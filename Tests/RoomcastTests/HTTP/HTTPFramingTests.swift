import Testing
@testable import RoomcastCore

/// The framing rules of RFC 9112 that a request smuggler leans on (issue
/// 28 item 6): an empty or list-broken Content-Length (§6.3), an empty
/// Transfer-Encoding (§6.1), Host missing, twice or invalid (§3.2), a bare
/// CR (§2.2). Each is refused with 400 before a byte of what follows is
/// read as a request.
@Suite struct HTTPFramingTests {
    static func status(_ text: String) -> Int? {
        let r = HTTPRequestReaderTests.read(text)
        return r.error?.status
    }

    /// The smuggling case of the issue: with `Content-Length:` read as no
    /// body, the body was parsed as a second request (400, then 200).
    /// Now the first request is refused and nothing after it is read.
    @Test func emptyContentLengthIsRefusedAndNothingFollows() {
        let inner = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n"
        let r = HTTPRequestReaderTests.read("POST /v1/rooms/r/publish HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n" + inner)
        #expect(r.requests.isEmpty)
        #expect(r.error?.status == 400)
    }

    @Test(arguments: [
        "Content-Length:",
        "Content-Length:   ",
        "Content-Length: ,",
        "Content-Length: 2,",
        "Content-Length: ,2",
        "Content-Length: 2,,2",
        "Content-Length: 2\r\nContent-Length:",
        "Content-Length: +2",
        "Content-Length: 2 2",
    ])
    func malformedContentLength(line: String) {
        #expect(Self.status("POST / HTTP/1.1\r\nHost: a\r\n\(line)\r\n\r\nab") == 400, "\(line)")
    }

    @Test(arguments: ["Transfer-Encoding:", "Transfer-Encoding:  ", "Transfer-Encoding: ,", "Transfer-Encoding:\r\nContent-Length: 2"])
    func emptyTransferEncoding(line: String) {
        #expect(Self.status("POST / HTTP/1.1\r\nHost: a\r\n\(line)\r\n\r\nab") == 400, "\(line)")
    }

    /// Still fine: equal lengths repeated, and `0`.
    @Test func goodLengthsStillRead() {
        #expect(HTTPRequestReaderTests.read("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2 , 2\r\n\r\nok").requests.map(\.1) == ["ok"])
        #expect(HTTPRequestReaderTests.read("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n").requests.count == 1)
    }

    @Test(arguments: [
        "GET / HTTP/1.1\r\n\r\n",                                   // no Host
        "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",             // two, even equal
        "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a b\r\n\r\n",                      // invalid ones
        "GET / HTTP/1.1\r\nHost: a, b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: user@a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a:80x\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a:80:81\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: []\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a%2\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a%zz\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: \u{e9}.example\r\n\r\n",
    ])
    func badHost(text: String) {
        #expect(Self.status(text) == 400, "\(text)")
        // The WebSocket listener and the page share the parser.
        var p = HTTPRequestParser()
        guard case .error(let e) = Array(text.utf8).withUnsafeBytes({ p.parse($0) }) else {
            Issue.record("parsed: \(text)")
            return
        }
        #expect(e.status == 400)
    }

    @Test(arguments: ["a", "roomcastd", "127.0.0.1", "127.0.0.1:9899", "[::1]", "[::1]:9897", "[v1.fe]", "Server.Example.COM",
                      "xn--bcher-kva.example", "a%20b", "a:", "", "a-b_c~d.e!$&'()*+;=", "localhost:65535"])
    func goodHost(host: String) {
        let r = HTTPRequestReaderTests.read("GET / HTTP/1.1\r\nHost: \(host)\r\n\r\n")
        #expect(r.error == nil && r.requests.count == 1, "\(host)")
    }

    @Test(arguments: [
        "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r2\r\n\r\n",           // in a value
        "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\r\n\r\n",            // at a value's end
        "GET / HTTP/1.1\r\nHost: a\rX-B: 2\r\n\r\n",                // as a line end
        "GET /\r HTTP/1.1\r\nHost: a\r\n\r\n",                      // in the request line
        "GET / HTTP/1.1\r\nHost: a\r\nX\r: 1\r\n\r\n",              // in a name
    ])
    func bareCR(text: String) {
        #expect(Self.status(text) == 400, "\(text.debugDescription)")
    }

    /// CR LF, bare LF and the empty-line forms still end lines and heads.
    @Test func lineEndsStillAccepted() {
        #expect(HTTPRequestReaderTests.read("GET / HTTP/1.1\r\nHost: a\r\n\r\n").requests.count == 1)
        #expect(HTTPRequestReaderTests.read("GET / HTTP/1.1\nHost: a\n\n").requests.count == 1)
        #expect(HTTPRequestReaderTests.read("GET / HTTP/1.1\nHost: a\n\r\n").requests.count == 1)
        #expect(HTTPRequestReaderTests.read("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n").requests.count == 1)
    }
}
