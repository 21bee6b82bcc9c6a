@preconcurrency import CHiredis
import Glibc
import RoomcastCore
import RoomcastIO

// ClusterReplies.swift: what ClusterLink does with Redis's replies and
// pushes: handshakes, heartbeats, other daemons' frames (Cluster.swift),
// and the server's side: starting the link, delivering those frames.
extension ClusterLink {
    // MARK: - Replies

    /// hiredis's reply callback (`reply` nil: the context is being freed).
    func redisReply(_ c: RedisConnection, _ tag: RedisReplyTag, _ reply: UnsafeMutablePointer<redisReply>?) {
        guard let reply else { return }
        switch tag {
        case .ping:
            let now = nowMs
            c.replied(nowMs: now)
            if reply.pointee.type == REDIS_REPLY_ERROR {
                c.pendingReset = "PING: \(reply.text)"
            } else if c.state == .handshaking {
                becameReady(c, now: now)
            }
        case .publish:
            c.replied(nowMs: c.outstanding > 1 ? nowMs : 0)
            if reply.pointee.type == REDIS_REPLY_ERROR {
                logger.peerWarning(reason: "cluster_error", nowMs: nowMs, "cluster: Redis refused a PUBLISH: \(reply.text)",
                                   ["REDIS": address.description, "DETAIL": reply.text])
            }
        case .subscription:
            subscription(c, reply)
        }
    }

    private func subscription(_ c: RedisConnection, _ reply: UnsafeMutablePointer<redisReply>) {
        guard let type = reply.bytes(at: 0), let channel = reply.bytes(at: 1) else { return }
        if type.count == 7, let payload = reply.bytes(at: 2), memcmp(type.baseAddress!, "message", 7) == 0 {
            message(payload)
        } else if type.count == 9, memcmp(type.baseAddress!, "subscribe", 9) == 0, c.state == .handshaking,
                  channel.elementsEqual(heartbeatChannel) {
            becameReady(c, now: nowMs)
        }
    }

    /// One message from a room channel or our heartbeat channel.
    private func message(_ payload: UnsafeRawBufferPointer) {
        let v: ClusterEnvelope.View
        switch ClusterEnvelope.decode(payload) {
        case .success(let view):
            v = view
        case .failure(let error):
            logger.peerWarning(reason: "cluster_bad_message", nowMs: nowMs,
                               "cluster: dropped a \(payload.count)-byte message that is not a roomcast envelope: \(error)",
                               ["REDIS": address.description])
            return
        }
        if v.origin == origin {
            if v.kind == .heartbeat { lastHeardMs = nowMs }
            return  // our own frames: relayed here already
        }
        guard v.kind != .heartbeat else { return }
        let room = RoomName(bytes: Array(v.room))
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
        if v.kind == kind {
            server.deliverFromCluster(v.frame, room: room, address: sender)
        } else {
            ClusterEnvelope.convertHeader(v.frame, from: byteOrder == .little ? .big : .little, to: byteOrder, into: &converted)
            converted.withUnsafeBytes { server.deliverFromCluster($0, room: room, address: sender) }
        }
    }

}

extension Server {
    /// Starts the cluster link when `[cluster] redis` is set.
    func startCluster(now: UInt64) {
        guard let address = config.cluster.redis else { return }
        let link = ClusterLink(server: self, address: address, settings: config.cluster, byteOrder: config.protocol.byteOrder)
        cluster = link
        relay.observer = link
        link.start(nowMs: now)
    }

    /// A frame another daemon relayed to `room`, for the members here
    /// (docs/protocol.md §12): the same fan-out as local frames, with no
    /// local sender; JSON members see `address` as its `addr`.
    @discardableResult
    func deliverFromCluster(_ frame: UnsafeRawBufferPointer, room: RoomName, address: String) -> Int {
        table.fanout.remoteSenderAddress = address
        defer { table.fanout.remoteSenderAddress = "" }
        return relay.deliver(frame, toRoom: room, sink: table.fanout)
    }
}
