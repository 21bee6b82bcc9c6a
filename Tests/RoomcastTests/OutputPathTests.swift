import Glibc
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

/// The daemon's output path without the event loop: the raw output queue,
/// broadcasts into the connection table, direct writes of large frames and
/// the sweep that frees idle connections' buffers (the fan-out fast path).
@Suite struct OutputPathTests {
    @Test func outputQueueAppendsConsumesGrowsAndSlides() {
        var q = OutputQueue()
        defer { q.release() }
        var model: [UInt8] = []
        var rng = SeededGenerator(state: 5)
        for round in 0..<2_000 {
            let n = Int.random(in: 0...700, using: &rng)
            let chunk = (0..<n).map { UInt8(truncatingIfNeeded: $0 &+ round) }
            chunk.withUnsafeBytes { q.append($0) }
            model += chunk
            let take = Int.random(in: 0...model.count, using: &rng)
            q.withReadableBytes { #expect(Array($0) == model) }
            q.consume(take, keepCapacity: 1 << 20)
            model.removeFirst(take)
            #expect(q.count == model.count)
        }
        q.consume(q.count, keepCapacity: 0)
        #expect(q.isEmpty && q.capacity == 0, "an emptied queue over keepCapacity gives its storage back")
    }

    /// A table with `n` connections on socketpairs; returns the peer ends.
    static func table(_ n: Int, hard: Int = 1 << 20) -> (ConnectionTable, [Int32], [Int32]) {
        let t = ConnectionTable(fanout: Fanout(outputHardBytes: hard, relaySettings: RelaySettings()))
        var ours: [Int32] = [], peers: [Int32] = []
        for i in 0..<n {
            var sv: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue), 0, &sv) == 0)
            #expect(t.add(fd: sv[0], dialect: .ltb, address: "127.0.0.1:\(1000 + i)") == i)
            ours.append(sv[0])
            peers.append(sv[1])
        }
        return (t, ours, peers)
    }

    static func drain(_ fd: Int32) -> [UInt8] {
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n <= 0 { return out }
            out += buf[0..<n]
        }
    }

    @Test("a pass stores each frame once; each recipient gets one send of its range, in order")
    func framesAreStoredOnceAndSentOncePerRecipient() {
        let (t, ours, peers) = Self.table(2)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        let small = FrameCodec.encode(type: 99, body: [1, 2, 3], byteOrder: .little)
        let large = FrameCodec.encode(type: 99, body: [UInt8](repeating: 7, count: 8_000), byteOrder: .little)
        #expect(small.withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0, 1], except: -1) } == 2)
        #expect(large.withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0, 1], except: -1) } == 2)
        #expect(t.fanout.batch.count == small.count + large.count, "each frame is stored once, whatever the recipients")
        for id in 0..<2 {
            #expect(t.fanout.outboxes[id].queue.count == 0, "nothing is copied per recipient")
            #expect(t.fanout.outboxes[id].pending == small.count + large.count)
        }
        #expect(t.fanout.flushList == [0, 1])
        #expect(Self.drain(peers[0]).isEmpty, "nothing is written before the end of the pass")
        for id in 0..<2 {
            guard case .all = t.fanout.write(id, keepCapacity: 0) else { Issue.record("connection \(id) was not flushed"); continue }
            #expect(Self.drain(peers[id]) == small + large, "both frames, in order")
        }
        t.fanout.endPass()
        #expect(t.fanout.batch.count == 0)
    }

    @Test("a recipient whose frames are not adjacent in the batch keeps its order (its earlier range is copied first)")
    func interleavedRoomsKeepOrder() {
        let (t, ours, peers) = Self.table(2)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        let frames = (0..<3).map { FrameCodec.encode(type: 99, body: [UInt8](repeating: UInt8($0), count: 10 + $0), byteOrder: .little) }
        _ = frames[0].withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0], except: -1) }
        _ = frames[1].withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [1], except: -1) }
        _ = frames[2].withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0], except: -1) }
        #expect(t.fanout.outboxes[0].queue.count == frames[0].count, "the first range moved to the queue")
        for id in 0..<2 { _ = t.fanout.write(id, keepCapacity: 0) }
        #expect(Self.drain(peers[0]) == frames[0] + frames[2])
        #expect(Self.drain(peers[1]) == frames[1])
        t.fanout.endPass()
    }

    @Test func idleBuffersAreFreedBySweepsBusyOnesKept() {
        let (t, ours, peers) = Self.table(2)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        let frame = FrameCodec.encode(type: 99, body: [UInt8](repeating: 1, count: 100), byteOrder: .little)
        func deliverAndDrain(_ ids: [Int]) {
            _ = frame.withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: ids, except: -1) }
            for id in ids {
                frame.withUnsafeBytes { t.fanout.outboxes[id].queue.append($0) }  // a backlog from an earlier pass
                _ = t.fanout.write(id, keepCapacity: 16 * 1024)  // as a flush does
            }
            t.fanout.endPass()
        }
        deliverAndDrain([0, 1])
        #expect(t.fanout.outboxes[0].queue.capacity > 0 && t.fanout.outboxes[1].queue.capacity > 0, "drained buffers are kept")
        #expect(t.fanout.sweepIdleBuffers() == 0, "both got a frame since the last sweep")
        deliverAndDrain([0])
        let idleCapacity = t.fanout.outboxes[1].queue.capacity
        #expect(t.fanout.sweepIdleBuffers() == idleCapacity, "the sweep reports what it freed")
        #expect(t.fanout.outboxes[1].queue.capacity == 0, "connection 1 got nothing for a sweep interval: freed")
        #expect(t.fanout.outboxes[0].queue.capacity > 0, "connection 0 is busy: kept")
        #expect(t.fanout.sweepIdleBuffers() > 0)
        #expect(t.fanout.outboxes[0].queue.capacity == 0)
    }

    /// A frame whose JSON form alone exceeds output_hard_bytes is skipped for
    /// that JSON client (it is not slow); LTB recipients still get it.
    @Test func oversizeTranslationIsSkippedNotAClose() {
        let t = ConnectionTable(fanout: Fanout(outputHardBytes: 1_000, relaySettings: RelaySettings()))
        var fds: [Int32] = []
        for (i, dialect) in [Dialect.ltb, .json].enumerated() {
            var sv: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue), 0, &sv) == 0)
            #expect(t.add(fd: sv[0], dialect: dialect, address: "127.0.0.1:\(2000 + i)") == i)
            fds += sv
        }
        defer { t.remove(0); t.remove(1); fds.forEach { close($0) } }
        // 400 control characters: 6 bytes each in JSON ("\u0001").
        let text = String(repeating: "\u{1}", count: 400)
        let frame = FrameCodec.encode(type: 2, body: ChatMessage(user: UserInfo(level: 1, name: "a", iconURL: ""), text: text).serialized(),
                                      byteOrder: .little)
        #expect(frame.count < 1_000)
        #expect(frame.withUnsafeBytes { t.fanout.broadcast($0, from: 0, to: [0, 1], except: -1) } == 1)
        #expect(t.closeList.isEmpty, "nobody is closed")
        #expect(t.fanout.skips.map(\.kind) == [.overOutputLimit] && t.fanout.skips.map(\.address) == ["127.0.0.1:2001"] && t.fanout.skips[0].bytes > 1_000)
        #expect(t.fanout.outboxes[0].pending == frame.count)
    }

    @Test func overTheHardLimitClosesOnlyThatRecipient() {
        let (t, ours, peers) = Self.table(2, hard: 300)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        let frame = FrameCodec.encode(type: 99, body: [UInt8](repeating: 1, count: 100), byteOrder: .little)
        _ = frame.withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0, 1], except: -1) }
        _ = t.fanout.write(1, keepCapacity: 0)  // 1 is flushed (its peer reads), 0 is not
        for _ in 0..<2 { _ = frame.withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0, 1], except: -1) } }
        #expect(t.closeList == [0])
        #expect(t.slots[0]?.closeReason?.text.contains("output_hard_bytes") == true)
        #expect(t.fanout.outboxes[1].pending == 2 * frame.count)
    }
}
