import RoomcastCore

// APIModeration.swift: the moderation endpoints (docs/api.md "Moderation"):
// bans and mutes of a sub in a room (subs come from signed joins, so these
// need `[auth] key_file`), and a room's settings (slow mode). With
// `[cluster]` on, a change is stored in Redis and told to every daemon
// (Cluster/ClusterModeration.swift); while Redis is not connected a change
// is refused (503), since the next load from Redis would undo it.

extension Server {
    /// `/v1/rooms/{room}/bans[/{sub}]`, `.../mutes[/{sub}]`, `.../settings`.
    func moderationRoute(_ request: HTTPRequest, _ s: [Substring], body: [UInt8], now: UInt64) throws(APIError) -> APIResponse {
        let room = try roomName(s[2])
        func allow(_ methods: [String]) throws(APIError) {
            guard methods.contains(request.method) else {
                let list = methods.joined(separator: ", ")
                throw APIError(405, "method_not_allowed", "\(request.path) takes \(list)", headers: [("Allow", list)])
            }
        }
        if s[3] == "settings" {
            guard s.count == 4 else { throw APIError(404, "not_found", "no endpoint under .../settings (docs/api.md)") }
            try allow(["GET", "PUT"])
            if request.method == "PUT" { try putSettings(room, body: body) }
            return .json("{\"room\": \(jsonStringLiteral(room.string)), \"slow_mode_seconds\": \(moderation.slowModeSeconds(room))}")
        }
        let kind: ModerationKind = s[3] == "bans" ? .ban : .mute
        guard auth.keys != nil else {
            throw APIError(409, "auth_off", "\(kind.rawValue)s name a sub of a signed join: set [auth] key_file (docs/protocol/tokens.md §13)")
        }
        switch s.count {
        case 4:
            try allow(["GET"])
            return try moderationList(kind, room, request)
        case 5:
            try allow(["PUT", "DELETE"])
            let sub = try subName(s[4])
            let key = ModerationKey(kind, room: room, sub: sub)
            return request.method == "PUT" ? try putEntry(key, body: body, now: now) : try deleteEntry(key)
        default:
            throw APIError(404, "not_found", "no endpoint \(clipForLog(request.path, maxBytes: 80)) (docs/api.md)")
        }
    }

    /// A `{sub}` segment: percent-decoded UTF-8, 1 ... 1024 bytes.
    private func subName(_ segment: Substring) throws(APIError) -> [UInt8] {
        guard let bytes = percentDecoded(segment), !bytes.isEmpty, bytes.count <= 1024, String(validating: bytes, as: UTF8.self) != nil else {
            throw APIError(400, "bad_sub", "the sub must be 1 ... 1024 bytes of percent-encoded UTF-8 (a signed join's sub)")
        }
        return bytes
    }

    /// A change needs Redis when the cluster is on: 503 while it is not connected.
    private func requireCluster() throws(APIError) {
        if let cluster, !cluster.connected {
            throw APIError(503, "cluster_down", "Redis is not connected: the change would not reach the other daemons; retry",
                           headers: [("Retry-After", "1")])
        }
    }

    private func putEntry(_ key: ModerationKey, body: [UInt8], now: UInt64) throws(APIError) -> APIResponse {
        let json = try jsonBody(body)
        let code = "bad_\(key.kind.rawValue)"
        guard case .number(let x)? = json["seconds"], x == x.rounded(), x >= 1, x <= Double(ModerationBook.maxSeconds) else {
            throw APIError(422, code, "seconds must be an integer 1 ... \(ModerationBook.maxSeconds) (14 days)")
        }
        var reason = ""
        switch json["reason"] {
        case nil, .null?: break
        case .string(let r)? where r.utf8.count <= ModerationBook.maxReasonBytes: reason = r
        default: throw APIError(422, code, "reason must be a string of at most \(ModerationBook.maxReasonBytes) bytes")
        }
        try requireCluster()
        let set = moderationStamp()
        let entry = ModerationBook.Entry(key: key, untilMs: set + Int64(x) * 1000, setMs: set, reason: reason)
        do throws(ModerationBook.Refusal) {
            try moderation.set(entry, nowMs: now, wallMs: set)
        } catch .full(let cap) {
            throw APIError(507, "moderation_full", "at most \(cap): remove some first")
        } catch {
            throw APIError(409, "conflict", "a later change of this \(key.kind.rawValue) is already here; retry")
        }
        cluster?.store(entry.record)
        logModeration(entry.record)
        let kicked = enforceBan(entry, now: now)
        logger.info("\(key.kind.rawValue) of '\(clipForLog(String(decoding: key.sub, as: UTF8.self), maxBytes: 64))' in \(key.room) "
                    + "for \(Int64(x)) s through the API", ["ROOM": key.room.string, "REASON": key.kind.rawValue])
        return .json(String(entryJSON(entry, wallMs: set).dropLast()) + (key.kind == .ban ? ", \"kicked\": \(kicked)}" : "}"))
    }

    private func deleteEntry(_ key: ModerationKey) throws(APIError) -> APIResponse {
        try requireCluster()
        let set = moderationStamp()
        guard let entry = moderation.remove(key, setMs: set, wallMs: set) else {
            throw APIError(404, "not_\(key.kind == .ban ? "banned" : "muted")", "no \(key.kind.rawValue) of this sub in this room is in force")
        }
        let removal = ModerationRecord.removed(key, untilMs: entry.untilMs, setMs: set)
        cluster?.store(removal)
        logModeration(removal)
        return .json("{\"removed\": true}")
    }

    private func putSettings(_ room: RoomName, body: [UInt8]) throws(APIError) {
        let json = try jsonBody(body)
        let range = ModerationBook.slowModeRange
        guard case .number(let x)? = json["slow_mode_seconds"], x == x.rounded(), x == 0 || (x >= Double(range.lowerBound) && x <= Double(range.upperBound)) else {
            throw APIError(422, "bad_settings", "slow_mode_seconds must be 0 (off) or an integer \(range.lowerBound) ... \(range.upperBound)")
        }
        try requireCluster()
        let set = moderationStamp()
        do throws(ModerationBook.Refusal) {
            try moderation.setSlowMode(room, seconds: Int(x), setMs: set, wallMs: set)
        } catch .full(let cap) {
            throw APIError(507, "moderation_full", "at most \(cap)")
        } catch {
            throw APIError(409, "conflict", "a later change of this room's settings is already here; retry")
        }
        let setting = ModerationRecord.settings(room, slowModeSeconds: Int(x), setMs: set)
        cluster?.store(setting)
        logModeration(setting)
    }

    /// The entries in force by sub's bytes, `limit` after `cursor` (the last sub of the previous page).
    private func moderationList(_ kind: ModerationKind, _ room: RoomName, _ request: HTTPRequest) throws(APIError) -> APIResponse {
        let (items, n) = try listingQuery(request)
        let after = items["cursor"] ?? []
        let wall = wallClock()
        let (page, more) = moderation.page(kind, room: room, after: after, limit: n, wallMs: wall)
        let list = page.map { entryJSON($0, wallMs: wall) }.joined(separator: ", ")
        let next = more ? jsonStringLiteral(percentEncoded(page.last!.key.sub)) : "null"
        return .json("{\"room\": \(jsonStringLiteral(room.string)), \"\(kind.rawValue)s\": [\(list)], \"next_cursor\": \(next)}")
    }

    private func entryJSON(_ e: ModerationBook.Entry, wallMs: Int64) -> String {
        "{\"sub\": \(jsonStringLiteral(String(decoding: e.key.sub, as: UTF8.self))), \"until_ms\": \(e.untilMs), "
            + "\"retry_after_ms\": \(max(0, e.untilMs - wallMs)), \"reason\": \(jsonStringLiteral(e.reason))}"
    }
}
