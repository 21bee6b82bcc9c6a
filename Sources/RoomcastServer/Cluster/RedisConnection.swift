@preconcurrency import CHiredis
@preconcurrency import Glibc
import RoomcastCore
import RoomcastIO

// RedisConnection.swift owns one connection to Redis on the daemon's own
// selector: our own non-blocking socket, our own output buffer, and
// hiredis's `redisReader` as the RESP parser (it reports a protocol error
// as a value, where hiredis's async layer asserts and aborts the process on
// a reply it did not expect).
//
// - Commands are encoded here (RESP2 arrays of bulk strings, as every
//   client sends them) and written once per loop turn, before the loop
//   waits (`flush`); EPOLLOUT is armed only while the socket refuses bytes.
// - Each command that expects a reply leaves an `Expectation` in a FIFO:
//   Redis answers in order, so the reply at the front answers the oldest.
//   A (UN)SUBSCRIBE of N channels is answered by N confirmations, one per
//   channel, in order; on a subscribed connection, messages (pushes) may
//   come between them.
// - Anything else is a surprise: a reply nobody asked for, a reply of the
//   wrong type or shape, a channel other than the one asked for, a protocol
//   error, a close with a reply half read. Each is a broken connection: it
//   is closed and reported to the link once, which reconnects with its
//   backoff. Never an assertion, never the process.
// - Reads are bounded per wakeup, as for clients (`readsPerWakeup` reads of
//   `readSize` bytes); the descriptor is level-triggered, so the rest comes
//   at the next turn.
// This file holds the connection's state, connect, close, writes and the
// encoding of commands; RedisReplies.swift reads and matches the replies.

/// One connection to Redis: the cluster has a publisher and a subscriber
/// (RESP2 allows nothing but (UN)SUBSCRIBE and PING on a subscribed one).
final class RedisConnection {
    enum Role: Int {
        case publisher = 0
        case subscriber = 1

        var name: String { self == .publisher ? "publisher" : "subscriber" }
    }

    enum State: Equatable {
        /// No socket; the next attempt is at `retryAtMs`.
        case idle
        /// connect(2) in progress.
        case connecting
        /// Connected; waiting for the answers to the handshake (PONG, or the
        /// confirmation of every channel subscribed while connecting).
        case handshaking
        /// Answered: usable.
        case ready
    }

    /// What the reply at the front of the FIFO must answer.
    struct Expectation {
        /// `store`: HSET, HDEL, EVAL (any reply but an error); `load`: HGETALL (field, value pairs);
        /// `claim`: SET NX GET of an Idempotency-Key (nil or a string);
        /// `claimStore`: its answer written, or its release (any reply but an error).
        enum Kind { case pong, publish, subscribe, unsubscribe, store, load, claim, claimStore }
        var kind: Kind
        /// The channels of a (UN)SUBSCRIBE, confirmed one by one in this order.
        var channels: [[UInt8]] = []
        var confirmed = 0
        /// Sent while connecting: part of the handshake (`settled`).
        var handshake = false
    }

    /// Why a connection broke, for the link's log and backoff.
    enum Loss: Equatable {
        /// The network or the peer: refused, reset, closed, timed out.
        case io
        /// What answered is not Redis as we speak it (a reply nobody asked
        /// for, a wrong shape, a protocol error, a close mid-reply).
        case surprise
        /// Redis refused a command of the handshake or a subscription (an ACL: `-NOPERM`).
        case refused
    }

    /// Bytes per read(2), and reads per wakeup (as for clients, Input.swift).
    static let readSize = 64 * 1024
    static let readsPerWakeup = 4

    let role: Role
    unowned let link: ClusterLink
    private let selector: Selector<Server.Source>
    private(set) var fd: Int32 = -1
    private var registration: Registration?
    var state = State.idle
    var reader: UnsafeMutablePointer<redisReader>?
    var input = [UInt8](repeating: 0, count: RedisConnection.readSize)
    /// Commands encoded and not yet written; `outputSent` of them are.
    private var output: [UInt8] = []
    private var outputSent = 0
    /// What the replies to come answer, oldest at `expectedHead`.
    var expected: [Expectation] = []
    var expectedHead = 0
    /// Handshake commands not yet fully answered.
    var handshakeLeft = 0

    /// When the current state began (connect timeouts), in ms.
    var sinceMs: UInt64 = 0
    /// When an idle connection tries again, in ms.
    var retryAtMs: UInt64 = 0
    /// Attempts since the connection last stayed up (the backoff's exponent).
    var attempts = 0
    /// When every command of the handshake was answered (nil: not yet, or not connected), in ms.
    var settledAtMs: UInt64?
    /// Since when the oldest unanswered command has waited without any reply, in ms (nil: none waits).
    var awaitingSinceMs: UInt64?
    /// A reason to drop the connection found where it cannot be closed
    /// (the selector refused a change); acted on by the next timer run.
    var pendingReset: String?

    /// The most bytes one reply may hold, counted twice: the bytes read and
    /// not yet parsed, and the objects the parser built for it (every
    /// nested element with its own size, `roomcast_reply_budget`). The
    /// link sets it per role from what a daemon of ours writes
    /// (`ClusterLink.init`); a reply over it closes the connection.
    let maxReplyBytes: Int
    /// The parser's count of the reply being read (outlives `reader`).
    let budget: UnsafeMutablePointer<roomcast_reply_budget>

    init(role: Role, link: ClusterLink, selector: Selector<Server.Source>, maxReplyBytes: Int) {
        self.role = role
        self.link = link
        self.selector = selector
        self.maxReplyBytes = maxReplyBytes
        budget = .allocate(capacity: 1)
        budget.initialize(to: roomcast_reply_budget())
        budget.pointee.max = maxReplyBytes
        output.reserveCapacity(4096)
    }

    deinit {
        if let reader { redisReaderFree(reader) }
        budget.deallocate()
    }

    /// Bytes encoded for Redis and not yet written.
    var pendingOutput: Int { output.count - outputSent }

    /// Replies still expected.
    var outstanding: Int { expected.count - expectedHead }

    // MARK: - Connect and close

    /// Starts a non-blocking connect to a numeric address (nothing is looked up).
    /// - Returns: nil once the connect is under way, or why it could not start.
    func connect(_ address: RedisAddress, nowMs: UInt64) -> String? {
        precondition(fd < 0)
        let target: SocketAddress
        switch address {
        case .tcp(let host, let port, _):
            guard let a = try? SocketAddress.resolve(host: host, port: port, numericHost: true).first else {
                return "\(host) is not a numeric address"
            }
            target = a
        case .unix(let path):
            guard let a = SocketAddress.unix(path: path) else { return "unix:\(path): the path is too long" }
            target = a
        }
        let s = socket(target.family, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard s >= 0 else { return "socket: \(String(cString: strerror(errno)))" }
        if target.family != AF_UNIX { _ = Sys.setOption(s, Int32(IPPROTO_TCP), TCP_NODELAY, 1) }
        let rc = target.withSockaddr { Glibc.connect(s, $0, $1) }
        if rc != 0 && errno != EINPROGRESS {
            let reason = String(cString: strerror(errno))
            Sys.close(s)
            return reason
        }
        do {
            // EPOLLOUT tells when connect(2) completes.
            registration = try selector.register(s, .cluster(role.rawValue), readable: true, writable: true)
        } catch {
            Sys.close(s)
            return error.description
        }
        fd = s
        reader = reader ?? roomcast_reader_create(budget)
        state = .connecting
        sinceMs = nowMs
        awaitingSinceMs = nil
        pendingReset = nil
        settledAtMs = nil
        return nil
    }

    /// Closes the socket now and forgets every command and reply in flight.
    /// The link decides what happens next (`ClusterLink.failed`).
    func close() {
        if let r = registration { selector.deregister(r) }
        registration = nil
        if fd >= 0 { Sys.close(fd) }
        fd = -1
        // A fresh parser for the next connection: no half reply carries over.
        if let reader { redisReaderFree(reader) }
        reader = nil
        output.removeAll(keepingCapacity: output.capacity <= 1 << 20)
        outputSent = 0
        expected.removeAll(keepingCapacity: true)
        expectedHead = 0
        handshakeLeft = 0
        state = .idle
        awaitingSinceMs = nil  // settledAtMs stays: the link's backoff reads it
    }

    /// The connection broke (`reason`): closed, and the link told once.
    func broke(_ reason: String, _ loss: Loss) {
        let wasConnected = state == .handshaking || state == .ready
        close()
        link.redisLost(self, reason: reason, connected: wasConnected, loss: loss)
    }

    // MARK: - Readiness, reads and writes

    /// An event of the selector for this connection.
    func ready(_ readiness: Readiness) {
        guard fd >= 0 else { return }
        if state == .connecting {
            guard readiness.contains(.writable) || readiness.contains(.hangup) else { return }
            var error: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            if getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 { error = errno }
            if error != 0 { return broke(String(cString: strerror(error)), .io) }
            state = .handshaking
            sinceMs = link.nowMs
            link.redisConnected(self)
            write()
            return
        }
        if readiness.contains(.readable) || readiness.contains(.hangup) {
            readReplies()
            guard fd >= 0 else { return }
        }
        if readiness.contains(.writable) { write() }
    }

    /// Before the loop waits: what is encoded goes out.
    func flush() {
        guard fd >= 0, state != .connecting, pendingOutput > 0 else { return }
        write()
    }

    private func write() {
        guard fd >= 0, let r = registration else { return }
        if role == .publisher && pendingOutput > 0 { link.publisherWillWrite() }
        while pendingOutput > 0 {
            let result = output.withUnsafeBytes { Sys.send(fd, $0.baseAddress! + outputSent, pendingOutput) }
            switch result {
            case .done(let n):
                outputSent += n
            case .wouldBlock, .endOfFile:
                break
            case .failed(let e):
                return broke(String(cString: strerror(e)), .io)
            }
            if case .done = result { continue }
            break
        }
        if pendingOutput == 0 {
            output.removeAll(keepingCapacity: output.capacity <= 1 << 20)
            outputSent = 0
        } else if outputSent >= 64 * 1024 && outputSent * 2 >= output.count {
            output.removeFirst(outputSent)
            outputSent = 0
        }
        do {
            try selector.setInterest(r, readable: true, writable: pendingOutput > 0)
        } catch {
            pendingReset = error.description
        }
    }

    // MARK: - Commands

    /// Encodes `args` as one command and expects its reply (`kind`); the
    /// channels of a (UN)SUBSCRIBE are `args` after the first.
    /// - Returns: false when there is no connection to send it on.
    @discardableResult
    func command(_ args: [[UInt8]], _ kind: Expectation.Kind) -> Bool {
        guard fd >= 0 else { return false }
        appendArrayHeader(args.count)
        for a in args { a.withUnsafeBytes { appendBulk($0) } }
        var e = Expectation(kind: kind)
        if kind == .subscribe || kind == .unsubscribe { e.channels = Array(args.dropFirst()) }
        if state != .ready {
            e.handshake = true
            handshakeLeft += 1
        }
        expect(e) { link.nowMs }
        return true
    }

    /// PUBLISH `channel` `payload`: encoded straight into the output buffer.
    /// - Returns: false when there is no connection to send it on.
    func publish(_ channel: [UInt8], _ payload: [UInt8], nowMs: @autoclosure () -> UInt64) -> Bool {
        guard fd >= 0 else { return false }
        appendArrayHeader(3)
        output.append(contentsOf: "$7\r\nPUBLISH\r\n".utf8)
        channel.withUnsafeBytes { appendBulk($0) }
        payload.withUnsafeBytes { appendBulk($0) }
        expect(Expectation(kind: .publish), nowMs)
        return true
    }

    /// `nowMs` is read only when nothing else waits (the publish path's clock read).
    private func expect(_ e: Expectation, _ nowMs: () -> UInt64) {
        if outstanding == 0 { awaitingSinceMs = nowMs() }
        expected.append(e)
    }

    private func appendArrayHeader(_ count: Int) {
        output.append(UInt8(ascii: "*"))
        appendDecimal(count)
        output.append(contentsOf: [0x0D, 0x0A])
    }

    private func appendBulk(_ bytes: UnsafeRawBufferPointer) {
        output.append(UInt8(ascii: "$"))
        appendDecimal(bytes.count)
        output.append(contentsOf: [0x0D, 0x0A])
        output.append(contentsOf: bytes)
        output.append(contentsOf: [0x0D, 0x0A])
    }

    private func appendDecimal(_ n: Int) {
        if n < 10 { output.append(UInt8(48 + n)); return }
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var v = n, count = 0
        withUnsafeMutableBytes(of: &digits) { d in
            while v > 0 { d[count] = UInt8(48 + v % 10); v /= 10; count += 1 }
            for i in stride(from: count - 1, through: 0, by: -1) { output.append(d[i]) }
        }
    }
}
