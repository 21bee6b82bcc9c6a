// What the relay knows of each connection (its room, identity, violations).

extension Relay {
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
}
