import Glibc
import RoomcastCore

// AuthGate.swift: signed joins and roles on the daemon's input path
// (docs/protocol/tokens.md §13). The reactor asks `authorize` before a frame goes
// into the relay: a join's token is verified and its identity checked, a
// send is checked against the connection's verified claims. A refusal is a
// violation like any other (limits of `protocol.max_violations`), the
// client is told why in a notice frame, the journal hears of it at most
// once per address per minute, and the token never reaches a log line.

/// What one connection has proved with its last accepted token.
struct AuthSession: Equatable {
    /// The verified claims (never the token).
    var claims: TokenClaims
    /// The frame types it may send besides join, leave and heartbeat (nil: every type).
    var may: [UInt16]?
    /// When it expires without a renewal: exp + `AuthGate.graceMs`, on the server's (monotonic) clock, in ms.
    var deadlineMs: UInt64
}

/// The daemon's signed-join state: the keys, the expiry queue, the counters.
struct AuthGate {
    /// Time after `exp` at which a connection that did not renew is told
    /// `token_expired` and closed, in ms (docs/protocol/tokens.md §13).
    static let graceMs: Int64 = 25_000
    /// A refusal from one address is logged at most once per this, in ms.
    static let logIntervalMs: UInt64 = 60_000

    /// The keys of `[auth] key_file`; nil: no key file (tokens are not checked).
    var keys: VerifyingKeys?
    /// Refusals so far (STATUS= and the stats line).
    var refusals: UInt64 = 0
    /// Connections closed because their token ran out.
    var expired: UInt64 = 0
    /// Pending expiries: at most one per connection id (its session's
    /// deadline), replaced on renewal and cancelled when the connection is
    /// released (`forget`), so it holds exactly one entry per connection with
    /// a session. (It was a heap with an entry per accepted token, kept until
    /// exp + 25 s after the client was gone: 1.6 M joins took RSS from 20.8 MB
    /// to 105.7 MB for good, issue 28 item 2.)
    private(set) var expiries = TimingWheel(tickMs: AuthGate.wheelTickMs, slotCount: 256, startMs: 0)
    /// The refusals' log lines, per address.
    private var refusalLog = RateLimitedLogs<String>(intervalMs: AuthGate.logIntervalMs)

    /// Expiries are rounded up to this, in ms (late by at most one tick).
    static let wheelTickMs: UInt64 = 250

    /// Whether frames need checking at all: a key file, or `required`.
    func active(_ config: Config) -> Bool { keys != nil || config.auth.required }

    /// Pending expiries: connections holding a session (`roomcast_auth_sessions`).
    var sessionCount: Int { expiries.count }

    /// Milliseconds from `nowMs` until an expiry may be due (nil: none pending; may be early, never late).
    func nextTimeout(fromMs nowMs: UInt64) -> UInt64? { expiries.nextTimeout(from: nowMs) }

    /// Sets the expiry of connection `id` to `deadlineMs` (monotonic ms), replacing the one it had.
    mutating func schedule(_ id: Int, deadlineMs: UInt64) {
        expiries.schedule(id, at: deadlineMs)
    }

    /// Drops the expiry of `id` (its connection is released). O(1).
    mutating func forget(_ id: Int) {
        expiries.cancel(id)
    }

    /// The connections whose expiry is due at `now` (ms), each removed.
    mutating func due(now: UInt64) -> [Int] {
        expiries.advance(to: now)
        var out: [Int] = []
        while let id = expiries.popExpired() { out.append(id) }
        return out
    }

    /// Whether a refusal from `address` may be logged now (once per minute
    /// per address, at most 4,096 addresses a minute: `RateLimitedLogs`).
    mutating func shouldLog(_ address: String, nowMs: UInt64) -> Bool {
        refusalLog.mayLog(address, nowMs: nowMs)
    }
}

/// The wall clock in ms since the epoch (CLOCK_REALTIME): tokens' `exp` and `nbf` are wall-clock times.
public func wallClockMilliseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

/// The outcome of `Server.authorize`.
enum AuthVerdict {
    /// Relay the frame.
    case pass
    /// Relay the join; once the relay has joined it, the connection holds `session`.
    case join(AuthSession)
    /// Refused: the notice is sent, the violation counted, nothing relayed.
    case refused
}

extension Server {
    /// Checks one frame from `id` before the relay sees it (docs/protocol/tokens.md §13).
    /// `frame` is the whole LTB frame (header included); for a JSON client the LTB frame its command stands for.
    func authorize(_ id: Int, type: UInt16, frame: UnsafeRawBufferPointer, now: UInt64) -> AuthVerdict {
        let s = relay.settings
        let body = UnsafeRawBufferPointer(rebasing: frame[FrameCodec.headerSize...])
        switch type {
        case s.heartbeatType, s.leaveType, s.noticeType:
            return .pass  // proof of life; a leave is always allowed; a client's notice is the relay's to refuse
        case s.joinType:
            return authorizeJoin(id, body: body, now: now)
        default:
            break
        }
        guard let session = table.slots[id]!.auth else {
            guard config.auth.required else { return .pass }
            refuse(id, .tokenRequired, config.auth.anonymous == .read
                   ? "an anonymous reader may not send (join with a token)" : "join with a token first", type: type, now: now)
            return .refused
        }
        guard session.may?.contains(type) ?? true else {
            refuse(id, .notPermitted, "frame type \(type) is not in the token's 'may'", type: type, now: now)
            return .refused
        }
        if refuseIfMuted(id, session, now: now) { return .refused }
        let user: UserInfo?
        switch type {
        case s.textType: user = try? ChatMessage(protobuf: body).user
        case s.giftType: user = try? GiftMessage(protobuf: body).user
        default: user = nil  // opaque: never decoded
        }
        if let user, let problem = identityProblem(user, session.claims) {
            refuse(id, .identityMismatch, problem, type: type, now: now)
            return .refused
        }
        return .pass
    }

    private func authorizeJoin(_ id: Int, body: UnsafeRawBufferPointer, now: UInt64) -> AuthVerdict {
        // A body that does not decode is the relay's to refuse (§3).
        guard let info = try? UserInfo(protobuf: body) else { return .pass }
        let type = relay.settings.joinType
        let room = (info.room ?? "").isEmpty ? config.server.defaultRoom : info.room!
        guard let token = info.token else {
            if let session = table.slots[id]!.auth {
                // Joined before with a token: the same identity, still within its rooms.
                if let problem = identityProblem(info, session.claims) {
                    refuse(id, .identityMismatch, problem, type: type, now: now)
                    return .refused
                }
                guard session.claims.permits(room: room, defaultRoom: config.server.defaultRoom) else {
                    refuse(id, .roomForbidden, TokenError.roomForbidden(room: room).description, type: type, now: now)
                    return .refused
                }
                if refuseIfBanned(id, room: room, sub: session.claims.sub, now: now) { return .refused }
                return .pass
            }
            if config.auth.required && config.auth.anonymous == .none {
                refuse(id, .tokenRequired, "auth.required: a join needs a token (UserInfo field 5)", type: type, now: now)
                return .refused
            }
            return .pass
        }
        guard let keys = auth.keys else { return .pass }  // no key file: the token is only removed
        let wallMs = wallClock()
        let claims: TokenClaims
        do throws(TokenError) {
            claims = try keys.verify(token.utf8, nowSeconds: wallMs / 1000)
            guard claims.permits(room: room, defaultRoom: config.server.defaultRoom) else { throw TokenError.roomForbidden(room: room) }
        } catch {
            let code: RejectionCode = switch error {
            case .expired: .tokenExpired
            case .roomForbidden: .roomForbidden
            default: .tokenInvalid
            }
            refuse(id, code, error.description, type: type, now: now)
            return .refused
        }
        if let problem = identityProblem(info, claims) {
            refuse(id, .identityMismatch, problem, type: type, now: now)
            return .refused
        }
        if refuseIfBanned(id, room: room, sub: claims.sub, now: now) { return .refused }
        return .join(session(claims, wallMs: wallMs, now: now))
    }

    /// The session `claims` give: `may` resolved with the current
    /// `viewer_may`, the expiry at exp + 25 s on the monotonic clock.
    func session(_ claims: TokenClaims, wallMs: Int64, now: UInt64) -> AuthSession {
        let may = claims.may ?? (claims.role == .viewer ? config.auth.viewerMay : nil)
        let remaining = (claims.exp * 1000 + AuthGate.graceMs) - wallMs
        let deadline = remaining <= 0 ? now : now &+ UInt64(remaining)
        return AuthSession(claims: claims, may: may, deadlineMs: deadline)
    }

    /// A connection handed over by the previous process (a restart, or
    /// recovery after a crash) keeps the identity it had proved.
    func restoreSession(_ id: Int, _ claims: TokenClaims, now: UInt64) {
        commitSession(id, session(claims, wallMs: wallClock(), now: now))
    }

    /// Why `user` is not the identity `claims` vouch for (nil: it is). Names
    /// compare byte for byte: an NFC and an NFD spelling are two accounts.
    func identityProblem(_ user: UserInfo, _ claims: TokenClaims) -> String? {
        if !sameBytes(user.name, claims.displayName) {
            return "UserInfo name '\(clipForLog(user.name, maxBytes: 64))' is not the token's "
                + (claims.name == nil ? "sub" : "name") + " '\(clipForLog(claims.displayName, maxBytes: 64))'"
        }
        if let level = claims.level, user.level != level { return "UserInfo level \(user.level) is not the token's level \(level)" }
        if let icon = claims.icon, !sameBytes(user.iconURL, icon) { return "UserInfo iconURL is not the token's icon" }
        return nil
    }

    /// A join the relay accepted: `id` now holds `session` (a renewal replaces the old one).
    func commitSession(_ id: Int, _ session: AuthSession) {
        table.slots[id]!.auth = session
        auth.schedule(id, deadlineMs: session.deadlineMs)
    }

    /// Queues a notice (docs/protocol/notices.md §13) for `id` alone: a frame of
    /// type `protocol.notice_type`, or `{"cmd":"notice",...}` for a JSON client.
    func sendNotice(_ id: Int, _ notice: Notice) {
        let frame = FrameCodec.encode(type: config.protocol.noticeType, body: notice.serialized(), byteOrder: config.protocol.byteOrder)
        _ = frame.withUnsafeBytes { table.fanout.broadcast($0, from: id, to: [id], except: -1) }
    }

    /// Ends a connection just sent a notice that removes it (`kicked`,
    /// `banned`, `token_expired`, an auth refusal at `max_violations`): its room hears the leave now, an upgraded
    /// WebSocket client also gets the close frame 1008 (policy, docs/protocol/websocket.md
    /// §15: a browser would otherwise see 1006 and reconnect at once), then
    /// what it is owed is flushed and the socket closed.
    func removeAfterNotice(_ id: Int, _ notice: Notice, now: UInt64) {
        if table.slots[id]!.webSocket?.isOpen == true {
            closeWebSocket(id, .policyViolation, notice.code)
            return
        }
        depart(id)
        heartbeats.untrack(id)
        startDraining(id, now: now)
    }

    /// Closes the connections whose token ran out without a renewal:
    /// `token_expired`, then the owed output is flushed and the socket closed.
    func expireTokens(now: UInt64) {
        for id in auth.due(now: now) {
            guard table.isOpen(id), let session = table.slots[id]!.auth, session.deadlineMs <= now else { continue }
            auth.expired &+= 1
            table.slots[id]!.disconnectReason = .tokenExpired
            let notice = Notice(code: RejectionCode.tokenExpired.rawValue, text: "the token expired at \(session.claims.exp) and was not renewed")
            sendNotice(id, notice)
            let address = table.address(of: id)
            if auth.shouldLog(address, nowMs: now) {
                logger.warning("\(address): token of '\(clipForLog(session.claims.sub, maxBytes: 64))' expired without renewal; closing",
                               ["CLIENT_ADDR": address, "REASON": "token_expired", "USER_SUB": clipForLog(session.claims.sub, maxBytes: 64),
                                "ROOM": relay.room(of: id) ?? ""])
            }
            removeAfterNotice(id, notice, now: now)
        }
    }

    /// Loads `[auth] key_file` at start.
    /// - Throws: `ConfigError` (KeyStore.load): the daemon refuses to start.
    public static func loadKeys(_ config: Config) throws(ConfigError) -> AuthKeys? {
        config.auth.keyFile.isEmpty ? nil : try KeyStore.load(path: config.auth.keyFile)
    }

    /// SIGHUP: re-reads the key file; a bad one keeps the keys in use and says why.
    func reloadKeys() {
        guard !config.auth.keyFile.isEmpty else {
            if auth.keys != nil { logger.info("auth.key_file removed: tokens are no longer checked") }
            auth.keys = nil
            return
        }
        do {
            auth.keys = try KeyStore.load(path: config.auth.keyFile)
            logger.info("keys reloaded from \(config.auth.keyFile): \(auth.keys!.keys.map(\.key.description).joined(separator: ", "))",
                        ["KEY_FILE": config.auth.keyFile])
        } catch {
            logger.error("key file reload failed, keeping the keys in use: \(error)",
                         ["REASON": "key_file_invalid", "DETAIL": error.description, "KEY_FILE": config.auth.keyFile])
        }
    }
}
