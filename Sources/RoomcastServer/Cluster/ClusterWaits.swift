import Glibc
import RoomcastCore
import RoomcastIO

// ClusterWaits.swift: the two moments the cluster link is waited for, with
// poll(2) on its own two sockets only (the clients' descriptors are not
// looked at, so nothing else is served or spun on), each bounded by a
// real clock: before READY=1 after a restart, until every restored room is
// subscribed; and at a hand-over, until what the last loop turn relayed is
// written to Redis.
extension ClusterLink {
    /// The longest wait before READY=1 for the subscriptions, in ms.
    static let readyWaitMs: UInt64 = 1_000
    /// The longest wait at a hand-over for the publisher's output, in ms.
    static let handOverWaitMs: UInt64 = 200

    /// After a restore, before READY=1: waits until both connections are
    /// ready, so that every restored room is subscribed (the subscriber is
    /// ready only once Redis confirmed all of them), or until they fail or
    /// `min(cluster.timeout, readyWaitMs)` passes; then the loop's timers
    /// take over as after any start.
    /// - Returns: whether the link is up.
    @discardableResult
    func awaitReady() -> Bool {
        let deadline = Sys.monotonicMs() + min(settings.timeoutMs, Self.readyWaitMs)
        while !connected {
            let pending = [publisher!, subscriber!].filter { $0.state == .connecting || $0.state == .handshaking }
            guard !pending.isEmpty, poll(pending, until: deadline) else { break }
        }
        return connected
    }

    /// Before READY=1: waits until the moderation hash is loaded
    /// (ClusterModeration.swift), so that a daemon started after a ban
    /// refuses the banned from its first client on, or until a connection
    /// fails or `min(cluster.timeout, moderationWaitMs)` passes.
    /// - Returns: whether it is loaded.
    @discardableResult
    func awaitModerationLoaded() -> Bool {
        let deadline = Sys.monotonicMs() + min(settings.timeoutMs, Self.moderationWaitMs)
        while !moderationLoaded {
            guard publisher.state != .idle, subscriber.state != .idle, poll([publisher, subscriber], until: deadline) else { break }
        }
        return moderationLoaded
    }

    /// At a hand-over, before the state is written: the frames this
    /// process relayed last are written to Redis (at most `handOverWaitMs`;
    /// what is left then is dropped and counted, as for a slow Redis).
    /// Idempotency-Key claims still waiting are waited for too, in the same
    /// time: their publishes are relayed (or not) and answered by this
    /// process, instead of leaving their keys "in progress" in Redis.
    func publishBeforeHandOver() {
        guard publisher.state == .ready else { return }
        publisher.flush()
        let deadline = Sys.monotonicMs() + Self.handOverWaitMs
        while publisher.pendingOutput > 0 || claimsWaiting > 0, publisher.state == .ready, poll([publisher], until: deadline) {}
        if publisher.pendingOutput > 0 {
            logger.warning("cluster: Redis did not take the last \(publisher.pendingOutput) bytes within "
                           + "\(formatDuration(ms: Self.handOverWaitMs)) of the hand-over; they are lost",
                           ["REASON": "cluster_output_limit", "REDIS": address.description])
        }
    }

    /// One poll(2) of `connections` (reading always, writing while they
    /// have output or are connecting) and their readiness handled.
    /// - Returns: false once `deadline` (CLOCK_MONOTONIC ms) has passed.
    private func poll(_ connections: [RedisConnection], until deadline: UInt64) -> Bool {
        let now = Sys.monotonicMs()
        guard now < deadline else { return false }
        for c in connections { c.flush() }
        var fds = connections.map { c in
            pollfd(fd: c.fd, events: Int16(POLLIN) | (c.state == .connecting || c.pendingOutput > 0 ? Int16(POLLOUT) : 0), revents: 0)
        }
        let n = fds.withUnsafeMutableBufferPointer { Glibc.poll($0.baseAddress, nfds_t($0.count), Int32(min(deadline - now, 100))) }
        guard n > 0 else { return n == 0 || errno == EINTR }
        for (c, p) in zip(connections, fds) where p.revents != 0 && c.fd == p.fd {
            var r: Readiness = []
            if p.revents & Int16(POLLIN) != 0 { r.insert(.readable) }
            if p.revents & Int16(POLLOUT) != 0 { r.insert(.writable) }
            if p.revents & (Int16(POLLHUP) | Int16(POLLERR)) != 0 { r.insert(.hangup) }
            c.ready(r)
        }
        return true
    }
}
