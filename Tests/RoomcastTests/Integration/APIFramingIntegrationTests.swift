// HTTP framing against the real daemon's API (issue 28 item 6, RFC 9112
// §6.3 and §3.2): a request whose framing is in doubt gets 400 and the
// connection is closed, so what a proxy in front may have read as its
// body is never served here as a second request.
import Glibc
import Testing

@Suite(.serialized) struct APIFramingIntegrationTests {
    /// The smuggling case: `Content-Length:` empty. Before, the body was
    /// read as a second request (400, then 200, connection kept open).
    @Test func emptyContentLengthIs400AndClose() throws {
        let (d, _) = try APIIntegrationTests.daemon()
        let port = try #require(d.apiPort)
        let c = try APITestClient(port: port)
        let inner = "GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(APIIntegrationTests.key)\r\n\r\n"
        c.send("POST /v1/rooms/r/publish HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(APIIntegrationTests.key)\r\n"
               + "Content-Length:\r\n\r\n" + inner)
        #expect(c.answer()?.status == 400)
        #expect(c.answer(timeout: .seconds(1)) == nil, "the body was served as a request")
        #expect(c.isClosed())
        // No Host, two Hosts, an invalid one: 400 and close; a good request on another connection is served.
        for head in ["GET /healthz HTTP/1.1\r\n", "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n", "GET /healthz HTTP/1.1\r\nHost: a b\r\n",
                     "GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n", "GET /healthz HTTP/1.1\r\nHost: a\r\nX: 1\r2\r\n"] {
            let bad = try APITestClient(port: port)
            bad.send(head + "Authorization: Bearer \(APIIntegrationTests.key)\r\n\r\n")
            #expect(bad.answer()?.status == 400, "\(head.debugDescription)")
            #expect(bad.isClosed())
        }
        let good = try APITestClient(port: port)
        #expect(good.request("GET", "/healthz")?.status == 200)
    }
}
