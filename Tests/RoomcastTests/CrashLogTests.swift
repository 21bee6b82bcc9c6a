// The crash path's budget and its composition with restarts, in-process (the
// fake fd store of HandOverTests): a torn frame through a restart and then a
// crash, a trickled frame's log cost, input logged before it is processed,
// closed connections' kernel memory, a damaged live box, the slow-consumer
// clock, the state's size cap, 64-bit serials and the random seed.
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("Crash log (live box and log) budget and composition")
struct CrashLogTests {
    typealias Node = HandOverTests.Node
    typealias ManualClock = HandOverTests.ManualClock
    static let config = HandOverTests.config
    static func send(_ fd: Int32, _ bytes: [UInt8]) { HandOverTests.send(fd, bytes) }
    static func drain(_ fd: Int32) -> [UInt8]? { HandOverTests.drain(fd) }
    static func frames(_ bytes: [UInt8]) -> [(UInt16, [UInt8])] { HandOverTests.frames(bytes) }
    static func join(_ name: String, room: String) -> [UInt8] { HandOverTests.join(name, room: room) }

    typealias Client = (id: Int, peer: Int32)

    /// A node whose room "r" has a sender X and a reader W that reads
    /// nothing (4 KiB send buffer: the kernel soon refuses its output).
    static func senderAndSlowReader(_ sections: String = config, maxStateBytes: Int = Server.maxStateBytes) throws -> (Node, x: Client, w: Client) {
        let a = try Node(sections, clock: ManualClock(), maxStateBytes: maxStateBytes)
        let x = a.connect(), w = a.connect(sendBuffer: 4096)
        Self.send(x.peer, Self.join("xavier", room: "r"))
        Self.send(w.peer, Self.join("wendy", room: "r"))
        try a.tick()
        _ = [x, w].map { Self.drain($0.peer) }
        return (a, x, w)
    }

    /// A frame from `from` reaches `to`: the connections are served.
    static func expectServed(_ node: Node, from: Client, to: Client, _ what: String = "") throws {
        Self.send(from.peer, FrameCodec.encode(type: 100, body: [1, 2, 3], byteOrder: .little))
        try node.tick()
        #expect(Self.frames(Self.drain(to.peer) ?? []).contains { $0.1 == [1, 2, 3] }, "\(what) served")
    }

    /// What the live log of `node` says now, by serial.
    static func liveLog(_ node: Node) throws -> [UInt64: LiveLog.Connection] {
        let live = node.server.live!
        let raw = UnsafeRawBufferPointer(start: live.map!, count: live.capacity)
        return try Result { () throws(HandOverState.DecodeError) in try LiveLog.replay(raw) }.get()
    }

    /// The node's connection for a test client (ids are the node's own).
    static func id(_ node: Node, _ c: (id: Int, peer: Int32)) -> Int {
        node.server.table.ids.first { node.server.table.address(of: $0) == "peer-\(c.peer)" }!
    }

    /// A crash of `node`: the next node gets only what it stored.
    static func crash(_ node: Node) throws -> Node {
        node.notify.update()
        return try Node(config, clock: node.clock, stored: node.notify.passed)
    }

    @Test("a restart then a crash: a slow reader's half-sent frame is finished first, and its stream stays well-framed")
    func restartThenCrashKeepsTornFrameWhole() throws {
        let (a, x, w) = try Self.senderAndSlowReader()
        let big = FrameCodec.encode(type: 100, body: (0..<40_000).map { UInt8(truncatingIfNeeded: $0 * 7) }, byteOrder: .little)
        Self.send(x.peer, big)
        try a.tick()
        let tornBefore = a.server.table.fanout.outboxes[w.id].torn
        #expect(tornBefore > 0, "W got part of the frame")
        var got = Self.drain(w.peer) ?? []

        let b = try HandOverTests.handOver(a)
        let wB = Self.id(b, w)
        // B may have written some of it already (W read what A's kernel took).
        let tornB = b.server.table.fanout.outboxes[wB].torn
        let written = tornBefore - tornB
        #expect(tornB > 0 && written >= 0, "the count of bytes owed to finish the frame carries over the restart (\(tornBefore) before, \(tornB) after)")
        let serial = b.server.live!.slot(wB).serial
        let logged = try Self.liveLog(b)[serial]?.torn
        #expect(logged == Array(big.suffix(tornB)), "and the new process's live log has those bytes (\(logged?.count ?? 0))")
        // More frames owed to W in B, then B crashes before W reads anything.
        Self.send(x.peer, FrameCodec.encode(type: 100, body: [1, 2, 3], byteOrder: .little))
        try b.tick()
        let c = try Self.crash(b)
        #expect(c.server.table.count == 2 && c.log.contains("after a crash"))
        Self.send(x.peer, FrameCodec.encode(type: 100, body: [4, 5], byteOrder: .little))
        for _ in 0..<100 {
            try c.tick()
            got += Self.drain(w.peer) ?? []
        }
        #expect(Array(got.prefix(big.count)) == big, "the half-sent frame arrives whole")
        let bodies = Self.frames(Array(got.dropFirst(big.count))).map(\.1)
        #expect(bodies.last == [4, 5], "what follows is framed: \(bodies.map(\.count))")
        #expect(bodies.allSatisfy { $0 == [4, 5] || $0 == [1, 2, 3] || $0 == Array(big[6...]) }, "no frame is made of another's bytes")
        [x, w].forEach { close($0.peer) }
    }

    @Test("a frame trickled in 8-byte pieces appends to the log: one generation, one store; a crash mid-frame keeps every byte")
    func trickledFrameIsAppended() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        let x = a.connect(), y = a.connect()
        try a.tick()
        a.notify.update()
        let generation = a.server.live!.logGeneration
        let frame = FrameCodec.encode(type: 100, body: (0..<65_536).map { UInt8(truncatingIfNeeded: $0) }, byteOrder: .little)
        var sent = 0
        while sent < frame.count - 8 {
            let n = min(8, frame.count - 8 - sent)
            Self.send(x.peer, Array(frame[sent..<(sent + n)]))
            sent += n
            try a.tick()
        }
        #expect(a.server.table.slots[x.id]!.input.count == sent)
        #expect(a.server.live!.logGeneration == generation, "no compaction: \(a.server.live!.logGeneration - generation) new log generations")
        a.notify.update()
        let stores = a.notify.receive().count
        #expect(stores == 0, "no new store for PID 1 while the frame trickles in (\(stores))")
        // 17 bytes of record header per read (length, kind, serial, byte count): O(n), where rewriting the frame was O(n²).
        #expect(a.server.live!.committed < 8_200 * (17 + 8), "the log holds each byte once, plus a record header per read (\(a.server.live!.committed) bytes)")
        // A crash now: the next process has the partial frame, byte for byte.
        let b = try Self.crash(a)
        #expect(b.server.table.slots[Self.id(b, x)]!.input == Array(frame[0..<sent]))
        _ = Self.drain(y.peer)
        Self.send(x.peer, Array(frame[sent...]))
        try b.tick()
        let got = Self.frames(Self.drain(y.peer) ?? [])
        #expect(got.count == 1 && got.first?.1 == Array(frame[6...]), "the frame completed after the crash is relayed whole")
        [x, y].forEach { close($0.peer) }
    }

    @Test("superseded stores are coalesced: one pending store per kind while PID 1 does not read")
    func supersededStoresAreCoalesced() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        let x = a.connect()
        try a.tick()
        a.notify.update()
        // PID 1 stops reading: its queue fills (net.unix.max_dgram_qlen), stores wait.
        let live = a.server.live!
        for _ in 0..<40 { a.server.rebuildLiveLog() }
        #expect(live.pendingStores.filter { $0.name.hasPrefix("livestate-") }.count <= 1, "\(live.pendingStores.map(\.name))")
        let waiting = live.pendingStores.flatMap(\.fds).count
        #expect(waiting <= 2, "at most one descriptor per kind waits for PID 1 (\(waiting))")
        a.notify.update()
        try a.tick()
        a.notify.update()
        #expect(live.pendingStores.isEmpty)
        let logs = a.notify.store.keys.filter { $0.hasPrefix("livestate-") }
        #expect(logs == ["livestate-\(live.logGeneration)"], "PID 1 ends with the newest log only: \(logs.sorted())")
        close(x.peer)
    }

    @Test("the read is in the live log before its frames are handled: a crash while handling them cuts no frame")
    func inputIsLoggedBeforeProcessing() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        let x = a.connect(), y = a.connect()
        try a.tick()
        let serial = a.server.live!.slot(x.id).serial
        let f1 = FrameCodec.encode(type: 100, body: [1, 1, 1], byteOrder: .little)
        let f2 = FrameCodec.encode(type: 100, body: [2, 2, 2, 2], byteOrder: .little)
        Self.send(x.peer, Array(f1[0..<5]))
        try a.tick()
        var seen: [[UInt8]] = []
        // unowned: the server holds the hook, and a Node holding the server
        // in the hook would be a cycle (LeakSanitizer under make test-asan).
        a.server.beforeFrame = { [unowned a] id in
            if id == x.id { seen.append((try? Self.liveLog(a))?[serial]?.input ?? [0xEE]) }
        }
        // The rest of f1, f2 whole, and 4 bytes of a third frame in one read.
        Self.send(x.peer, Array(f1[5...]) + f2 + Array(f1[0..<4]))
        try a.tick()
        #expect(seen == [Array(f1[0..<4]), Array(f1[0..<4])], "while f1 and f2 are handled, the log already has the partial frame that follows")
        #expect(try Self.liveLog(a)[serial]?.input == Array(f1[0..<4]))
        [x, y].forEach { close($0.peer) }
    }

    /// A loopback TCP connection accepted by the test (`server.open` takes the accepted side).
    static func tcpPair() -> (client: Int32, server: Int32, serverPort: UInt16, clientPort: UInt16) {
        let l = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(l, $0, len) } }
        listen(l, 4)
        _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(l, $0, &len) } }
        let c = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        _ = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(c, $0, len) } }
        let s = accept(l, nil, nil)
        close(l)
        _ = fcntl(s, F_SETFL, O_NONBLOCK)
        var b = sockaddr_in()
        _ = withUnsafeMutablePointer(to: &b) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(c, $0, &len) } }
        return (c, s, UInt16(bigEndian: a.sin_port), UInt16(bigEndian: b.sin_port))
    }

    /// The bytes waiting to be read on the copy, in the live box of `node`,
    /// of the socket whose peer is on `port` (recv MSG_PEEK); nil when the
    /// box holds no such socket. Drains a duplicate of the box's read end.
    static func unreadInBox(_ node: Node, peerPort port: UInt16) -> Int? {
        let copy = dup(node.server.live!.box!.readEnd)
        var found: Int?
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        for e in HandOverBox.drain(copy).entries {
            var a = sockaddr_in()
            var len = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(e.fd, $0, &len) } }
            if UInt16(bigEndian: a.sin_port) == port {
                found = max(0, buffer.withUnsafeMutableBytes { recv(e.fd, $0.baseAddress, $0.count, Int32(MSG_PEEK | MSG_DONTWAIT)) })
            }
            close(e.fd)
        }
        return found
    }

    @Test("a closed connection's unread input is dropped, though the live box keeps a copy of its socket")
    func closeDropsUnreadInput() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        let (client, serverSide, _, clientPort) = Self.tcpPair()
        let id = a.server.open(fd: serverSide, dialect: .ltb, address: "tcp-client", now: clock.nowMs)!
        try a.tick()
        #expect(a.server.live!.boxed == 1, "in the live box")
        // A header over max_frame_bytes, then 120 KiB the daemon never reads: it closes at the header.
        var bytes = [UInt8](repeating: 0xFF, count: 6)
        bytes += [UInt8](repeating: 1, count: 120 * 1024)
        let sent = bytes.withUnsafeBytes { Glibc.send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        #expect(sent > 100_000)
        usleep(20_000)
        try a.tick()
        #expect(a.server.table.slots[id] == nil, "closed for the frame's length")
        #expect(a.server.live!.dead == 1, "its copy is still in the box")
        let unread = Self.unreadInBox(a, peerPort: clientPort)
        #expect(unread == 0, "the box's copy keeps no unread input in kernel memory (\(unread.map(String.init) ?? "not in the box") bytes)")
        close(client)
    }

    @Test("a box whose closed connections pin more than deadBytesBeforeRebuild of send queues is rebuilt, however few they are")
    func deadBytesTriggerRebuild() throws {
        let (a, x, w) = try Self.senderAndSlowReader()
        a.server.live!.deadBytesBeforeRebuild = 8 * 1024
        Self.send(x.peer, FrameCodec.encode(type: 100, body: [UInt8](repeating: 3, count: 60_000), byteOrder: .little))
        try a.tick()
        let generation = a.server.live!.boxGeneration
        a.server.table.close(w.id, "test")
        try a.tick()
        #expect(a.server.live!.boxGeneration == generation + 1, "rebuilt with one dead entry holding a full send queue")
        #expect(a.server.live!.dead == 0 && a.server.live!.deadBytes == 0)
        [x, w].forEach { close($0.peer) }
    }

    @Test("after a crash, a damaged live box's connections are served with fresh state, not closed")
    func damagedLiveBoxIsServedFresh() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        let x = a.connect(), y = a.connect()
        Self.send(x.peer, Self.join("alice", room: "r1"))
        Self.send(y.peer, Self.join("bob", room: "r1"))
        try a.tick()
        a.notify.update()
        // Damage the box: the same descriptors, with keys that do not pair up.
        let name = a.notify.store.keys.first { $0.hasPrefix("livebox-") }!
        let fds = HandOverBox.drain(a.notify.store[name]!.removeFirst()).entries.map(\.fd)
        #expect(fds.count == 2)
        let damaged = try HandOverBox.make()
        _ = [UInt8](repeating: 1, count: 3).withUnsafeBytes { Sys.sendDescriptors(damaged.writeEnd, $0, fds) }
        damaged.seal()
        fds.forEach { close($0) }
        a.notify.store[name] = [damaged.readEnd]
        let b = try Node(Self.config, clock: clock, stored: a.notify.passed)
        let log = b.log
        #expect(b.server.table.count == 2, "both clients kept: \(log)")
        #expect(log.contains("REASON=handover_box_damaged"), "\(log)")
        #expect(b.server.relay.memberCount(of: "lobby") == 2, "with fresh state: the default room")
        try Self.expectServed(b, from: x, to: y, "and")
        [x, y].forEach { close($0.peer) }
    }

    @Test("the slow-consumer clock goes on across a restart: cut after output_soft_seconds in all, not again in full")
    func softLimitClockCarriesOver() throws {
        let sections = Self.config + "output_soft_bytes = 16K\noutput_soft_seconds = 10s\n"
        let (a, x, w) = try Self.senderAndSlowReader(sections)
        let clock = a.clock
        Self.send(x.peer, FrameCodec.encode(type: 100, body: [UInt8](repeating: 3, count: 60_000), byteOrder: .little))
        try a.tick()
        #expect(a.server.table.fanout.outboxes[w.id].softSinceMs == clock.nowMs, "W went over output_soft_bytes")
        clock.nowMs += 7_000
        try a.tick()
        let b = try HandOverTests.handOver(a, sections: sections)
        let wB = Self.id(b, w)
        clock.nowMs += 2_000
        try b.tick()
        #expect(b.server.table.slots[wB] != nil, "9 s over the limit: not yet")
        clock.nowMs += 1_500
        try b.tick()
        #expect(b.server.table.slots[wB] == nil, "cut at 10 s over the limit, counted across the restart")
        #expect(b.server.table.count == 1, "the sender stays")
        [x, w].forEach { close($0.peer) }
    }

    @Test("the hand-over state stays under what the next process reads: the biggest backlogs are closed, everyone else keeps their state")
    func stateStaysUnderReaderLimit() throws {
        let clock = ManualClock()
        let limit = 48 * 1024
        let a = try Node(Self.config, clock: clock, maxStateBytes: limit)
        let x = a.connect(), y = a.connect(), w = a.connect(sendBuffer: 4096)
        for (c, n) in [(x, "x"), (y, "y"), (w, "w")] { Self.send(c.peer, Self.join(n, room: "r")) }
        try a.tick()
        for _ in 0..<2 {
            Self.send(x.peer, FrameCodec.encode(type: 100, body: [UInt8](repeating: 3, count: 30_000), byteOrder: .little))
            try a.tick()
            _ = [x, y].map { Self.drain($0.peer) }
        }
        #expect(a.server.table.fanout.outboxes[w.id].queue.count > limit, "W owes more than the state may hold")
        let b = try HandOverTests.handOver(a, maxStateBytes: limit)
        let log = a.log + b.log
        #expect(log.contains("REASON=handover_state_too_large"), "\(log)")
        #expect(!log.contains("handover_state_unreadable") && !log.contains("fresh state"), "the state was read: \(log)")
        #expect(b.server.table.count == 2 && b.server.relay.memberCount(of: "r") == 2, "X and Y keep their room")
        #expect(Self.drain(w.peer) == nil || Self.drain(w.peer) == nil, "W is closed")
        [x, y, w].forEach { close($0.peer) }
    }

    @Test("the live log stays under what the next process reads: a partial frame it cannot hold closes that client after a crash, never splices it")
    func liveLogIsBounded() throws {
        let clock = ManualClock()
        let limit = 64 * 1024
        let a = try Node(Self.config, clock: clock, maxStateBytes: limit)
        let x = a.connect(), y = a.connect(), z = a.connect()
        Self.send(z.peer, Self.join("z", room: "r"))
        try a.tick()
        let frame = FrameCodec.encode(type: 100, body: [UInt8](repeating: 5, count: 60_000), byteOrder: .little)
        Self.send(x.peer, Array(frame[0..<50_000]))
        try a.tick()
        Self.send(y.peer, Array(frame[0..<16_000]))
        try a.tick()
        #expect(a.server.live!.capacity <= limit, "the log is \(a.server.live!.capacity) bytes")
        #expect(a.log.contains("cannot hold 1 connection"))
        let b = try Self.crash(a)
        #expect(b.server.table.count == 2, "X, whose partial frame the log could not hold, is closed: \(b.log)")
        #expect(b.server.table.slots[Self.id(b, y)]!.input == Array(frame[0..<16_000]))
        #expect(b.server.relay.memberCount(of: "r") == 1)
        [x, y, z].forEach { close($0.peer) }
    }

    @Test("serials past 2^32 survive a crash (64-bit in the log and the box)")
    func serialsPast32Bits() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        a.server.live!.nextSerial = UInt64(UInt32.max) - 1
        let x = a.connect(), y = a.connect(), z = a.connect()
        Self.send(x.peer, Self.join("x", room: "r1"))
        Self.send(y.peer, Self.join("y", room: "r1"))
        Self.send(z.peer, Self.join("z", room: "r2"))
        try a.tick()
        #expect(a.server.live!.slot(z.id).serial > UInt64(UInt32.max))
        let b = try Self.crash(a)
        #expect(b.server.relay.memberCount(of: "r1") == 2 && b.server.relay.memberCount(of: "r2") == 1, "\(b.log)")
        [x, y, z].forEach { close($0.peer) }
    }

    @Test("the random seed never blocks: getrandom's EAGAIN (early boot) falls back to /dev/urandom")
    func randomSeedFallsBack() {
        var calls = 0
        let seed = Sys.randomSeed { _, _ in
            calls += 1
            errno = EAGAIN
            return -1
        }
        #expect(calls == 1 && seed != 0)
        #expect(Sys.randomSeed() != Sys.randomSeed(), "two draws differ")
    }
}
