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
    /// Queues one whole frame another daemon relayed, for every connection
    /// in `members`; `address` is its sender's client address as that
    /// daemon saw it (the `addr` JSON clients see, docs/protocol/json.md).
    /// - Returns: how many connections the frame was queued for.
    func broadcast(_ frame: UnsafeRawBufferPointer, fromRemote address: String, to members: [Int]) -> Int
    /// Queues one whole frame for `member` alone as a replay (a room's
    /// recent lines on join, missed lines on resume, docs/protocol.md §4):
    /// a sink that sheds slow readers' texts must not shed these (§6).
    /// - Returns: how many connections it was queued for (0 or 1).
    func replay(_ frame: UnsafeRawBufferPointer, to member: Int) -> Int
}

extension FrameSink {
    /// A sink that shows no sender's address broadcasts a remote frame as one of no sender (-1).
    public func broadcast(_ frame: UnsafeRawBufferPointer, fromRemote address: String, to members: [Int]) -> Int {
        broadcast(frame, from: -1, to: members, except: -1)
    }

    /// A sink that sheds nothing replays as it broadcasts.
    public func replay(_ frame: UnsafeRawBufferPointer, to member: Int) -> Int {
        broadcast(frame, from: -1, to: [member], except: -1)
    }
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
    /// As `relayed(_:room:from:)`, for the join of a token `sender` is
    /// proving now (`Relay.receive(from:type:frame:proving:sink:)`): `sub`
    /// is that token's verified sub, which the connection holds only once
    /// the join is taken. nil for every other frame (the sender's own sub).
    func relayed(_ frame: UnsafeRawBufferPointer, room: RoomName, from sender: Int, proving sub: String?)
}

extension RelayObserver {
    /// An observer that does not carry subs is told as of any frame.
    public func relayed(_ frame: UnsafeRawBufferPointer, room: RoomName, from sender: Int, proving sub: String?) {
        relayed(frame, room: room, from: sender)
    }
}

/// Rooms, memberships and the per-connection session state (identity from
/// join, violation count) — the relay policy of docs/protocol/ §2-§4, with no
/// syscalls. Connection ids are small dense integers (slot indices) chosen
/// by the caller; every operation is O(1) except broadcasts, which are
/// O(room members).
public struct Relay {
    public private(set) var settings: RelaySettings

    struct Room {
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

    struct Session {
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

    var rooms: [Room] = []
    var freeRooms: [Int] = []
    /// Keyed by the name's bytes: rooms that only look alike are different (§3).
    var roomIndex: [RoomName: Int] = [:]
    /// The names of `roomIndex` by their bytes, and every membership as
    /// `room index << 32 | connection id`: the API's listings page over
    /// them (OrderedIndex.swift; a join or leave costs O(log n + 512) more).
    var roomOrder = OrderedIndex<ByteKey>()
    var memberOrder = OrderedIndex<Int>()
    var sessions: [Session] = []
    /// Rooms whose members that asked for positions are owed the notice
    /// `position` at the end of this pass (`sendPositions`).
    var dueRooms: [Int] = []

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
    public mutating func receive(from id: Int, type: UInt16, frame: UnsafeRawBufferPointer, proving sub: String? = nil, sink: some FrameSink) -> RelayEvent {
        precondition(id < sessions.count && sessions[id].active, "frame from unknown connection \(id)")
        let body = UnsafeRawBufferPointer(rebasing: frame[FrameCodec.headerSize...])
        let s = settings
        receivedByKind.add(FrameKind.of(type, join: s.joinType, leave: s.leaveType, heartbeat: s.heartbeatType, notice: s.noticeType))
        switch type {
        case s.heartbeatType:
            return .heartbeat
        case s.joinType:
            if tracksChanges { changed.append(id) }
            return join(id, body: body, frame: frame, proving: sub, sink: sink)
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

    private mutating func join(_ id: Int, body: UnsafeRawBufferPointer, frame: UnsafeRawBufferPointer, proving sub: String?, sink: some FrameSink) -> RelayEvent {
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
            recipients = copy.withUnsafeBytes { announce($0, room: r, from: id, proving: sub, sink: sink) }
        } else {
            recipients = announce(frame, room: r, from: id, proving: sub, sink: sink)
        }
        if replays { replayHistory(to: id, room: r, since: info?.since, sink: sink) }
        return .joined(name: sessions[id].name, room: target.string, recipients: recipients)
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
