@preconcurrency import CHiredis
import Glibc
import RoomcastCore
import RoomcastIO

// ClusterReplies.swift: what ClusterLink does with Redis's replies and
// pushes: handshakes, heartbeats, other daemons' frames (Cluster.swift);
// the server's side (making and starting the link, delivering those
// frames) is ServerCluster.swift.
extension ClusterLink {
    // MARK: - Replies (RedisConnection matched them to their commands)

    /// Every command of the handshake is answered: the publisher's PING,
    /// or every channel the subscriber asked for while connecting (the
    /// heartbeat channel, every room with members here). Only then is the
    /// connection ready: a subscriber that Redis refuses a room never is,
    /// so the cluster does not flap between up and down at each attempt.
    func redisSettled(_ c: RedisConnection) {
        if c.state == .handshaking { becameReady(c, now: nowMs) }
    }

    /// Redis answered a PUBLISH with an error (an ACL, out of memory): that
    /// frame is lost, the connection stays.
    func redisPublishRefused(_ c: RedisConnection, _ text: String) {
        logger.peerWarning(reason: "cluster_error", nowMs: nowMs, "cluster: Redis refused a PUBLISH: \(text)",
                           ["REDIS": address.description, "DETAIL": text])
    }

    /// A message pushed on the subscriber.
    /// - Returns: false when its channel is none this daemon subscribes to
    ///   (a room channel whose room closed here is one: its messages were in flight).
    func redisMessage(_ c: RedisConnection, channel: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer) -> Bool {
        if channel.elementsEqual(heartbeatChannel) || channel.elementsEqual(channels.daemons) {
            message(payload, room: nil)
            return true
        }
        if channel.elementsEqual(channels.control) {
            controlMessage(payload)  // ClusterModeration.swift
            return true
        }
        guard channel.count >= channels.roomPrefix.count,
              UnsafeRawBufferPointer(rebasing: channel[..<channels.roomPrefix.count]).elementsEqual(channels.roomPrefix) else {
            return false
        }
        message(payload, room: UnsafeRawBufferPointer(rebasing: channel[channels.roomPrefix.count...]))
        return true
    }

    /// One message from a room channel (`room`: the channel's room) or the
    /// daemons or our heartbeat channel (nil), taken only as a daemon of
    /// ours writes it (ClusterInput.swift; anything else is refused,
    /// `refuse`). The room a frame goes to is always the channel's: an
    /// envelope naming another room is dropped and counted (`misrouted`),
    /// so no subscribed channel can inject into other rooms. A message for
    /// a room with no member here any more (it was in flight when the room
    /// closed) is dropped before it creates any state.
    private func message(_ payload: UnsafeRawBufferPointer, room channelRoom: UnsafeRawBufferPointer?) {
        let v: ClusterEnvelope.View
        switch ClusterEnvelope.decode(payload) {
        case .success(let view):
            v = view
        case .failure(let error):
            return refuse(.envelope, "a \(payload.count)-byte message that is not a roomcast envelope: \(error)")
        }
        if v.origin == origin {
            if v.kind == .heartbeat { lastHeardMs = nowMs }
            return  // our own frames: relayed here already
        }
        guard let channelRoom else {
            if v.kind == .littleEndianFrame || v.kind == .bigEndianFrame {
                return refuse(.kind, "a frame on the daemons channel (frames go on their room's channel)", origin: v.origin)
            }
            guard remote.admit(v.origin, nowMs: nowMs) else {
                return refuse(.origins, "a message of a daemon not known here while \(RemoteDaemons.maxDaemons) are", origin: v.origin)
            }
            switch v.kind {
            case .heartbeat: heardDaemon(v.origin, advert: v.frame)
            case .bye: departed(v.origin, "stopped (it said bye)")
            case .counts: takeCounts(v.frame, of: v.origin)
            case .handingOver: handingOver(v.origin, graceMs: v.seq)
            case .littleEndianFrame, .bigEndianFrame: break
            }
            return
        }
        guard v.kind == .littleEndianFrame || v.kind == .bigEndianFrame else {
            return refuse(.kind, "a \(v.kind) envelope on a room channel (only frames go there)", origin: v.origin)
        }
        guard v.room.elementsEqual(channelRoom) else {
            misrouted &+= 1
            logger.peerWarning(reason: "cluster_bad_message", nowMs: nowMs,
                               "cluster: dropped a message from daemon \(ClusterEnvelope.hex(v.origin)) on the channel of "
                               + "\(RoomName(bytes: Array(channelRoom))) whose envelope names another room",
                               ["REDIS": address.description, "ORIGIN": ClusterEnvelope.hex(v.origin)])
            return
        }
        let room = RoomName(bytes: Array(channelRoom))
        guard hasMembers(room) else {
            stale &+= 1
            return
        }
        let order: ByteOrder = v.kind == .littleEndianFrame ? .little : .big
        if let why = ClusterFrameCheck.refusal(v.frame, order: order, room: room, sub: v.sub, settings: relaySettings) {
            return refuse(why, "a frame to \(room) that no daemon of ours relays (\(why.label))", origin: v.origin)
        }
        guard remote.admit(v.origin, nowMs: nowMs, frame: true) else {
            return refuse(.origins, "a frame of a daemon not known here while \(RemoteDaemons.maxDaemons) are", origin: v.origin)
        }
        switch tracker.check(room: room, origin: v.origin, stream: v.stream, seq: v.seq) {
        case .late:
            late &+= 1
            return
        case .deliver(let missed):
            if missed > 0 {
                gaps &+= missed
                logger.peerWarning(reason: "cluster_gap", nowMs: nowMs,
                                   "cluster: \(missed) frames from daemon \(ClusterEnvelope.hex(v.origin)) to \(room) never arrived "
                                   + "(lost in Redis or while a connection was down)",
                                   ["ROOM": room.string, "ORIGIN": ClusterEnvelope.hex(v.origin), "LENGTH": String(missed)])
            }
        }
        received &+= 1
        let sender = String(decoding: v.address, as: UTF8.self)
        track(v.frame, order: order, origin: v.origin, address: sender, sub: v.sub, room: room)
        if !v.sub.isEmpty && host.clusterModerates && moderatedRemote(v.frame, order: order, from: v.origin, sub: v.sub, room: room) {
            return  // logged there
        }
        if v.kind == kind {
            host.deliverFromCluster(v.frame, room: room, address: sender)
        } else {
            ClusterEnvelope.convertHeader(v.frame, from: byteOrder == .little ? .big : .little, to: byteOrder, into: &converted)
            _ = converted.withUnsafeBytes { host.deliverFromCluster($0, room: room, address: sender) }
        }
    }

    /// A `counts` message of `origin`: its rooms' members, taken within
    /// `ClusterCounts.decode`'s bounds and `RemoteDaemons.maxCountedRooms`.
    private func takeCounts(_ payload: UnsafeRawBufferPointer, of origin: UInt64) {
        switch ClusterCounts.decode(payload, maxRoomBytes: relaySettings.maxRoomBytes) {
        case .success(let counts):
            if !remote.setCounts(origin, counts, nowMs: nowMs) {
                refuse(.countsLimit, "the viewer counts of \(plural(counts.count, "room")) of daemon \(ClusterEnvelope.hex(origin)): "
                       + "more than \(RemoteDaemons.maxCountedRooms) rooms counted over every daemon", origin: origin)
            }
        case .failure(let error):
            refuse(.counts, "the \(payload.count)-byte viewer counts of daemon \(ClusterEnvelope.hex(origin)): \(error)", origin: origin)
        }
    }

    /// Whether a frame of another daemon is one its sender may not send in
    /// `room` by this daemon's moderation state: anything but a join, a
    /// leave or a heartbeat from a sub muted or banned there (its own
    /// daemon refuses these too, but may not have heard of the mute yet).
    /// A frame in envelope version 1 has no sub and is never held back
    /// (docs/protocol/across-daemons.md §12).
    func moderatedRemote(_ frame: UnsafeRawBufferPointer, order: ByteOrder, from origin: UInt64, sub: UnsafeRawBufferPointer,
                         room: RoomName) -> Bool {
        guard case .frame(let type, _) = FrameCodec.parse(frame, byteOrder: order, maxFrameBytes: Int.max) else { return false }
        let p = relaySettings
        guard type != p.joinType && type != p.leaveType && type != p.heartbeatType else { return false }
        guard let what = host.clusterModeration(of: sub, in: room) else { return false }
        let shown = clipForLog(String(decoding: sub, as: UTF8.self), maxBytes: 64)
        logger.peerWarning(reason: "cluster_moderated", nowMs: nowMs,
                           "cluster: dropped a frame of type \(type) from daemon \(ClusterEnvelope.hex(origin)) to \(room): "
                           + "its sender's sub '\(shown)' is \(what) there",
                           ["ROOM": room.string, "USER_SUB": shown, "ORIGIN": ClusterEnvelope.hex(origin)])
        return true
    }

}
