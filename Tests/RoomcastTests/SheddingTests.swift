import Glibc
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

/// `[limits] shed = text` in the fan-out (docs/protocol/rooms.md §6, "Shedding"),
/// without the event loop: connections on socketpairs whose peer stops
/// reading, so a flush leaves a real backlog above `output_soft_bytes`.
@Suite struct SheddingTests {
    static let soft = 64 << 10
    static let little = ByteOrder.little

    static func frame(_ type: UInt16, _ marker: UInt8, size: Int = 100) -> [UInt8] {
        FrameCodec.encode(type: type, body: [UInt8](repeating: marker, count: size), byteOrder: little)
    }

    /// Sends `frame` from `sender` to `members` and flushes them all, as the end of a pass does.
    @discardableResult
    static func pass(_ t: ConnectionTable, _ frame: [UInt8], from sender: Int, to members: [Int]) -> Int {
        let n = frame.withUnsafeBytes { t.fanout.broadcast($0, from: sender, to: members, except: -1) }
        let list = t.fanout.flushList
        t.fanout.flushList.removeAll()
        for id in list { _ = t.fanout.write(id, keepCapacity: 0, softBytes: soft, nowMs: 1) }
        t.fanout.endPass()
        return n
    }

    /// The frame types in `bytes` (whole LTB frames, little-endian), and the first body byte of each.
    static func frames(_ bytes: [UInt8]) -> [(type: UInt16, marker: UInt8)] {
        var out: [(UInt16, UInt8)] = []
        var p = 0
        while p + FrameCodec.headerSize <= bytes.count {
            let length = Int(bytes[p]) | Int(bytes[p + 1]) << 8 | Int(bytes[p + 2]) << 16 | Int(bytes[p + 3]) << 24
            let type = UInt16(bytes[p + 4]) | UInt16(bytes[p + 5]) << 8
            out.append((type, length > 0 ? bytes[p + 6] : 0))
            p += FrameCodec.headerSize + length
        }
        #expect(p == bytes.count, "whole frames only")
        return out
    }

    /// Makes connection 1 a slow consumer: a 1 MiB opaque frame it does not
    /// read leaves it a backlog above the soft limit (its soft clock runs).
    static func makeSlow(_ t: ConnectionTable, with big: [UInt8] = frame(42, 0xBB, size: 1 << 20)) {
        _ = big.withUnsafeBytes { t.fanout.broadcast($0, from: 0, to: [1], except: -1) }
        t.fanout.flushList.removeAll()
        guard case .partial(let pending, _, let becameSlow) = t.fanout.write(1, keepCapacity: 0, softBytes: soft, nowMs: 1) else {
            Issue.record("the kernel took 1 MiB at once")
            return
        }
        #expect(becameSlow && pending > soft)
        t.fanout.someoneSlow = true  // as the server does when it lists it in OutputWatch.overSoft
        t.fanout.endPass()
    }

    /// Reads what `peer` gets until the daemon side owes nothing, flushing as EPOLLOUT would.
    static func catchUp(_ t: ConnectionTable, _ id: Int, _ peer: Int32) -> [UInt8] {
        var got: [UInt8] = []
        for _ in 0..<10_000 {
            got += OutputPathTests.drain(peer)
            if case .all = t.fanout.write(id, keepCapacity: 0, softBytes: soft, nowMs: 2) {
                got += OutputPathTests.drain(peer)
                return got
            }
        }
        Issue.record("connection \(id) never caught up")
        return got
    }

    @Test("above output_soft_bytes a connection gets no texts of others; gifts, joins, leaves, notices, opaque frames and its own texts still come; caught up, the episode ends with its count")
    func textsOfOthersAreShedUntilCaughtUp() {
        let (t, ours, peers) = OutputPathTests.table(3, hard: 8 << 20)
        defer { for id in 0..<3 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        Self.makeSlow(t)
        let room = [0, 1, 2]
        let kept: [(UInt16, UInt8)] = [(0, 1), (1, 2), (3, 3), (9, 4), (42, 5)]  // join, leave, gift, notice, opaque
        #expect(Self.pass(t, Self.frame(2, 10), from: 0, to: room) == 2, "a text of another: not to the slow one")
        for (type, marker) in kept { #expect(Self.pass(t, Self.frame(type, marker), from: 0, to: room) == 3) }
        #expect(Self.pass(t, Self.frame(2, 11), from: 2, to: room) == 2)
        #expect(Self.pass(t, Self.frame(2, 12), from: 1, to: room) == 3, "its own text (the echo) is never shed")
        #expect(Self.pass(t, Self.frame(2, 13), from: -1, to: room) == 2, "a text from another daemon or the API is shed too")
        #expect(t.fanout.framesShed == 3)
        #expect(t.fanout.shedding == [1: 3])
        #expect(t.fanout.sheddingStarted == [Fanout.SheddingEpisode(id: 1, address: "127.0.0.1:1001", count: 1)], "one start per episode")
        t.fanout.sheddingStarted.removeAll()
        #expect(t.fanout.sheddingEnded.isEmpty, "not caught up yet")
        for id in [0, 2] { #expect(Self.frames(OutputPathTests.drain(peers[id])).filter { $0.type == 2 }.map(\.marker) == [10, 11, 12, 13]) }

        let got = Self.frames(Self.catchUp(t, 1, peers[1]))
        #expect(got.map(\.marker) == [0xBB] + kept.map(\.1) + [12], "every frame not shed, in order")
        #expect(t.fanout.sheddingEnded == [Fanout.SheddingEpisode(id: 1, address: "127.0.0.1:1001", count: 3)])
        #expect(t.fanout.shedding.isEmpty)
        t.fanout.sheddingEnded.removeAll()

        // Caught up: texts come again, and a new episode counts from 0.
        #expect(Self.pass(t, Self.frame(2, 14), from: 0, to: room) == 3)
        #expect(Self.frames(OutputPathTests.drain(peers[1])).map(\.marker) == [14])
        Self.makeSlow(t)
        #expect(Self.pass(t, Self.frame(2, 15), from: 0, to: room) == 2)
        #expect(t.fanout.shedding == [1: 1] && t.fanout.sheddingStarted.count == 1 && t.fanout.framesShed == 4)
    }

    @Test("shed = none (shedsText off): a slow consumer gets every text, as before shedding existed")
    func noShedding() {
        let (t, ours, peers) = OutputPathTests.table(2, hard: 8 << 20)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        t.fanout.shedsText = false
        Self.makeSlow(t)
        for i in 0..<5 { #expect(Self.pass(t, Self.frame(2, UInt8(i)), from: 0, to: [0, 1]) == 2) }
        #expect(t.fanout.framesShed == 0 && t.fanout.shedding.isEmpty && t.fanout.sheddingStarted.isEmpty)
        #expect(Self.frames(Self.catchUp(t, 1, peers[1])).map(\.marker) == [0xBB, 0, 1, 2, 3, 4])
        #expect(t.fanout.sheddingEnded.isEmpty)
    }

    @Test("a JSON recipient above the soft limit is shed the same way; a slot freed mid-episode forgets it")
    func jsonRecipientAndFreedSlot() {
        let (t, ours, peers) = OutputPathTests.table(1, hard: 8 << 20)
        var sv: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue), 0, &sv) == 0)
        #expect(t.add(fd: sv[0], dialect: .json, address: "127.0.0.1:2001") == 1)
        defer { t.remove(0); (ours + peers + sv).forEach { close($0) } }
        let user = UserInfo(level: 1, name: "a", iconURL: "https://img.example/a.png", room: nil)
        func text(_ s: String) -> [UInt8] {
            FrameCodec.encode(type: 2, body: ChatMessage(user: user, text: s).serialized(), byteOrder: .little)
        }
        Self.makeSlow(t, with: text(String(repeating: "x", count: 1 << 20)))
        #expect(t.fanout.outboxes[1].softSinceMs != nil)
        #expect(text("hi").withUnsafeBytes { t.fanout.broadcast($0, from: 0, to: [0, 1], except: -1) } == 1)
        #expect(t.fanout.batch(.json).count == 0, "not even translated for it")
        #expect(t.fanout.shedding == [1: 1])
        t.fanout.flushList.removeAll()
        _ = t.fanout.write(0, keepCapacity: 0)
        t.fanout.endPass()
        t.remove(1)
        #expect(t.fanout.shedding.isEmpty, "a reused slot starts with no episode")
    }
}
