// The API's per-wakeup cap, in-process (issue 28 item 1): a connection that
// pipelines many requests gets at most `APIServer.requestsPerWakeup`
// answers per loop turn, the rest on the following turns without any new
// byte arriving (the requests are read already: no readiness brings them
// back), and all of them in order. HandOverTests' server and fake fd store.
import Foundation
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("The API answers at most requestsPerWakeup pipelined requests a loop turn")
struct APIPipeliningCapTests {
    @Test func capPerTurnAndResumedWithoutNewBytes() throws {
        let dir = try TempDirectory()
        let path = dir.path + "/api.sock"
        let node = try HandOverTests.Node(HandOverTests.config + "[api]\nlisten = unix:\(path)\n", clock: HandOverTests.ManualClock())
        let fd = APIHandOverTests.connectUnix(path)
        try #require(fd >= 0)
        defer { close(fd) }
        let total = 1_000
        let one = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        HandOverTests.send(fd, Array(String(repeating: one, count: total).utf8))  // ~34 KB: the socket takes it whole
        var text = ""
        var perTurn: [Int] = []
        var turns = 0
        while perTurn.reduce(0, +) < total && turns < 500 {
            try node.tick()
            turns += 1
            let got = HandOverTests.drain(fd).map { String(decoding: $0, as: UTF8.self) } ?? ""
            text += got
            let n = got.components(separatedBy: "HTTP/1.1 ").count - 1
            if n > 0 || !perTurn.isEmpty { perTurn.append(n) }
        }
        #expect(perTurn.reduce(0, +) == total, "answers: \(perTurn)")
        #expect(perTurn.allSatisfy { $0 <= APIServer.requestsPerWakeup }, "answers per turn: \(perTurn)")
        #expect(perTurn.count >= total / APIServer.requestsPerWakeup, "answers per turn: \(perTurn)")
        // Every answer is the same request's, whole and in order.
        let statuses = text.components(separatedBy: "HTTP/1.1 ").dropFirst().map { String($0.prefix(3)) }
        #expect(statuses.count == total && Set(statuses).count == 1, "\(Set(statuses))")
        #expect(node.server.api.again.isEmpty)
    }
}
