import COpenSSL
import Glibc
import RoomcastCore

// APIRoutes.swift: the API's endpoints (docs/api.md): who may ask, then
// health, stats, rooms and members, publish and kick. Publish takes the
// relay's own path (Relay.publish), so a published frame reaches members
// and the cluster exactly as a member's frame does.

extension Server {
    /// The answer to one whole request from `peer`.
    func answer(_ request: HTTPRequest, body: [UInt8], peer: APIServer.Peer, now: UInt64) -> APIResponse {
        do {
            let open = config.api.publicMetrics && request.method == "GET" && (request.path == "/healthz" || request.path == "/metrics")
            if !open { try authorizeAPI(request, peer: peer) }
            return try route(request, body: body, now: now)
        } catch {
            return APIResponse(error)
        }
    }

    /// TCP: a bearer key of `[api] key_file`; Unix socket: root, the
    /// daemon's own uid, `allow_uids` or `allow_gids` (SO_PEERCRED).
    /// - Throws: 401 `unauthorized` (no or a wrong key), 403 `forbidden` (a peer not allowed).
    private func authorizeAPI(_ request: HTTPRequest, peer: APIServer.Peer) throws(APIError) {
        switch peer {
        case .unix(let uid, let gid, _):
            guard uid == 0 || uid == geteuid() || config.api.allowUIDs.contains(uid) || config.api.allowGIDs.contains(gid) else {
                throw APIError(403, "forbidden", "uid \(uid) (gid \(gid)) is not in api.allow_uids or api.allow_gids")
            }
        case .tcp:
            let challenge = [("WWW-Authenticate", "Bearer realm=\"roomcast\"")]
            guard let value = request.value("authorization") else {
                throw APIError(401, "unauthorized", "send Authorization: Bearer KEY (a key of api.key_file)", headers: challenge)
            }
            let parts = value.split(separator: " ", maxSplits: 1)
            guard parts.count == 2, parts[0].lowercased() == "bearer", let keys = api.keys, keys.accepts(Array(parts[1].utf8)) else {
                throw APIError(401, "unauthorized", "the bearer key is not one of api.key_file", headers: challenge)
            }
        }
    }

    private func route(_ request: HTTPRequest, body: [UInt8], now: UInt64) throws(APIError) -> APIResponse {
        let segments = request.path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        func method(_ allowed: String) throws(APIError) {
            guard request.method == allowed else {
                throw APIError(405, "method_not_allowed", "\(request.path) takes \(allowed)", headers: [("Allow", allowed)])
            }
        }
        switch Array(segments) {
        case ["healthz"]:
            try method("GET")
            return stopping ? .json(#"{"status": "stopping"}"#, status: 503) : .json(#"{"status": "ok"}"#)
        case ["metrics"]:
            try method("GET")
            return APIResponse(status: 200, body: Array(metricsText(now: now).utf8), contentType: "text/plain; version=0.0.4; charset=utf-8")
        case ["v1", "stats"]:
            try method("GET")
            return .json(statsJSON(now: now))
        case ["v1", "rooms"]:
            try method("GET")
            return try roomsJSON(request)
        case let s where s.count == 3 && s[0] == "v1" && s[1] == "rooms":
            try method("GET")
            return try roomJSON(try roomName(s[2]), request)
        case let s where s.count == 4 && s[0] == "v1" && s[1] == "rooms" && s[3] == "publish":
            try method("POST")
            return try publish(try roomName(s[2]), request, body: body, now: now)
        case let s where s.count == 4 && s[0] == "v1" && s[1] == "rooms" && s[3] == "kick":
            try method("POST")
            return try kick(try roomName(s[2]), body: body, now: now)
        case let s where s.count >= 4 && s[0] == "v1" && s[1] == "rooms" && ["bans", "mutes", "settings"].contains(s[3]):
            return try moderationRoute(request, s, body: body, now: now)  // APIModeration.swift
        default:
            throw APIError(404, "not_found", "no endpoint \(clipForLog(request.path, maxBytes: 80)) (docs/api.md)")
        }
    }

    /// A `{room}` segment: percent-decoded bytes, 1 ... `protocol.max_room_bytes`.
    func roomName(_ segment: Substring) throws(APIError) -> RoomName {
        guard let bytes = percentDecoded(segment), !bytes.isEmpty else {
            throw APIError(400, "bad_room", "the room must be percent-encoded bytes, not empty")
        }
        guard bytes.count <= config.protocol.maxRoomBytes else {
            throw APIError(400, "bad_room", "the room is \(bytes.count) bytes, over protocol.max_room_bytes (\(config.protocol.maxRoomBytes))")
        }
        return RoomName(bytes: bytes)
    }

    private func statsJSON(now: UInt64) -> String {
        let f = figures
        return "{\"clients\": \(f.clients), \"rooms\": \(f.rooms), \"frames_in\": \(status.framesIn), \"deliveries\": \(f.deliveries), "
            + "\"api_connections\": \(api.count), \"uptime_ms\": \(now &- status.startedMs), \"cluster\": \(cluster == nil ? "false" : "true"), "
            + "\"stopping\": \(stopping)}"
    }

    /// A listing's query (docs/api.md, the `GET /v1/rooms` rows): its items, and `limit`
    /// (1 ... 1000, default 100). Every listing pages over an ordered index
    /// (OrderedIndex.swift) from its `cursor`, O(log n + limit) a page.
    /// - Throws: 400 `bad_query` (malformed percent-encoding), 400 `bad_limit`.
    func listingQuery(_ request: HTTPRequest) throws(APIError) -> (items: [String: [UInt8]], limit: Int) {
        guard let items = queryItems(request.query) else { throw APIError(400, "bad_query", "malformed percent-encoding in the query") }
        guard let raw = items["limit"] else { return (items, 100) }
        guard let n = Int(String(decoding: raw, as: UTF8.self)), (1...1000).contains(n) else {
            throw APIError(400, "bad_limit", "limit must be 1 ... 1000")
        }
        return (items, n)
    }

    /// Rooms with viewers here or on another daemon, by their bytes, with
    /// the cluster-wide count; `limit` of them after `cursor` (the last room of the previous page).
    private func roomsJSON(_ request: HTTPRequest) throws(APIError) -> APIResponse {
        let (items, n) = try listingQuery(request)
        let after = items["cursor"] ?? []
        // A page of the relay's ordered index, merged with one of the other
        // daemons' rooms (RemoteListing.swift): O(log rooms + limit).
        let got = relay.roomsPage(after: after, limit: n)
        var rooms = got.rooms, more = got.more
        if let remotePage = cluster?.remoteRoomsPage(after: after, limit: n) {
            (rooms, more) = RemoteListing.merged((rooms, more), remotePage, limit: n)
        }
        let page = rooms.map { (room: $0, viewers: viewers(of: $0)) }
        let list = page.map { "{\"room\": \(jsonStringLiteral($0.room.string)), \"viewers\": \($0.viewers)}" }.joined(separator: ", ")
        let next = more ? jsonStringLiteral(percentEncoded(page.last!.room.bytes)) : "null"
        return .json("{\"rooms\": [\(list)], \"next_cursor\": \(next)}")
    }

    /// A room's members by connection, `limit` after `cursor`.
    private func roomJSON(_ room: RoomName, _ request: HTTPRequest) throws(APIError) -> APIResponse {
        let (items, n) = try listingQuery(request)
        let after = items["cursor"].flatMap { Int(String(decoding: $0, as: UTF8.self)) } ?? -1
        let (page, more) = relay.membersPage(of: room, after: after, limit: n)
        let list = page.map { id in
            let sub = table.slots[id]?.auth.map { jsonStringLiteral($0.claims.sub) } ?? "null"
            return "{\"id\": \(id), \"name\": \(jsonStringLiteral(relay.name(of: id))), \"sub\": \(sub), \"addr\": \(jsonStringLiteral(table.address(of: id)))}"
        }.joined(separator: ", ")
        let next = more ? "\"\(page.last!)\"" : "null"
        let (remote, remoteNext) = remoteMembersJSON(room, limit: n, after: items["remote_cursor"] ?? [])
        return .json("{\"room\": \(jsonStringLiteral(room.string)), \"viewers\": \(viewers(of: room)), \"members\": [\(list)], "
                     + "\"next_cursor\": \(next), \"remote_members\": [\(remote)], \"remote_next_cursor\": \(remoteNext)}")
    }

    /// The members of other daemons of the cluster in `room` that this
    /// daemon tracks (their joins reached it: rooms with members here), by
    /// daemon and address, `limit` after `after` (`DAEMON/ADDR`, the last
    /// of the previous page): `{"daemon", "name", "sub", "addr"}` each,
    /// `sub` the one their daemon sent in the envelope (docs/protocol/across-daemons.md
    /// §12; `null`: none, or a daemon that sends only version 1).
    private func remoteMembersJSON(_ room: RoomName, limit n: Int, after: [UInt8]) -> (list: String, next: String) {
        guard let cluster else { return ("", "null") }
        // A page of the room's ordered index (RemoteListing.swift): O(log members + limit).
        let got = cluster.remoteMembersPage(in: room, after: after, limit: n)
        let page = got.members
        let list = page.map { m in
            let name = (try? UserInfo(protobuf: m.member.identity))?.name ?? ""
            return "{\"daemon\": \"\(ClusterEnvelope.hex(m.origin))\", \"name\": \(jsonStringLiteral(name)), "
                + "\"sub\": \(m.member.sub.map(jsonStringLiteral) ?? "null"), \"addr\": \(jsonStringLiteral(m.address))}"
        }.joined(separator: ", ")
        let next = got.more ? jsonStringLiteral(percentEncoded(got.lastKey!)) : "null"
        return (list, next)
    }

    func jsonBody(_ body: [UInt8]) throws(APIError) -> JSONValue {
        let value: JSONValue
        do { value = try parseJSON(body) } catch { throw APIError(400, "bad_json", "the body is not JSON: \(error)") }
        guard case .object = value else { throw APIError(400, "bad_json", "the body must be a JSON object") }
        return value
    }

    /// POST /v1/rooms/{room}/publish: a text, gift or opaque frame relayed as a member's.
    private func publish(_ room: RoomName, _ request: HTTPRequest, body: [UInt8], now: UInt64) throws(APIError) -> APIResponse {
        let key = request.value("idempotency-key")
        if let key {
            guard !key.isEmpty, key.utf8.count <= 255 else { throw APIError(400, "bad_idempotency_key", "Idempotency-Key must be 1 ... 255 bytes") }
        }
        let fingerprint = key.map { _ in IdempotencyCache.fingerprint(method: request.method, path: request.path, body: body) }
        if let key, let fingerprint, let first = try api.idempotency.answer(key, fingerprint: fingerprint, now: now) { return first }
        let json = try jsonBody(body)
        let s = relay.settings
        let type: UInt16
        let frameBody: [UInt8]
        func string(_ v: JSONValue?, _ name: String, required: Bool = true) throws(APIError) -> String {
            switch v {
            case .string(let t)?: return t
            case nil where !required: return ""
            default: throw APIError(422, "bad_publish", "\(name) must be a string")
            }
        }
        func int(_ v: JSONValue?, _ name: String, _ range: ClosedRange<Int64>, default d: Int64) throws(APIError) -> Int64 {
            guard let v else { return d }
            guard case .number(let x) = v, x == x.rounded(), x >= Double(range.lowerBound), x <= Double(range.upperBound) else {
                throw APIError(422, "bad_publish", "\(name) must be an integer \(range.lowerBound) ... \(range.upperBound)")
            }
            return Int64(x)
        }
        func user() throws(APIError) -> UserInfo {
            guard case .object? = json["user"] else { throw APIError(422, "bad_publish", "user must be an object {\"name\", \"level\", \"icon\"}") }
            let u = json["user"]!
            return UserInfo(level: Int32(try int(u["level"], "user.level", Int64(Int32.min)...Int64(Int32.max), default: 0)),
                            name: try string(u["name"], "user.name"), iconURL: try string(u["icon"], "user.icon", required: false))
        }
        switch json["type"] {
        case .string("text")?:
            type = s.textType
            frameBody = ChatMessage(user: try user(), text: try string(json["text"], "text")).serialized()
        case .string("gift")?:
            type = s.giftType
            frameBody = GiftMessage(user: try user(), giftname: try string(json["giftname"], "giftname"),
                                    giftURL: try string(json["giftURL"], "giftURL", required: false),
                                    giftcount: Int32(try int(json["giftcount"], "giftcount", 1...Int64(Int32.max), default: 1))).serialized()
        case .number?:
            let t = UInt16(try int(json["type"], "type", 0...65535, default: 0))
            guard ![s.joinType, s.leaveType, s.heartbeatType, s.noticeType].contains(t) else {
                throw APIError(422, "bad_publish", "type \(t) is a control type (join, leave, heartbeat or notice): publish text, gift or an opaque type")
            }
            guard let decoded = base64Decoded(try string(json["body_base64"], "body_base64")) else {
                throw APIError(422, "bad_publish", "body_base64 is not base64 (RFC 4648 §4, standard alphabet with padding)")
            }
            type = t
            frameBody = decoded
        default:
            throw APIError(422, "bad_publish", "type must be \"text\", \"gift\" or a frame type number")
        }
        guard frameBody.count <= config.protocol.maxFrameBytes else {
            throw APIError(413, "frame_too_large", "the frame body is \(frameBody.count) bytes, over protocol.max_frame_bytes (\(config.protocol.maxFrameBytes))")
        }
        let frame = FrameCodec.encode(type: type, body: frameBody, byteOrder: s.byteOrder)
        if let key, let fingerprint, let cluster {
            // Claimed cluster-wide first (APIIdempotency.swift); nil: Redis
            // cannot take the claim now, the local cache alone decides.
            let pending = PendingPublish(key: key, fingerprint: fingerprint, room: room, type: type, frame: frame)
            if let deferred = claimPublish(pending, cluster: cluster, now: now) { return deferred }
        }
        return IdempotencyCache.reply(delivered: try relayPublish(frame, type: type, room: room, key: key, fingerprint: fingerprint, now: now))
    }

    /// POST /v1/rooms/{room}/kick: every member with that `sub` (or `name`)
    /// is sent the notice `kicked` and closed; the room gets its leave.
    private func kick(_ room: RoomName, body: [UInt8], now: UInt64) throws(APIError) -> APIResponse {
        let json = try jsonBody(body)
        let bySub: Bool
        let value: String
        if case .string(let sub)? = json["sub"], !sub.isEmpty {
            (bySub, value) = (true, sub)
        } else if case .string(let name)? = json["name"], !name.isEmpty {
            (bySub, value) = (false, name)
        } else {
            throw APIError(422, "bad_kick", "give {\"sub\": ...} (from signed joins) or {\"name\": ...}, not empty")
        }
        // Compared as bytes (the relay's rule, PeerText.swift), here and on every other daemon.
        let n = kickMembers(of: room, bySub: bySub, value: Array(value.utf8), now: now)
        cluster?.publishControl(.kick(room, bySub: bySub, value: Array(value.utf8)))
        return .json("{\"kicked\": \(n)}")
    }
}

/// RFC 4648 §4 base64 (standard alphabet, padded) through OpenSSL's
/// EVP_DecodeBlock; nil when malformed. Empty text is an empty body.
func base64Decoded(_ text: String) -> [UInt8]? {
    let input = Array(text.utf8)
    if input.isEmpty { return [] }
    guard input.count % 4 == 0, input.allSatisfy({ ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2B || $0 == 0x2F || $0 == 0x3D }) else { return nil }
    let pad = input.reversed().prefix { $0 == 0x3D }.count
    guard pad <= 2, !input.dropLast(pad).contains(0x3D) else { return nil }
    var out = [UInt8](repeating: 0, count: input.count / 4 * 3)
    let n = EVP_DecodeBlock(&out, input, Int32(input.count))
    guard n >= 0 else { return nil }
    return Array(out[0..<(Int(n) - pad)])
}
