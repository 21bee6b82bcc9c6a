// How the relay hands frames to the sink: broadcasts, frames from other
// daemons, the API's publishes, and announced joins and leaves (§4).

extension Relay {
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

    func broadcast(_ frame: UnsafeRawBufferPointer, room r: Int, from sender: Int, proving sub: String? = nil, sink: some FrameSink) -> Int {
        guard rooms.indices.contains(r) else { return 0 }
        let n = rooms[r].members.isEmpty ? 0 : sink.broadcast(frame, from: sender, to: rooms[r].members, except: settings.echo ? -1 : sender)
        observer?.relayed(frame, room: rooms[r].name, from: sender, proving: sub)
        return n
    }

    /// A frame another daemon relayed to `room`: queued for every
    /// member here, byte for byte. No member here is its sender, so echo
    /// rules do not apply, and the observer is not told (it came from there).
    /// `address` is its sender's client address as that daemon saw it.
    /// - Returns: how many connections it was queued for.
    public mutating func deliver(_ frame: UnsafeRawBufferPointer, toRoom room: RoomName, from address: String = "", sink: some FrameSink) -> Int {
        guard let r = roomIndex[room], !rooms[r].members.isEmpty else { return 0 }
        if case .frame(let type, _) = FrameCodec.parse(frame, byteOrder: settings.byteOrder, maxFrameBytes: Int.max) {
            number(frame, type: type, room: r)
        }
        return sink.broadcast(frame, fromRemote: address, to: rooms[r].members)
    }

    /// A join `id` sent: to the room (`announce_joins`), or else
    /// back to its sender alone (with `echo`), and the observer not told.
    /// `sub`: the sub of the token the join proves (`receive`'s `proving`).
    func announce(_ frame: UnsafeRawBufferPointer, room r: Int, from id: Int, proving sub: String?, sink: some FrameSink) -> Int {
        if settings.announceJoins { return broadcast(frame, room: r, from: id, proving: sub, sink: sink) }
        return settings.echo ? sink.broadcast(frame, from: id, to: [id], except: -1) : 0
    }

    /// Sends a synthesized leave of `id` (type leave, body = identity) to
    /// room `r`, which `id` has already left (nobody without `announce_joins`).
    func announceLeave(_ identity: [UInt8], of id: Int, room r: Int, sink: some FrameSink) -> Int {
        guard settings.announceJoins else { return 0 }
        let frame = FrameCodec.encode(type: settings.leaveType, body: identity, byteOrder: settings.byteOrder)
        return frame.withUnsafeBytes { broadcast($0, room: r, from: id, sink: sink) }
    }
}
