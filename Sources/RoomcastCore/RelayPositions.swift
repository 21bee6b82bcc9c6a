// The relay's positions and recent lines (docs/protocol/positions.md §4):
// numbering text and gift frames, the notice `position`, the replay on join.

extension Relay {
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

    /// Numbers a text or gift frame relayed to room `r`, keeps it in the
    /// room's history, and makes the notice `position` due (§4). Other
    /// types are not numbered.
    mutating func number(_ frame: UnsafeRawBufferPointer, type: UInt16, room r: Int) {
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
    mutating func setPositions(_ id: Int, _ on: Bool) {
        guard sessions[id].positions != on else { return }
        sessions[id].positions = on
        let r = sessions[id].room
        if r >= 0 { rooms[r].positionMembers += on ? 1 : -1 }
    }

    /// A notice `code` carrying `position` (its fields 5 and 6, §13).
    func positionNotice(_ code: String, _ position: RoomPosition, count: Int? = nil) -> [UInt8] {
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
    func replayHistory(to id: Int, room r: Int, since: RoomPosition?, sink: some FrameSink) {
        guard rooms.indices.contains(r) else { return }
        let room = rooms[r]
        func send(_ frame: [UInt8]) { _ = frame.withUnsafeBytes { sink.replay($0, to: id) } }
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
}
