// Clients that write a frame's header and body in two send() calls without
// TCP_NODELAY (the original JSON chat client does): Nagle's algorithm holds
// the body until the header is acknowledged, and a delayed ACK (about 40 ms
// on Linux) would make every message wait for it. The daemon acknowledges a
// partial frame at once (TCP_QUICKACK, tcp(7)).
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Split writes are not delayed by Nagle and delayed ACKs (real roomcastd)")
struct SplitWriteTests {
    /// Sends `header`, then `body`, in two writes.
    static func sendSplit(_ client: TestClient, _ frame: [UInt8], headerSize: Int) throws {
        try client.sendRaw(Array(frame[..<headerSize]))
        try client.sendRaw(Array(frame[headerSize...]))
    }

    /// The median of `samples` (ms).
    static func median(_ samples: [Int64]) -> Int64 { samples.sorted()[samples.count / 2] }

    @Test("a JSON client writing length and body separately gets its echo in well under a delayed ACK")
    func jsonSplitWrites() throws {
        let d = try Daemon(["json.listen": "127.0.0.1:0"])
        let a = try JSONTestClient(d)
        a.connection.setNoDelay(false)
        try a.send(["cmd": "nickname", "nickname": "phone"])
        _ = a.receive()
        var samples: [Int64] = []
        for i in 0..<15 {
            let body = try JSONSerialization.data(withJSONObject: ["cmd": "msg", "content": "m\(i)"], options: [.prettyPrinted, .sortedKeys])
            let start = monotonicMs()
            try Self.sendSplit(a.connection, JSONFrameCodec.encode(body), headerSize: JSONFrameCodec.headerSize)
            let echo = try #require(a.receive(), "message \(i) was not echoed")
            samples.append(monotonicMs() - start)
            #expect(echo["content"] as? String == "m\(i)")
        }
        print("split JSON writes: echo after \(samples) ms, median \(Self.median(samples)) ms")
        #expect(Self.median(samples) < 20, "median \(Self.median(samples)) ms: the body waited for a delayed ACK")
    }

    @Test("an LTB client writing header and body separately gets its echo in well under a delayed ACK")
    func ltbSplitWrites() throws {
        let d = try Daemon()
        let a = try d.connect()
        a.setNoDelay(false)
        let user = Wire.user("phone")
        try a.send(Wire.join(user))
        _ = a.receiveFrame()
        var samples: [Int64] = []
        for i in 0..<15 {
            let start = monotonicMs()
            try Self.sendSplit(a, Wire.text(user, "m\(i)"), headerSize: FrameCodec.headerSize)
            let echo = try #require(a.receiveFrame(), "message \(i) was not echoed")
            samples.append(monotonicMs() - start)
            #expect(echo.type == Wire.text)
        }
        print("split LTB writes: echo after \(samples) ms, median \(Self.median(samples)) ms")
        #expect(Self.median(samples) < 20, "median \(Self.median(samples)) ms: the body waited for a delayed ACK")
    }
}
