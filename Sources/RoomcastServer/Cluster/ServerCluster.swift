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
        let link = ClusterLink(server: self, address: address, settings: config.cluster, byteOrder: config.protocol.byteOrder, selector: selector,
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

    /// A frame another daemon relayed to `room`, for the members here
    /// (docs/protocol/across-daemons.md §12): the same fan-out as local frames, with no
    /// local sender; JSON members see `address` as its `addr`.
    @discardableResult
    func deliverFromCluster(_ frame: UnsafeRawBufferPointer, room: RoomName, address: String) -> Int {
        relay.deliver(frame, toRoom: room, from: address, sink: table.fanout)
    }
}
