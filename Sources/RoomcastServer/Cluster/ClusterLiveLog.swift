@preconcurrency import CHiredis
import Glibc
import RoomcastCore
import RoomcastIO

// ClusterLiveLog.swift: what the link writes to the live log (the crash
// path, LiveStore.swift): its origin, the numbering of its streams before
// the publisher sends them, and the positions of frames delivered here.
extension ClusterLink {
    // MARK: - The crash path (LiveStore.swift)

    /// The records of the whole link for a compacted live log: origin,
    /// every stream, every position.
    func liveSnapshot() -> [UInt8] {
        var out = LiveLog.clusterOrigin(origin, lastStream: streams.lastStreamID)
        for s in streams.snapshot.streams { out += LiveLog.clusterStream(s.room, id: s.id, seq: s.seq) }
        var byRoom: [RoomName: [ClusterSequenceTracker.Carried]] = [:]
        for p in tracker.carried { byRoom[p.room, default: []].append(p) }
        for (room, list) in byRoom { out += LiveLog.clusterPositions(room, list) }
        loggedLastStream = streams.lastStreamID
        streamsToLog.removeAll(keepingCapacity: true)
        _ = tracker.takeChanged()
        return out
    }

    /// Before the publisher sends: the numbers of the frames it is about
    /// to send go into the live log first, so that after a crash no stream
    /// goes on behind a number another daemon has seen (it would drop the
    /// frames as late); numbers drawn and not sent before a crash are
    /// drawn again.
    func publisherWillWrite() {
        guard logsLive, !streamsToLog.isEmpty || streams.lastStreamID != loggedLastStream else { return }
        if streams.lastStreamID != loggedLastStream {
            loggedLastStream = streams.lastStreamID
            host.logLive(LiveLog.clusterOrigin(origin, lastStream: loggedLastStream))
        }
        for room in streamsToLog {
            if let s = streams.position(room) { host.logLive(LiveLog.clusterStream(room, id: s.id, seq: s.seq)) }
        }
        streamsToLog.removeAll(keepingCapacity: true)
    }

    /// Once per loop turn: the positions of the rooms that received frames
    /// from other daemons, or forgot some, into the live log.
    func logLivePositions() {
        guard logsLive else { return }
        for (room, list) in tracker.takeChanged() { host.logLive(LiveLog.clusterPositions(room, list)) }
    }
}
