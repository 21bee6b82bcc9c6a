import RoomcastCore
import RoomcastIO

// ServerCluster.swift: the server's side of the cluster link (Cluster.swift):
// making it when `[cluster] redis` is set, starting it, and delivering the
// frames other daemons relayed (docs/cluster.md).
extension Server {
    /// Makes the cluster link when `[cluster] redis` is set, and makes it
    /// the relay's observer: rooms opened from now on (a restore's too)
    /// are its to subscribe. It connects at `startCluster`.
    func makeCluster() {
        guard let address = config.cluster.redis else { return }
        let link = ClusterLink(host: self, address: address, settings: clusterSettings, byteOrder: config.protocol.byteOrder,
                               clock: clock, wallClock: wallClock, logger: logger, logsLive: live != nil, selector: selector,
                               maxMessageBytes: ClusterLink.maxMessageBytes(config.protocol, json: config.json))
        cluster = link
        relay.observer = link
    }

    /// Connects the cluster link. After a restore (`restored`), waits
    /// (bounded, `ClusterLink.awaitReady`) until Redis confirmed every
    /// restored room, so that READY=1 means they are subscribed.
    func startCluster(now: UInt64, restored: Bool) {
        guard let link = cluster else { return }
        link.start(nowMs: now)
        if restored && !link.rooms.isEmpty {
            let up = link.awaitReady()
            logger.info(up ? "cluster: subscribed to \(plural(link.rooms.count, "restored room")) before READY=1"
                           : "cluster: Redis did not confirm the restored rooms before READY=1; they are subscribed once it does",
                        ["REDIS": link.address.description])
        }
        if !link.awaitModerationLoaded() {
            logger.info("cluster: the moderation state was not loaded from Redis before READY=1; it is once Redis answers",
                        ["REDIS": link.address.description])
        }
    }

    /// What the cluster link is given of the running config (`[cluster]`
    /// and the relay's rules), at its start and at every reload.
    var clusterSettings: ClusterSettings { ClusterSettings(cluster: config.cluster, relay: relay.settings) }
}

// The daemon as the cluster link's host (ClusterHost.swift has what each does).
extension Server: ClusterHost {
    @discardableResult
    func deliverFromCluster(_ frame: UnsafeRawBufferPointer, room: RoomName, address: String) -> Int {
        relay.deliver(frame, toRoom: room, from: address, sink: table.fanout)
    }

    func clusterAddress(of id: Int) -> String { table.address(of: id) }

    func clusterSub(of id: Int) -> String { table.sub(of: id) }

    func clusterMembers() -> [(id: Int, room: RoomName, identity: [UInt8])] {
        table.ids.compactMap { id in
            guard let identity = relay.identity(of: id), let room = relay.roomName(of: id) else { return nil }
            return (id, room, identity)
        }
    }

    var clusterModerates: Bool { moderation.count > 0 }

    func clusterModeration(of sub: UnsafeRawBufferPointer, in room: RoomName) -> String? {
        let wall = wallClock(), bytes = Array(sub)
        if moderation.active(ModerationKey(.mute, room: room, sub: bytes), wallMs: wall) != nil { return "muted" }
        if moderation.active(ModerationKey(.ban, room: room, sub: bytes), wallMs: wall) != nil { return "banned" }
        return nil
    }
}
