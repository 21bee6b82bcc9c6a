/// Where the relay puts frames. The server's connection table implements it
/// by appending to each recipient's output buffer; tests record deliveries.
/// The relay never performs I/O itself.
public protocol FrameSink: AnyObject {
    /// Queues one whole frame (6-byte header + body, exactly as it should go
    /// on the wire) for every connection in `members` except `except` (-1:
    /// none), on behalf of connection `sender` (the departing one for a
    /// synthesized leave). One call per broadcast, so a sink can do per-frame
    /// work (e.g. a translation) once. `frame` is only valid during the call.
    /// - Returns: how many connections the frame was queued for.
    func broadcast(_ frame: UnsafeRawBufferPointer, from sender: Int, to members: [Int], except: Int) -> Int
}

/// Told what the relay does to rooms, for rooms that span daemons (the cluster
/// publishes what is relayed here and subscribes to the rooms
/// that have members here). Called synchronously, in the relay's order.
public protocol RelayObserver: AnyObject {
    /// `room` got its first member.
    func roomOpened(_ room: RoomName)
    /// `room` lost its last member.
    func roomClosed(_ room: RoomName)
    /// A frame from connection `sender` was relayed to `room` (after its
    /// members were given it), also when nobody heard it: the leave of the
    /// last member, a synthesized one included. `frame` is valid only during the call.
    func relayed(_ frame: UnsafeRawBufferPointer, room: RoomName, from sender: Int)
}

/// The relay rules that can change on reload (docs/protocol/ §2-§4).
public struct RelaySettings: Equatable, Sendable {
    public var byteOrder: ByteOrder
    public var joinType: UInt16
    public var leaveType: UInt16
    public var heartbeatType: UInt16
    /// Text (2) and gift (3) are fixed (docs/protocol/ltb.md §2).
    public var textType: UInt16 = 2
    public var giftType: UInt16 = 3
    /// Send frames back to their sender too (docs/protocol/rooms.md §4).
    public var echo: Bool
    /// Check join/leave/text/gift bodies against the proto2 schema (§3).
    public var validate: Bool
    /// Bad frames after which the sender is disconnected (>= 1).
    public var maxViolations: Int
    /// The room a connection is in after accept and after a join without `room`.
    public var defaultRoom: String
    /// Longest `room` a join may name, in bytes of UTF-8 (`[protocol]
    /// max_room_bytes`); a longer one is a violation and the join is refused.
    public var maxRoomBytes: Int
    /// The type of server notices (`[protocol] notice_type`,
    /// docs/protocol/tokens.md §13): a client sending one is refused.
    public var noticeType: UInt16
    /// Whether a new connection is a member of the default room at once
    /// (§4). False when `[auth] required = yes` and `anonymous = none`: a
    /// client without a token hears nothing (§13).
    public var admitsToDefaultRoom: Bool
    /// `[rooms] announce_joins`: joins and leaves, synthesized ones too,
    /// reach the room and the observer (§4). False: a join goes back to its
    /// sender only (with `echo`), a leave (sent or synthesized) nowhere.
    public var announceJoins = true
    /// `[rooms] history`: the text and gift frames each room keeps for the
    /// members who join it later (§4, "Recent lines on join"); 0: none, and
    /// no notice `history`.
    public var historyFrames = 0
    /// `[rooms] history_bytes`: the most a room's history holds, in bytes
    /// of whole frames (headers included).
    public var historyBytes = 262_144

    public init(byteOrder: ByteOrder = .little, joinType: UInt16 = 0, leaveType: UInt16 = 1, heartbeatType: UInt16 = 8,
                echo: Bool = true, validate: Bool = true, maxViolations: Int = 3, defaultRoom: String = "lobby",
                maxRoomBytes: Int = 255, noticeType: UInt16 = 9, admitsToDefaultRoom: Bool = true) {
        self.noticeType = noticeType
        self.admitsToDefaultRoom = admitsToDefaultRoom
        self.byteOrder = byteOrder
        self.joinType = joinType
        self.leaveType = leaveType
        self.heartbeatType = heartbeatType
        self.echo = echo
        self.validate = validate
        self.maxViolations = maxViolations
        self.defaultRoom = defaultRoom
        self.maxRoomBytes = maxRoomBytes
    }

    /// Byte-wise, like every peer-visible string (see PeerText.swift): a
    /// default room respelled in another normalization form is a change.
    public static func == (a: RelaySettings, b: RelaySettings) -> Bool {
        a.byteOrder == b.byteOrder && a.joinType == b.joinType && a.leaveType == b.leaveType
            && a.heartbeatType == b.heartbeatType && a.textType == b.textType && a.giftType == b.giftType
            && a.echo == b.echo && a.validate == b.validate && a.maxViolations == b.maxViolations
            && sameBytes(a.defaultRoom, b.defaultRoom) && a.maxRoomBytes == b.maxRoomBytes
            && a.noticeType == b.noticeType && a.admitsToDefaultRoom == b.admitsToDefaultRoom && a.announceJoins == b.announceJoins
            && a.historyFrames == b.historyFrames && a.historyBytes == b.historyBytes
    }
}

/// Why the relay dropped a frame; the raw value is the `REASON` code the
/// daemon logs (a stable snake_case code, see Logger.peerWarning).
public enum RejectionCode: String, Sendable {
    /// A body that does not match the proto2 schema (§3), or a malformed JSON command (§7).
    case badFrame = "bad_frame"
    /// A join naming a room longer than `max_room_bytes`.
    case roomTooLong = "room_too_long"
    /// Over `[limits] frames_per_second` or `bytes_per_second` (the server's check).
    case rateLimit = "rate_limit"
    /// A JSON command whose frame would be over a `max_frame_bytes` (the server's check).
    case frameTooLarge = "frame_too_large"
    /// Signed joins (docs/protocol/tokens.md §13): a join without a token where one
    /// is required, or a send by an anonymous reader.
    case tokenRequired = "token_required"
    /// A token that is malformed, badly signed, of the wrong algorithm or key.
    case tokenInvalid = "token_invalid"
    /// A token past `exp` (plus the leeway), or a connection whose token ran out.
    case tokenExpired = "token_expired"
    /// A join naming a room outside the token's `rooms`.
    case roomForbidden = "room_forbidden"
    /// A join, text or gift whose UserInfo is not the token's identity.
    case identityMismatch = "identity_mismatch"
    /// A frame type outside the token's `may`.
    case notPermitted = "not_permitted"
    /// A frame of type `protocol.notice_type` from a client.
    case noticeFromClient = "notice_from_client"
}

/// What the relay did with one frame, for the caller's logs and counters.
public enum RelayEvent: Equatable, Sendable {
    /// A heartbeat: proof of life only, never relayed (§2).
    case heartbeat
    /// Relayed to `recipients` connections (0 when the sender is in no room).
    case relayed(recipients: Int)
    /// A join moved the sender into `room` and was relayed there.
    case joined(name: String, room: String, recipients: Int)
    /// A leave took the sender out of `room` (nil: it was in none).
    case left(room: String?, recipients: Int)
    /// The frame was dropped: `reason` says why and `code` what kind of
    /// problem it is; `violations` counts the sender's bad frames so far;
    /// `disconnect` is true once the count reaches `maxViolations`. The
    /// sender's room and identity are as before the frame.
    case rejected(reason: String, violations: Int, disconnect: Bool, code: RejectionCode)

    /// Names and rooms compare byte for byte (see PeerText.swift).
    public static func == (a: RelayEvent, b: RelayEvent) -> Bool {
        switch (a, b) {
        case (.heartbeat, .heartbeat): true
        case let (.relayed(x), .relayed(y)): x == y
        case let (.joined(n1, r1, x), .joined(n2, r2, y)): sameBytes(n1, n2) && sameBytes(r1, r2) && x == y
        case let (.left(r1, x), .left(r2, y)): sameBytes(r1, r2) && x == y
        case let (.rejected(r1, v1, d1, c1), .rejected(r2, v2, d2, c2)): sameBytes(r1, r2) && v1 == v2 && d1 == d2 && c1 == c2
        default: false
        }
    }
}

/// Rooms, memberships and the per-connection session state (identity from
/// join, violation count) — the relay policy of docs/protocol/ §2-§4, with no
/// syscalls. Connection ids are small dense integers (slot indices) chosen
/// by the caller; every operation is O(1) except broadcasts, which are
/// O(room members).
public struct Relay {
    public private(set) var settings: RelaySettings

    private struct Room {
        var name: RoomName
        var members: [Int] = []
        /// Its recent text and gift frames (empty unless `historyFrames` > 0).
        var history = RoomHistory()
        /// Its epoch and the number of its last text or gift frame (§4,
        /// "Positions and resume"): a new epoch with every new room.
        var position = RoomPosition(epoch: RoomPosition.newEpoch(), seq: 0)
        /// Members that asked for the notice `position` (UserInfo field 6).
        var positionMembers = 0
        /// In `dueRooms`: numbered frames were relayed to it in this pass.
        var positionDue = false
    }

    private struct Session {
        var active = false
        var room = -1            // index into rooms, -1: in no room
        var position = -1        // index into rooms[room].members
        var identity: [UInt8]?   // the UserInfo body of the last join (§4)
        var name = ""
        var violations = 0
        /// Its last join asked for the notice `position` (UserInfo field 6, §4).
        var positions = false
    }

    /// Frames received, by kind (`roomcast_frames_received_total`): every
    /// frame `receive` takes, and each publish counted with `countReceived`.
    /// Counted here, inside the access `receive` holds anyway: a counter in
    /// the server's own state cost a run-time exclusivity check per frame.
    public private(set) var receivedByKind = FrameKindCounts()

    /// Frames refused, by reason (`roomcast_frames_refused_total`): each
    /// violation the relay counts (its own checks and every `reject`), and
    /// each refusal the server counts with `countRefused` (moderation's).
    public private(set) var refusedByReason = FrameRefusalCounts()

    /// Counts one frame refused outside the relay's violations (a ban, a mute, slow mode).
    public mutating func countRefused(_ reason: FrameRefusal) { refusedByReason.add(reason) }

    /// Counts one frame of `type` as received (an API publish, which does
    /// not pass through `receive`).
    public mutating func countReceived(_ type: UInt16) {
        let s = settings
        receivedByKind.add(FrameKind.of(type, join: s.joinType, leave: s.leaveType, heartbeat: s.heartbeatType, notice: s.noticeType))
    }

    /// Whether `changed` collects the connections whose room or identity a
    /// frame changed (for the crash path's log); off by default.
    public var tracksChanges = false
    /// Connections whose room or identity changed since `takeChanged()`.
    public private(set) var changed: [Int] = []

    private var rooms: [Room] = []
    private var freeRooms: [Int] = []
    /// Keyed by the name's bytes: rooms that only look alike are different (§3).
    private var roomIndex: [RoomName: Int] = [:]
    /// The names of `roomIndex` by their bytes, and every membership as
    /// `room index << 32 | connection id`: the API's listings page over
    /// them (OrderedIndex.swift; a join or leave costs O(log n + 512) more).
    private var roomOrder = OrderedIndex<ByteKey>()
    private var memberOrder = OrderedIndex<Int>()
    private var sessions: [Session] = []
    /// Rooms whose members that asked for positions are owed the notice
    /// `position` at the end of this pass (`sendPositions`).
    private var dueRooms: [Int] = []

    /// Told of rooms opened and closed and of frames relayed (nil: nobody).
    /// A strong reference (a weak load on every broadcast costs more); the
    /// observer must not own the relay.
    public var observer: (any RelayObserver)?

    public init(settings: RelaySettings) {
        self.settings = settings
    }

    /// Applies new settings; memberships and identities are kept. A new
    /// default room applies to connections accepted from now on.
    public mutating func reconfigure(_ settings: RelaySettings) {
        self.settings = settings
        for r in roomIndex.values where rooms[r].history.count > 0 {
            rooms[r].history.trim(maxFrames: settings.historyFrames, maxBytes: settings.historyBytes)
        }
    }

    /// The recent frames of `room`, oldest first (empty when it has none).
    public func history(of room: RoomName) -> ArraySlice<[UInt8]> {
        roomIndex[room].map { rooms[$0].history.all } ?? []
    }

    /// Where `room`'s stream stands (nil: no such room): its epoch and the
    /// number of its last text or gift frame (docs/protocol/positions.md §4).
    public func position(of room: RoomName) -> RoomPosition? {
        roomIndex[room].map { rooms[$0].position }
    }

    /// Every room with members: its position and its recent frames with
    /// their numbers (the hand-over state, docs/operations/restarts.md), in no fixed order.
    public var streams: [RoomStream] {
        roomIndex.map { RoomStream(room: $0.key, position: rooms[$0.value].position, history: rooms[$0.value].history.numbered) }
    }

    /// A room's stream carried over from the previous process (a restart):
    /// the room, if it has members here (restored ones), goes on with that
    /// epoch, number and history, kept within this process's bounds; a room
    /// without members is ignored (its history would have ended with it).
    public mutating func adopt(_ stream: RoomStream) {
        guard let r = roomIndex[stream.room] else { return }
        rooms[r].position = stream.position
        var history = RoomHistory()
        let s = settings
        for f in stream.history where f.seq <= stream.position.seq {
            f.frame.withUnsafeBytes { history.append($0, seq: f.seq, maxFrames: s.historyFrames, maxBytes: s.historyBytes) }
        }
        rooms[r].history = history
    }

    /// Whether some room's members are owed the notice `position` (a
    /// cheap check the loop makes once per pass).
    public var positionsDue: Bool { !dueRooms.isEmpty }

    /// The end of a loop pass (docs/protocol/positions.md §4): in every room that was
    /// relayed text or gift frames in it, the members that asked for
    /// positions get the notice `position` with the room's epoch and seq,
    /// encoded once per room, after those frames.
    public mutating func sendPositions(sink: some FrameSink) {
        for r in dueRooms where rooms[r].positionDue {
            rooms[r].positionDue = false
            let targets = rooms[r].members.filter { sessions[$0].positions }
            guard !targets.isEmpty else { continue }
            let frame = positionNotice("position", rooms[r].position)
            _ = frame.withUnsafeBytes { sink.broadcast($0, from: -1, to: targets, except: -1) }
        }
        dueRooms.removeAll(keepingCapacity: true)
    }

    /// Number of rooms with at least one member.
    public var roomCount: Int { roomIndex.count }

    /// Members of `room` (0 when it does not exist).
    public func memberCount(of room: RoomName) -> Int {
        roomIndex[room].map { rooms[$0].members.count } ?? 0
    }

    /// Members of the room named by the bytes of `room` (0 when it does not exist).
    public func memberCount(of room: String) -> Int {
        memberCount(of: RoomName(room))
    }

    /// Every room with members and its member count, in no fixed order
    /// (the API sorts; docs/api.md). O(rooms).
    public var roomCounts: [(room: RoomName, members: Int)] {
        roomIndex.map { ($0.key, rooms[$0.value].members.count) }
    }

    /// The connections in `room` (empty when it does not exist).
    public func members(of room: RoomName) -> [Int] {
        roomIndex[room].map { rooms[$0].members } ?? []
    }

    /// At most `limit` rooms with members whose names follow `after` by
    /// their bytes (empty: from the first), and whether more follow
    /// (docs/api.md's cursor). O(log rooms + limit).
    public func roomsPage(after: [UInt8], limit: Int) -> (rooms: [RoomName], more: Bool) {
        let got = roomOrder.page(after: ByteKey(after), inclusive: after.isEmpty, limit: limit)
        return (got.keys.map { RoomName(bytes: $0.bytes) }, got.more)
    }

    /// At most `limit` connections of `room` with ids above `after`,
    /// ascending, and whether more follow. O(log memberships + limit).
    public func membersPage(of room: RoomName, after: Int, limit: Int) -> (ids: [Int], more: Bool) {
        guard let r = roomIndex[room], after < 0xFFFF_FFFF else { return ([], false) }
        let from = r << 32 | max(0, after + 1)
        let got = memberOrder.page(after: from, inclusive: true, limit: limit, stop: { $0 >> 32 != r })
        return (got.keys.map { $0 & 0xFFFF_FFFF }, got.more)
    }

    /// A frame the server itself publishes into `room` (the backend's API,
    /// docs/api.md): its body checked as a member's would be (§3), then
    /// relayed exactly as a member's frame, and the observer told (the
    /// cluster publishes it), with sender -1 (no member sent it).
    /// - Returns: the recipients here, or the reason the body was refused.
    public mutating func publish(_ frame: UnsafeRawBufferPointer, type: UInt16, toRoom room: RoomName, sink: some FrameSink) -> Result<Int, ProtoError> {
        let body = UnsafeRawBufferPointer(rebasing: frame[FrameCodec.headerSize...])
        if settings.validate {
            do {
                if type == settings.textType { try validateBody(.chatMessage, body) }
                if type == settings.giftType { try validateBody(.giftMessage, body) }
            } catch { return .failure(error) }
        }
        var n = 0
        if let r = roomIndex[room], !rooms[r].members.isEmpty {
            n = sink.broadcast(frame, from: -1, to: rooms[r].members, except: -1)
            number(frame, type: type, room: r)
        }
        observer?.relayed(frame, room: room, from: -1)
        return .success(n)
    }

    /// The room connection `id` is in, if any.
    public func roomName(of id: Int) -> RoomName? {
        guard id < sessions.count, sessions[id].room >= 0 else { return nil }
        return rooms[sessions[id].room].name
    }

    /// The name of the room connection `id` is in, if any (for logs).
    public func room(of id: Int) -> String? {
        roomName(of: id)?.string
    }

    /// The name from the connection's last join ("" before any join).
    public func name(of id: Int) -> String {
        id < sessions.count ? sessions[id].name : ""
    }

    /// Whether connection `id`'s last join asked for the notice `position` (§4).
    public func wantsPositions(_ id: Int) -> Bool {
        id < sessions.count && sessions[id].positions
    }

    /// Whether connection `id` has joined (and not left since).
    public func hasJoined(_ id: Int) -> Bool {
        id < sessions.count && sessions[id].identity != nil
    }

    /// The UserInfo body of the connection's last join (nil: not joined).
    public func identity(of id: Int) -> [UInt8]? {
        id < sessions.count ? sessions[id].identity : nil
    }

    /// The connection's bad frames so far (0 for an unknown id).
    public func violations(of id: Int) -> Int {
        id < sessions.count ? sessions[id].violations : 0
    }

    /// The connections whose room or identity changed since the last call.
    public mutating func takeChanged() -> [Int] {
        defer { changed.removeAll(keepingCapacity: true) }
        return changed
    }

    /// A connection carried over from the previous process (a restart), just
    /// `connect`ed: it moves into `room` (nil: none) with the identity and
    /// violation count it had, and nobody is told: its room never saw it
    /// leave. The name is read from `identity`, as a join does; `positions`:
    /// it had asked for the notice `position` (§4).
    public mutating func restore(_ id: Int, room: RoomName?, identity: [UInt8]?, violations: Int, positions: Bool = false) {
        precondition(id < sessions.count && sessions[id].active, "restore of unknown connection \(id)")
        _ = exit(id)
        sessions[id].positions = positions
        if let room { enter(id, room: room) }
        sessions[id].identity = identity
        sessions[id].name = identity.flatMap { try? UserInfo(protobuf: $0) }?.name ?? ""
        sessions[id].violations = violations
    }

    /// A newly accepted connection: it becomes a member of the default room
    /// (clients receive the room's traffic before they join, §4).
    public mutating func connect(_ id: Int) {
        precondition(id >= 0)
        if id >= sessions.count {
            sessions.append(contentsOf: repeatElement(Session(), count: id + 1 - sessions.count))
        }
        precondition(!sessions[id].active, "connection id \(id) is already in use")
        sessions[id] = Session(active: true)
        if settings.admitsToDefaultRoom { enter(id, room: RoomName(settings.defaultRoom)) }
    }

    /// The connection is gone (closed, evicted). If it had joined, its room
    /// gets a leave frame carrying the `UserInfo` from its join, exactly as if
    /// it had sent leave itself (§4); otherwise it leaves silently.
    /// - Returns: the room it left and how many members were told.
    @discardableResult
    public mutating func disconnect(_ id: Int, sink: some FrameSink) -> (room: String?, recipients: Int) {
        guard id < sessions.count, sessions[id].active else { return (nil, 0) }
        let room = self.room(of: id)
        var told = 0
        if let identity = sessions[id].identity, let r = exit(id) {
            told = announceLeave(identity, of: id, room: r, sink: sink)
        } else {
            _ = exit(id)
        }
        sessions[id] = Session()
        return (room, told)
    }

    /// The connection is gone and nobody is told: the daemon is stopping,
    /// and every room closes with it. A connection unknown or already gone
    /// is ignored.
    public mutating func forget(_ id: Int) {
        guard id < sessions.count, sessions[id].active else { return }
        _ = exit(id)
        sessions[id] = Session()
    }

    /// Handles one complete frame from connection `id`. `frame` is the whole
    /// frame as received (header + body); relayed copies are byte-identical.
    public mutating func receive(from id: Int, type: UInt16, frame: UnsafeRawBufferPointer, sink: some FrameSink) -> RelayEvent {
        precondition(id < sessions.count && sessions[id].active, "frame from unknown connection \(id)")
        let body = UnsafeRawBufferPointer(rebasing: frame[FrameCodec.headerSize...])
        let s = settings
        receivedByKind.add(FrameKind.of(type, join: s.joinType, leave: s.leaveType, heartbeat: s.heartbeatType, notice: s.noticeType))
        switch type {
        case s.heartbeatType:
            return .heartbeat
        case s.joinType:
            if tracksChanges { changed.append(id) }
            return join(id, body: body, frame: frame, sink: sink)
        case s.leaveType:
            if s.validate, let error = check(.userInfo, body) { return violation(id, "leave: \(error)") }
            if tracksChanges { changed.append(id) }
            let old = exit(id)
            sessions[id].identity = nil
            guard let r = old else { return .left(room: nil, recipients: 0) }
            return .left(room: rooms.indices.contains(r) ? rooms[r].name.string : nil, recipients: settings.announceJoins ? broadcast(frame, room: r, from: id, sink: sink) : 0)
        case s.noticeType:
            return violation(id, "type \(type) is protocol.notice_type: only the server sends notices", .noticeFromClient)
        case s.textType:
            if s.validate, let error = check(.chatMessage, body) { return violation(id, "text: \(error)") }
        case s.giftType:
            if s.validate, let error = check(.giftMessage, body) { return violation(id, "gift: \(error)") }
        default:
            break // opaque: relayed unchanged (§2)
        }
        let r = sessions[id].room
        guard r >= 0 else { return .relayed(recipients: 0) }
        number(frame, type: type, room: r)
        return .relayed(recipients: broadcast(frame, room: r, from: id, sink: sink))
    }

    // MARK: - Private

    private func check(_ kind: BodyKind, _ body: UnsafeRawBufferPointer) -> ProtoError? {
        do { try validateBody(kind, body); return nil } catch { return error }
    }

    /// Counts a bad frame that the caller rejected itself (e.g. a malformed
    /// JSON body, docs/protocol/json.md §7), exactly like a bad proto2 body.
    public mutating func reject(_ id: Int, reason: String, code: RejectionCode = .badFrame) -> RelayEvent {
        violation(id, reason, code)
    }

    private mutating func violation(_ id: Int, _ reason: String, _ code: RejectionCode = .badFrame) -> RelayEvent {
        sessions[id].violations += 1
        refusedByReason.add(FrameRefusal(code))
        let n = sessions[id].violations
        return .rejected(reason: reason, violations: n, disconnect: n >= settings.maxViolations, code: code)
    }

    private mutating func join(_ id: Int, body: UnsafeRawBufferPointer, frame: UnsafeRawBufferPointer, sink: some FrameSink) -> RelayEvent {
        let info: UserInfo?
        do {
            info = try UserInfo(protobuf: body)
        } catch {
            if settings.validate { return violation(id, "join: \(error)") }
            info = nil
        }
        var target = RoomName(settings.defaultRoom)
        if let room = info?.room, !room.isEmpty {
            // Refused before anything changes: the sender stays in its room,
            // with its identity (a room name costs memory in the index and
            // in every log line that names it).
            guard room.utf8.count <= settings.maxRoomBytes else {
                return violation(id, "join: room is \(room.utf8.count) bytes, over protocol.max_room_bytes "
                                 + "(\(settings.maxRoomBytes)): '\(clipForLog(room, maxBytes: 32))'", .roomTooLong)
            }
            target = RoomName(room)
        }
        // The token (field 5) never reaches another member (§13), nor the
        // fields asking for positions (6-8, §4): the join is relayed, and
        // remembered for the synthesized leave, without them.
        let relayedBody = info == nil || info!.hasDaemonFields ? UserInfo.removingDaemonFields(body) : nil
        let current = sessions[id].room
        // Byte for byte: NFC and NFD spellings of a name are two rooms (§3).
        let entered = current < 0 || rooms[current].name != target
        // A join into a room the client is not a joined member of hears the
        // room's recent lines (§4): a move, or the first join (a connection
        // sits in the default room from its accept on, unjoined).
        let replays = entered || sessions[id].identity == nil
        if entered {
            // A joined client moving rooms says goodbye to the old one (§4).
            if let identity = sessions[id].identity, let old = exit(id) {
                _ = announceLeave(identity, of: id, room: old, sink: sink)
            } else {
                _ = exit(id)
            }
            enter(id, room: target)
        }
        setPositions(id, info?.positions ?? false)
        sessions[id].identity = relayedBody ?? Array(body)
        sessions[id].name = info?.name ?? ""
        let r = sessions[id].room
        let recipients: Int
        if let relayedBody {
            let copy = FrameCodec.encode(type: settings.joinType, body: relayedBody, byteOrder: settings.byteOrder)
            recipients = copy.withUnsafeBytes { announce($0, room: r, from: id, sink: sink) }
        } else {
            recipients = announce(frame, room: r, from: id, sink: sink)
        }
        if replays { replayHistory(to: id, room: r, since: info?.since, sink: sink) }
        return .joined(name: sessions[id].name, room: target.string, recipients: recipients)
    }

    private func broadcast(_ frame: UnsafeRawBufferPointer, room r: Int, from sender: Int, sink: some FrameSink) -> Int {
        guard rooms.indices.contains(r) else { return 0 }
        let n = rooms[r].members.isEmpty ? 0 : sink.broadcast(frame, from: sender, to: rooms[r].members, except: settings.echo ? -1 : sender)
        observer?.relayed(frame, room: rooms[r].name, from: sender)
        return n
    }

    /// A frame another daemon relayed to `room`: queued for every
    /// member here, byte for byte. No member here is its sender, so echo
    /// rules do not apply, and the observer is not told (it came from there).
    /// - Returns: how many connections it was queued for.
    public mutating func deliver(_ frame: UnsafeRawBufferPointer, toRoom room: RoomName, sink: some FrameSink) -> Int {
        guard let r = roomIndex[room], !rooms[r].members.isEmpty else { return 0 }
        if case .frame(let type, _) = FrameCodec.parse(frame, byteOrder: settings.byteOrder, maxFrameBytes: Int.max) {
            number(frame, type: type, room: r)
        }
        return sink.broadcast(frame, from: -1, to: rooms[r].members, except: -1)
    }

    /// Numbers a text or gift frame relayed to room `r`, keeps it in the
    /// room's history, and makes the notice `position` due (§4). Other
    /// types are not numbered.
    private mutating func number(_ frame: UnsafeRawBufferPointer, type: UInt16, room r: Int) {
        guard type == settings.textType || type == settings.giftType else { return }
        rooms[r].position.seq += 1
        if settings.historyFrames > 0 {
            rooms[r].history.append(frame, seq: rooms[r].position.seq, maxFrames: settings.historyFrames, maxBytes: settings.historyBytes)
        }
        if rooms[r].positionMembers > 0 && !rooms[r].positionDue {
            rooms[r].positionDue = true
            dueRooms.append(r)
        }
    }

    /// Sets whether `id` asked for positions, keeping its room's count.
    private mutating func setPositions(_ id: Int, _ on: Bool) {
        guard sessions[id].positions != on else { return }
        sessions[id].positions = on
        let r = sessions[id].room
        if r >= 0 { rooms[r].positionMembers += on ? 1 : -1 }
    }

    /// A notice `code` carrying `position` (its fields 5 and 6, §13).
    private func positionNotice(_ code: String, _ position: RoomPosition, count: Int? = nil) -> [UInt8] {
        let notice = Notice(code: code, count: count.map(Int64.init), position: position)
        return FrameCodec.encode(type: settings.noticeType, body: notice.serialized(), byteOrder: settings.byteOrder)
    }

    /// A member that just entered room `r` (§4), to `id` alone: with
    /// `since` of the room's epoch and its frames after `since.seq` still
    /// held, the notice `history` with their number, then those frames;
    /// with another `since`, the notice `history_lost`, then as a join
    /// without it: the notice `history` with the number of frames that
    /// follow (0 when the room has none), then the room's recent frames,
    /// oldest first (nothing with `history` off). Last, to a member that
    /// asked for positions, the notice `position`.
    private func replayHistory(to id: Int, room r: Int, since: RoomPosition?, sink: some FrameSink) {
        guard rooms.indices.contains(r) else { return }
        let room = rooms[r]
        func send(_ frame: [UInt8]) { _ = frame.withUnsafeBytes { sink.broadcast($0, from: -1, to: [id], except: -1) } }
        var held: ArraySlice<[UInt8]>? = settings.historyFrames > 0 ? room.history.all : nil
        if let since {
            if sameBytes(since.epoch, room.position.epoch), let after = room.history.frames(after: since.seq, last: room.position.seq) {
                held = after
            } else {
                send(positionNotice("history_lost", room.position))
            }
        }
        if let held {
            send(positionNotice("history", room.position, count: held.count))
            held.forEach(send)
        }
        if sessions[id].positions { send(positionNotice("position", room.position)) }
    }

    /// A join `id` sent: to the room (`announce_joins`), or else
    /// back to its sender alone (with `echo`), and the observer not told.
    private func announce(_ frame: UnsafeRawBufferPointer, room r: Int, from id: Int, sink: some FrameSink) -> Int {
        if settings.announceJoins { return broadcast(frame, room: r, from: id, sink: sink) }
        return settings.echo ? sink.broadcast(frame, from: id, to: [id], except: -1) : 0
    }

    /// Sends a synthesized leave of `id` (type leave, body = identity) to
    /// room `r`, which `id` has already left (nobody without `announce_joins`).
    private func announceLeave(_ identity: [UInt8], of id: Int, room r: Int, sink: some FrameSink) -> Int {
        guard settings.announceJoins else { return 0 }
        let frame = FrameCodec.encode(type: settings.leaveType, body: identity, byteOrder: settings.byteOrder)
        return frame.withUnsafeBytes { broadcast($0, room: r, from: id, sink: sink) }
    }

    private mutating func enter(_ id: Int, room name: RoomName) {
        let r: Int
        if let existing = roomIndex[name] {
            r = existing
        } else if let free = freeRooms.popLast() {
            r = free
            rooms[r] = Room(name: name)
            roomIndex[name] = r
            roomOrder.insert(ByteKey(name.bytes))
        } else {
            r = rooms.count
            rooms.append(Room(name: name))
            roomIndex[name] = r
            roomOrder.insert(ByteKey(name.bytes))
        }
        memberOrder.insert(r << 32 | id)
        sessions[id].room = r
        sessions[id].position = rooms[r].members.count
        rooms[r].members.append(id)
        if sessions[id].positions { rooms[r].positionMembers += 1 }
        if rooms[r].members.count == 1 { observer?.roomOpened(name) }
    }

    /// Takes `id` out of its room (swap-remove, O(1)); returns the room index
    /// it was in. An emptied room is deleted, but its index stays valid for
    /// the caller's immediate broadcast (it has no members, so nobody hears).
    private mutating func exit(_ id: Int) -> Int? {
        let r = sessions[id].room
        guard r >= 0 else { return nil }
        let pos = sessions[id].position
        let last = rooms[r].members.removeLast()
        if last != id {
            rooms[r].members[pos] = last
            sessions[last].position = pos
        }
        memberOrder.remove(r << 32 | id)
        sessions[id].room = -1
        sessions[id].position = -1
        if sessions[id].positions { rooms[r].positionMembers -= 1 }
        if rooms[r].members.isEmpty {
            roomIndex[rooms[r].name] = nil
            roomOrder.remove(ByteKey(rooms[r].name.bytes))
            freeRooms.append(r)
            observer?.roomClosed(rooms[r].name)
        }
        return r
    }
}

extension RelaySettings {
    /// The relay rules of a config (`[protocol]` and `server.default_room`).
    public init(_ config: Config) {
        self.init(byteOrder: config.protocol.byteOrder, joinType: config.protocol.joinType, leaveType: config.protocol.leaveType,
                  heartbeatType: config.protocol.heartbeatType, echo: config.protocol.echo, validate: config.protocol.validate,
                  maxViolations: config.protocol.maxViolations, defaultRoom: config.server.defaultRoom,
                  maxRoomBytes: config.protocol.maxRoomBytes, noticeType: config.protocol.noticeType,
                  admitsToDefaultRoom: !(config.auth.required && config.auth.anonymous == .none))
        announceJoins = config.rooms.announceJoins
        historyFrames = config.rooms.history
        historyBytes = config.rooms.historyBytes
    }
}
