// Per-connection token buckets and the per-IP connection cap (hostile input,
// "rate limits"): over the limit, frames are dropped and count as violations.
import RoomcastCore
import Testing

@Suite("Rate limits (real roomcastd)")
struct RateLimitIntegrationTests {
    @Test("frames over frames_per_second are dropped as violations; the flooder is cut off, others are not")
    func framesPerSecond() throws {
        let d = try Daemon(["limits.frames_per_second": "5", "limits.frames_burst": "5",
                            "protocol.max_violations": "3", "protocol.echo": "no"])
        let flooder = try d.connect(), calm = try d.connect(), reader = try d.connect()
        let frames = (0..<20).map { Wire.frame(Wire.opaque, [UInt8($0)]) }
        try flooder.sendRaw(frames.flatMap { $0 })
        // The burst of 5 passes, the next 3 are violations, the 3rd closes it.
        #expect(reader.receiveFrames(6, timeout: .seconds(1)).map(\.wire) == Array(frames[0..<5]))
        flooder.expectClosed(within: .seconds(2))
        #expect(d.stderr.line(with: ["WARNING", flooder.address, "rate limit: over limits.frames_per_second (5)"]) != nil)
        // A client within its budget is unaffected; the bucket refills at the rate.
        for i in 0..<3 {
            let f = Wire.frame(Wire.opaque, [0xC0, UInt8(i)])
            try calm.send(f)
            #expect(reader.receiveFrame()?.wire == f)
        }
        calm.expectOpen()
    }

    @Test("bytes over bytes_per_second are dropped as violations")
    func bytesPerSecond() throws {
        let d = try Daemon(["limits.bytes_per_second": "2K", "protocol.max_frame_bytes": "1K",
                            "protocol.max_violations": "2", "protocol.echo": "no"])
        let sender = try d.connect(), reader = try d.connect()
        let big = Wire.frame(Wire.opaque, [UInt8](repeating: 1, count: 1000))  // 1006 bytes
        try sender.sendRaw(big + big + big + big)
        #expect(reader.receiveFrames(3, timeout: .seconds(1)).count == 2, "2 KiB of budget: two 1006-byte frames")
        sender.expectClosed(within: .seconds(2))
        #expect(d.stderr.line(with: [sender.address, "limits.bytes_per_second (2K)"]) != nil)
    }

    @Test("max_clients_per_ip refuses the extra connection from one address, not from another")
    func perIPCap() throws {
        let d = try Daemon(["server.max_clients_per_ip": "2"])
        let a = try d.connect(), b = try d.connect()
        let third = try d.connect(awaitAccept: false)
        third.expectClosed(within: .seconds(2), "(third from 127.0.0.1)")
        #expect(d.stderr.wait(forLineWith: ["max_clients_per_ip (2) reached for 127.0.0.1", third.address]))
        let other = try d.connect(sourceIP: "127.0.0.2")
        other.expectOpen()
        // A slot frees up when a client leaves.
        a.reset()
        #expect(d.stderr.wait(forLineWith: ["client disconnected", a.address]))
        let again = try d.connect()
        again.expectOpen()
        b.expectOpen()
    }
}
