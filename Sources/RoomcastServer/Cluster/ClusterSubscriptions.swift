@preconcurrency import CHiredis
import Glibc
import RoomcastCore
import RoomcastIO

// ClusterSubscriptions.swift: the rooms the subscriber listens to (those
// with members here, as the relay opens and closes them), sent to Redis
// once per loop turn (Cluster.swift).
extension ClusterLink {
    // MARK: - The relay's hooks (RelayObserver)

    func roomOpened(_ room: RoomName) {
        rooms.insert(room)
        streams.open(room)
        if subscriber.state == .handshaking || subscriber.state == .ready { changedRooms.append(room) }
    }

    func roomClosed(_ room: RoomName) {
        rooms.remove(room)
        streams.close(room)
        tracker.forget(room: room)
        remote.roomClosed(room)
        if subscriber.state == .handshaking || subscriber.state == .ready { changedRooms.append(room) }
    }

    // MARK: - Subscriptions

    /// Sends this turn's subscription changes: one SUBSCRIBE and one
    /// UNSUBSCRIBE at most, for the rooms whose state differs from what
    /// Redis was told (a room opened and closed in one turn costs nothing).
    func flushSubscriptions() {
        defer { changedRooms.removeAll(keepingCapacity: true) }
        guard subscriber.state == .handshaking || subscriber.state == .ready else { return }
        var subscribe: [[UInt8]] = [Array("SUBSCRIBE".utf8)]
        var unsubscribe: [[UInt8]] = [Array("UNSUBSCRIBE".utf8)]
        for room in changedRooms {
            let want = rooms.contains(room)
            if want && !subscribed.contains(room) {
                subscribed.insert(room)
                subscribe.append(channels.room(room))
            } else if !want && subscribed.contains(room) {
                subscribed.remove(room)
                unsubscribe.append(channels.room(room))
            }
        }
        if unsubscribe.count > 1 { subscriber.command(unsubscribe, .unsubscribe) }
        if subscribe.count > 1 { subscriber.command(subscribe, .subscribe) }
    }
}
