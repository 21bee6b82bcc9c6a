import RoomcastCore

// ClusterRefusals.swift: what the link refuses from Redis (issue 28, item 4;
// docs/cluster.md, "What arrives from Redis"): the bounds of a reply, and
// the count and log line of everything refused (ClusterInput.swift has the
// checks of each kind of message).

/// Refusals by reason: `roomcast_cluster_refused_total{reason}`.
struct ClusterRefusalCounts {
    private var counts = [UInt64](repeating: 0, count: ClusterRefusal.allCases.count)

    /// How many of `reason` since the daemon started.
    subscript(_ reason: ClusterRefusal) -> UInt64 { counts[reason.rawValue] }

    /// Every reason with its count, in `ClusterRefusal` order.
    var all: [(reason: ClusterRefusal, count: UInt64)] { ClusterRefusal.allCases.map { ($0, counts[$0.rawValue]) } }

    mutating func add(_ reason: ClusterRefusal) { counts[reason.rawValue] &+= 1 }
}

extension ClusterLink {
    /// The publisher's largest reply: HGETALL of the moderation hash
    /// (`ModerationBook.maxEntries` bans and mutes and
    /// `maxRoomSettings` settings, typically about 150 bytes each).
    static let maxHashReplyBytes = 64 << 20

    /// The subscriber's largest reply: a message of a daemon of ours is one
    /// frame in an envelope (other daemons may allow larger frames than
    /// this one: twice the largest here), or its viewer counts
    /// (`ClusterCounts.maxRooms` rooms of at most `max_room_bytes`, bounded
    /// by 64 MiB), with the channel's name and the parser's own objects.
    static func maxMessageBytes(_ p: Config.ProtocolSettings, json: Config.JSON) -> Int {
        let largest = max(p.maxFrameBytes, json.maxFrameBytes)
        let counts = min(ClusterCounts.maxRooms * (6 + p.maxRoomBytes), 64 << 20)
        return max(2 * largest, counts) + (64 << 10)
    }

    /// Refuses something read from Redis (`reason`, said by `text`):
    /// counted, logged at most a few times a minute per reason
    /// (`REASON=cluster_input_LABEL`, e.g. `cluster_input_frame_type`),
    /// and never delivered, stored or answered.
    func refuse(_ reason: ClusterRefusal, _ text: @autoclosure () -> String, origin: UInt64? = nil) {
        refusals.add(reason)
        logger.peerWarning(reason: "cluster_input_\(reason.label)", nowMs: nowMs, "cluster: refused from Redis: \(text())",
                           ["REDIS": address.description, "ORIGIN": origin.map { ClusterEnvelope.hex($0) } ?? ""])
    }
}
