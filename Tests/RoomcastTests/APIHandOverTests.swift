// The API's listeners across a restart (docs/api.md, "Restarts"): kept in
// systemd's fd store as `listen-api`, so that a backend's request sent while
// one process hands over to the next waits in the backlog and is answered by
// the next; and a socket unit's listener named `api` is the API's, never a
// client listener. In-process, with HandOverTests' servers and fake fd store.
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("The API's listeners across a restart")
struct APIHandOverTests {
    /// A connected Unix stream socket to `path` (blocking), or -1.
    static func connectUnix(_ path: String) -> Int32 {
        guard let address = SocketAddress.unix(path: path) else { return -1 }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        let r = address.withSockaddr { connect(fd, $0, $1) }
        if r != 0 { close(fd); return -1 }
        return fd
    }

    /// Ticks `node` until `fd` has an HTTP status line, at most 2 s; the text read.
    static func answer(_ fd: Int32, from node: HandOverTests.Node) throws -> String {
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        var text = ""
        for _ in 0..<400 where !text.contains("\r\n\r\n") {
            try node.tick()
            if let got = HandOverTests.drain(fd) { text += String(decoding: got, as: UTF8.self) }
            usleep(5_000)
        }
        return text
    }

    @Test("a unix:/PATH listener is kept as listen-api: a request sent during the hand-over is answered by the next process; the file stays")
    func unixListenerKept() throws {
        let dir = try TempDirectory()
        let path = dir.path + "/api.sock"
        let sections = HandOverTests.config + "[api]\nlisten = unix:\(path)\n"
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(sections, clock: clock)
        a.notify.update()
        #expect(a.notify.store[HandOverName.apiListener]?.count == 1, "\(a.notify.store.keys.sorted())")
        var before = stat()
        #expect(stat(path, &before) == 0)
        let x = a.connect()
        HandOverTests.send(x.peer, HandOverTests.join("alice", room: "r1"))
        try a.tick()

        a.server.handOver.flushIdleMs = 0
        a.server.beginHandOver()
        while try a.tick() {}
        #expect(a.server.handOver.done)
        // Between the two processes: the file is there and the socket listens (in the store).
        var during = stat()
        #expect(stat(path, &during) == 0 && during.st_ino == before.st_ino, "the socket file stays at a hand-over")
        let backend = Self.connectUnix(path)
        try #require(backend >= 0, "connect during the gap: \(String(cString: strerror(errno)))")
        defer { close(backend) }
        HandOverTests.send(backend, Array("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".utf8))

        a.notify.update()
        let b = try HandOverTests.Node(sections, clock: clock, stored: a.notify.passed)
        #expect(b.server.api.listeners.count == 1 && b.server.api.listeners[0].inStore)
        #expect(Socket.unixPath(b.server.api.listeners[0].fd) == path)
        #expect(b.log.contains("listening on unix:\(path) (api)"))
        let reply = try Self.answer(backend, from: b)
        #expect(reply.hasPrefix("HTTP/1.1 200"), "answered by the next process: \(reply)")
        #expect(b.server.table.count == 1, "the client was handed over as well")
    }

    @Test("a graceful stop without an fd store removes the socket file")
    func stopRemovesTheFile() throws {
        let dir = try TempDirectory()
        let path = dir.path + "/api.sock"
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(HandOverTests.config + "[api]\nlisten = unix:\(path)\n", clock: clock, fdStoreMax: 0)
        #expect(a.server.api.listeners.count == 1 && !a.server.api.listeners[0].inStore)
        a.server.closeAPIAll()
        #expect(access(path, F_OK) != 0, "nothing will take it over: the file goes")
    }

    @Test("socket activation: a socket named api is the API's (Unix or TCP), not an LTB listener; [server] listen is still bound")
    func socketNamedAPI() throws {
        let dir = try TempDirectory()
        let path = dir.path + "/activated.sock"
        let unixFD = try Server.listenUnix(path)
        let tcpFD = try Socket.listen(on: #require(ListenAddress.parse("127.0.0.1:0")))
        let config = try Config.parse("[server]\nlisten = 127.0.0.1:0\n[api]\nlisten = unix:\(dir.path)/unused.sock\n", file: "t.conf")
        let logger = Logger(level: .info, sink: .stderr(syslogPrefix: false), outputFD: open("/dev/null", O_WRONLY))
        let systemd = Systemd(notifySocket: false, watchdogUsec: nil, listenFDs: [(unixFD, "api"), (tcpFD, "api")], channel: nil,
                              storedFDs: [], fdStoreMax: 0)
        let server = try Server(config: config, options: .init(configPath: nil), systemd: systemd, logger: logger, signalFD: -1,
                                clock: { 0 }, keys: nil)
        try server.start()
        let tcpAddress = try #require(ListenAddress.parse(Socket.localAddress(tcpFD)))
        #expect(server.api.listeners.map(\.address) == [.unix(path: path), .tcp(tcpAddress)])
        #expect(server.api.listeners.allSatisfy { $0.fromSystemd })
        #expect(server.listeners.all.count == 1 && server.listeners.all[0].dialect == .ltb && server.listeners.all[0].fd != tcpFD,
                "[server] listen bound by the daemon; the api sockets are not client listeners")
        #expect(access("\(dir.path)/unused.sock", F_OK) != 0, "[api] listen is not used under socket activation of the API")
        server.closeAPIAll()
        #expect(access(path, F_OK) == 0, "a socket unit's file is the unit's")
    }
}
