// The reactor driven in-process on socketpairs with a manual clock: the
// time-dependent policy (heartbeat eviction, the slow-consumer cut-off, the
// stop deadline) is checked by advancing the clock, never by sleeping.
import Glibc
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

@Suite("Server on a manual clock (socketpairs, no sleeping)")
struct ServerClockTests {
    /// The time the server sees, moved only by the test.
    final class ManualClock: @unchecked Sendable {
        var nowMs: UInt64 = 1_000_000
    }

    /// A started server on a manual clock. Its listener (an ephemeral
    /// loopback port) is never used: clients are socketpairs handed to it.
    final class Rig {
        let clock = ManualClock()
        let server: Server
        private var logPipe: [Int32] = [-1, -1]
        private var peers: [Int32] = []

        init(_ sections: String) throws {
            let config = try Config.parse("[server]\nlisten = 127.0.0.1:0\n" + sections + "\n[rooms]\ncounts = 0\n", file: "test.conf")
            _ = pipe(&logPipe)
            _ = fcntl(logPipe[1], F_SETFL, O_NONBLOCK)  // a full pipe drops log lines, never blocks the test
            let logger = Logger(level: .debug, sink: .stderr(syslogPrefix: false), outputFD: logPipe[1])
            let clock = self.clock
            server = try Server(config: config, options: .init(configPath: nil), systemd: Systemd(notifySocket: false, watchdogUsec: nil, listenFDs: []),
                                logger: logger, signalFD: -1, clock: { clock.nowMs })
            try server.start()
        }

        deinit {
            (peers + logPipe).forEach { close($0) }
        }

        /// A client connected through a socketpair; the test holds the peer end.
        /// - Parameter sendBuffer: SO_SNDBUF of the server's end, in bytes.
        func connect(sendBuffer: Int32 = 0) -> (id: Int, peer: Int32) {
            var sv: [Int32] = [-1, -1]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0, &sv) == 0)
            if sendBuffer > 0 {
                var size = sendBuffer
                setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
            }
            let id = server.open(fd: sv[0], dialect: .ltb, address: "test:\(sv[1])", now: clock.nowMs)!
            peers.append(sv[1])
            return (id, sv[1])
        }

        /// One loop iteration that does not wait.
        @discardableResult
        func tick() throws -> Bool { try server.runOnce(maxWaitMs: 0) }

        /// Moves the clock on by `ms` and runs one iteration.
        @discardableResult
        func advance(_ ms: UInt64) throws -> Bool {
            clock.nowMs += ms
            return try tick()
        }

        /// Whether connection `id` is still in the table.
        func isConnected(_ id: Int) -> Bool { server.table.slots[id] != nil }
    }

    static func send(_ fd: Int32, _ bytes: [UInt8]) {
        #expect(bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == bytes.count)
    }

    /// Reads what is there; nil at EOF.
    static func drain(_ fd: Int32) -> [UInt8]? {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n == 0 { return nil }
            if n < 0 { return out }
            out += buffer[0..<n]
        }
    }

    static let heartbeat = FrameCodec.encode(type: 8, body: Array("beat".utf8), byteOrder: .little)

    @Test("a client silent for heartbeat.timeout is evicted at its deadline, not before; a frame moves the deadline")
    func evictionFollowsTheClock() throws {
        let rig = try Rig("[heartbeat]\ntimeout = 1s\ntick = 100ms\n")
        let a = rig.connect()
        try rig.tick()
        try rig.advance(900)
        #expect(rig.isConnected(a.id), "900 ms of silence: still connected")
        Self.send(a.peer, Self.heartbeat)  // proof of life at +900 ms
        try rig.tick()
        try rig.advance(950)
        #expect(rig.isConnected(a.id), "950 ms after its heartbeat: still connected")
        #expect(Self.drain(a.peer) != nil, "no EOF yet")
        try rig.advance(200)  // +2050 ms: 1,150 ms after the heartbeat, past timeout + tick
        #expect(!rig.isConnected(a.id), "evicted")
        #expect(Self.drain(a.peer) == nil, "the client sees EOF")
        #expect(rig.server.status.evictions == 1)
    }

    /// A sender A and a client B that never reads (a small send buffer):
    /// what A sends piles up for B in the daemon.
    static func senderAndStalledReader(_ rig: Rig) throws -> (a: (id: Int, peer: Int32), b: (id: Int, peer: Int32)) {
        let a = rig.connect()
        let b = rig.connect(sendBuffer: 4096)
        let frame = FrameCodec.encode(type: 99, body: [UInt8](repeating: 7, count: 1000), byteOrder: .little)
        for _ in 0..<100 {
            Self.send(a.peer, frame)
            try rig.tick()
            _ = Self.drain(a.peer)  // A reads its echoes
        }
        return (a, b)
    }

    @Test("a client above output_soft_bytes is cut off after output_soft_seconds on the clock; the sender stays")
    func softLimitCutOffFollowsTheClock() throws {
        let rig = try Rig("[limits]\noutput_soft_bytes = 16K\noutput_soft_seconds = 2s\n")
        let (a, b) = try Self.senderAndStalledReader(rig)
        #expect(rig.server.table.fanout.outboxes[b.id].pending > 16 * 1024, "B's backlog is in the daemon, above the soft limit")
        try rig.advance(1_900)
        #expect(rig.isConnected(b.id), "1.9 s above the soft limit: still connected")
        try rig.advance(200)
        #expect(!rig.isConnected(b.id), "2.1 s above the soft limit: closed")
        #expect(rig.isConnected(a.id), "the sender is not slow and stays")
    }

    @Test("on stop, a client that does not read is drained until the deadline, then the loop ends")
    func stopDeadlineFollowsTheClock() throws {
        let rig = try Rig("")
        let (a, b) = try Self.senderAndStalledReader(rig)
        rig.server.beginStop(signal: SIGTERM)
        #expect(try rig.tick(), "B still owes output: the loop goes on")
        #expect(!rig.isConnected(a.id), "A owed nothing and is closed at once")
        #expect(try rig.advance(Server.drainTimeoutMs - 100), "before the deadline: still draining")
        #expect(rig.isConnected(b.id))
        #expect(try !rig.advance(100), "at the deadline the loop ends")
        rig.server.finishStop()
        #expect(rig.server.table.count == 0)
        #expect(Self.drain(b.peer) == nil, "B sees EOF once it reads what it was sent")
    }
}
