import RoomcastCore

// WebSocketServer.swift owns the WebSocket dialect on the reactor
// (docs/protocol/websocket.md §15, RFC 6455): the HTTP upgrade of a new connection,
// then its frames: messages into the JSON bridge or the relay, pings and
// pongs, close frames, and the close codes of a broken stream. What the
// relay sends out is framed once per broadcast by the fan-out
// (`Fanout.broadcast`); what goes to one connection alone (the 101 answer,
// an HTTP refusal, pongs, pings, close frames) is `Fanout.unicast`.

/// The schedule of the pings to every upgraded connection
/// (`Server.pingWebSocketsIfDue`), carried over a restart per connection
/// (`HandOverState.WebSocket.nextPingMs`).
struct WebSocketPings {
    /// When the next round is due, in ms.
    var nextMs: UInt64 = 0

    func isDue(nowMs: UInt64) -> Bool { nowMs >= nextMs }

    /// The ms left until the next round (0: due), for the hand-over's record.
    func remainingMs(nowMs: UInt64) -> UInt32 { UInt32(clamping: nextMs > nowMs ? nextMs - nowMs : 0) }

    /// A restored connection was due for its ping at `dueMs`: the next
    /// round comes no later (the earliest of the restored ones, a past
    /// schedule replaced).
    mutating func restore(dueMs: UInt64, nowMs: UInt64) { nextMs = nextMs > nowMs ? min(nextMs, dueMs) : dueMs }
}

extension Server {
    /// Handles `count` freshly read bytes in `scratch` from a WebSocket
    /// connection: the upgrade, then whole frames; the rest waits in the
    /// connection's input buffer (the decoder consumes whole frames only).
    func consumeWebSocket(_ id: Int, count n: Int) {
        let now = clock()
        var input: [UInt8] = []
        swap(&input, &table.slots[id]!.input)
        input.append(contentsOf: scratch[0..<n])
        let used = input.withUnsafeBytes { webSocketInput(id, $0, newBytes: n, now: now) }
        guard table.isOpen(id) else { return }  // closing or draining: the input is dropped
        if used == input.count { input.removeAll(keepingCapacity: input.capacity <= Self.readSize) }
        else if used > 0 { input.removeSubrange(0..<used) }
        if !input.isEmpty { Socket.acknowledgeNow(table.slots[id]!.fd) }
        swap(&input, &table.slots[id]!.input)
    }

    /// The upgrade, if still under way, then every whole frame at the start of `bytes`.
    /// - Returns: the bytes used (all of them once the connection stops reading).
    /// With a live log (LiveStore.swift), the read's frames are decoded
    /// first, logged, then acted on (`webSocketFrames`).
    private func webSocketInput(_ id: Int, _ bytes: UnsafeRawBufferPointer, newBytes: Int, now: UInt64) -> Int {
        var offset = 0
        let logs = live.map { id < $0.slots.count && $0.slots[id].serial != 0 } ?? false
        if case .upgrading(var parser) = table.slots[id]!.webSocket!.phase {
            switch parser.parse(bytes) {
            case .needMore:
                table.slots[id]!.webSocket!.phase = .upgrading(parser)
                if logs { liveInput(id, bytes, newBytes: newBytes, wholeFrames: 0) }
                return 0
            case .error(let error):
                refuseUpgrade(id, error, now: now)
                return bytes.count
            case .request(let request, let headBytes):
                guard upgrade(id, request, now: now) else { return bytes.count }
                if logs { liveUpgraded(id) }
                offset = headBytes
            }
        }
        return webSocketFrames(id, bytes, from: offset, newBytes: newBytes, logged: logs, now: now)
    }

    /// Every whole frame of `bytes` from `start`, decoded and acted on: at once, or, when the
    /// live log keeps this connection (`logged`), every whole frame decoded first, the
    /// decoder's message and the input left logged (`liveWebSocketInput`), then the events
    /// acted on, so that a crash while acting loses the read's events (as the other dialects
    /// lose its frames) but never replays them or cuts a frame.
    /// - Returns: the bytes used (all of them once the connection stops reading).
    private func webSocketFrames(_ id: Int, _ bytes: UnsafeRawBufferPointer, from start: Int, newBytes: Int,
                                 logged: Bool, now: UInt64) -> Int {
        var offset = start
        var events: [WebSocketDecoder.Event] = []
        var failure: WebSocketFailure?
        let messageBefore = logged ? table.slots[id]!.webSocket!.decoder.message.count : 0
        var restarted = false
        decoding: while offset < bytes.count {
            let rest = UnsafeRawBufferPointer(rebasing: bytes[offset...])
            let inMessage = logged && table.slots[id]!.webSocket!.decoder.carried.messageOpcode != nil
            switch table.slots[id]!.webSocket!.decoder.next(rest) {
            case .needMore:
                break decoding
            case .failure(let f):
                failure = f
                break decoding
            case .event(let event, let consumed):
                offset += consumed
                if logged {
                    if inMessage, case .message = event { restarted = true }
                    events.append(event)
                } else if !actOnWebSocketEvent(id, event, now: now) {
                    return bytes.count
                }
            }
        }
        if logged {
            if failure == nil {
                liveWebSocketInput(id, bytes, newBytes: newBytes, consumed: offset, messageBefore: messageBefore, restarted: restarted)
            }
            for event in events where !actOnWebSocketEvent(id, event, now: now) { return bytes.count }
        }
        if let failure {
            failWebSocket(id, failure, now: now)
            return bytes.count
        }
        return offset
    }

    /// One decoded frame: proof of life (a pong or any frame), then its action.
    /// - Returns: whether the connection is still open.
    private func actOnWebSocketEvent(_ id: Int, _ event: WebSocketDecoder.Event, now: UInt64) -> Bool {
        heartbeats.touch(id, .webSocket, nowMs: now)
        webSocketEvent(id, event, now: now)
        return table.isOpen(id)
    }

    /// Decides the request head (WebSocketHandshake.evaluate) and answers it:
    /// 101 and the connection is upgraded, or the HTTP refusal and a close.
    /// - Returns: whether frames may follow.
    private func upgrade(_ id: Int, _ request: HTTPRequest, now: UInt64) -> Bool {
        let ws = config.webSocket
        let policy = WebSocketPolicy(webSocketPaths: ws.echo ? ["/", "/echo"] : ["/"],
                                     pagePaths: ws.page ? page?.paths ?? [] : [], allowedOrigins: ws.allowedOrigins)
        let handshake: WebSocketHandshake
        do {
            handshake = try WebSocketHandshake.evaluate(request, policy: policy)
        } catch {
            refuseUpgrade(id, error, now: now)
            return false
        }
        guard case .upgrade(let path, let key, let offered) = handshake, let spoken = handshake.spoken else {
            servePage(id, request, now: now)
            return false
        }
        guard let accept = webSocketAccept(key: key) else {
            refuseUpgrade(id, HTTPError(500, "SHA-1 is not available from libcrypto"), now: now)
            return false
        }
        table.fanout.unicast(WebSocketHandshake.response(accept: accept, subprotocol: offered), to: id)
        // Frames follow the answer: the torn-frame walk (Fanout) starts after it.
        table.fanout.outboxes[id].torn = table.fanout.outboxes[id].pending
        table.fanout.outboxes[id].webSocketFramed = true
        let echo = path == "/echo"
        table.slots[id]!.webSocket!.phase = .open
        table.slots[id]!.webSocket!.subprotocol = spoken
        table.slots[id]!.webSocket!.echo = echo
        heartbeats.webSocketUpgraded(id, nowMs: now)
        if !echo {
            table.fanout.outboxes[id].webSocketForm = spoken
            relay.connect(id)  // the default room (docs/protocol/rooms.md §4), as for the other dialects
        }
        logger.debug("WebSocket upgrade to \(path) (\(spoken.rawValue))",
                     ["CLIENT_ADDR": table.address(of: id), "PROTOCOL": spoken.rawValue])
        return true
    }

    /// One whole frame of an upgraded connection.
    private func webSocketEvent(_ id: Int, _ event: WebSocketDecoder.Event, now: UInt64) {
        switch event {
        case .fragment, .pong:
            break
        case .ping(let data):
            // RFC 6455 §5.5.2: a pong with the same application data.
            table.fanout.unicast(WebSocketFrameEncoder.encode(.pong, payload: data), to: id)
        case .close(let code, _):
            // RFC 6455 §5.5.1: answer with a close frame (echoing the code), then close.
            table.fanout.unicast(code.map { WebSocketFrameEncoder.close($0) } ?? WebSocketFrameEncoder.encode(.close, payload: []), to: id)
            endWebSocket(id, "closed by peer (close frame\(code.map { " \($0)" } ?? ""))")
        case .message(let opcode, let payload):
            status.framesIn &+= 1
            let session = table.slots[id]!.webSocket!
            if session.echo {
                table.fanout.unicast(WebSocketFrameEncoder.encode(opcode, payload: payload), to: id)
                return
            }
            switch (session.subprotocol, opcode) {
            case (.json, .text):
                guard withinRateLimits(id, bytes: payload.count, type: nil, now: now) else { return }
                payload.withUnsafeBytes { handleJSONCommand(id, $0, now: now) }
            case (.ltb, .binary):
                guard withinRateLimits(id, bytes: payload.count, type: nil, now: now) else { return }
                payload.withUnsafeBytes { ltbMessage(id, $0, now: now) }
            default:
                let wanted = session.subprotocol == .json ? "text" : "binary"
                failWebSocket(id, WebSocketFailure(.unsupportedData, "\(session.subprotocol.rawValue) takes \(wanted) messages only"), now: now)
            }
        }
    }

    /// A binary message of `roomcast.ltb.v1`: exactly one LTB frame, relayed
    /// as an LTB client's (docs/protocol/websocket.md §15); anything else is a violation.
    private func ltbMessage(_ id: Int, _ message: UnsafeRawBufferPointer, now: UInt64) {
        let limit = config.protocol.maxFrameBytes
        switch FrameCodec.parse(message, byteOrder: config.protocol.byteOrder, maxFrameBytes: limit) {
        case .frame(let type, let length) where FrameCodec.headerSize + length == message.count:
            relayFrame(id, type: type, frame: message, now: now)
        case .tooLarge(let claimed):
            handleRejected(id, relay.reject(id, reason: "websocket: LTB frame length \(claimed) exceeds protocol.max_frame_bytes (\(limit))",
                                            code: .frameTooLarge), type: nil, now: now)
        default:
            handleRejected(id, relay.reject(id, reason: "websocket: a \(message.count)-byte binary message is not exactly one LTB frame"),
                           type: nil, now: now)
        }
    }

    /// A plain GET of one of the page's files (docs/protocol/websocket.md §15, "The
    /// page"): the 200 answer with the file, then the connection is closed
    /// once it is written (one request per connection).
    private func servePage(_ id: Int, _ request: HTTPRequest, now: UInt64) {
        guard let response = page?.response(for: request.path) else {
            refuseUpgrade(id, HTTPError(404, "nothing is served at this path"), now: now)
            return
        }
        logger.debug("page \(request.path) served", ["CLIENT_ADDR": table.address(of: id)])
        table.fanout.unicast(response, to: id)
        endWebSocket(id, "page served")
    }

    /// An upgrade refused: the HTTP answer, then the connection is closed
    /// once it is written; logged once (REASON `websocket_upgrade_refused`).
    private func refuseUpgrade(_ id: Int, _ error: HTTPError, now: UInt64) {
        let address = table.address(of: id)
        logger.peerWarning(reason: "websocket_upgrade_refused", nowMs: now, "\(address): WebSocket upgrade refused: \(error)",
                           ["CLIENT_ADDR": address, "STATUS": String(error.status), "DETAIL": error.reason])
        table.fanout.unicast(error.response, to: id)
        endWebSocket(id, "upgrade refused: \(error.status)")
    }

    /// A broken stream (RFC 6455 §7.1.7): a close frame with the decoder's
    /// code, then the connection is closed; logged once with a REASON.
    private func failWebSocket(_ id: Int, _ failure: WebSocketFailure, now: UInt64) {
        let address = table.address(of: id)
        let reason = switch failure.code {
        case .protocolError: "websocket_protocol_error"
        case .invalidPayload: "websocket_invalid_utf8"
        case .messageTooBig: "websocket_message_too_big"
        case .unsupportedData: "websocket_unsupported_data"
        default: "websocket_failure"
        }
        logger.peerWarning(reason: reason, nowMs: now, "\(address): WebSocket closed with \(failure.code): \(failure.reason)",
                           ["CLIENT_ADDR": address, "CLOSE_CODE": String(failure.code.rawValue), "DETAIL": failure.reason,
                            "ROOM": relay.room(of: id) ?? ""])
        table.fanout.unicast(WebSocketFrameEncoder.close(failure.code, reason: failure.reason), to: id)
        endWebSocket(id, "WebSocket failure \(failure)")
    }

    /// Closes an upgraded connection with a close frame of `code` (1008 for
    /// too many violations), flushed before the socket is closed.
    func closeWebSocket(_ id: Int, _ code: WebSocketCloseCode, _ why: String) {
        table.fanout.unicast(WebSocketFrameEncoder.close(code, reason: why), to: id)
        endWebSocket(id, why)
    }

    /// An HTTP answer without a journal line (the caller logged), then the
    /// connection is closed once it is written.
    func answerAndEnd(_ id: Int, _ error: HTTPError) {
        table.fanout.unicast(error.response, to: id)
        endWebSocket(id, "HTTP \(error.status)")
    }

    /// Stops reading `id`: its room hears the leave now, and what it is owed
    /// (the close frame or HTTP answer just queued) is flushed before close.
    private func endWebSocket(_ id: Int, _ why: String) {
        depart(id)
        heartbeats.untrack(id)
        logger.debug("closing WebSocket: \(why)", ["CLIENT_ADDR": table.address(of: id)])
        startDraining(id, now: clock())
    }

    /// Every `[websocket] ping_interval` (at most half of `[heartbeat]
    /// timeout`), a ping to each upgraded connection (RFC 6455 §5.5.2):
    /// browsers answer pings, and a client silent for `[heartbeat] timeout`
    /// is closed (Heartbeats.swift).
    func pingWebSocketsIfDue(now: UInt64) {
        guard webSocketPings.isDue(nowMs: now), listeners.all.contains(where: { $0.dialect == .webSocket }) else { return }
        webSocketPings.nextMs = now + config.webSocket.effectivePingIntervalMs(heartbeatTimeoutMs: config.heartbeat.timeoutMs)
        let ping = WebSocketFrameEncoder.encode(.ping, payload: [])
        for id in table.ids where table.isOpen(id) && table.slots[id]!.webSocket?.isOpen == true {
            table.fanout.unicast(ping, to: id)
        }
    }
}
