@preconcurrency import CHiredis
import Glibc
import RoomcastCore
import RoomcastIO

// ClusterPublishing.swift: what the link publishes (Cluster.swift): every
// frame the relay relays, this daemon's members per room, its heartbeat,
// and its return after a hand-over.
// (docs/protocol/across-daemons.md §12.)
extension ClusterLink {
    /// Every frame relayed here goes to Redis once; one that cannot (Redis
    /// down or slow) still takes its number, so the others count the gap.
    func relayed(_ frame: UnsafeRawBufferPointer, room: RoomName, from sender: Int) {
        relayed(frame, room: room, from: sender, proving: nil)
    }

    /// A frame relayed here, `sub` the sub of the token its join proves
    /// (the connection holds it only once the relay has taken the join), nil
    /// for every other frame: it goes out with its sender's own sub.
    func relayed(_ frame: UnsafeRawBufferPointer, room: RoomName, from sender: Int, proving sub: String?) {
        let next = streams.next(room)
        if logsLive { streamsToLog.insert(room) }
        guard publisher.state == .ready else {
            dropped &+= 1
            return
        }
        let pending = publisher.pendingOutput
        guard pending + frame.count <= settings.maxOutputBytes else {
            dropped &+= 1
            logger.peerWarning(reason: "cluster_output_limit", nowMs: nowMs,
                               "cluster: Redis is not taking our output (\(pending) bytes waiting, max_output_bytes "
                               + "\(formatSize(settings.maxOutputBytes))): a frame to \(room) was not published",
                               ["ROOM": room.string, "REDIS": address.description])
            return
        }
        ClusterEnvelope.encode(kind: kind, origin: origin, stream: next.stream, seq: next.seq, room: room,
                               address: host.clusterAddress(of: sender), sub: sendsSub ? sub ?? host.clusterSub(of: sender) : nil,
                               frame: frame, into: &envelope)
        if publisher.publish(next.channel, envelope, nowMs: self.nowMs) {
            published &+= 1
        } else {
            dropped &+= 1
        }
    }

    /// This daemon's members per room on the daemons channel, when they
    /// changed since the last time or `countsRefreshMs` passed (the
    /// others' viewer counts are the sum, docs/api.md). O(rooms).
    func publishCounts(now: UInt64, roomCounts: [(room: RoomName, members: Int)]) {
        nextCountsMs = now + Self.countsMinMs
        ClusterCounts.encode(roomCounts, into: &countsPayload)
        guard countsPayload != lastCountsPayload || now &- lastCountsMs >= Self.countsRefreshMs else { return }
        guard publisher.pendingOutput + countsPayload.count <= settings.maxOutputBytes else { return }  // the next turn tries again
        countsPayload.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .counts, origin: origin, stream: 0, seq: 0, room: RoomName(bytes: []), address: "", frame: $0, into: &envelope)
        }
        if publisher.publish(channels.daemons, envelope, nowMs: now) {
            lastCountsPayload = countsPayload
            lastCountsMs = now
        }
    }

    /// Says in the log when the form of the frames sent changes (checked
    /// at each heartbeat; the form itself follows `sendsSub` at once): a
    /// rolling upgrade is over when every daemon reads version 2.
    func noteEnvelopeForm() {
        let now = sendsSub
        guard now != saidSendsSub else { return }
        saidSendsSub = now
        if now {
            logger.info("cluster: every daemon heard reads envelope version 2: frames go out with their sender's sub",
                        ["REASON": "cluster_envelope_v2", "REDIS": address.description])
        } else {
            let old = remote.daemons.filter { !$0.value.readsSub }.keys.sorted().prefix(4).map { ClusterEnvelope.hex($0) }
            logger.info("cluster: frames go out in envelope version 1, without their sender's sub"
                        + (old.isEmpty ? " (Redis was lost)" : ": daemon \(old.joined(separator: ", ")) reads only that"),
                        ["REASON": "cluster_envelope_v1", "REDIS": address.description])
        }
    }

    /// Our heartbeat, to ourselves (the proof Redis relays) and to the others.
    func sendHeartbeat(now: UInt64) {
        heartbeatSeq &+= 1
        if let after = subFormAfterMs, now >= after {
            subFormAfterMs = nil
            settledForSub = true
        }
        // The versions this daemon reads, where the frame would be: a
        // version 1 decoder takes a heartbeat's frame bytes and ignores them.
        ClusterEnvelope.readableVersions.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .heartbeat, origin: origin, stream: 0, seq: heartbeatSeq, room: RoomName(bytes: []), address: "",
                                   frame: $0, into: &envelope)
        }
        _ = publisher.publish(heartbeatChannel, envelope, nowMs: now)
        _ = publisher.publish(channels.daemons, envelope, nowMs: now)
        nextHeartbeatMs = now + max(1, settings.timeoutMs / 4)
    }

    /// The publisher is up after a hand-over: a heartbeat first, before
    /// any frame, so the others stop waiting; if they stopped already
    /// (later than the `restart_grace` announced), the restored members
    /// are announced again, as after a crash with a new origin.
    func returnFromHandOver(by: UInt64, now: UInt64) {
        returnByMs = nil
        sendHeartbeat(now: now)
        if now + Self.returnSlackMs >= by {
            logger.warning("cluster: back on Redis " + (now >= by ? "\(now - by) ms after" : "\(by - now) ms before")
                           + " the end of the [cluster] restart_grace the hand-over announced: the other daemons have sent (or may "
                           + "send) leaves for the members here, so they are announced again", ["REASON": "cluster_late_return", "REDIS": address.description])
            announceRestoredMembers(after: "the late return")
        }
    }
}
