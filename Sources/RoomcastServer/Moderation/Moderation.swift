import RoomcastCore

// Moderation.swift: bans, mutes and slow mode on the daemon's input path
// (docs/api.md "Moderation", docs/protocol/tokens.md §13): a banned sub is removed
// from its room and its joins there are refused, a muted one may not send,
// a viewer in a slow room sends one text per interval. None of these
// refusals counts as a violation (`protocol.max_violations`): the client
// did nothing wrong with the protocol, it is told when to try again
// (`retry_after_ms`), and rate limits still bound what it sends.

extension Server {
    /// A `setMs` for a change made here: the wall clock, strictly after the
    /// last one (a DELETE and a PUT within one ms keep their order).
    func moderationStamp() -> Int64 {
        let now = max(wallClock(), lastModerationStamp + 1)
        lastModerationStamp = now
        return now
    }

    /// Refuses a join of `sub` to `room` while a ban is in force: the
    /// notice `banned` with the time left. Called by `authorizeJoin`.
    /// - Returns: true when refused.
    func refuseIfBanned(_ id: Int, room: String, sub: String, now: UInt64) -> Bool {
        guard moderation.count > 0 else { return false }
        let wall = wallClock()
        guard let ban = moderation.active(ModerationKey(.ban, room: RoomName(room), sub: Array(sub.utf8)), wallMs: wall) else { return false }
        refuseModerated(id, .banned, "banned from \(clipForLog(room, maxBytes: 64))" + (ban.reason.isEmpty ? "" : ": \(clipForLog(ban.reason, maxBytes: 128))"),
                        retryAfterMs: ban.untilMs - wall, now: now)
        return true
    }

    /// Refuses a send (anything but join, leave and heartbeat) by `session`'s
    /// sub while it is muted in the room `id` is in. Called by `authorize`.
    /// - Returns: true when refused.
    func refuseIfMuted(_ id: Int, _ session: AuthSession, now: UInt64) -> Bool {
        guard moderation.count > 0, let room = relay.roomName(of: id) else { return false }
        let wall = wallClock()
        guard let mute = moderation.active(ModerationKey(.mute, room: room, sub: Array(session.claims.sub.utf8)), wallMs: wall) else { return false }
        refuseModerated(id, .muted, "muted in \(clipForLog(room.string, maxBytes: 64))" + (mute.reason.isEmpty ? "" : ": \(clipForLog(mute.reason, maxBytes: 128))"),
                        retryAfterMs: mute.untilMs - wall, now: now)
        return true
    }

    /// Slow mode: a viewer (a token's role `viewer`, or no token) sends one
    /// text per `slow_mode_seconds` of its room; moderators and owners are
    /// exempt. A text refused for any other reason does not count.
    /// - Returns: whether the text from `id` may be relayed.
    func slowModeAllows(_ id: Int, type: UInt16, now: UInt64) -> Bool {
        guard type == relay.settings.textType, !moderation.slowMode.isEmpty, let room = relay.roomName(of: id) else { return true }
        let seconds = moderation.slowModeSeconds(room)
        guard seconds > 0 else { return true }
        if let role = table.slots[id]!.auth?.claims.role, role != .viewer { return true }
        let interval = UInt64(seconds) * 1000
        if let last = table.slots[id]!.lastTextMs, now &- last < interval {
            refuseModerated(id, .slowMode, "slow mode in \(clipForLog(room.string, maxBytes: 64)): one text every \(seconds) s",
                            retryAfterMs: Int64(interval - (now &- last)), now: now)
            return false
        }
        table.slots[id]!.lastTextMs = now
        return true
    }

    /// Removes every member of `room` that `matches`: `notice`, then its
    /// leave to the room, then its owed output is flushed and it is closed.
    /// - Returns: how many.
    @discardableResult
    func removeMembers(of room: RoomName, _ notice: Notice, why: String, now: UInt64, matching matches: (Int) -> Bool) -> Int {
        let targets = relay.members(of: room).filter { table.isOpen($0) && matches($0) }
        for id in targets {
            table.slots[id]!.disconnectReason = notice.code == "banned" ? .banned : .kicked
            sendNotice(id, notice)
            logger.info("\(table.address(of: id)): \(why) \(room)", ["CLIENT_ADDR": table.address(of: id), "ROOM": room.string, "REASON": notice.code])
            removeAfterNotice(id, notice, now: now)
        }
        return targets.count
    }

    /// A ban now in force: its sub's members of the room go, told `banned`.
    @discardableResult
    func enforceBan(_ entry: ModerationBook.Entry, now: UInt64) -> Int {
        guard entry.key.kind == .ban else { return 0 }
        let left = entry.untilMs - wallClock()
        guard left > 0 else { return 0 }
        let notice = Notice(code: "banned", text: "banned from \(clipForLog(entry.key.room.string, maxBytes: 64))"
                            + (entry.reason.isEmpty ? "" : ": \(clipForLog(entry.reason, maxBytes: 128))"), retryAfterMs: left)
        return removeMembers(of: entry.key.room, notice, why: "banned from", now: now) { [table] id in
            table.slots[id]?.auth.map { Array($0.claims.sub.utf8) == entry.key.sub } ?? false
        }
    }

    /// Kicks by sub or by name (every member of that name) in `room`, for
    /// the API and the cluster's control channel.
    @discardableResult
    func kickMembers(of room: RoomName, bySub: Bool, value: [UInt8], now: UInt64) -> Int {
        let notice = Notice(code: "kicked", text: "removed from \(clipForLog(room.string, maxBytes: 64)) by the service")
        return removeMembers(of: room, notice, why: "kicked from", now: now) { [table, relay] id in
            bySub ? table.slots[id]?.auth.map { Array($0.claims.sub.utf8) == value } ?? false : Array(relay.name(of: id).utf8) == value
        }
    }

    /// Forgets the bans and mutes whose time is up; the cluster's copy in
    /// Redis goes with them.
    func expireModeration(now: UInt64) {
        for e in moderation.popExpired(nowMs: now, wallMs: wallClock()) {
            cluster?.forgetExpired(e.record)
        }
    }

    /// A ban, mute, removal or setting taken here goes into the live log,
    /// so that a crash keeps it (docs/operations/restarts.md; without a cluster
    /// nothing else holds it).
    func logModeration(_ record: ModerationRecord) { logLive(LiveLog.moderation(record)) }

    /// A change another daemon made (the control channel), or Redis's
    /// state at connect: the same rules as a change made here.
    func applyControl(_ message: ControlMessage, now: UInt64) {
        let wall = wallClock()
        switch message.operation {
        case .set(let record):
            do throws(ModerationBook.Refusal) {
                try moderation.apply(record, nowMs: now, wallMs: wall)
            } catch .full(let cap) {
                logger.warning("cluster: a moderation record from daemon \(ClusterEnvelope.hex(message.origin)) was not taken: \(cap)",
                               ["REASON": "moderation_full"])
                return
            } catch { return }
            logModeration(record)
            if case .entry(let key, let until, let set, let reason) = record {
                enforceBan(.init(key: key, untilMs: until, setMs: set, reason: reason), now: now)
            }
        case .kick(let room, let bySub, let value):
            kickMembers(of: room, bySub: bySub, value: value, now: now)
        }
    }

    /// Redis's moderation hash as loaded at connect (`ModerationBook.load`).
    func loadModeration(_ records: [ModerationRecord], now: UInt64) {
        let (taken, expired, missing) = moderation.load(records, nowMs: now, wallMs: wallClock())
        for r in taken { logModeration(r) }
        for r in expired { cluster?.forgetExpired(r) }
        for r in missing { cluster?.store(r, tellOthers: false) }
        for case .entry(let key, let until, let set, let reason) in taken where key.kind == .ban {
            enforceBan(.init(key: key, untilMs: until, setMs: set, reason: reason), now: now)
        }
        logger.info("cluster: moderation loaded from Redis: \(moderation.count) bans and mutes, "
                    + "\(plural(moderation.slowMode.count, "room")) in slow mode"
                    + (missing.isEmpty ? "" : "; \(missing.count) that Redis lacked stored again"), ["REASON": "moderation_loaded"])
    }
}
