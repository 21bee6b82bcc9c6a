// Pipelined API requests against the real daemon (issue 28 item 1): one
// connection sends 20,000 small requests at once, half without a key
// (401) and half with one (200); every answer arrives, in order, and a
// second connection's request meanwhile is answered promptly (the per-
// wakeup cap; a loose bound, the machine is noisy).
import Foundation
import Glibc
import Testing

@Suite(.serialized) struct APIPipeliningIntegrationTests {
    @Test func twentyThousandPipelinedInOrderWhileAnotherIsServed() throws {
        let (d, _) = try APIIntegrationTests.daemon()
        let port = try #require(d.apiPort)
        let piper = try APITestClient(port: port)
        let other = try APITestClient(port: port)
        #expect(other.request("GET", "/healthz")?.status == 200)
        let total = 20_000
        let keyed = "GET /healthz HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer \(APIIntegrationTests.key)\r\n\r\n"
        let keyless = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n"
        var bytes: [UInt8] = []
        for i in 0..<total { bytes += Array((i % 2 == 0 ? keyless : keyed).utf8) }
        // Sent from another thread: the daemon stops reading while its answers are untaken.
        let fd = piper.fd, payload = bytes
        let sender = Thread {
            var off = 0
            while off < payload.count {
                let n = payload[off...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                guard n > 0 else { return }
                off += n
            }
        }
        sender.start()
        var statuses: [Int] = []
        var worstOtherMs: Int64 = 0
        while statuses.count < total {
            guard let a = piper.answer(timeout: .seconds(10)) else { break }
            statuses.append(a.status)
            if statuses.count % 2_000 == 1_000 {
                let started = monotonicMs()
                #expect(other.request("GET", "/healthz")?.status == 200)
                worstOtherMs = max(worstOtherMs, monotonicMs() - started)
            }
        }
        #expect(statuses.count == total)
        let expected = (0..<total).map { $0 % 2 == 0 ? 401 : 200 }
        #expect(statuses == expected, "first difference at \(Array(zip(statuses, expected)).firstIndex { $0 != $1 } ?? -1)")
        #expect(worstOtherMs < 1_000, "the other connection waited \(worstOtherMs) ms")
        #expect(other.request("GET", "/healthz")?.status == 200)
    }
}
