import RoomcastCore

// ClusterHost.swift: the narrow interface between the cluster link
// (Cluster.swift) and the daemon that owns it. The link reaches the
// daemon only through these methods; what it needs of the configuration
// comes in a `ClusterSettings` value at `init` and `reconfigure`, and the
// daemon reaches the link only through the link's methods (docs/cluster.md).

/// What the cluster link needs from the daemon that owns it. Every method
/// is called on the loop's thread, from inside a link's method (a Redis
/// reply being read, a timer, a frame being published).
protocol ClusterHost: AnyObject {
    /// Delivers a frame another daemon relayed to `room` to the members
    /// here, the same fan-out as a local frame with no local sender
    /// (docs/protocol/across-daemons.md §12); JSON members see `address`
    /// as its `addr`. `frame` is a whole LTB frame (header and body) in
    /// this daemon's byte order.
    /// - Returns: how many members it was delivered to.
    @discardableResult
    func deliverFromCluster(_ frame: UnsafeRawBufferPointer, room: RoomName, address: String) -> Int

    /// The peer address of connection `id` ("" for a free slot or an
    /// unknown id, such as an API publish): what an envelope names as sender.
    func clusterAddress(of id: Int) -> String

    /// The verified sub of connection `id` (signed joins,
    /// docs/protocol/tokens.md §13); "" for none or for no connection.
    func clusterSub(of id: Int) -> String

    /// Every member here that has joined a room: its connection, the room,
    /// and the identity its join carried (the body of its join frame).
    /// O(connections); called only to announce members again after a crash
    /// or a late return.
    func clusterMembers() -> [(id: Int, room: RoomName, identity: [UInt8])]

    /// Whether any ban, mute or setting is held here (the cheap test before
    /// `clusterModeration(of:in:)` on each frame of another daemon).
    var clusterModerates: Bool { get }

    /// Why the sender `sub` (a verified sub, raw bytes) may not send in
    /// `room` by this daemon's moderation state at the wall clock now:
    /// "muted", "banned", or nil when it may.
    func clusterModeration(of sub: UnsafeRawBufferPointer, in room: RoomName) -> String?

    /// Applies a control message of another daemon (a moderation record set
    /// or removed, or a kick), already checked within the API's bounds;
    /// `now` in ms of the monotonic clock.
    func applyControl(_ message: ControlMessage, now: UInt64)

    /// Takes the whole moderation hash as loaded from Redis (each record
    /// checked), merging it with what is held here; `now` in ms of the
    /// monotonic clock.
    func loadModeration(_ records: [ModerationRecord], now: UInt64)

    /// Redis answered the Idempotency-Key claim the daemon sent with
    /// `token` (`ClusterLink.claimIdempotency`), or it failed.
    func claimAnswered(_ token: UInt64, _ outcome: IdempotencyClaimOutcome)

    /// Appends one record (`LiveLog.cluster*`) to the live log, the crash
    /// path (LiveStore.swift); called only once the link was told the live
    /// log is on (`ClusterLink.startLiveLog`).
    func logLive(_ record: [UInt8])
}

/// What the cluster link needs of the configuration: `[cluster]` and the
/// relay's rules (frame types, `protocol.max_room_bytes`), given at
/// `ClusterLink.init` and again at every reload (`ClusterLink.reconfigure`).
struct ClusterSettings {
    /// `[cluster]`; of it only `timeout`, `restart_grace` and
    /// `max_output_bytes` take effect at a reload (`redis` and `name` need a restart).
    var cluster: Config.Cluster
    /// The relay's rules (`RelaySettings(config)`): the join, leave and
    /// heartbeat types and `max_room_bytes` the link checks frames against.
    var relay: RelaySettings
}
