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
        #expect(t.fanout.batch(.ltb).count == small.count + large.count, "each frame is stored once, whatever the recipients")
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
        #expect(t.fanout.batch(.ltb).count == 0)
    }

    @Test("a broadcast stores each WebSocket form once (a binary frame of the LTB frame, a text frame of the JSON body), never per recipient")
    func webSocketFormsAreStoredOncePerBroadcast() {
        let (t, ours, peers) = Self.table(6)
        defer { for id in 0..<6 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        for id in 1...2 { t.fanout.outboxes[id].isWebSocket = true; t.fanout.outboxes[id].webSocketForm = .ltb }
        for id in 3...4 { t.fanout.outboxes[id].isWebSocket = true; t.fanout.outboxes[id].webSocketForm = .json }
        t.fanout.outboxes[5].isWebSocket = true  // upgrading: gets nothing
        let s = RelaySettings()
        let frame = FrameCodec.encode(type: s.textType, body: ChatMessage(user: UserInfo(level: 0, name: "a", iconURL: ""), text: "hi").serialized(),
                                      byteOrder: s.byteOrder)
        #expect(frame.withUnsafeBytes { t.fanout.broadcast($0, from: 0, to: Array(0..<6), except: -1) } == 5)
        let json = Array(#"{"cmd":"msg","content":"hi","from":"a"}"#.utf8)
        let binary = [0x82, UInt8(frame.count)] + frame
        let text = [0x81, UInt8(json.count)] + json
        #expect(t.fanout.batch(.ltb).count == frame.count && t.fanout.batch(.webSocketBinary).count == binary.count
                && t.fanout.batch(.webSocketText).count == text.count, "each form once, whatever the recipients, each in its region")
        for id in 0..<5 { _ = t.fanout.write(id, keepCapacity: 0) }
        #expect(Self.drain(peers[0]) == frame)
        for id in 1...2 { #expect(Self.drain(peers[id]) == binary, "one binary message, the LTB frame byte for byte") }
        for id in 3...4 { #expect(Self.drain(peers[id]) == text, "one text message, the JSON form the JSON listener sends") }
        #expect(Self.drain(peers[5]).isEmpty)
        t.fanout.endPass()
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

    /// Sets SO_SNDBUF of `fd` (Linux doubles it, socket(7)), as the daemon
    /// does for client sockets (`Socket.clientSendBuffer`).
    static func setSendBuffer(_ fd: Int32, _ bytes: Int32) {
        var size = bytes
        #expect(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size)) == 0)
    }

    /// `count` frames of `size` body bytes, each numbered in its first 4 bytes.
    static func burst(_ count: Int, size: Int) -> [[UInt8]] {
        (0..<count).map { i in
            var body = [UInt8](repeating: UInt8(truncatingIfNeeded: i), count: size)
            withUnsafeBytes(of: UInt32(i).littleEndian) { body.replaceSubrange(0..<4, with: $0) }
            return FrameCodec.encode(type: 99, body: body, byteOrder: .little)
        }
    }

    /// The end-of-pass flushes, then the reads of readers that keep up, then
    /// more flushes (as EPOLLOUT would bring them) until nothing is owed.
    /// - Returns: what each reader got, by index into `readers`.
    static func flushUntilDrained(_ t: ConnectionTable, ids: [Int], readers peers: [Int32]) -> [[UInt8]] {
        var got = [[UInt8]](repeating: [], count: ids.count)
        for _ in 0..<100 {
            for id in ids { _ = t.fanout.write(id, keepCapacity: 0) }
            t.fanout.endPass()
            for (i, fd) in peers.enumerated() { got[i] += drain(fd) }
            if ids.allSatisfy({ t.fanout.outboxes[$0].pending == 0 || t.state($0) == .closing }) { break }
        }
        return got
    }

    @Test("one pass holding a 200 KiB burst with output_hard_bytes = 128K cuts neither the sender (echo) nor a reader with nothing queued")
    func burstOverTheHardLimitCutsNoReaderThatReads() {
        let hard = 128 << 10
        let (t, ours, peers) = Self.table(3, hard: hard)
        defer { for id in 0..<3 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        for fd in ours { Self.setSendBuffer(fd, 64 << 10) }
        let frames = Self.burst(25, size: 8 << 10 - 6)  // 25 x 8 KiB = 200 KiB, read in one pass
        for f in frames {
            #expect(f.withUnsafeBytes { t.fanout.broadcast($0, from: 0, to: [0, 1, 2], except: -1) } == 3)
        }
        #expect(t.closeList.isEmpty, "the pass's range is the shared batch, not any recipient's memory")
        let got = Self.flushUntilDrained(t, ids: [0, 1, 2], readers: peers)
        #expect(t.closeList.isEmpty, "readers that read are never cut: \(t.closeList.map { t.slots[$0]?.closeReason?.text ?? "" })")
        for i in 0..<3 { #expect(got[i] == frames.flatMap { $0 }, "connection \(i): all 200 KiB, in order") }
    }

    @Test("frames of a 200 KiB pass that are not adjacent in the batch (two rooms) are sent before they are copied past output_hard_bytes")
    func interleavedBurstIsSentBeforeItIsCopied() {
        let hard = 128 << 10
        let (t, ours, peers) = Self.table(2, hard: hard)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        for fd in ours { Self.setSendBuffer(fd, 64 << 10) }
        let a = Self.burst(25, size: 8 << 10 - 6), b = Self.burst(25, size: 100)
        for i in 0..<25 {
            _ = a[i].withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0], except: -1) }
            _ = b[i].withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [1], except: -1) }
        }
        #expect(t.closeList.isEmpty)
        #expect(t.fanout.outboxes[0].queue.count <= hard + a[0].count, "its own copy stays within the limit and one frame")
        let got = Self.flushUntilDrained(t, ids: [0, 1], readers: peers)
        #expect(t.closeList.isEmpty)
        #expect(got[0] == a.flatMap { $0 } && got[1] == b.flatMap { $0 }, "each room's frames, in order")
    }

    @Test("a reader that stops reading is cut once what it owed before a pass, after the kernel took what it could, passes output_hard_bytes; not before")
    func readerThatStopsIsCutAtItsOwnBacklog() {
        let hard = 64 << 10
        let (t, ours, peers) = Self.table(2, hard: hard)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        for fd in ours { Self.setSendBuffer(fd, 4096) }
        let frames = Self.burst(200, size: 4090)  // 4 KiB frames, one per pass
        var cutAt: Int?
        for (pass, f) in frames.enumerated() {
            let backlog = t.fanout.outboxes[1].queue.count
            _ = f.withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0, 1], except: -1) }
            #expect(t.state(1) != .closing, "not cut in the broadcast (pass \(pass), backlog \(backlog))")
            for id in 0..<2 { _ = t.fanout.write(id, keepCapacity: 0) }
            t.fanout.endPass()
            _ = Self.drain(peers[0])  // 0 reads, 1 never does
            if t.state(1) == .closing {
                cutAt = pass
                #expect(backlog > hard, "cut only when what it owed before this pass is over the limit (backlog \(backlog))")
                break
            }
            #expect(t.fanout.outboxes[1].queue.count <= hard + f.count, "an open reader's own backlog is within the limit and one pass's frames")
        }
        let pass = try? #require(cutAt, "the reader that stopped was never cut")
        #expect(pass.map { $0 > hard / 4096 - 4 } == true, "cut at pass \(pass ?? -1), after about 64 KiB of its own backlog")
        #expect(t.slots[1]?.closeReason?.text.contains("output_hard_bytes (64K)") == true, "\(t.slots[1]?.closeReason?.text ?? "")")
        #expect(t.slots[1]?.closeReason?.warning == "output_hard_limit")
        #expect(t.state(0) == .open && t.fanout.outboxes[0].pending == 0, "the reader that reads is untouched")
    }

    @Test("a partial flush of a connection whose queue holds only this pass's copies asks for EPOLLOUT (it had no backlog)")
    func copiesOfThePassAreNoBacklog() {
        let (t, ours, peers) = Self.table(2, hard: 1 << 20)
        defer { for id in 0..<2 { t.remove(id) }; (ours + peers).forEach { close($0) } }
        Self.setSendBuffer(ours[0], 4096)
        let big = Self.burst(8, size: 4090)
        for f in big {  // not adjacent: each range of 0's is copied into its queue
            _ = f.withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [0], except: -1) }
            _ = f.withUnsafeBytes { t.fanout.broadcast($0, from: 9, to: [1], except: -1) }
        }
        #expect(t.fanout.outboxes[0].queue.count > 0)
        guard case .partial(_, let hadBacklog, _) = t.fanout.write(0, keepCapacity: 0) else {
            Issue.record("expected a partial write")
            return
        }
        #expect(!hadBacklog, "nothing armed EPOLLOUT for it: the flush must (else the rest waits for the room's next frame)")
        _ = t.fanout.write(1, keepCapacity: 0)
        t.fanout.endPass()
    }
}
