// A restart that keeps the clients, in-process: server A hands its
// connections over (box + state memfd, through a fake notify socket that
// plays systemd's fd store), server B takes them back as its start would,
// and the clients (socketpairs) go on as if nothing happened. Manual clocks:
// heartbeat time left and token buckets are checked exactly.
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("Hand-over between two servers (socketpairs, a fake fd store)")
struct HandOverTests {
    final class ManualClock: @unchecked Sendable {
        var nowMs: UInt64 = 5_000_000
    }

    /// What a fake PID 1 received on its notify socket.
    struct Notification {
        var text: String
        var fds: [Int32]
        var name: String? { text.split(separator: "\n").first { $0.hasPrefix("FDNAME=") }.map { String($0.dropFirst(7)) } }
    }

    /// A notify socket bound in /tmp, read by the test (PID 1's side).
    final class FakeNotify {
        let fd: Int32
        let path: String

        init() {
            path = "/tmp/roomcast-handover-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
            var a = sockaddr_un()
            a.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &a.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
            let ok = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
            precondition(ok == 0)
        }

        deinit {
            close(fd)
            unlink(path)
        }

        /// PID 1's fd store as the notifications so far left it (FDSTORE=1,
        /// FDSTOREREMOVE=1; barrier descriptors are closed at once).
        var store: [String: [Int32]] = [:]
        /// FileDescriptorStoreMax=: PID 1 closes what does not fit, and only
        /// its journal says so (systemd 252, measured).
        var max = Int.max
        /// Descriptors dropped for `max`.
        var refused = 0

        /// Reads what was sent and applies it to `store`.
        func update() {
            for n in receive() {
                let lines = n.text.split(separator: "\n")
                if lines.contains("FDSTORE=1"), let name = n.name {
                    let room = max - store.values.reduce(0) { $0 + $1.count }
                    store[name, default: []] += n.fds.prefix(Swift.max(0, room))
                    n.fds.dropFirst(Swift.max(0, room)).forEach { close($0) }
                    refused += Swift.max(0, n.fds.count - Swift.max(0, room))
                    if store[name]!.isEmpty { store[name] = nil }
                } else {
                    n.fds.forEach { close($0) }
                    if lines.contains("FDSTOREREMOVE=1"), let name = n.name { store.removeValue(forKey: name)?.forEach { close($0) } }
                }
            }
        }

        /// The store as LISTEN_FDS would pass it, by name.
        var passed: [(fd: Int32, name: String)] { store.sorted { $0.key < $1.key }.flatMap { e in e.value.map { (fd: $0, name: e.key) } } }

        /// Everything sent so far.
        func receive() -> [Notification] {
            var out: [Notification] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                var fds: [Int32] = []
                var truncated = false
                guard case .done(let got) = buffer.withUnsafeMutableBytes({
                    Sys.receiveDescriptors(fd, into: $0, fds: &fds, truncated: &truncated, flags: Int32(MSG_DONTWAIT))
                }) else { return out }
                out.append(Notification(text: String(decoding: buffer[0..<got], as: UTF8.self), fds: fds))
            }
        }
    }

    /// A started server with an fd store (`$FDSTORE`), on a manual clock.
    final class Node {
        let clock: ManualClock
        let server: Server
        let notify = FakeNotify()
        var logPipe: [Int32] = [-1, -1]

        init(_ sections: String, clock: ManualClock, stored: [(fd: Int32, name: String)] = [], fdStoreMax: Int = 16,
             maxStateBytes: Int = Server.maxStateBytes, keys: AuthKeys? = nil) throws {
            self.clock = clock
            let config = try Config.parse("[server]\nlisten = 127.0.0.1:0\n" + sections + "\n[rooms]\ncounts = 0\n", file: "test.conf")
            _ = pipe(&logPipe)
            _ = fcntl(logPipe[0], F_SETFL, O_NONBLOCK)
            _ = fcntl(logPipe[1], F_SETFL, O_NONBLOCK)
            let logger = Logger(level: .info, sink: .stderr(syslogPrefix: false), outputFD: logPipe[1])
            let systemd = Systemd(notifySocket: true, watchdogUsec: nil, listenFDs: [], channel: NotifyChannel(address: notify.path),
                                  storedFDs: stored, fdStoreMax: fdStoreMax)
            server = try Server(config: config, options: .init(configPath: nil), systemd: systemd, logger: logger, signalFD: -1,
                                clock: { [clock] in clock.nowMs }, keys: keys)
            server.handOver.timeoutMs = 50  // the barrier is answered only after the fact here
            server.handOver.maxStateBytes = maxStateBytes
            try server.start()
        }

        deinit { logPipe.forEach { close($0) } }

        var log: String {
            var out: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = buffer.withUnsafeMutableBytes { read(logPipe[0], $0.baseAddress, $0.count) }
                if n <= 0 { return String(decoding: out, as: UTF8.self) }
                out += buffer[0..<n]
            }
        }

        /// A connection of `dialect` on a socketpair, as the listener would accept it.
        func connect(sendBuffer: Int32 = 0, dialect: Dialect = .ltb) -> (id: Int, peer: Int32) {
            var sv: [Int32] = [-1, -1]
            _ = socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0, &sv)
            if sendBuffer > 0 {
                var size = sendBuffer
                setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
            }
            return (server.open(fd: sv[0], dialect: dialect, address: "peer-\(sv[1])", now: clock.nowMs)!, sv[1])
        }

        @discardableResult
        func tick() throws -> Bool { try server.runOnce(maxWaitMs: 0) }
    }

    static func send(_ fd: Int32, _ bytes: [UInt8]) { ServerClockTests.send(fd, bytes) }

    /// What is readable now; nil at EOF.
    static func drain(_ fd: Int32) -> [UInt8]? { ServerClockTests.drain(fd) }

    /// Whole LTB frames in `bytes` as (type, body).
    static func frames(_ bytes: [UInt8]) -> [(UInt16, [UInt8])] {
        var out: [(UInt16, [UInt8])] = []
        var i = 0
        while bytes.count - i >= 6 {
            let length = Int(bytes[i]) | Int(bytes[i + 1]) << 8 | Int(bytes[i + 2]) << 16 | Int(bytes[i + 3]) << 24
            guard bytes.count - i - 6 >= length else { break }
            out.append((UInt16(bytes[i + 4]) | UInt16(bytes[i + 5]) << 8, Array(bytes[(i + 6)..<(i + 6 + length)])))
            i += 6 + length
        }
        return out
    }

    static func join(_ name: String, room: String) -> [UInt8] {
        FrameCodec.encode(type: 0, body: UserInfo(level: 1, name: name, iconURL: "a", room: room).serialized(), byteOrder: .little)
    }

    static let config = "[heartbeat]\ntimeout = 30s\ntick = 100ms\n[limits]\nframes_per_second = 1\nframes_burst = 50\n"

    /// Hands A's connections over and starts B on what A stored.
    static func handOver(_ a: Node, sections: String = config, maxStateBytes: Int = Server.maxStateBytes,
                         keys: AuthKeys? = nil) throws -> Node {
        a.notify.update()
        a.server.handOver.flushIdleMs = 0  // its readers read only after the hand-over: no flush wait
        a.server.beginHandOver()
        var ticks = 1
        while try a.tick() && ticks < 3 { ticks += 1 }
        #expect(ticks < 3, "the loop ends once the connections are handed over (a second turn when output is owed)")
        #expect(a.server.handOver.done)
        a.notify.update()
        #expect(a.notify.store["state"] != nil && a.notify.store.keys.contains { $0 == "box" || $0.hasPrefix("livebox-") },
                "\(a.notify.store.keys.sorted())")
        a.clock.nowMs += 40  // the gap: no deadline moves closer during it
        return try Node(sections, clock: a.clock, stored: a.notify.passed, maxStateBytes: maxStateBytes, keys: keys)
    }

    @Test("rooms, identities, partial input, owed output, heartbeat time left, violations and token buckets carry over")
    func everythingCarriesOver() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        let x = a.connect(), y = a.connect(), z = a.connect()
        let w = a.connect(sendBuffer: 4096)  // reads nothing: owed output builds up
        Self.send(x.peer, Self.join("alice", room: "r1"))
        Self.send(y.peer, Self.join("bob", room: "r1"))
        Self.send(w.peer, Self.join("wendy", room: "r1"))
        try a.tick()
        Self.send(y.peer, FrameCodec.encode(type: 2, body: [0xFF, 0xFF], byteOrder: .little))  // a bad text: one violation
        try a.tick()
        clock.nowMs += 1_000
        let big = (0..<6).map { i in FrameCodec.encode(type: 100, body: [UInt8](repeating: UInt8(i), count: 20_000), byteOrder: .little) }
        for f in big {
            Self.send(x.peer, f)
            try a.tick()
        }
        let owed = a.server.table.fanout.outboxes[w.id].pending
        #expect(owed > 20_000, "W owes a backlog the kernel refused: \(owed) bytes")
        // Z: half a frame (header and 3 of 8 body bytes) in the daemon's input buffer.
        let zFrame = FrameCodec.encode(type: 100, body: Array("zzzzzzzz".utf8), byteOrder: .little)
        Self.send(z.peer, Array(zFrame[0..<9]))
        try a.tick()
        #expect(a.server.table.slots[z.id]!.input.count == 9)
        _ = [x, y, z].map { Self.drain($0.peer) }
        clock.nowMs += 4_000  // X's last frame was 4 s ago (26 s left); Z has sent no whole frame since it connected 5 s ago (25 s left)
        let before = (x: a.server.heartbeats.remaining(x.id, .ltb, nowMs: clock.nowMs).heartbeat,
                      z: a.server.heartbeats.remaining(z.id, .ltb, nowMs: clock.nowMs).heartbeat)
        var bucket = a.server.table.slots[x.id]!.frameBucket!
        let xTokens = bucket.milliTokens(nowMs: clock.nowMs)

        let b = try Self.handOver(a)
        let s = b.server
        #expect(s.table.count == 4)
        #expect(b.log.contains("restored 4 connections in 2 rooms in"), "the log says what happened")
        #expect(s.relay.memberCount(of: "r1") == 3 && s.relay.memberCount(of: "lobby") == 1)
        // New ids are B's own: find each client by its peer address.
        func id(_ c: (id: Int, peer: Int32)) -> Int { s.table.ids.first { s.table.address(of: $0) == "peer-\(c.peer)" }! }
        #expect(s.relay.name(of: id(x)) == "alice" && s.relay.name(of: id(w)) == "wendy")
        #expect(s.relay.violations(of: id(y)) == 1)
        #expect(s.table.slots[id(z)]!.input == Array(zFrame[0..<9]))
        #expect(s.table.fanout.outboxes[id(w)].queue.count == owed)
        #expect(s.heartbeats.remaining(id(x), .ltb, nowMs: clock.nowMs).heartbeat == before.x,
                "the heartbeat deadline is as far away as when A stopped (the gap does not count)")
        #expect(s.heartbeats.remaining(id(z), .ltb, nowMs: clock.nowMs).heartbeat == before.z)
        var restoredBucket = s.table.slots[id(x)]!.frameBucket!
        #expect(restoredBucket.milliTokens(nowMs: clock.nowMs) == xTokens, "the token bucket level carried over")
        #expect(xTokens == 48_000, "X spent 7 tokens and got 5 back in 5 s")

        // The clients go on: Z completes its frame, W gets everything in order.
        Self.send(z.peer, Array(zFrame[9...]))
        try b.tick()
        #expect(Self.frames(Self.drain(z.peer) ?? []).map(\.1) == [Array("zzzzzzzz".utf8)], "Z's frame, completed across the restart, is relayed (echo)")
        var got: [UInt8] = []
        for _ in 0..<200 {
            got += Self.drain(w.peer) ?? []
            try b.tick()
        }
        let wFrames = Self.frames(got).filter { $0.0 == 100 }
        #expect(wFrames.map(\.1) == big.map { Array($0[6...]) }, "every frame owed to W arrives once, whole and in order")
        // X leaves: the room hears alice's identity, carried over.
        _ = Self.drain(y.peer)
        close(x.peer)
        try b.tick()
        let leave = Self.frames(Self.drain(y.peer) ?? []).filter { $0.0 == 1 }
        #expect(leave.count == 1 && (try? UserInfo(protobuf: leave[0].1))?.name == "alice")
        [y, z, w].forEach { close($0.peer) }
    }

    @Test("a damaged or unknown state: the connections are served with what the live log has, else fresh state; never dropped")
    func damagedStateKeepsTheConnections() throws {
        for (damage, keepLiveLog) in [("damaged", true), ("version", true), ("damaged", false), ("version", false)] {
            let clock = ManualClock()
            let a = try Node(Self.config, clock: clock)
            let x = a.connect(), y = a.connect()
            Self.send(x.peer, Self.join("alice", room: "r1"))
            Self.send(y.peer, Self.join("bob", room: "r1"))
            try a.tick()
            a.notify.update()
            a.server.beginHandOver()
            #expect(try !a.tick())
            a.notify.update()
            var bytes = HandOverState(connections: [HandOverState.Record(key: 0)]).encode()
            if damage == "damaged" { bytes[30] ^= 0xFF } else { bytes[4] = 99 }
            a.notify.store["state"]!.forEach { close($0) }
            a.notify.store["state"] = [try StateFile.make(bytes, name: "test")]
            if !keepLiveLog { a.notify.store.removeValue(forKey: "livestate-1")?.forEach { close($0) } }
            let b = try Node(Self.config, clock: clock, stored: a.notify.passed)
            let log = b.log
            let what = "\(damage) state, \(keepLiveLog ? "with" : "without") the live log"
            #expect(b.server.table.count == 2, "\(what): both connections kept")
            let room = keepLiveLog ? "r1" : "lobby"
            #expect(b.server.relay.memberCount(of: room) == 2, "\(what): in \(room)")
            #expect(log.contains(damage == "damaged" ? "REASON=handover_state_damaged" : "REASON=handover_state_version"), "\(what): logged: \(log)")
            Self.send(x.peer, FrameCodec.encode(type: 100, body: [1, 2, 3], byteOrder: .little))
            try b.tick()
            #expect(Self.frames(Self.drain(y.peer) ?? []).contains { $0.1 == [1, 2, 3] }, "\(what): and they are served")
            [x, y].forEach { close($0.peer) }
        }
    }

    @Test("with an fd store SIGTERM hands over; without one it is the graceful stop")
    func handOverNeedsStore() throws {
        let clock = ManualClock()
        let a = try Node("", clock: clock)
        #expect(a.server.canHandOver)
        let noStore = try Node("", clock: clock, fdStoreMax: 0)
        #expect(!noStore.server.canHandOver, "no fd store (FDSTORE= unset): nothing to hand over to")
        noStore.server.beginStop(signal: SIGTERM)
        #expect(!noStore.server.handOver.pending, "the graceful stop")
    }

    @Test("the flush before a hand-over: it goes on while a reader takes its output, ends flushIdleMs after the last byte taken, and no input is read meanwhile")
    func flushBeforeHandOver() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        let x = a.connect(), w = a.connect(sendBuffer: 4096)
        Self.send(x.peer, Self.join("alice", room: "r1"))
        Self.send(w.peer, Self.join("wendy", room: "r1"))
        try a.tick()
        _ = [x, w].map { Self.drain($0.peer) }
        clock.nowMs += 10_000  // tokens for the frames below
        for i in 0..<6 {
            Self.send(x.peer, FrameCodec.encode(type: 100, body: [UInt8](repeating: UInt8(i), count: 20_000), byteOrder: .little))
            try a.tick()
        }
        _ = Self.drain(x.peer)
        #expect(a.server.table.fanout.outboxes[w.id].pending > 20_000, "W owes more than its socket holds")
        a.server.beginHandOver()
        #expect(try a.tick(), "bytes owed: the flush begins instead of the hand-over")
        // The loop sleeps while it waits for W (it spun: the hand-over's
        // stop deadline of 0 made every epoll_wait return at once).
        #expect(a.server.waitTimeout(now: clock.nowMs) > 0, "the flush waits in epoll_wait, it does not spin")
        // X sends during the flush: not read (it stays in the kernel for the next process).
        Self.send(x.peer, FrameCodec.encode(type: 100, body: [7], byteOrder: .little))
        var got: [UInt8] = []
        var turns = 0
        while turns < 20_000 {
            got += Self.drain(w.peer) ?? []
            clock.nowMs += 10  // a reader that takes its output every 10 ms keeps the flush going
            turns += 1
            if try !a.tick() { break }
        }
        got += Self.drain(w.peer) ?? []
        #expect(a.server.handOver.done, "nothing owed any more: handed over")
        #expect(turns > 5, "the flush lasted \(turns) turns of 10 ms, longer than flushIdleMs, while W read")
        let frames = Self.frames(got).filter { $0.0 == 100 }
        #expect(frames.count == 6 && frames.allSatisfy { $0.1.count == 20_000 }, "W got everything it was owed: \(frames.count) frames")
        #expect(Self.drain(x.peer) == [], "X's frame sent during the flush was not read, so not echoed")
        [x, w].forEach { close($0.peer) }
    }

    @Test("the flush gives up flushIdleMs after the last byte a reader took: its output goes with the state")
    func flushGivesUpOnAReaderThatDoesNotRead() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        let x = a.connect(), w = a.connect(sendBuffer: 4096)
        Self.send(x.peer, Self.join("alice", room: "r1"))
        Self.send(w.peer, Self.join("wendy", room: "r1"))
        try a.tick()
        clock.nowMs += 10_000
        for i in 0..<4 {
            Self.send(x.peer, FrameCodec.encode(type: 100, body: [UInt8](repeating: UInt8(i), count: 20_000), byteOrder: .little))
            try a.tick()
        }
        let owed = a.server.table.fanout.outboxes[w.id].pending
        a.server.beginHandOver()
        #expect(try a.tick())
        clock.nowMs += a.server.handOver.flushIdleMs - 1
        #expect(try a.tick(), "1 ms before the idle limit: still flushing")
        clock.nowMs += 1
        #expect(try !a.tick(), "no byte taken for flushIdleMs: handed over")
        a.notify.update()
        let b = try Node(Self.config, clock: clock, stored: a.notify.passed)
        let wid = b.server.table.ids.first { b.server.table.address(of: $0) == "peer-\(w.peer)" }!
        #expect(b.server.table.fanout.outboxes[wid].queue.count == owed, "what W was owed carried over")
        [x, w].forEach { close($0.peer) }
    }

    @Test("after a crash the live box and log put every client back in its room; a partial input frame and a torn output frame are completed")
    func crashKeepsClientsInTheirRooms() throws {
        let clock = ManualClock()
        let a = try Node(Self.config, clock: clock)
        #expect(a.server.live != nil, "with an fd store the live box and log are kept")
        let x = a.connect(), y = a.connect(), z = a.connect()
        let w = a.connect(sendBuffer: 4096)
        Self.send(x.peer, Self.join("alice", room: "r1"))
        Self.send(y.peer, Self.join("bob", room: "r2"))
        Self.send(w.peer, Self.join("wendy", room: "r1"))
        try a.tick()
        _ = [x, y, z, w].map { Self.drain($0.peer) }
        // W gets part of a large frame: the kernel takes only what fits.
        let big = FrameCodec.encode(type: 100, body: (0..<40_000).map { UInt8(truncatingIfNeeded: $0) }, byteOrder: .little)
        Self.send(x.peer, big)
        try a.tick()
        #expect(a.server.table.fanout.outboxes[w.id].torn > 0, "W's frame is torn")
        let partOfBig = Self.drain(w.peer) ?? []
        #expect(partOfBig.count > 0 && partOfBig.count < big.count)
        // Z: half a frame.
        let zFrame = FrameCodec.encode(type: 100, body: Array("zzzz".utf8), byteOrder: .little)
        Self.send(z.peer, Array(zFrame[0..<7]))
        try a.tick()
        // A closed client leaves a dead entry in the box.
        let gone = a.connect()
        try a.tick()
        close(gone.peer)
        try a.tick()
        #expect(a.server.table.count == 4)
        // The crash: whatever A stored is all B gets (A is never ticked again).
        a.notify.update()
        let names = a.notify.store.keys.sorted()
        #expect(names.contains("livebox-1") && names.contains("livestate-1"), "\(names)")
        let b = try Node(Self.config, clock: clock, stored: a.notify.passed)
        let s = b.server
        let log = b.log
        #expect(log.contains("restored 4 connections in 3 rooms in") && log.contains("after a crash"), "\(log)")
        #expect(s.table.count == 4, "the closed client's copy in the box is dropped")
        #expect(s.relay.memberCount(of: "r1") == 2 && s.relay.memberCount(of: "r2") == 1 && s.relay.memberCount(of: "lobby") == 1)
        func id(_ c: (id: Int, peer: Int32)) -> Int { s.table.ids.first { s.table.address(of: $0) == "peer-\(c.peer)" }! }
        #expect(s.relay.name(of: id(x)) == "alice")
        // W: the rest of the torn frame first, then what follows, in sync.
        var got = partOfBig
        for _ in 0..<100 {
            got += Self.drain(w.peer) ?? []
            try b.tick()
        }
        #expect(Array(got.prefix(big.count)) == big, "the torn frame arrives whole")
        Self.send(x.peer, FrameCodec.encode(type: 100, body: [9, 9], byteOrder: .little))
        for _ in 0..<10 {
            try b.tick()
            got += Self.drain(w.peer) ?? []
        }
        #expect(Self.frames(got).map(\.1).last == [9, 9], "the stream stays in sync after the crash")
        // Z completes its frame: relayed whole to its room (echo).
        Self.send(z.peer, Array(zFrame[7...]))
        try b.tick()
        #expect(Self.frames(Self.drain(z.peer) ?? []).map(\.1) == [Array("zzzz".utf8)])
        // B keeps its own generation, and removed A's names.
        let fromB = b.notify.receive()
        #expect(fromB.contains { $0.text == "FDSTOREREMOVE=1\nFDNAME=livebox-1" })
        #expect(fromB.contains { $0.text.hasPrefix("FDSTORE=1") && $0.name == "livebox-2" })
        for n in fromB where n.text.hasPrefix("FDSTORE=1") { #expect(n.text.contains("FDPOLL=0"), "\(n.text): PID 1 must not poll a box") }
        [x, y, z, w].forEach { close($0.peer) }
    }

    @Test("verified identities survive a restart and a crash: the token is not sent again, a forged name is still refused")
    func verifiedIdentitiesCarryOver() throws {
        let dir = try TempDirectory()
        let keyPath = try TestKeys.writeKeyFile(dir, "hs1 HS256 \(TestKeys.secret)\n")
        let keys = try #require(try Server.loadKeys(try Config.parse("[auth]\nkey_file = \(keyPath)\n", file: "k")))
        let sections = Self.config + "[auth]\nkey_file = \(keyPath)\n"
        let token = try mintTokens([TestKeys.hs(["sub": "u-1", "name": "alice", "exp": TestKeys.now + 3600, "rooms": ["stage"]])])[0]
        for crash in [false, true] {
            let clock = ManualClock()
            let a = try Node(sections, clock: clock, keys: keys)
            let x = a.connect(), y = a.connect()
            Self.send(x.peer, FrameCodec.encode(type: 0, body: UserInfo(level: 1, name: "alice", iconURL: "a", room: "stage", token: token).serialized(),
                                                byteOrder: .little))
            Self.send(y.peer, Self.join("bob", room: "stage"))
            try a.tick()
            #expect(a.server.table.slots[x.id]!.auth?.claims.sub == "u-1")
            _ = [x, y].map { Self.drain($0.peer) }
            let b: Node
            if crash {
                a.notify.update()
                b = try Node(sections, clock: clock, stored: a.notify.passed, keys: keys)
            } else {
                b = try Self.handOver(a, sections: sections, keys: keys)
            }
            let s = b.server
            func id(_ c: (id: Int, peer: Int32)) -> Int { s.table.ids.first { s.table.address(of: $0) == "peer-\(c.peer)" }! }
            #expect(s.table.slots[id(x)]!.auth?.claims == TokenClaims(sub: "u-1", exp: s.table.slots[id(x)]!.auth!.claims.exp, name: "alice",
                                                                      rooms: ["stage"]), crash ? "after a crash" : "after a restart")
            #expect(s.table.slots[id(y)]!.auth == nil, "bob had no token and still has none")
            // Alice's connection is still bound to her account: a forged name is refused, hers relayed.
            let forged = FrameCodec.encode(type: 2, body: ChatMessage(user: UserInfo(level: 1, name: "bob", iconURL: "a"), text: "x").serialized(), byteOrder: .little)
            let honest = FrameCodec.encode(type: 2, body: ChatMessage(user: UserInfo(level: 1, name: "alice", iconURL: "a"), text: "hi").serialized(), byteOrder: .little)
            Self.send(x.peer, forged)
            Self.send(x.peer, honest)
            try b.tick()
            let toX = Self.frames(Self.drain(x.peer) ?? [])
            #expect(toX.first.map { $0.0 == 9 && (try? Notice(protobuf: $0.1))?.code == "identity_mismatch" } ?? false, "crash \(crash): \(toX) \(b.log)")
            #expect(Self.frames(Self.drain(y.peer) ?? []).map(\.1) == [Array(honest[6...])], "only the honest text reaches bob")
            [x, y].forEach { close($0.peer) }
        }
    }

    @Test("a token's expiry survives a restart and a crash: the unrenewed connection is told token_expired and closed at exp + 25 s, the renewed one is not")
    func expiryCarriesOver() throws {
        let dir = try TempDirectory()
        let keyPath = try TestKeys.writeKeyFile(dir, "hs1 HS256 \(TestKeys.secret)\n")
        let keys = try #require(try Server.loadKeys(try Config.parse("[auth]\nkey_file = \(keyPath)\n", file: "k")))
        let sections = Self.config + "[auth]\nkey_file = \(keyPath)\n"
        // exp 10 s ago: inside the 30 s leeway, so they join; exp + 25 s is about 15 s of wall time away.
        let now = TestKeys.now
        let t = try mintTokens([TestKeys.hs(["sub": "alice", "exp": now - 10, "rooms": ["stage"]]),
                                TestKeys.hs(["sub": "bob", "exp": now - 10, "rooms": ["stage"]]),
                                TestKeys.hs(["sub": "bob", "exp": now + 3600, "rooms": ["stage"]])])
        func join(_ name: String, _ token: String) -> [UInt8] {
            FrameCodec.encode(type: 0, body: UserInfo(level: 1, name: name, iconURL: "a", room: "stage", token: token).serialized(), byteOrder: .little)
        }
        for crash in [false, true] {
            let clock = ManualClock()
            let a = try Node(sections, clock: clock, keys: keys)
            let x = a.connect(), y = a.connect()
            Self.send(x.peer, join("alice", t[0]))
            Self.send(y.peer, join("bob", t[1]))
            try a.tick()
            Self.send(y.peer, join("bob", t[2]))  // bob renews: only his new exp must count after the restart
            try a.tick()
            #expect(a.server.table.slots[x.id]!.auth?.claims.sub == "alice" && a.server.table.slots[y.id]!.auth?.claims.exp == Int64(now + 3600),
                    "both joined, bob renewed: \(a.log)")
            _ = [x, y].map { Self.drain($0.peer) }
            let b: Node
            if crash {
                a.notify.update()
                b = try Node(sections, clock: clock, stored: a.notify.passed, keys: keys)
            } else {
                b = try Self.handOver(a, sections: sections, keys: keys)
            }
            let s = b.server
            func id(_ c: (id: Int, peer: Int32)) -> Int? { s.table.ids.first { s.table.address(of: $0) == "peer-\(c.peer)" } }
            let what = crash ? "after a crash" : "after a restart"
            #expect(s.table.slots[id(y)!]!.auth?.claims.exp == Int64(now + 3600), "bob's renewed exp \(what)")
            clock.nowMs += 2_000
            try b.tick()
            #expect(id(x) != nil, "alice is still in \(what), her exp + 25 s is ahead")
            _ = [x, y].map { Self.drain($0.peer) }
            clock.nowMs += 20_000
            try b.tick()
            try b.tick()
            // What alice got before the close (drain gives nil at the end of the stream, so read it here).
            var bytes: [UInt8] = [], buffer = [UInt8](repeating: 0, count: 1 << 16)
            while case let n = buffer.withUnsafeMutableBytes({ recv(x.peer, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }), n > 0 { bytes += buffer[0..<n] }
            let toX = Self.frames(bytes)
            #expect(toX.contains { $0.0 == 9 && (try? Notice(protobuf: $0.1))?.code == "token_expired" }, "\(what): \(toX) \(b.log)")
            #expect(b.log.contains("REASON=token_expired"), "\(what): \(b.log)")
            #expect(id(x) == nil, "alice is closed \(what)")
            #expect(id(y) != nil, "bob renewed and stays \(what)")
            [x, y].forEach { close($0.peer) }
        }
    }

    @Test("a box holds thousands of descriptors and gives back keys and descriptors in order")
    func boxRoundTrip() throws {
        var pairs: [(Int32, Int32)] = []
        for _ in 0..<600 {
            var sv: [Int32] = [-1, -1]
            _ = socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &sv)
            pairs.append((sv[0], sv[1]))
        }
        // u64 keys (the live box's serials, past 2^32 here) and u32 keys (a
        // hand-over's own box, as earlier releases read it).
        for wide in [true, false] {
            let box = try HandOverBox.make()
            let entries = pairs.enumerated().map { (key: UInt64($0.offset * 7) + (wide ? 1 << 33 : 0), fd: $0.element.0) }
            let (n, error) = box.put(entries[...], wideKeys: wide)
            #expect(n == 600 && error == nil)
            box.seal()
            let (out, problem) = HandOverBox.drain(box.readEnd)
            #expect(problem == nil)
            #expect(out.map(\.key) == entries.map { $0.key })
            // Each received descriptor is the same socket as the one put in.
            for (e, p) in zip(out, pairs) {
                var st1 = stat(), st2 = stat()
                fstat(e.fd, &st1)
                fstat(p.0, &st2)
                #expect(st1.st_ino == st2.st_ino)
                close(e.fd)
            }
        }
        pairs.forEach { close($0.0); close($0.1) }
    }

    @Test("bans, mutes and slow mode survive a restart (a daemon without a cluster has no other copy)")
    func moderationCarriesOver() throws {
        let a = try Node(Self.config, clock: ManualClock())
        let wall = wallClockMilliseconds()
        let ban = ModerationBook.Entry(key: ModerationKey(.ban, room: "stage", sub: Array("troll".utf8)), untilMs: wall + 600_000,
                                       setMs: wall, reason: "raid")
        let mute = ModerationBook.Entry(key: ModerationKey(.mute, room: "stage", sub: Array("loud".utf8)), untilMs: wall + 60_000,
                                        setMs: wall, reason: "")
        try a.server.moderation.set(ban, nowMs: a.clock.nowMs, wallMs: wall)
        try a.server.moderation.set(mute, nowMs: a.clock.nowMs, wallMs: wall)
        try a.server.moderation.setSlowMode("stage", seconds: 10, setMs: wall, wallMs: wall)
        _ = a.connect()
        let b = try Self.handOver(a)
        #expect(b.server.moderation.active(ban.key, wallMs: wall + 1) == ban)
        #expect(b.server.moderation.active(mute.key, wallMs: wall + 1) == mute)
        #expect(b.server.moderation.slowModeSeconds("stage") == 10)
    }

    @Test("bans, mutes and slow mode set through the API survive a crash without a cluster: the live log has them, compacted or appended; a removal stays removed")
    func moderationSurvivesACrash() throws {
        let dir = try TempDirectory()
        let keyPath = try TestKeys.writeKeyFile(dir, "hs1 HS256 \(TestKeys.secret)\n")
        let keys = try #require(try Server.loadKeys(try Config.parse("[auth]\nkey_file = \(keyPath)\n", file: "k")))
        let socket = dir.path + "/api.sock"
        let sections = Self.config + "[auth]\nkey_file = \(keyPath)\n[api]\nlisten = unix:\(socket)\n"
        let clock = ManualClock()
        let a = try Node(sections, clock: clock, keys: keys)
        _ = a.connect()
        func call(_ method: String, _ path: String, _ body: String = "") throws -> String {
            let fd = APIHandOverTests.connectUnix(socket)
            try #require(fd >= 0)
            defer { close(fd) }
            Self.send(fd, Array("\(method) \(path) HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)".utf8))
            return try APIHandOverTests.answer(fd, from: a)
        }
        #expect(try call("PUT", "/v1/rooms/stage/bans/troll", "{\"seconds\": 600, \"reason\": \"raid\"}").hasPrefix("HTTP/1.1 200"))
        #expect(try call("PUT", "/v1/rooms/stage/bans/forgiven", "{\"seconds\": 600}").hasPrefix("HTTP/1.1 200"))
        a.server.rebuildLiveLog()  // a compaction: what was logged so far is now in the snapshot
        #expect(try call("PUT", "/v1/rooms/stage/mutes/loud", "{\"seconds\": 60}").hasPrefix("HTTP/1.1 200"))
        #expect(try call("PUT", "/v1/rooms/stage/settings", "{\"slow_mode_seconds\": 10}").hasPrefix("HTTP/1.1 200"))
        #expect(try call("DELETE", "/v1/rooms/stage/bans/forgiven").hasPrefix("HTTP/1.1 200"))
        let wall = wallClockMilliseconds()

        // The crash: whatever A stored is all B gets (A is never ticked again).
        a.notify.update()
        let b = try Node(sections, clock: clock, stored: a.notify.passed, keys: keys)
        #expect(b.log.contains("after a crash"), "\(b.log)")
        let m = b.server.moderation
        #expect(m.active(ModerationKey(.ban, room: "stage", sub: Array("troll".utf8)), wallMs: wall)?.reason == "raid")
        #expect(m.active(ModerationKey(.mute, room: "stage", sub: Array("loud".utf8)), wallMs: wall) != nil)
        #expect(m.active(ModerationKey(.ban, room: "stage", sub: Array("forgiven".utf8)), wallMs: wall) == nil, "removed before the crash")
        #expect(m.slowModeSeconds("stage") == 10)
        #expect(m.count == 2)
    }
}

extension HandOverTests {
    @Test("positions survive a restart: the room keeps its epoch, numbers and recent lines; a member that asked for positions still gets them")
    func positionsCarryOver() throws {
        let sections = Self.config + "[rooms]\nhistory = 50\n"
        let a = try Node(sections, clock: ManualClock())
        let (viewer, streamer) = (a.connect(), a.connect())
        var u = UserInfo(level: 1, name: "v", iconURL: "a", room: "stage")
        u.positions = true
        Self.send(viewer.peer, FrameCodec.encode(type: 0, body: u.serialized(), byteOrder: .little))
        Self.send(streamer.peer, Self.join("s", room: "stage"))
        try a.tick()
        let su = UserInfo(level: 1, name: "s", iconURL: "a", room: "stage")
        func text(_ s: String) -> [UInt8] { FrameCodec.encode(type: 2, body: ChatMessage(user: su, text: s).serialized(), byteOrder: .little) }
        for i in 0..<10 { Self.send(streamer.peer, text("before \(i)")) }
        try a.tick()
        let epoch = try #require(a.server.relay.position(of: RoomName("stage"))?.epoch)
        let notices = Self.frames(Self.drain(viewer.peer) ?? []).filter { $0.0 == 9 }.compactMap { try? Notice(protobuf: $0.1) }
        #expect(notices.last == Notice(code: "position", position: RoomPosition(epoch: epoch, seq: 10)))
        _ = Self.drain(streamer.peer)

        let b = try Self.handOver(a, sections: sections)
        #expect(b.server.relay.position(of: RoomName("stage")) == RoomPosition(epoch: epoch, seq: 10), "the epoch and the number go on")
        #expect(b.server.relay.history(of: RoomName("stage")).count == 10)
        for i in 0..<5 { Self.send(streamer.peer, text("after \(i)")) }
        try b.tick()
        let got = Self.frames(Self.drain(viewer.peer) ?? [])
        #expect(got.filter { $0.0 == 2 }.count == 5)
        #expect(got.last.flatMap { try? Notice(protobuf: $0.1) } == Notice(code: "position", position: RoomPosition(epoch: epoch, seq: 15)))

        let late = b.connect()
        var lu = UserInfo(level: 1, name: "l", iconURL: "a", room: "stage")
        lu.since = RoomPosition(epoch: epoch, seq: 8)
        Self.send(late.peer, FrameCodec.encode(type: 0, body: lu.serialized(), byteOrder: .little))
        try b.tick()
        let resumed = Self.frames(Self.drain(late.peer) ?? [])
        #expect(resumed.count == 9, "its join echo, the notice history (7), lines 9-15")
        #expect((try? Notice(protobuf: resumed[1].1)) == Notice(code: "history", count: 7, position: RoomPosition(epoch: epoch, seq: 15)))
        #expect(resumed.dropFirst(2).compactMap { try? ChatMessage(protobuf: $0.1).text } == ["before 8", "before 9"] + (0..<5).map { "after \($0)" })
    }

    @Test("roomcast_handovers_total counts the restarts that kept the connections, carried from process to process")
    func handOverCountCarriesOver() throws {
        let a = try Node(Self.config, clock: ManualClock())
        #expect(a.server.handOver.handOvers == 0 && a.server.handOver.startedFrom == "fresh")
        _ = a.connect()
        let b = try Self.handOver(a)
        let c = try Self.handOver(b)
        #expect(b.server.handOver.handOvers == 1 && c.server.handOver.handOvers == 2)
        #expect(c.server.metricsText(now: c.clock.nowMs).contains("roomcast_handovers_total 2\n"))
    }
}
