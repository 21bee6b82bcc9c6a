import RoomcastCore

// Refusal.swift: the one path of a frame the daemon does not relay, for every
// dialect (LTB, the JSON bridge, WebSocket): what its sender is told, how it
// is counted, the log line, and the close at `protocol.max_violations`
// (docs/protocol/notices.md §13 for the notices, docs/protocol/ltb.md §9 for
// violations).

/// How a refused frame counts.
enum Refusal {
    /// A violation toward `protocol.max_violations`, already counted by the
    /// relay (`Relay.reject` or `Relay.receive`): `violations` so far,
    /// `disconnect` at the limit. The `[auth]` codes are told to the sender
    /// (`RejectionCode.isToldBack`); a bad frame is dropped without a word.
    case violation(RejectionCode, violations: Int, disconnect: Bool)
    /// A ban, mute or slow mode: told with `retry_after_ms` (ms, at least 1),
    /// never a violation (the client broke no rule of the protocol).
    case moderation(FrameRefusal, retryAfterMs: Int64)
}

extension RejectionCode {
    /// Whether the sender is told with a notice of this code (the `[auth]`
    /// refusals, docs/protocol/notices.md §13). Bad frames, rate limits and
    /// sizes are only dropped and counted: the sender's code is at fault,
    /// and a notice per bad frame would be output it may not read.
    var isToldBack: Bool {
        switch self {
        case .tokenRequired, .tokenInvalid, .tokenExpired, .roomForbidden, .identityMismatch, .notPermitted: true
        case .badFrame, .roomTooLong, .rateLimit, .frameTooLarge, .noticeFromClient: false
        }
    }
}

extension Server {
    /// Counts a violation of `code` by `id` at the relay, then refuses the frame (`refuse(_:_:_:type:now:)`).
    func refuse(_ id: Int, _ code: RejectionCode, _ reason: String, type: UInt16?, now: UInt64) {
        handleRejected(id, relay.reject(id, reason: reason, code: code), type: type, now: now)
    }

    /// Refuses a frame the relay rejected (its `.rejected` event; any other event is ignored).
    func handleRejected(_ id: Int, _ event: RelayEvent, type: UInt16?, now: UInt64) {
        guard case .rejected(let reason, let violations, let disconnect, let code) = event else { return }
        refuse(id, .violation(code, violations: violations, disconnect: disconnect), reason, type: type, now: now)
    }

    /// Refuses a frame of `id` for moderation (`reason`; `text` says why), counted by reason.
    func refuseModerated(_ id: Int, _ reason: FrameRefusal, _ text: String, retryAfterMs: Int64, now: UInt64) {
        relay.countRefused(reason)
        refuse(id, .moderation(reason, retryAfterMs: retryAfterMs), text, type: nil, now: now)
    }

    /// The refusal path: the notice to `id` where its kind is told, the log
    /// line (a bad frame's once per burst of its reason, `Logger.peerWarning`;
    /// the others' once a minute per address), and, at
    /// `protocol.max_violations`, the end of the connection: after the notice
    /// when there is one (`removeAfterNotice`), else at once; an upgraded
    /// WebSocket client gets the close 1008 first (docs/protocol/websocket.md
    /// §15). `type` is the frame's type, nil for a JSON command.
    private func refuse(_ id: Int, _ refusal: Refusal, _ reason: String, type: UInt16?, now: UInt64) {
        let address = table.address(of: id)
        let max = config.protocol.maxViolations
        let what = type.map { "frame of type \($0)" } ?? "JSON frame"
        let room = relay.room(of: id) ?? ""
        var notice: Notice?
        switch refusal {
        case .violation(let code, let violations, _) where !code.isToldBack:
            logger.peerWarning(reason: code.rawValue, nowMs: now,
                               "\(address): dropped \(code == .badFrame ? "bad " : "")\(what): \(reason) (violation \(violations) of \(max))",
                               ["CLIENT_ADDR": address, "DETAIL": reason, "FRAME_TYPE": type.map(String.init) ?? "json", "ROOM": room])
        case .violation(let code, let violations, _):
            auth.refusals &+= 1
            notice = Notice(code: code.rawValue, text: reason, count: Int64(violations))
            if auth.shouldLog(address, nowMs: now) {
                logger.warning("\(address): refused \(what): \(reason) (violation \(violations) of \(max))",
                               ["CLIENT_ADDR": address, "REASON": code.rawValue, "DETAIL": reason,
                                "FRAME_TYPE": type.map(String.init) ?? "json", "ROOM": room, "USER_SUB": loggedSub(id)])
            }
        case .moderation(let why, let retryAfterMs):
            notice = Notice(code: why.label, text: reason, retryAfterMs: Swift.max(retryAfterMs, 1))
            if auth.shouldLog(address, nowMs: now) {
                logger.info("\(address): refused: \(reason)", ["CLIENT_ADDR": address, "REASON": why.label, "USER_SUB": loggedSub(id), "ROOM": room])
            }
        }
        if let notice { sendNotice(id, notice) }
        guard case .violation(_, let violations, true) = refusal else { return }
        let why = "\(violations) bad frames (protocol.max_violations = \(max))"
        if let notice {
            // Closed after the notice is out, so the client hears why (a drain, as after EOF).
            logger.debug("closing \(address): \(why)", ["CLIENT_ADDR": address])
            removeAfterNotice(id, notice, now: now)
        } else if table.slots[id]!.webSocket?.isOpen == true {
            closeWebSocket(id, .policyViolation, why)  // a close frame first (docs/protocol/websocket.md §15)
        } else {
            table.close(id, why)
        }
    }

    /// The verified sub of `id` as a log field: at most 64 bytes ("" for none).
    private func loggedSub(_ id: Int) -> String {
        table.slots[id]!.auth.map { clipForLog($0.claims.sub, maxBytes: 64) } ?? ""
    }
}
