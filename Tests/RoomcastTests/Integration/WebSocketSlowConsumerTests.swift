// Slow WebSocket consumers (docs/protocol/rooms.md §6 and §15) with the real
// daemon: a client closed for `[limits] output_soft_bytes` or
// `output_hard_bytes` gets the rest of the frame it was receiving, whole,
// then a close frame 1013 "try again later", then the TCP close; one that
// never reads again is closed within the drain deadline all the same.
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("WebSocket slow consumers")
struct WebSocketSlowConsumerTests {
    /// 1 KiB opaque LTB frames numbered `range`, each one binary message of a
    /// `roomcast.ltb.v1` client.
    static func frames(_ range: Range<Int>) -> [[UInt8]] {
        range.map { i in
            var body = [UInt8](repeating: UInt8(truncatingIfNeeded: i), count: 1018)
            withUnsafeBytes(of: UInt32(i).littleEndian) { body.replaceSubrange(0..<4, with: $0) }
            return Wire.frame(Wire.opaque, body)
        }
    }

    /// Reads what `client` gets now that it reads again: binary messages that
    /// are, in order, the first of `sent`, then a close frame (its code and
    /// reason), then the TCP close. Records an issue for anything else (a
    /// frame cut by the close frame shows as a message that is not one of
    /// `sent`, or a close frame that does not parse).
    static func readUntilClose(_ client: WebSocketTestClient, sent: [[UInt8]],
                               sourceLocation: SourceLocation = #_sourceLocation) -> (messages: Int, code: UInt16?, reason: String) {
        var messages = 0
        while let f = client.receive(timeout: .seconds(10)) {
            switch f.opcode {
            case 0x2:
                guard messages < sent.count, f.payload == sent[messages] else {
                    Issue.record("message \(messages) is not the frame sent in that place (\(f.payload.count) bytes)",
                                 sourceLocation: sourceLocation)
                    return (messages, nil, "")
                }
                messages += 1
            case 0x8:
                #expect(client.connection.isClosed(within: .seconds(5)), "no TCP close after the close frame",
                        sourceLocation: sourceLocation)
                guard f.payload.count >= 2 else { return (messages, 1005, "") }
                return (messages, UInt16(f.payload[0]) << 8 | UInt16(f.payload[1]), String(decoding: f.payload[2...], as: UTF8.self))
            case 0x9:
                continue  // a ping
            default:
                Issue.record("unexpected opcode \(f.opcode)", sourceLocation: sourceLocation)
                return (messages, nil, "")
            }
        }
        Issue.record("the connection ended after \(messages) messages without a close frame", sourceLocation: sourceLocation)
        return (messages, nil, "")
    }

    @Test("above output_soft_bytes for output_soft_seconds: whole frames, then a close frame 1013, then EOF")
    func softLimit() throws {
        let d = try Daemon(["websocket.listen": "127.0.0.1:0", "limits.output_hard_bytes": "256K",
                            "limits.output_soft_bytes": "64K", "limits.output_soft_seconds": "1s", "protocol.echo": "no"])
        let sender = try d.connect()
        let slow = try WebSocketTestClient.open(d, subprotocol: "roomcast.ltb.v1", receiveBuffer: 4096)
        // About 220 KiB: under the hard limit, over the soft one even after the kernel buffers take their share.
        let sent = Self.frames(0..<220)
        try sender.sendRaw(sent.flatMap { $0 })
        #expect(d.stderr.wait(forLineWith: ["slow consumer", slow.address, "pending for", "REASON=output_soft_limit"],
                              timeout: .seconds(10)), "the soft-limit warning, as for the other dialects")
        let (messages, code, reason) = Self.readUntilClose(slow, sent: sent)
        #expect(code == 1013)
        #expect(reason == "slow consumer")
        #expect(messages < sent.count, "what it was owed past the frame it was receiving is dropped")
        sender.expectOpen()
    }

    @Test("own backlog over output_hard_bytes: whole frames, then a close frame 1013, then EOF")
    func hardLimit() throws {
        let d = try Daemon(["websocket.listen": "127.0.0.1:0", "limits.output_hard_bytes": "256K",
                            "limits.output_soft_bytes": "64K", "limits.output_soft_seconds": "1min", "protocol.echo": "no"])
        let sender = try d.connect()
        let slow = try WebSocketTestClient.open(d, subprotocol: "roomcast.ltb.v1", receiveBuffer: 4096)
        let sent = Self.frames(0..<2000)
        let warning = ["slow consumer", "output_hard_bytes", slow.address, "REASON=output_hard_limit"]
        for batch in 0..<40 where !d.stderr.wait(forLineWith: warning, timeout: .milliseconds(1)) {
            try sender.sendRaw(sent[batch * 50..<(batch + 1) * 50].flatMap { $0 })
        }
        #expect(d.stderr.wait(forLineWith: warning, timeout: .seconds(10)), "the hard-limit warning, as for the other dialects")
        let (messages, code, reason) = Self.readUntilClose(slow, sent: sent)
        #expect(code == 1013)
        #expect(reason == "slow consumer")
        #expect(messages < sent.count)
        let after = Wire.frame(Wire.opaque, [1])
        let other = try d.connect()
        try sender.send(after)
        #expect(other.receiveFrame()?.wire == after, "the relay goes on")
    }

    @Test("a slow WebSocket consumer that never reads again is still closed, within the drain deadline")
    func neverReads() throws {
        let d = try Daemon(["websocket.listen": "127.0.0.1:0", "limits.output_hard_bytes": "256K",
                            "limits.output_soft_bytes": "64K", "limits.output_soft_seconds": "1s", "protocol.echo": "no"])
        let sender = try d.connect()
        let slow = try WebSocketTestClient.open(d, subprotocol: "roomcast.ltb.v1", receiveBuffer: 4096)
        try sender.sendRaw(Self.frames(0..<220).flatMap { $0 })
        #expect(d.stderr.wait(forLineWith: ["slow consumer", slow.address, "REASON=output_soft_limit"], timeout: .seconds(10)))
        // The drain deadline is 5 s (docs/protocol/websocket.md §15); the bound here is generous for a loaded machine.
        #expect(d.stderr.wait(forLineWith: ["client disconnected", "CLIENT_ADDR=\(slow.address)"], timeout: .seconds(30)),
                "the daemon let go of a client that does not read")
        sender.expectOpen()
    }
}
