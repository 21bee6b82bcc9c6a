// ClusterInput.swift: what a daemon takes from Redis (issue 28, item 4;
// docs/cluster.md, "What arrives from Redis"). Whoever may PUBLISH to a
// cluster's channels or write its hash is not vouched for: a message is
// taken only when a daemon of ours could have written it, within the
// bounds the relay and the API enforce on their own input; the viewer
// counts' payload, both ways, is here with its bounds. Pure: no
// sockets, no clock (the caller passes the wall clock where it matters).

/// Why something read from Redis was refused: the `reason` label of
/// `roomcast_cluster_refused_total` (docs/api.md, metrics). Nothing
/// refused is delivered, stored or answered.
public enum ClusterRefusal: Int, CaseIterable, Sendable {
    /// Not a roomcast envelope (too short, an unknown version or kind, a
    /// frame whose header does not match its bytes).
    case envelope
    /// An envelope kind no daemon sends on that channel: a heartbeat, bye,
    /// counts or hand-over on a room channel, a frame on the daemons channel.
    case kind
    /// A frame type no daemon publishes: `protocol.notice_type` (only the
    /// daemon of the member sends notices) or `protocol.heartbeat_type`
    /// (never relayed).
    case frameType
    /// A join, leave, text or gift whose body the relay would refuse
    /// (`protocol.validate`), a join carrying fields only a daemon reads
    /// (5-8, stripped before relaying), or a join naming another room.
    case body
    /// A verified sub over `ModerationField.maxSubBytes` or not UTF-8.
    case sub
    /// A new origin while `RemoteDaemons.maxDaemons` are known.
    case origins
    /// Viewer counts outside their bounds (`ClusterCounts.decode`).
    case counts
    /// Viewer counts that would hold more than `RemoteDaemons.maxCountedRooms`
    /// (room, daemon) pairs over every daemon.
    case countsLimit
    /// A moderation record (hash or control channel) outside the API's
    /// bounds: a duration over 14 days, a time ahead of this daemon's clock
    /// by more than `ModerationRecord.maxClockSkewMs`, a room over
    /// `protocol.max_room_bytes`, a sub that is not UTF-8.
    case moderation
    /// A control message that is not roomcast's.
    case control
    /// A reply over the connection's cap, its nested elements counted
    /// (`RedisConnection.maxReplyBytes`): the connection is closed.
    case replySize
    /// The value of an Idempotency-Key in Redis that is not one a daemon
    /// of ours writes (64 lowercase hex digits, then a space and the
    /// delivered count once answered; `IdempotencyClaimValue`).
    case idempotency

    /// The metric label.
    public var label: String {
        switch self {
        case .envelope: "envelope"
        case .kind: "kind"
        case .frameType: "frame_type"
        case .body: "body"
        case .sub: "sub"
        case .origins: "origins"
        case .counts: "counts"
        case .countsLimit: "counts_limit"
        case .moderation: "moderation"
        case .control: "control"
        case .replySize: "reply_size"
        case .idempotency: "idempotency"
        }
    }
}

/// What may arrive on a room channel: the frames a relay relays.
public enum ClusterFrameCheck {
    /// Why `frame` (6-byte header in `order`, its length already checked by
    /// `ClusterEnvelope.decode`) published on the channel of `room` is not
    /// one a daemon of ours relays under `settings` (the cluster shares
    /// `[protocol]`'s control codes, docs/cluster.md), or nil. Opaque types
    /// are relayed unchanged by every relay and pass; `sub` is the verified
    /// sub the envelope carries.
    public static func refusal(_ frame: UnsafeRawBufferPointer, order: ByteOrder, room: RoomName, sub: UnsafeRawBufferPointer,
                               settings: RelaySettings) -> ClusterRefusal? {
        guard case .frame(let type, _) = FrameCodec.parse(frame, byteOrder: order, maxFrameBytes: Int.max) else { return .envelope }
        if sub.count > ModerationField.maxSubBytes || String(validating: sub, as: UTF8.self) == nil { return .sub }
        let body = UnsafeRawBufferPointer(rebasing: frame[FrameCodec.headerSize...])
        switch type {
        case settings.noticeType, settings.heartbeatType:
            return .frameType
        case settings.joinType:
            // The relay strips fields 5-8 before relaying, and a join
            // naming a room is relayed in that room only.
            guard let info = try? UserInfo(protobuf: body) else { return settings.validate ? .body : nil }
            if info.hasDaemonFields { return .body }
            if let r = info.room, !r.isEmpty, !r.utf8.elementsEqual(room.bytes) { return .body }
        case settings.leaveType:
            if settings.validate, (try? validateBody(.userInfo, body)) == nil { return .body }
        case settings.textType:
            if settings.validate, (try? validateBody(.chatMessage, body)) == nil { return .body }
        case settings.giftType:
            if settings.validate, (try? validateBody(.giftMessage, body)) == nil { return .body }
        default:
            break
        }
        return nil
    }
}

/// The payload of a `counts` envelope: how many members each room has at
/// the origin, every room with members there (an empty payload: none).
/// Repeated, integers little-endian:
///
///     size
///     2    room length R
///     R    room name (UTF-8 bytes)
///     4    members
///
/// Each daemon publishes it on the daemons channel; the viewer count of a
/// room is the sum over daemons (docs/protocol/across-daemons.md §12, docs/api.md).
public enum ClusterCounts {
    /// Appends the counts to `out` (emptied first, capacity kept), the
    /// first `maxRooms` rooms at most (the others refuse more, `decode`). Rooms over 65535 bytes (never: `max_room_bytes` is at
    /// most 64 KiB) are skipped.
    public static func encode(_ counts: [(room: RoomName, members: Int)], into out: inout [UInt8]) {
        out.removeAll(keepingCapacity: true)
        var rooms = 0
        for (room, members) in counts where room.bytes.count <= Int(UInt16.max) && members > 0 {
            rooms += 1
            if rooms > maxRooms { break }
            withUnsafeBytes(of: UInt16(room.bytes.count).littleEndian) { out.append(contentsOf: $0) }
            out.append(contentsOf: room.bytes)
            withUnsafeBytes(of: UInt32(clamping: min(members, maxMembers)).littleEndian) { out.append(contentsOf: $0) }
        }
    }
}

extension ClusterCounts {
    /// Rooms at most in one `counts` payload: a daemon with more sends the
    /// first this many (`encode`), the others refuse a longer one.
    public static let maxRooms = 100_000
    /// Members at most in one room of one daemon (`[server] max_clients` at most).
    public static let maxMembers = 1 << 20

    /// Why a `counts` payload was refused.
    public enum DecodeError: Error, Equatable, Sendable {
        /// It ends inside an entry.
        case cutShort
        /// More than `maxRooms` rooms.
        case tooManyRooms
        /// A room that is empty, over `maxRoomBytes` or not UTF-8 (a relay
        /// takes room names from a join's `room`, a proto2 string).
        case badRoom
        /// A room twice.
        case duplicateRoom
        /// 0 members (never sent) or more than `maxMembers`.
        case badCount
    }

    /// The counts of a payload, each room within what the relay accepts
    /// (1 ... `maxRoomBytes` bytes of UTF-8, `[protocol] max_room_bytes`),
    /// at most `maxRooms` of them; refused whole otherwise, before any
    /// room is kept (the payload is scanned first).
    public static func decode(_ p: UnsafeRawBufferPointer, maxRoomBytes: Int, maxRooms: Int = maxRooms) -> Result<[RoomName: Int], DecodeError> {
        var i = 0, rooms = 0
        while i < p.count {
            guard p.count - i >= 2 else { return .failure(.cutShort) }
            let length = Int(UInt16(littleEndian: p.loadUnaligned(fromByteOffset: i, as: UInt16.self)))
            guard p.count - i - 2 >= length + 4 else { return .failure(.cutShort) }
            rooms += 1
            guard rooms <= maxRooms else { return .failure(.tooManyRooms) }
            let name = UnsafeRawBufferPointer(rebasing: p[(i + 2)..<(i + 2 + length)])
            guard length > 0, length <= maxRoomBytes, String(validating: name, as: UTF8.self) != nil else { return .failure(.badRoom) }
            let members = UInt32(littleEndian: p.loadUnaligned(fromByteOffset: i + 2 + length, as: UInt32.self))
            guard members > 0, members <= maxMembers else { return .failure(.badCount) }
            i += 2 + length + 4
        }
        var out: [RoomName: Int] = [:]
        out.reserveCapacity(rooms)
        i = 0
        while i < p.count {
            let length = Int(UInt16(littleEndian: p.loadUnaligned(fromByteOffset: i, as: UInt16.self)))
            let room = RoomName(bytes: Array(p[(i + 2)..<(i + 2 + length)]))
            let members = UInt32(littleEndian: p.loadUnaligned(fromByteOffset: i + 2 + length, as: UInt32.self))
            guard out.updateValue(Int(members), forKey: room) == nil else { return .failure(.duplicateRoom) }
            i += 2 + length + 4
        }
        return .success(out)
    }
}

extension ModerationRecord {
    /// How far ahead of this daemon's wall clock a record's `setMs` may be
    /// (the daemons' clocks differ by this much at most; NTP keeps them
    /// within milliseconds): a later one would win over every change made
    /// here (409 forever).
    public static let maxClockSkewMs: Int64 = 5 * 60_000

    /// Why a record read from Redis (the hash, the control channel) is not
    /// one the API of a daemon of ours could have written at `wallMs`
    /// (docs/api.md "Moderation"), or nil. The bounds of the value itself
    /// (duration, reason) are `init(field:value:)`'s; these need this
    /// daemon's clock and config.
    public func refusal(wallMs: Int64, maxRoomBytes: Int) -> String? {
        if setMs > wallMs + Self.maxClockSkewMs {
            return "set at \(setMs) ms, more than \(Self.maxClockSkewMs / 1000) s ahead of this daemon's clock (\(wallMs))"
        }
        let room: RoomName, sub: [UInt8]?
        switch self {
        case .entry(let key, _, _, _), .removed(let key, _, _): room = key.room; sub = key.sub
        case .settings(let r, _, _): room = r; sub = nil
        }
        if room.count > maxRoomBytes { return "a room of \(room.count) bytes, over protocol.max_room_bytes (\(maxRoomBytes))" }
        if let sub, String(validating: sub, as: UTF8.self) == nil { return "a sub that is not UTF-8" }
        return nil
    }
}
