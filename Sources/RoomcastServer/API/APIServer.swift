import Glibc
import RoomcastCore
import RoomcastIO

// APIServer.swift owns the backend's HTTP API on the reactor (docs/api.md):
// its listeners (TCP and Unix sockets), its connections with their bounded
// input and output, the 5 s request deadline and the idle timeout. What a
// request asks for is answered in APIRoutes.swift. An API connection is no
// client: it is in no room and not in the connection table, and a slow or
// stalled one costs itself only (its output is bounded and it is not read
// while its answers are unsent).

/// The API's listeners and connections.
struct APIServer {
    struct Listener {
        var fd: Int32
        var address: APIListenAddress
        var registration: Registration?
        /// Passed by systemd (a socket named `api`): its socket unit owns it.
        var fromSystemd = false
        /// Kept in systemd's fd store for the next process: its Unix
        /// socket's file stays when this process exits.
        var inStore = false
    }

    /// Who is at the other end, as the kernel says.
    enum Peer: Equatable {
        /// A TCP peer, `1.2.3.4:P` or `[::1]:P`.
        case tcp(String)
        /// A Unix-socket peer's credentials (SO_PEERCRED, unix(7)).
        case unix(uid: UInt32, gid: UInt32, pid: Int32)

        var description: String {
            switch self {
            case .tcp(let address): address
            case .unix(let uid, let gid, let pid): "unix peer uid \(uid) gid \(gid) pid \(pid)"
            }
        }
    }

    struct Connection {
        var fd: Int32
        var registration: Registration?
        var peer: Peer
        var reader = HTTPRequestReader()
        /// Received and not yet answered (compacted once per wakeup, not
        /// per request): less than ``APIServer/inputPauseBytes`` plus one
        /// read's worth.
        var input: [UInt8] = []
        /// Answers; the first `outputSent` bytes are taken by the kernel
        /// (dropped once they are the larger half).
        var output: [UInt8] = []
        var outputSent = 0
        /// Whether `input` may hold whole requests not yet answered (the
        /// per-wakeup cap or the output bound stopped the answering).
        var unanswered = false
        /// In ``APIServer/again``: to be answered on the next loop turn.
        var queued = false
        /// The peer sent EOF: answer what is whole, then close.
        var peerClosed = false
        /// When the request under way must be complete (its first byte + 5 s), ms.
        var requestDeadlineMs: UInt64?
        /// When an idle keep-alive connection is closed, ms.
        var idleDeadlineMs: UInt64
        /// Close once `output` is written (an error, `Connection: close`, EOF).
        var closeAfterWrite = false
        /// The interest registered: readable while nothing is owed, writable while something is.
        var reading = true
        var writing = false
        /// Parked: its request waits for an Idempotency-Key claim in Redis
        /// (`APIServer.claims`); nothing more is answered until it comes.
        var parkedToken: UInt64?
        /// Whether the parked request keeps the connection open.
        var parkedKeepAlive = true

        /// Answer bytes not yet taken by the kernel.
        var pendingOutput: Int { output.count - outputSent }
    }

    /// A request must be complete this long after its first byte, in ms (docs/api.md).
    static let requestTimeoutMs: UInt64 = 5_000
    /// A keep-alive connection with no request under way is closed after this, in ms.
    static let idleTimeoutMs: UInt64 = 60_000
    /// Bytes read per wakeup at most (bounded work per event).
    static let readBytesPerWakeup = 128 * 1024
    /// Answers held for one connection before it is no longer read or
    /// answered, in bytes: a pipeliner that does not read its answers
    /// holds at most this plus one answer here.
    static let outputPauseBytes = 256 * 1024
    /// Unanswered input held before the connection is no longer read, in
    /// bytes: more than the largest request (8 KiB of head, 64 KiB of
    /// body), so a request is never starved of its own bytes.
    static let inputPauseBytes = 128 * 1024
    /// Requests answered per connection per loop turn at most; the rest
    /// waits for the next turn (``again``), so one pipelining connection
    /// holds the loop for at most this many answers (issue 28 item 1).
    static let requestsPerWakeup = 64
    /// Accepts per listener wakeup at most.
    static let acceptsPerWakeup = 32

    var listeners: [Listener] = []
    var connections: [Connection?] = []
    private var freeSlots: [Int] = []
    private(set) var count = 0
    /// The keys of `[api] key_file`; nil: none configured.
    var keys: APIKeys?
    /// Replies of publishes by `Idempotency-Key` (APIRoutes.swift).
    var idempotency = IdempotencyCache()
    /// Keyed publishes waiting for their claim in Redis, by token (APIIdempotency.swift).
    var claims: [UInt64: PendingPublish] = [:]
    var nextClaim: UInt64 = 1
    /// Requests answered, by status class, and refusals at accept (GET /metrics).
    var requests: [Int: UInt64] = [:]
    var refusedAtAccept: UInt64 = 0
    /// Connections with whole requests left by the per-wakeup cap, answered
    /// after the next wait (which does not sleep while any is here): their
    /// bytes are read already, so no readiness would bring them back.
    var again: [Int] = []

    mutating func insert(_ c: Connection) -> Int {
        count += 1
        if let slot = freeSlots.popLast() {
            connections[slot] = c
            return slot
        }
        connections.append(c)
        return connections.count - 1
    }

    mutating func remove(_ id: Int) -> Connection? {
        guard connections.indices.contains(id), let c = connections[id] else { return nil }
        connections[id] = nil
        freeSlots.append(id)
        count -= 1
        return c
    }

    /// The earliest request or idle deadline, ms; nil without connections. O(connections).
    var nextDeadline: UInt64? {
        guard count > 0 else { return nil }
        var next = UInt64.max
        for c in connections {
            guard let c else { continue }
            next = min(next, c.requestDeadlineMs ?? c.idleDeadlineMs)
        }
        return next
    }
}

extension Server {
    /// Adopts the sockets systemd passed with the name `api` (socket
    /// activation, sd_listen_fds_with_names(3): TCP or Unix stream sockets;
    /// then `[api] listen` is not used), or binds every `[api] listen`
    /// address, taking the listener a previous process kept in systemd's fd
    /// store when there is one for it; then watches them.
    /// - Throws: `SystemError` when an address cannot be bound.
    func openAPI() throws(SystemError) {
        let passed = systemd.listenFDs.filter { $0.name == Self.apiSocketName }
        var opened: [APIServer.Listener] = []
        if !passed.isEmpty {
            for (fd, _) in passed {
                try Sys.setNonBlocking(fd)  // blocking unless NonBlocking=yes (systemd.socket(5))
                if let path = Socket.unixPath(fd) {
                    opened.append(.init(fd: fd, address: .unix(path: path), fromSystemd: true))
                } else if Systemd.isListeningInetSocket(fd), let address = ListenAddress.parse(Socket.localAddress(fd)) {
                    opened.append(.init(fd: fd, address: .tcp(address), fromSystemd: true))
                } else {
                    logger.warning("ignoring descriptor \(fd) (api) from systemd: not a listening TCP or Unix stream socket")
                }
            }
            if !config.api.listen.isEmpty { logger.info("using the api socket(s) from systemd; [api] listen is not used") }
        } else {
            for address in config.api.listen {
                let fd: Int32
                if let stored = adoptStoredAPIListener(address) {
                    fd = stored
                } else {
                    switch address {
                    case .tcp(let a): fd = try Socket.listen(on: a)
                    case .unix(let path): fd = try Self.listenUnix(path)
                    }
                }
                opened.append(.init(fd: fd, address: address))
            }
        }
        for var l in opened {
            l.registration = try selector.register(l.fd, .apiListener(api.listeners.count))
            api.listeners.append(l)
            let shown = if case .tcp = l.address { Socket.localAddress(l.fd) } else { l.address.description }
            logger.info("listening on \(shown) (api)", ["LISTEN": shown, "PROTOCOL": "api"])
        }
    }

    /// FileDescriptorName= of a socket unit's API listener (roomcastd(8)).
    static let apiSocketName = "api"

    /// A listening Unix stream socket at `path`, mode 0666: the peers are
    /// told apart by SO_PEERCRED, not by the file's mode. A stale socket
    /// file is replaced; any other file at `path` is left alone (EADDRINUSE).
    static func listenUnix(_ path: String) throws(SystemError) -> Int32 {
        var st = stat()
        if lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFSOCK { unlink(path) }
        guard let address = SocketAddress.unix(path: path) else { throw SystemError("bind unix:\(path)", errno: ENAMETOOLONG) }
        let fd = try Sys.blocking("socket") { Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0) }
        do throws(SystemError) {
            _ = try Sys.blocking("bind unix:\(path)") { address.withSockaddr { Glibc.bind(fd, $0, $1) } }
            chmod(path, 0o666)
            _ = try Sys.blocking("listen unix:\(path)") { Glibc.listen(fd, 128) }
            return fd
        } catch {
            Sys.close(fd)
            throw error
        }
    }

    /// SO_PEERCRED of a connected Unix socket (unix(7)): the peer's
    /// credentials as of connect(2). `struct ucred` is `{pid_t pid; uid_t
    /// uid; gid_t gid;}` on Linux; Glibc's Swift import leaves it out
    /// (it needs _GNU_SOURCE), so the same 12 bytes are read into a tuple.
    static func peerCredentials(_ fd: Int32) -> (pid: Int32, uid: UInt32, gid: UInt32)? {
        var cred: (Int32, UInt32, UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout.size(ofValue: cred))
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0, length == 12 else { return nil }
        return (cred.0, cred.1, cred.2)
    }

    /// Accepts on API listener `index`; one over `[api] max_connections` is closed at once.
    func acceptAPI(_ index: Int) {
        guard !stopping else { return }
        let listener = api.listeners[index]
        let now = clock()
        for _ in 0..<APIServer.acceptsPerWakeup {
            let accepted: (fd: Int32, peer: sockaddr_storage)
            do {
                guard case .done(let a) = try Sys.accept(listener.fd) else { return }
                accepted = a
            } catch {
                if error.errno == ECONNABORTED || error.errno == EPROTO || error.errno == EPERM { continue }
                logger.peerWarning(reason: "api_accept_failed", nowMs: now, "API accept on \(listener.address) failed: \(error)", ["DETAIL": error.description])
                return
            }
            let peer: APIServer.Peer
            if case .unix = listener.address {
                guard let cred = Self.peerCredentials(accepted.fd) else {
                    Sys.close(accepted.fd)
                    continue
                }
                peer = .unix(uid: cred.uid, gid: cred.gid, pid: cred.pid)
            } else {
                peer = .tcp(Socket.format(accepted.peer))
                Sys.setOption(accepted.fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
            }
            guard api.count < config.api.maxConnections else {
                api.refusedAtAccept &+= 1
                logger.peerWarning(reason: "api_max_connections", nowMs: now,
                                   "refused API connection from \(peer.description): api.max_connections (\(config.api.maxConnections)) reached")
                let answer = apiErrorResponse(APIError(503, "too_many_connections", "api.max_connections (\(config.api.maxConnections)) reached"), close: true)
                _ = answer.withUnsafeBytes { Sys.send(accepted.fd, $0.baseAddress!, $0.count) }
                Sys.close(accepted.fd)
                continue
            }
            let slot = api.insert(APIServer.Connection(fd: accepted.fd, peer: peer, idleDeadlineMs: now + APIServer.idleTimeoutMs))
            do {
                api.connections[slot]!.registration = try selector.register(accepted.fd, .apiConnection(slot))
            } catch {
                _ = api.remove(slot)
                Sys.close(accepted.fd)
            }
        }
    }

    func closeAPI(_ id: Int) {
        guard let c = api.remove(id) else { return }
        if let token = c.parkedToken { api.claims[token]?.connection = nil }  // the publish goes on, unanswered
        if let r = c.registration { selector.deregister(r) }
        Sys.close(c.fd)
    }

    /// Request deadlines (408, then closed: a slowloris costs itself only) and idle keep-alive connections.
    func expireAPI(now: UInt64) {
        for id in api.connections.indices {
            guard let c = api.connections[id] else { continue }
            if c.parkedToken != nil { continue }  // waiting for Redis: bounded by cluster.timeout (APIIdempotency.swift)
            if let deadline = c.requestDeadlineMs, now >= deadline, !c.closeAfterWrite {
                api.connections[id]!.output.append(contentsOf: apiErrorResponse(APIError(408, "request_timeout",
                    "the request was not complete within \(APIServer.requestTimeoutMs / 1000) s"), close: true))
                api.connections[id]!.closeAfterWrite = true
                api.connections[id]!.input = []
                api.connections[id]!.unanswered = false
                api.requests[408, default: 0] &+= 1
                flushAPI(id)
            } else if c.requestDeadlineMs == nil && c.pendingOutput == 0 && c.parkedToken == nil && now >= c.idleDeadlineMs {
                closeAPI(id)
            } else if let deadline = c.requestDeadlineMs, now >= deadline + APIServer.requestTimeoutMs {
                closeAPI(id)  // the 408 itself was not taken
            }
        }
    }

    /// Closes the API's listeners and connections (stop, hand-over).
    func closeAPIAll() {
        for id in api.connections.indices where api.connections[id] != nil { closeAPI(id) }
        for l in api.listeners {
            if let r = l.registration { selector.deregister(r) }
            Sys.close(l.fd)
            // A socket unit's file, or one the next process takes from the store, stays.
            if case .unix(let path) = l.address, !l.fromSystemd, !l.inStore { unlink(path) }
        }
        api.listeners = []
    }

    static func httpErrorCode(_ status: Int) -> String {
        switch status {
        case 408: "request_timeout"
        case 411: "length_required"
        case 413: "payload_too_large"
        case 431: "headers_too_large"
        case 501: "not_implemented"
        default: "bad_request"
        }
    }
}
