import FoundationEssentials
import RoomcastCore

/// Seed 002's JSON chat room (PROTOCOL.md §7), bridged into the rooms of the
/// length-type-body protocol. Inside the daemon every event is an LTB frame;
/// this file turns JSON commands into such frames and such frames into the
/// JSON a seed-002 client expects.
enum JSONDialect {
    /// A command from a JSON client.
    enum Command: Equatable {
        /// `{"cmd":"nickname","nickname":N}`: join the default room as N.
        case nickname(String)
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
    }

    /// Decodes one JSON body: any JSON object with a string `cmd` (extra keys
    /// are ignored; the seed client pretty-prints).
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
            return .success(.nickname(n))
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
    private struct Gift: Encodable {
        var cmd = "gift"; var from: String; var giftname: String; var giftURL: String; var giftcount: Int32
    }

    private static let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return e
    }()

    /// The JSON frame (4-byte length + body) a seed-002 client gets for an
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
        default:
            return nil
        }
        return json.map { JSONFrameCodec.encode($0) }
    }

    /// The LTB frame that stands for a JSON client's command inside the relay:
    /// its identity is `UserInfo(level: 0, name: nickname, iconURL: "")`.
    static func ltbFrame(type: UInt16, nickname: String, text: String? = nil, settings s: RelaySettings) -> [UInt8] {
        let user = UserInfo(level: 0, name: nickname, iconURL: "")
        let body = text.map { ChatMessage(user: user, text: $0).serialized() } ?? user.serialized()
        return FrameCodec.encode(type: type, body: body, byteOrder: s.byteOrder)
    }
}

/// Why a JSON body was refused; counted as a violation (PROTOCOL.md §7).
struct JSONBodyError: Error, Equatable {
    var reason: String
}
