import Glibc
import RoomcastCore
import RoomcastIO

// ClusterModeration.swift: bans, mutes, settings and kicks across the
// cluster (ModerationWire.swift has the key schema). A change made here
// goes to Redis on the publisher, in this order: the hash (HSET or HDEL),
// then a message on the control channel; Redis runs one connection's
// commands in order, so a daemon that hears the message and a daemon that
// loads the hash later see the same state. Each daemon loads the whole
// hash whenever its publisher connects: a daemon started later, or one
// that was cut off, knows what was set meanwhile.
extension ClusterLink {
    /// Removes `ARGV[1]` from the hash `KEYS[1]` only while its value is
    /// still `ARGV[2]` (an expiry must not remove a ban set again since).
    static let removeIfUnchanged = "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0"
    /// The longest wait before READY=1 for the hash, in ms.
    static let moderationWaitMs: UInt64 = 1_000

    /// A change made here (a removal too): into the hash, then, unless
    /// `tellOthers` is false (a record Redis lost, told again), to every daemon.
    func store(_ record: ModerationRecord, tellOthers: Bool = true) {
        guard publisher.state == .ready else { return }
        publisher.command([Array("HSET".utf8), channels.moderation, Array(record.field.utf8), Array(record.value.utf8)], .store)
        if tellOthers { publishControl(.set(record)) }
    }

    /// An entry (or removal) whose time is up: out of the hash unless it was set again.
    /// Every daemon that held it asks; the first one removes it.
    func forgetExpired(_ record: ModerationRecord) {
        guard publisher.state == .ready else { return }
        publisher.command([Array("EVAL".utf8), Array(Self.removeIfUnchanged.utf8), Array("1".utf8), channels.moderation,
                           Array(record.field.utf8), Array(record.value.utf8)], .store)
    }

    /// A message on the control channel for the other daemons (a kick is
    /// nothing but this message: it is not stored).
    func publishControl(_ operation: ControlMessage.Operation) {
        guard publisher.state == .ready else { return }
        _ = publisher.publish(channels.control, ControlMessage(origin: origin, operation).encoded, nowMs: nowMs)
    }

    /// Both connections are ready (the control channel subscribed): HGETALL of the hash.
    func loadModeration() {
        moderationLoaded = false
        publisher.command([Array("HGETALL".utf8), channels.moderation], .load)
    }

    /// A message on the control channel (ours come back too: ignored),
    /// taken only within the API's bounds (`ModerationRecord.refusal`).
    func controlMessage(_ payload: UnsafeRawBufferPointer) {
        guard let message = ControlMessage(payload) else {
            return refuse(.control, "a \(payload.count)-byte control message that is not roomcast's (or outside the API's bounds)")
        }
        guard message.origin != origin else { return }
        let maxRoom = relaySettings.maxRoomBytes
        switch message.operation {
        case .set(let record):
            if let why = record.refusal(wallMs: wallClock(), maxRoomBytes: maxRoom) {
                return refuse(.moderation, "the moderation record \(clipForLog(record.field, maxBytes: 96)) of daemon "
                              + "\(ClusterEnvelope.hex(message.origin)): \(why)", origin: message.origin)
            }
        case .kick(let room, _, _):
            if room.count > maxRoom {
                return refuse(.control, "a kick in a room of \(room.count) bytes, over protocol.max_room_bytes (\(maxRoom))", origin: message.origin)
            }
        }
        host.applyControl(message, now: nowMs)
    }

    /// The hash as HGETALL answered it; a field that is not ours, or
    /// outside the API's bounds, is skipped (said once per load, each
    /// counted as refused, `moderation`): it is neither taken nor written back.
    func redisModerationLoaded(_ pairs: [(field: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)]) {
        var records: [ModerationRecord] = []
        records.reserveCapacity(pairs.count)
        var skipped = 0, outside = 0
        let wall = wallClock(), maxRoom = relaySettings.maxRoomBytes
        for p in pairs {
            guard let r = ModerationRecord(field: p.field, value: p.value) else { skipped += 1; continue }
            if r.refusal(wallMs: wall, maxRoomBytes: maxRoom) != nil { outside += 1; continue }
            records.append(r)
        }
        for _ in 0..<(skipped + outside) { refusals.add(.moderation) }
        if skipped + outside > 0 {
            logger.warning("cluster: \(skipped) fields of \(String(decoding: channels.moderation, as: UTF8.self)) are not roomcast's; skipped"
                           + (outside > 0 ? "; \(outside) outside the API's bounds (a time ahead of this daemon's clock, a room over protocol.max_room_bytes) skipped" : ""),
                           ["REASON": "cluster_bad_message", "REDIS": address.description])
        }
        moderationLoaded = true
        host.loadModeration(records, now: nowMs)
    }

    /// Redis refused an HSET, HDEL, EVAL or HGETALL (an ACL, out of memory):
    /// said (rate-limited); the connection stays. A refused load counts as
    /// done: the daemon goes on with what it knows.
    func redisModerationRefused(_ c: RedisConnection, _ text: String, load: Bool) {
        if load { moderationLoaded = true }
        logger.peerWarning(reason: "cluster_error", nowMs: nowMs, "cluster: Redis refused a moderation command\(load ? " (HGETALL)" : ""): \(text)",
                           ["REDIS": address.description, "DETAIL": text])
    }
}
