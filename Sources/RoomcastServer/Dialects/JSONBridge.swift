import FoundationEssentials
import RoomcastCore

// JSONBridge.swift owns everything JSON (docs/protocol/json.md §7): the dialect
// (decoding commands, encoding broadcasts), the bridge of commands into the
// relay as LTB frames, and the size limits across the two dialects. The
// translation of relayed frames for JSON recipients is called from the
// fan-out, once per broadcast.

/// The JSON chat-room dialect, bridged into the rooms of the length-type-body
/// protocol. Inside the daemon every event is an LTB frame; this type turns
/// JSON commands into such frames and such frames into the JSON a JSON
/// client expects.
enum JSONDialect {
    /// A command from a JSON client.
    enum Command: Equatable {
        /// `{"cmd":"nickname","nickname":N}`: join the default room as N;
        /// `"room"` names another room, `"token"` carries a signed join (§13),
        /// `"positions": true` asks for the notice `position` and `"since":
        /// {"epoch": E, "seq": S}` resumes the room after S (§4).
        case nickname(String, room: String? = nil, token: String? = nil, positions: Bool? = nil, since: RoomPosition? = nil)
        /// `{"cmd":"msg","content":C}`: say C.
        case msg(String)
        /// `{"cmd":"leave"}`: leave the room, stay connected.
        case leave
        /// Any other `cmd`: ignored.
        case unknown(String)
    }

    private struct Incoming: Decodable {
        var cmd: String
        var nickname: String?
        var content: String?
        var room: String?
        var token: String?
        var positions: Bool?
        var since: Since?
        struct Since: Decodable { var epoch: String; var seq: Int64? }
    }

    /// Decodes one JSON body: any JSON object with a string `cmd` (extra keys
    /// are ignored; some clients pretty-print).
    /// - Returns: the command, or the reason the body is malformed (not a
    ///   JSON object, `cmd` missing, a field of the wrong type, a command
    ///   without its argument).
    static func decode(_ body: UnsafeRawBufferPointer) -> Result<Command, JSONBodyError> {
        let incoming: Incoming
        do {
            incoming = try JSONDecoder().decode(Incoming.self, from: Data(body))
        } catch let error as DecodingError {
            return .failure(JSONBodyError(reason: describe(error)))
        } catch {
            return .failure(JSONBodyError(reason: "\(error)"))
        }
        switch incoming.cmd {
        case "nickname":
            guard let n = incoming.nickname else { return .failure(JSONBodyError(reason: "nickname: missing string 'nickname'")) }
            return .success(.nickname(n, room: incoming.room, token: incoming.token, positions: incoming.positions,
                                      since: incoming.since.map { RoomPosition(epoch: $0.epoch, seq: $0.seq ?? 0) }))
        case "msg":
            guard let c = incoming.content else { return .failure(JSONBodyError(reason: "msg: missing string 'content'")) }
            return .success(.msg(c))
        case "leave":
            return .success(.leave)
        default:
            return .success(.unknown(incoming.cmd))
        }
    }

    private static func describe(_ error: DecodingError) -> String {
        switch error {
        case .typeMismatch(let type, let ctx):
            let path = ctx.codingPath.map(\.stringValue).joined(separator: ".")
            return path.isEmpty ? "not a JSON object" : "'\(path)' is not a \(type == String.self ? "string" : "\(type)")"
        case .keyNotFound(let key, _):
            return "missing '\(key.stringValue)'"
        case .valueNotFound(_, let ctx):
            return "'\(ctx.codingPath.map(\.stringValue).joined(separator: "."))' is null"
        case .dataCorrupted(let ctx):
            return "invalid JSON (\(ctx.debugDescription))"
        @unknown default:
            return "\(error)"
        }
    }

    // MARK: - Outgoing

    private struct Presence: Encodable { var cmd: String; var nickname: String; var addr: String }
    private struct Message: Encodable { var cmd = "msg"; var from: String; var content: String }
    private struct NoticeJSON: Encodable {
        var cmd = "notice"; var code: String; var text: String?; var retry_after_ms: Int64?; var count: Int64?
        var epoch: String?; var seq: Int64?
    }
    private struct Gift: Encodable {
        var cmd = "gift"; var from: String; var giftname: String; var giftURL: String; var giftcount: Int32
    }

    private static let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return e
    }()

    /// The JSON frame (4-byte length + body) a JSON client gets for an
    /// LTB frame, or nil when it has no JSON form (opaque types, heartbeats,
    /// bodies that do not decode). `senderAddress` fills join/leave's `addr`.
    static func translate(_ frame: UnsafeRawBufferPointer, settings s: RelaySettings, senderAddress: String) -> [UInt8]? {
        guard case .frame(let type, _) = FrameCodec.parse(frame, byteOrder: s.byteOrder, maxFrameBytes: Int.max) else { return nil }
        let body = UnsafeRawBufferPointer(rebasing: frame[FrameCodec.headerSize...])
        let json: Data?
        switch type {
        case s.joinType, s.leaveType:
            guard let user = try? UserInfo(protobuf: body) else { return nil }
            json = try? encoder.encode(Presence(cmd: type == s.joinType ? "join" : "leave", nickname: user.name, addr: senderAddress))
        case s.textType:
            guard let m = try? ChatMessage(protobuf: body) else { return nil }
            json = try? encoder.encode(Message(from: m.user.name, content: m.text))
        case s.giftType:
            guard let g = try? GiftMessage(protobuf: body) else { return nil }
            json = try? encoder.encode(Gift(from: g.user.name, giftname: g.giftname, giftURL: g.giftURL, giftcount: g.giftcount))
        case s.noticeType:
            // Only the server sends notices (Auth/AuthGate.swift): a client's is refused by the relay.
            guard let n = try? Notice(protobuf: Array(body)) else { return nil }
            json = try? encoder.encode(NoticeJSON(code: n.code, text: n.text, retry_after_ms: n.retryAfterMs, count: n.count,
                                                      epoch: n.position?.epoch, seq: n.position?.seq))
        default:
            return nil
        }
        return json.map { JSONFrameCodec.encode($0) }
    }

    /// The LTB frame that stands for a JSON client's command inside the relay:
    /// its identity is `UserInfo(level: 0, name: nickname, iconURL: "")`.
    /// A join's may carry `room`, `token`, `positions` and `since`
    /// (UserInfo fields 4-8).
    static func ltbFrame(type: UInt16, nickname: String, text: String? = nil, room: String? = nil, token: String? = nil,
                         positions: Bool? = nil, since: RoomPosition? = nil, settings s: RelaySettings) -> [UInt8] {
        let user = UserInfo(level: 0, name: nickname, iconURL: "", room: room, token: token, positions: positions, since: since)
        let body = text.map { ChatMessage(user: user, text: $0).serialized() } ?? user.serialized()
        return FrameCodec.encode(type: type, body: body, byteOrder: s.byteOrder)
    }
}

/// Why a JSON body was refused; counted as a violation (docs/protocol/json.md §7).
struct JSONBodyError: Error, Equatable {
    var reason: String
}

extension Server {
    /// One JSON command (docs/protocol/json.md §7): it becomes the LTB frame it
    /// stands for and goes through the same relay, so both dialects share
    /// rooms; JSON recipients get it translated back by the fan-out.
    func handleJSONCommand(_ id: Int, _ body: UnsafeRawBufferPointer, now: UInt64) {
        let s = relay.settings
        let type: UInt16
        let frame: [UInt8]
        var pendingSession: AuthSession?
        switch JSONDialect.decode(body) {
        case .failure(let error):
            handleRejected(id, relay.reject(id, reason: "json: \(error.reason)"), type: nil, now: now)
            return
        case .success(.nickname(let name, let room, let token, let positions, let since)):
            type = s.joinType
            frame = JSONDialect.ltbFrame(type: type, nickname: name, room: room, token: token, positions: positions, since: since, settings: s)
            guard reachesEveryone(id, frame, now: now) else { return }
            if auth.active(config) {
                let verdict = frame.withUnsafeBytes { authorize(id, type: type, frame: $0, now: now) }
                switch verdict {
                case .refused: return
                case .join(let session): pendingSession = session
                case .pass: break
                }
            }
            table.slots[id]!.nickname = name
        case .success(.msg(let content)):
            type = s.textType
            frame = JSONDialect.ltbFrame(type: type, nickname: table.slots[id]!.nickname ?? "", text: content, settings: s)
            guard reachesEveryone(id, frame, now: now) else { return }
            if auth.active(config), case .refused = frame.withUnsafeBytes({ authorize(id, type: type, frame: $0, now: now) }) { return }
            guard slowModeAllows(id, type: type, now: now) else { return }
        case .success(.leave):
            // A leave before any nickname announces nothing.
            guard let name = table.slots[id]!.nickname else { return }
            table.slots[id]!.nickname = nil
            type = s.leaveType
            frame = JSONDialect.ltbFrame(type: type, nickname: name, settings: s)
        case .success(.unknown(let cmd)):
            logger.debug("ignoring unknown JSON command '\(clipForLog(cmd))'", ["CLIENT_ADDR": table.address(of: id)])
            return
        }
        let event = frame.withUnsafeBytes { relay.receive(from: id, type: type, frame: $0, proving: pendingSession?.claims.sub, sink: table.fanout) }
        if case .rejected = event { handleRejected(id, event, type: nil, now: now); return }
        if let pendingSession, case .joined = event { commitSession(id, pendingSession) }
        if case .left(room: .some, _) = event, s.echo {
            // docs/protocol/json.md §7: the leave goes to every client including
            // the sender, which the relay has already taken out of the room.
            _ = frame.withUnsafeBytes { table.fanout.broadcast($0, from: id, to: [id], except: -1) }
        }
        if logger.enabled(.debug) { logRelayEvent(id, event) }
    }

    /// Whether the frame a JSON command stands for can reach every client:
    /// its LTB form within `protocol.max_frame_bytes` (docs/protocol/ltb.md §1)
    /// and its JSON broadcast within `json.max_frame_bytes`. Each command was
    /// within the JSON limit, but nickname and content together, or the
    /// added `from`/`addr`, can pass either. If not, the command is dropped
    /// as a violation, so its sender hears why instead of nobody hearing it.
    private func reachesEveryone(_ id: Int, _ frame: [UInt8], now: UInt64) -> Bool {
        let ltb = frame.count - FrameCodec.headerSize
        let json = frame.withUnsafeBytes {
            JSONDialect.translate($0, settings: relay.settings, senderAddress: table.address(of: id))
        }.map { $0.count - JSONFrameCodec.headerSize } ?? 0
        let problem: String
        if ltb > config.protocol.maxFrameBytes {
            problem = "the frame for LTB clients would be \(ltb) bytes, over protocol.max_frame_bytes (\(formatSize(config.protocol.maxFrameBytes)))"
        } else if json > config.json.maxFrameBytes {
            problem = "its JSON broadcast would be \(json) bytes, over json.max_frame_bytes (\(formatSize(config.json.maxFrameBytes)))"
        } else {
            return true
        }
        handleRejected(id, relay.reject(id, reason: "json: " + problem, code: .frameTooLarge), type: nil, now: now)
        return false
    }
}
