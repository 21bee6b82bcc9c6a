@preconcurrency import CHiredis
@preconcurrency import Glibc
import RoomcastCore
import RoomcastIO

// RedisConnection.swift owns one hiredis async context on the daemon's own
// selector: no thread of hiredis's own, no event library.
//
// - hiredis's adapter hooks: `addWrite` only notes that output is waiting
//   (hiredis calls it for every command); the loop calls
//   redisAsyncHandleWrite once per turn, before it waits (`flush`), and
//   arms EPOLLOUT only while the socket refuses bytes. `cleanup` takes the
//   descriptor off the selector before hiredis closes it. `addRead` and
//   `delRead` are not needed: the descriptor is always watched for reading,
//   level-triggered (hiredis reads at most 16 KiB per call).
// - Every command goes through redisAsyncCommandArgv (the variadic
//   redisAsyncCommand does not import); the publish path reuses its argv.
// - hiredis may free the context inside any of its calls (an error, EOF):
//   `context` is read again after each, never kept in a local across one.
// - The context is freed explicitly (`free`), never by a deinit, and never
//   recreated inside one of its own callbacks: reconnects are timers.

/// What a reply is for (the privdata of its command).
enum RedisReplyTag: UInt {
    /// The publisher's PING after connecting: its reply makes it ready.
    case ping = 1
    /// A PUBLISH (frames and heartbeats).
    case publish = 2
    /// Everything the subscriber's channels bring: confirmations and messages.
    case subscription = 3
}

/// One connection to Redis: the cluster has a publisher and a subscriber
/// (RESP2 allows nothing but (UN)SUBSCRIBE and PING on a subscribed one).
final class RedisConnection {
    enum Role: Int {
        case publisher = 0
        case subscriber = 1

        var name: String { self == .publisher ? "publisher" : "subscriber" }
    }

    enum State: Equatable {
        /// No context; the next attempt is at `retryAtMs`.
        case idle
        /// connect(2) in progress.
        case connecting
        /// Connected; waiting for the first answer (PONG, or the heartbeat
        /// channel's SUBSCRIBE confirmation).
        case handshaking
        /// Answered: usable.
        case ready
    }

    let role: Role
    private unowned let link: ClusterLink
    private let selector: Selector<Server.Source>
    private(set) var context: UnsafeMutablePointer<redisAsyncContext>?
    private var registration: Registration?
    var state = State.idle
    /// hiredis has output waiting since the last flush (its `addWrite` hook).
    fileprivate var wantsWrite = false
    /// Inside our own redisAsyncFree: its callbacks report nothing.
    fileprivate var freeing = false

    /// When the current state began (connect timeouts), in ms.
    var sinceMs: UInt64 = 0
    /// When an idle connection tries again, in ms.
    var retryAtMs: UInt64 = 0
    /// Attempts since it was last ready (the backoff's exponent).
    var attempts = 0
    /// Commands sent that expect a reply and have none yet.
    var outstanding = 0
    /// Since when the oldest unanswered command has waited without any reply, in ms (nil: none waits).
    var awaitingSinceMs: UInt64?
    /// A reason to drop the connection, found inside a callback (where
    /// hiredis must not be freed); acted on by the next timer run.
    var pendingReset: String?

    // The publish path's argv, made once.
    private let argv = UnsafeMutablePointer<UnsafePointer<CChar>?>.allocate(capacity: 3)
    private let argvlen = UnsafeMutablePointer<Int>.allocate(capacity: 3)
    private let publishCommand = UnsafePointer(strdup("PUBLISH")!)

    init(role: Role, link: ClusterLink, selector: Selector<Server.Source>) {
        self.role = role
        self.link = link
        self.selector = selector
    }

    deinit {
        argv.deallocate()
        argvlen.deallocate()
        Glibc.free(UnsafeMutableRawPointer(mutating: publishCommand))
    }

    /// Bytes hiredis holds for Redis and has not written.
    var pendingOutput: Int {
        guard let context else { return 0 }
        return roomcast_redis_pending_output(context)
    }

    // MARK: - Connect and free

    /// Starts a non-blocking connect (a numeric address: hiredis's
    /// getaddrinfo then does no lookup).
    /// - Returns: nil once the connect is under way, or why it could not start.
    func connect(_ address: RedisAddress, nowMs: UInt64) -> String? {
        precondition(context == nil)
        let made: UnsafeMutablePointer<redisAsyncContext>?
        switch address {
        case .tcp(let host, let port, _): made = redisAsyncConnect(host, Int32(port))
        case .unix(let path): made = redisAsyncConnectUnix(path)
        }
        guard let ac = made else { return "out of memory" }
        if ac.pointee.err != 0 {
            let reason = String(cString: ac.pointee.errstr)
            redisAsyncFree(ac)
            return reason
        }
        let me = Unmanaged.passUnretained(self).toOpaque()
        ac.pointee.data = me
        ac.pointee.ev.data = me
        // Every hook before SetConnectCallback: it calls addWrite to learn when the connect completes.
        ac.pointee.ev.addWrite = { p in Unmanaged<RedisConnection>.fromOpaque(p!).takeUnretainedValue().wantsWrite = true }
        ac.pointee.ev.cleanup = { p in Unmanaged<RedisConnection>.fromOpaque(p!).takeUnretainedValue().contextCleanedUp() }
        do {
            // EPOLLOUT tells when connect(2) completes; the fd stays on the
            // selector until hiredis's cleanup hook.
            registration = try selector.register(ac.pointee.c.fd, .cluster(role.rawValue), readable: true, writable: true)
        } catch {
            redisAsyncFree(ac)
            return error.description
        }
        context = ac
        redisAsyncSetConnectCallback(ac) { ac, status in
            guard let c = RedisConnection.of(ac), !c.freeing else { return }
            if status == REDIS_OK {
                c.link.redisConnected(c)
            } else {
                c.link.redisLost(c, reason: RedisConnection.errorText(ac), connected: false)
            }
        }
        redisAsyncSetDisconnectCallback(ac) { ac, status in
            guard let c = RedisConnection.of(ac), !c.freeing else { return }
            c.link.redisLost(c, reason: status == REDIS_OK ? "disconnected" : RedisConnection.errorText(ac), connected: true)
        }
        state = .connecting
        sinceMs = nowMs
        outstanding = 0
        awaitingSinceMs = nil
        pendingReset = nil
        return nil
    }

    /// Frees the context now (redisAsyncFree runs every pending callback
    /// with no reply and the cleanup hook before it returns); its callbacks
    /// report nothing. Never call it from inside a hiredis callback.
    func free() {
        guard let ac = context else { return }
        freeing = true
        redisAsyncFree(ac)
        freeing = false
        context = nil
        state = .idle
    }

    /// hiredis's cleanup hook: the descriptor leaves the selector before hiredis closes it.
    private func contextCleanedUp() {
        if let r = registration { selector.deregister(r) }
        registration = nil
        context = nil
        wantsWrite = false
    }

    private static func of(_ ac: UnsafePointer<redisAsyncContext>?) -> RedisConnection? {
        guard let data = ac?.pointee.data else { return nil }
        return Unmanaged<RedisConnection>.fromOpaque(data).takeUnretainedValue()
    }

    private static func errorText(_ ac: UnsafePointer<redisAsyncContext>?) -> String {
        guard let ac else { return "error" }
        if let s = ac.pointee.errstr, s.pointee != 0 { return String(cString: s) }
        if ac.pointee.c.errstr.0 != 0 {
            return withUnsafeBytes(of: ac.pointee.c.errstr) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
        }
        return "error \(ac.pointee.err)"
    }

    // MARK: - Readiness and writes

    /// An event of the selector for this connection.
    func ready(_ readiness: Readiness) {
        guard let ac = context else { return }
        if roomcast_redis_connected(ac) == 0 {
            // The connect completed (or failed): hiredis learns which at its first write event.
            if readiness.contains(.writable) || readiness.contains(.hangup) { write() }
            return
        }
        if readiness.contains(.readable) || readiness.contains(.hangup) {
            redisAsyncHandleRead(ac)  // one read of at most 16 KiB; level-triggered, so the rest comes next turn
        }
        if readiness.contains(.writable), context != nil { write() }
    }

    /// Before the loop waits: what hiredis holds goes out in one write.
    func flush() {
        guard wantsWrite, let ac = context, roomcast_redis_connected(ac) != 0 else { return }
        write()
    }

    private func write() {
        guard let ac = context else { return }
        redisAsyncHandleWrite(ac)  // may free the context
        wantsWrite = false
        guard let ac = context, let r = registration else { return }
        let refused = roomcast_redis_connected(ac) == 0 || roomcast_redis_pending_output(ac) > 0
        do {
            try selector.setInterest(r, readable: true, writable: refused)
        } catch {
            pendingReset = error.description
        }
    }

    // MARK: - Commands

    /// The reply callback of every command: privdata is the command's tag.
    private static let onReply: @convention(c) (UnsafeMutablePointer<redisAsyncContext>?, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void = { ac, reply, privdata in
        guard let c = RedisConnection.of(ac), !c.freeing,
              let tag = RedisReplyTag(rawValue: UInt(bitPattern: privdata)) else { return }
        c.link.redisReply(c, tag, reply?.assumingMemoryBound(to: redisReply.self))
    }

    /// Sends a command of any arguments (not the publish fast path).
    /// - Returns: false when hiredis refused it (no context, or it is closing).
    @discardableResult
    func command(_ args: [[UInt8]], _ tag: RedisReplyTag) -> Bool {
        guard let ac = context else { return false }
        var pointers: [UnsafePointer<CChar>?] = []
        var lengths: [Int] = []
        let storage = args.map { bytes -> UnsafeMutableRawPointer in
            let p = UnsafeMutableRawPointer.allocate(byteCount: max(bytes.count, 1), alignment: 1)
            bytes.withUnsafeBytes { if !$0.isEmpty { p.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
            return p
        }
        defer { storage.forEach { $0.deallocate() } }
        for (p, bytes) in zip(storage, args) {
            pointers.append(UnsafePointer(p.assumingMemoryBound(to: CChar.self)))
            lengths.append(bytes.count)
        }
        let status = pointers.withUnsafeMutableBufferPointer { argv in
            lengths.withUnsafeBufferPointer { argvlen in
                redisAsyncCommandArgv(ac, Self.onReply, UnsafeMutableRawPointer(bitPattern: tag.rawValue),
                                      Int32(args.count), argv.baseAddress, argvlen.baseAddress)
            }
        }
        guard status == REDIS_OK else { return false }
        if tag != .subscription { expectReply(nowMs: link.nowMs) }
        return true
    }

    /// PUBLISH `channel` `payload`, with the argv made once.
    /// - Returns: false when hiredis refused it.
    func publish(_ channel: [UInt8], _ payload: [UInt8], nowMs: @autoclosure () -> UInt64) -> Bool {
        guard let ac = context else { return false }
        let status = channel.withUnsafeBytes { ch in
            payload.withUnsafeBytes { pl in
                argv[0] = publishCommand
                argv[1] = ch.baseAddress.map { UnsafePointer($0.assumingMemoryBound(to: CChar.self)) } ?? publishCommand
                argv[2] = pl.baseAddress.map { UnsafePointer($0.assumingMemoryBound(to: CChar.self)) } ?? publishCommand
                argvlen[0] = 7
                argvlen[1] = ch.count
                argvlen[2] = pl.count
                return redisAsyncCommandArgv(ac, Self.onReply, UnsafeMutableRawPointer(bitPattern: RedisReplyTag.publish.rawValue),
                                             3, argv, argvlen)
            }
        }
        guard status == REDIS_OK else { return false }
        expectReply(nowMs: nowMs())
        return true
    }

    private func expectReply(nowMs: @autoclosure () -> UInt64) {
        if outstanding == 0 { awaitingSinceMs = nowMs() }
        outstanding += 1
    }

    /// A reply arrived (called by the link for the publisher's replies):
    /// the wait restarts from now while others are still unanswered.
    func replied(nowMs: UInt64) {
        outstanding = max(0, outstanding - 1)
        awaitingSinceMs = outstanding == 0 ? nil : nowMs
    }
}

/// The strings and integer of a hiredis reply, read in place.
extension UnsafeMutablePointer where Pointee == redisReply {
    /// Element `i` of an array reply as bytes (valid only inside the callback), nil if it is not a string.
    func bytes(at i: Int) -> UnsafeRawBufferPointer? {
        guard pointee.type == REDIS_REPLY_ARRAY, i < pointee.elements, let e = pointee.element[i],
              e.pointee.type == REDIS_REPLY_STRING, let s = e.pointee.str else { return nil }
        return UnsafeRawBufferPointer(start: s, count: e.pointee.len)
    }

    /// A status or error reply's text.
    var text: String {
        guard let s = pointee.str else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: s, count: pointee.len), as: UTF8.self)
    }
}
