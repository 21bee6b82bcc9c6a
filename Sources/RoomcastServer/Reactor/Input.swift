import RoomcastCore
import RoomcastIO

// Input.swift owns the read side of a connection: bounded reads, frame
// reassembly, ONE frame loop for both dialects (generic over the codec),
// rate limits, and the handling of frames the relay rejects (violations).
// It writes nothing to sockets (the relay queues output into the fan-out)
// and closes nobody itself: it asks the table (`ConnectionTable.close`).

/// A frame codec the input loop can run: how frames are cut from a byte
/// stream, and what a complete frame does.
protocol InputCodec {
    /// The dialect whose heartbeat tracker a frame refreshes.
    static var dialect: Dialect { get }
    /// Bytes before the body.
    static var headerSize: Int { get }
    /// The largest body accepted, in bytes (docs/protocol/ltb.md §1, §7).
    static func maxFrameBytes(_ config: Config) -> Int
    /// Peeks at the start of `bytes`: a whole frame, not yet, or a header
    /// that claims more than `maxFrameBytes` (nothing is allocated for it).
    static func parse(_ bytes: UnsafeRawBufferPointer, _ config: Config, maxFrameBytes: Int) -> FrameCodec.Step
    /// The frame type for logs and rate limits (nil: the dialect has none).
    static func frameType(_ type: UInt16) -> UInt16?
    /// Handles one complete frame (`frame` includes its header).
    static func handle(_ server: Server, _ id: Int, type: UInt16, frame: UnsafeRawBufferPointer, now: UInt64)
}

/// Length-type-body frames (docs/protocol/ltb.md §1): relayed as received.
enum LTBInput: InputCodec {
    static var dialect: Dialect { .ltb }
    static var headerSize: Int { FrameCodec.headerSize }
    static func maxFrameBytes(_ config: Config) -> Int { config.protocol.maxFrameBytes }
    @inline(__always)
    static func parse(_ bytes: UnsafeRawBufferPointer, _ config: Config, maxFrameBytes: Int) -> FrameCodec.Step {
        FrameCodec.parse(bytes, byteOrder: config.protocol.byteOrder, maxFrameBytes: maxFrameBytes)
    }
    static func frameType(_ type: UInt16) -> UInt16? { type }
    @inline(__always)
    static func handle(_ server: Server, _ id: Int, type: UInt16, frame: UnsafeRawBufferPointer, now: UInt64) {
        server.relayFrame(id, type: type, frame: frame, now: now)
    }
}

/// Length + JSON frames (docs/protocol/json.md §7): each command is bridged (JSONBridge.swift).
enum JSONInput: InputCodec {
    static var dialect: Dialect { .json }
    static var headerSize: Int { JSONFrameCodec.headerSize }
    static func maxFrameBytes(_ config: Config) -> Int { config.json.maxFrameBytes }
    static func parse(_ bytes: UnsafeRawBufferPointer, _ config: Config, maxFrameBytes: Int) -> FrameCodec.Step {
        JSONFrameCodec.parse(bytes, maxFrameBytes: maxFrameBytes)
    }
    static func frameType(_ type: UInt16) -> UInt16? { nil }
    static func handle(_ server: Server, _ id: Int, type: UInt16, frame: UnsafeRawBufferPointer, now: UInt64) {
        server.handleJSONCommand(id, UnsafeRawBufferPointer(rebasing: frame[headerSize...]), now: now)
    }
}

extension Server {
    // Per-wakeup work bounds: reads per connection event, bytes per read.
    static let readSize = 64 * 1024
    static let readsPerWakeup = 4

    /// Reads what `id` sent, up to `readsPerWakeup` reads; EOF and errors
    /// end the connection (ConnectionLifecycle.swift). Nothing while its own
    /// backlog is above `output_soft_bytes` (`pauseInput`); a hang-up seen
    /// while paused is read as usual.
    func readFrames(_ id: Int) {
        if !table.fanout.outboxes[id].inputPaused, table.fanout.outboxes[id].queue.count > config.limits.outputSoftBytes {
            pauseInput(id)
            return
        }
        if let ssl = table.slots[id]!.tls {
            readTLS(id, ssl)  // TLSConnection.swift
            return
        }
        let fd = table.slots[id]!.fd
        for _ in 0..<Self.readsPerWakeup {
            guard table.isOpen(id) else { return }
            let result = scratch.withUnsafeMutableBytes { Sys.read(fd, $0.baseAddress!, $0.count) }
            switch result {
            case .done(let n):
                consume(id, count: n)
                if n < Self.readSize { return }
            case .wouldBlock:
                return
            case .endOfFile:
                peerClosed(id)
                return
            case .failed(let e):
                table.close(id, SystemError("read", errno: e).description)
                return
            }
        }
    }

    /// Handles `count` freshly read bytes in `scratch`. Whole frames are
    /// relayed straight from the read buffer; only a trailing partial frame
    /// is copied into the connection's own input buffer.
    func consume(_ id: Int, count n: Int) {
        status.bytesIn &+= UInt64(n)
        if table.slots[id]!.dialect == .webSocket {
            consumeWebSocket(id, count: n)  // WebSocketServer.swift
            return
        }
        var input: [UInt8] = []
        swap(&input, &table.slots[id]!.input)
        let now = clock()
        let dialect = table.slots[id]!.dialect
        let wasPartial = !input.isEmpty
        var completed = false
        // The crash log learns of the read before it is processed
        // (LiveStore.swift): a crash while processing must not cut a frame.
        let logs = live != nil
        if input.isEmpty {
            let used = scratch.withUnsafeBytes { raw in
                let bytes = UnsafeRawBufferPointer(rebasing: raw[0..<n])
                if logs { logInput(dialect, id, bytes, newBytes: n) }
                return processFrames(dialect, id, bytes, now: now)
            }
            if used < n { input.append(contentsOf: scratch[used..<n]) }
        } else {
            input.append(contentsOf: scratch[0..<n])
            let used = input.withUnsafeBytes { bytes in
                if logs { logInput(dialect, id, bytes, newBytes: n) }
                return processFrames(dialect, id, bytes, now: now)
            }
            completed = used > 0
            if used == input.count {
                input = []
            } else if used > 0 {
                input.removeSubrange(0..<used)
            }
        }
        guard table.isOpen(id) else { return }
        // A partial frame: its sender may be waiting for our ACK before it
        // sends the rest (Nagle's algorithm, with a header and a body in two
        // writes), and a delayed ACK would hold it about 40 ms. Acknowledge
        // now (TCP_QUICKACK is not permanent, tcp(7): set it each time).
        if !input.isEmpty { Socket.acknowledgeNow(table.slots[id]!.fd) }
        if dialect == .json {
            heartbeats.jsonInput(id, partial: !input.isEmpty, startedNow: !wasPartial || completed, nowMs: now)
        }
        swap(&input, &table.slots[id]!.input)
    }

    /// `Server.liveInput` for a read about to be processed: `bytes` is the
    /// input with the read's `newBytes` at its end. A header over the limit
    /// logs nothing: the connection is closed.
    private func logInput(_ dialect: Dialect, _ id: Int, _ bytes: UnsafeRawBufferPointer, newBytes: Int) {
        let whole = dialect == .json ? wholeFrames(JSONInput.self, bytes) : wholeFrames(LTBInput.self, bytes)
        if let whole { liveInput(id, bytes, newBytes: newBytes, wholeFrames: whole) }
    }

    /// The bytes of the whole frames at the start of `bytes` (headers only
    /// are read); nil when a header claims more than the limit.
    private func wholeFrames<Codec: InputCodec>(_: Codec.Type, _ bytes: UnsafeRawBufferPointer) -> Int? {
        let limit = Codec.maxFrameBytes(config)
        var offset = 0
        while offset < bytes.count {
            switch Codec.parse(UnsafeRawBufferPointer(rebasing: bytes[offset...]), config, maxFrameBytes: limit) {
            case .needMore: return offset
            case .tooLarge: return nil
            case .frame(_, let length): offset += Codec.headerSize + length
            }
        }
        return offset
    }

    private func processFrames(_ dialect: Dialect, _ id: Int, _ bytes: UnsafeRawBufferPointer, now: UInt64) -> Int {
        dialect == .json ? frameLoop(JSONInput.self, id, bytes, now: now) : frameLoop(LTBInput.self, id, bytes, now: now)
    }

    /// Handles every whole frame at the start of `bytes`.
    /// - Returns: the bytes used (all of them once the connection is closed).
    private func frameLoop<Codec: InputCodec>(_: Codec.Type, _ id: Int, _ bytes: UnsafeRawBufferPointer, now: UInt64) -> Int {
        let limit = Codec.maxFrameBytes(config)
        var offset = 0
        while offset < bytes.count {
            let rest = UnsafeRawBufferPointer(rebasing: bytes[offset...])
            switch Codec.parse(rest, config, maxFrameBytes: limit) {
            case .needMore:
                return offset
            case .tooLarge(let claimed):
                frameTooLarge(id, claimed: claimed, limit: limit, now: now)
                return bytes.count
            case .frame(let type, let length):
                let size = Codec.headerSize + length
                offset += size
                beforeFrame?(id)
                status.framesIn &+= 1
                heartbeats.touch(id, Codec.dialect, nowMs: now)
                if withinRateLimits(id, bytes: size, type: Codec.frameType(type), now: now) {
                    Codec.handle(self, id, type: type, frame: UnsafeRawBufferPointer(rebasing: rest[0..<size]), now: now)
                }
                guard table.isOpen(id) else { return bytes.count }
            }
        }
        return offset
    }

    /// One LTB frame into the relay (docs/protocol/ §2-§4).
    func relayFrame(_ id: Int, type: UInt16, frame: UnsafeRawBufferPointer, now: UInt64) {
        if auth.active(config) {
            switch authorize(id, type: type, frame: frame, now: now) {
            case .refused: return
            case .join(let session): return relaySignedJoin(id, type: type, frame: frame, session: session, now: now)
            case .pass: break
            }
        }
        if type == FrameKind.textType { guard slowModeAllows(id, type: type, now: now) else { return } }
        relayed(id, relay.receive(from: id, type: type, frame: frame, sink: table.fanout), type: type, now: now)
    }

    /// A join whose token verified: relayed proving its sub (the cluster
    /// envelope carries it, docs/protocol/across-daemons.md §12), and its
    /// session committed once the relay took the join. Apart from
    /// `relayFrame`, so that every other frame pays nothing for it (it cost
    /// 7 instructions per delivery inline: a copy of the session per frame).
    @inline(never)
    private func relaySignedJoin(_ id: Int, type: UInt16, frame: UnsafeRawBufferPointer, session: AuthSession, now: UInt64) {
        let event = relay.receive(from: id, type: type, frame: frame, proving: session.claims.sub, sink: table.fanout)
        if case .joined = event { commitSession(id, session) }
        relayed(id, event, type: type, now: now)
    }

    /// What the relay did with a frame of `id`: a refusal is handled, the rest logged at debug.
    @inline(__always)
    private func relayed(_ id: Int, _ event: RelayEvent, type: UInt16, now: UInt64) {
        if case .rejected = event { handleRejected(id, event, type: type, now: now) }
        else if logger.enabled(.debug) { logRelayEvent(id, event) }
    }

    /// Takes one frame of `bytes` (header included) from the connection's
    /// token buckets. A frame over `frames_per_second` or `bytes_per_second`
    /// is dropped and counts as a violation.
    func withinRateLimits(_ id: Int, bytes: Int, type: UInt16?, now: UInt64) -> Bool {
        var exceeded: String?
        if table.slots[id]!.frameBucket != nil, !table.slots[id]!.frameBucket!.take(1, nowMs: now) {
            exceeded = "limits.frames_per_second (\(config.limits.framesPerSecond))"
        } else if table.slots[id]!.byteBucket != nil, !table.slots[id]!.byteBucket!.take(bytes, nowMs: now) {
            exceeded = "limits.bytes_per_second (\(formatSize(config.limits.bytesPerSecond)))"
        }
        guard let exceeded else { return true }
        handleRejected(id, relay.reject(id, reason: "rate limit: over \(exceeded)", code: .rateLimit), type: type, now: now)
        return false
    }

    /// Fresh token buckets with the current `[limits]` rates (on accept, and
    /// for everyone on reload).
    func resetRateLimits(_ id: Int, now: UInt64) {
        let l = config.limits
        table.slots[id]!.frameBucket = l.framesPerSecond > 0
            ? TokenBucket(rate: l.framesPerSecond, burst: l.framesBurst > 0 ? l.framesBurst : l.framesPerSecond, nowMs: now) : nil
        table.slots[id]!.byteBucket = l.bytesPerSecond > 0
            ? TokenBucket(rate: l.bytesPerSecond, burst: l.bytesBurst > 0 ? l.bytesBurst : l.bytesPerSecond, nowMs: now) : nil
    }

    /// A header claimed more than the limit: the stream cannot be trusted any
    /// further, so only this client is closed (docs/protocol/ltb.md §1).
    private func frameTooLarge(_ id: Int, claimed: UInt32, limit: Int, now: UInt64) {
        let address = table.address(of: id)
        logger.peerWarning(reason: "frame_too_large", nowMs: now,
                           "\(address): frame length \(claimed) exceeds max_frame_bytes (\(limit)); closing",
                           ["CLIENT_ADDR": address, "LENGTH": String(claimed)])
        table.close(id, "frame length \(claimed) exceeds max_frame_bytes \(limit)")
    }

    func logRelayEvent(_ id: Int, _ event: RelayEvent) {
        let address = table.address(of: id)
        switch event {
        case .joined(let name, let room, let n):
            let (name, room) = (clipForLog(name), clipForLog(room))
            logger.debug("\(name) joined \(room) (\(n) recipients)", ["CLIENT_ADDR": address, "ROOM": room, "USER_NAME": name])
        case .left(let room, let n):
            let room = room.map { clipForLog($0) }
            logger.debug("client left \(room ?? "no room") (\(n) recipients)", ["CLIENT_ADDR": address, "ROOM": room ?? ""])
        default:
            break
        }
    }
}
