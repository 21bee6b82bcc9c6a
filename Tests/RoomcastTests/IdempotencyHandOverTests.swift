// Idempotency-Key across a restart (issue 28 item 5): the keys the API
// remembers are carried in the hand-over state (record 0x4901, with the time
// each has left), so that the retry docs/api.md recommends, sent after a
// `systemctl restart`, gets the first reply instead of relaying a second
// paid gift. In-process, with HandOverTests' servers, fake fd store and
// manual clock; the API on a Unix socket (the daemon's own uid may ask).
import Foundation
import Glibc
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

@Suite("Idempotency-Key across a hand-over")
struct IdempotencyHandOverTests {
    static func gift(_ name: String) -> String {
        #"{"type": "gift", "user": {"name": "shop"}, "giftname": "\#(name)", "giftcount": 1}"#
    }

    /// POSTs a gift to /v1/rooms/r1/publish under `key` on `path`; the answer's status line and body.
    static func publish(_ node: HandOverTests.Node, _ path: String, key: String, gift name: String) throws -> String {
        let fd = APIHandOverTests.connectUnix(path)
        try #require(fd >= 0)
        defer { close(fd) }
        let body = gift(name)
        HandOverTests.send(fd, Array(("POST /v1/rooms/r1/publish HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \(key)\r\n"
                                      + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body).utf8))
        var text = try APIHandOverTests.answer(fd, from: node)
        for _ in 0..<20 where !text.hasSuffix("\n}\n") && !text.hasSuffix("}\n") {
            try node.tick()
            text += String(decoding: HandOverTests.drain(fd) ?? [], as: UTF8.self)
        }
        return text
    }

    /// The gifts among the frames readable on `fd` now.
    static func gifts(_ fd: Int32) -> Int { HandOverTests.frames(HandOverTests.drain(fd) ?? []).filter { $0.0 == 3 }.count }

    @Test("a gift by key, a restart, the same request again: the first reply, nothing relayed; another body: 422; after 5 minutes: forgotten")
    func keyCarriesOver() throws {
        let dir = try TempDirectory()
        let path = dir.path + "/api.sock"
        let sections = HandOverTests.config + "[api]\nlisten = unix:\(path)\n"
        let clock = HandOverTests.ManualClock()
        clock.nowMs = 1_000_000
        let a = try HandOverTests.Node(sections, clock: clock)
        let x = a.connect()
        HandOverTests.send(x.peer, HandOverTests.join("alice", room: "r1"))
        try a.tick()
        _ = HandOverTests.drain(x.peer)
        let first = try Self.publish(a, path, key: "gift-1", gift: "rose")
        #expect(first.hasPrefix("HTTP/1.1 200") && first.contains("{\"delivered\": 1}"), "\(first)")
        try a.tick()
        #expect(Self.gifts(x.peer) == 1)
        clock.nowMs += 60_000  // a minute of the 5 has passed

        let b = try HandOverTests.handOver(a, sections: sections)
        try b.tick()
        _ = HandOverTests.drain(x.peer)
        #expect(b.server.api.idempotency.count == 1, "the key came over")
        let retry = try Self.publish(b, path, key: "gift-1", gift: "rose")
        #expect(retry.hasPrefix("HTTP/1.1 200") && retry.contains("{\"delivered\": 1}"), "the first reply: \(retry)")
        let other = try Self.publish(b, path, key: "gift-1", gift: "yacht")
        #expect(other.hasPrefix("HTTP/1.1 422") && other.contains("idempotency_key_reused"), "\(other)")
        try b.tick()
        #expect(Self.gifts(x.peer) == 0, "the retry after the restart relayed a second gift")

        // The time left came over, not a fresh 5 minutes: 4 minutes on, it
        // is forgotten (the 40 ms between the processes are not counted).
        clock.nowMs += 4 * 60_000
        let y = b.connect()  // X's heartbeat deadline passed meanwhile
        HandOverTests.send(y.peer, HandOverTests.join("bob", room: "r1"))
        try b.tick()
        _ = HandOverTests.drain(y.peer)
        let later = try Self.publish(b, path, key: "gift-1", gift: "rose")
        #expect(later.hasPrefix("HTTP/1.1 200") && later.contains("{\"delivered\": 1}"), "\(later)")
        try b.tick()
        #expect(Self.gifts(y.peer) == 1, "forgotten after its 5 minutes, counted from the first request")
    }

    @Test("with a cluster: a keyed publish whose claim is in flight when the hand-over begins is relayed once; the retry on the next process gets its reply")
    func claimInFlightAtHandOver() throws {
        let redis = try RedisServer()
        let dir = try TempDirectory()
        let path = dir.path + "/api.sock"
        let sections = HandOverTests.config + "[api]\nlisten = unix:\(path)\n[cluster]\nredis = \(redis.address)\nname = ih\n"
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(sections, clock: clock)
        #expect(waitUntil(.seconds(5)) { _ = try? a.tick(); return a.server.cluster?.connected == true })
        let x = a.connect()
        HandOverTests.send(x.peer, HandOverTests.join("alice", room: "r1"))
        try a.tick()
        _ = HandOverTests.drain(x.peer)
        let fd = APIHandOverTests.connectUnix(path)
        try #require(fd >= 0)
        defer { close(fd) }
        let body = Self.gift("rose")
        // Redis takes the claim but answers only once the hand-over is under way
        // (stopped, then continued 50 ms later, within the 200 ms the hand-over waits).
        let pid = try #require(redis.child?.pid)
        redis.freeze()
        HandOverTests.send(fd, Array(("POST /v1/rooms/r1/publish HTTP/1.1\r\nHost: x\r\nIdempotency-Key: in-flight\r\n"
                                      + "Content-Length: \(body.utf8.count)\r\n\r\n" + body).utf8))
        #expect(waitUntil(.seconds(2)) { _ = try? a.tick(); return a.server.cluster!.claimsWaiting == 1 }, "the claim was sent")
        let thaw = Thread { usleep(50_000); kill(pid, SIGCONT) }
        thaw.start()
        // The reply is still to come: the hand-over begins (the API connection is closed, the backend will retry).
        let b = try HandOverTests.handOver(a, sections: sections)
        redis.thaw()
        #expect(waitUntil(.seconds(5)) { _ = try? b.tick(); return b.server.cluster?.connected == true })
        var got = HandOverTests.drain(x.peer) ?? []
        for _ in 0..<20 { try b.tick(); got += HandOverTests.drain(x.peer) ?? [] }
        #expect(HandOverTests.frames(got).filter { $0.0 == 3 }.count == 1, "relayed once, by the process that claimed it")
        let stored = (redis.cli(["GET", "roomcast:ih:idem:in-flight"]) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(stored.hasSuffix(" 1"), "its answer is in Redis, not left in progress: \(stored)")
        let retry = try Self.publish(b, path, key: "in-flight", gift: "rose")
        #expect(retry.hasPrefix("HTTP/1.1 200") && retry.contains("{\"delivered\": 1}"), "\(retry)")
        try b.tick()
        #expect(Self.gifts(x.peer) == 0, "the retry relayed a second gift")
    }

    @Test("the record round-trips; one outside the bounds (no key, a short fingerprint, more than 5 minutes) is dropped, not the state")
    func recordRoundTrips() throws {
        var state = HandOverState(stoppedReadingMs: 9, writer: "t")
        let fp = [UInt8](repeating: 7, count: 32)
        let good = HandOverState.IdempotencyEntry(key: Array("k".utf8), fingerprint: fp, delivered: 3, remainingMs: 1_000)
        state.idempotency = [
            good,
            .init(key: [], fingerprint: fp, delivered: 1, remainingMs: 1_000),
            .init(key: Array("s".utf8), fingerprint: [1, 2], delivered: 1, remainingMs: 1_000),
            .init(key: Array("t".utf8), fingerprint: fp, delivered: 1, remainingMs: 5 * 60_000 + 1),
            .init(key: [UInt8](repeating: 0x61, count: 256), fingerprint: fp, delivered: 1, remainingMs: 1_000),
        ]
        let back = try HandOverState.decode(state.encode())
        #expect(back.idempotency == [good])
        #expect(try HandOverState.decode(HandOverState(stoppedReadingMs: 9, writer: "t").encode()).idempotency.isEmpty,
                "an older writer: none")

        // A reader before the record sees an unknown tag: it skips it and keeps the rest.
        var older = state
        older.connections = [HandOverState.Record(key: 4)]
        var bytes = older.encode()
        var i = 24
        while i + 6 <= bytes.count {
            let tag = UInt16(bytes[i]) | UInt16(bytes[i + 1]) << 8
            let length = Int(bytes[i + 2]) | Int(bytes[i + 3]) << 8 | Int(bytes[i + 4]) << 16 | Int(bytes[i + 5]) << 24
            if tag == 0x4901 { bytes[i + 1] = 0x7E }  // 0x7E01: a tag no reader knows
            i += 6 + length
        }
        let crc = bytes.withUnsafeBytes { CRC32.checksum(UnsafeRawBufferPointer(rebasing: $0[24...])) }
        withUnsafeBytes(of: crc.littleEndian) { for k in 0..<4 { bytes[16 + k] = $0[k] } }
        let skipped = try HandOverState.decode(bytes)
        #expect(skipped.idempotency.isEmpty && skipped.connections.map(\.key) == [4])

        var cache = IdempotencyCache()
        cache.restore(back.idempotency, now: 50)
        #expect(cache.lookup("k", fingerprint: fp, now: 1_049) == .replay(delivered: 3))
        #expect(cache.lookup("k", fingerprint: fp, now: 1_050) == .unseen, "its 1,000 ms left, not 5 minutes")
        cache.remember("a", fingerprint: fp, delivered: 1, now: 100)
        cache.remember("b", fingerprint: fp, delivered: 2, now: 200)
        #expect(cache.carried(now: 300).map(\.remainingMs) == [299_800, 299_900], "oldest first, time left")
    }
}
