// Writing a hand-over state (the format: HandOverState.swift; the records:
// HandOverStateTables.swift).
extension HandOverState {
    /// At least the bytes `encode` writes for one connection with fields of
    /// these sizes (in bytes), so that a writer can keep a state under what
    /// its reader accepts before it encodes anything.
    public static func recordBytesBound(address: Int, room: Int, identity: Int, nickname: Int, input: Int, output: Int,
                                        claims: Int = 0, webSocketMessage: Int = 0) -> Int {
        // 6 per record header, 8 per integer, every field present.
        6 + maxConnectionFields * 14 + address + room + identity + nickname + input + output + claims
            + (webSocketMessage > 0 ? 6 + maxWebSocketFields * 14 + webSocketMessage : 0)
    }

    /// More than the rows of `connection` and of `webSocket` (room to add
    /// fields without changing the bounds a writer keeps to; a test checks).
    static let maxConnectionFields = 32, maxWebSocketFields = 16

    /// At least the bytes of the moderation records (a header per record
    /// and per field, the field's and the value's bytes).
    public static func moderationBytesBound(_ records: [ModerationRecord]) -> Int {
        records.reduce(0) { $0 + 3 * 6 + $1.field.utf8.count + $1.value.utf8.count }
    }

    /// At least the bytes of the room stream records: per room a header,
    /// three fields and the name's and epoch's bytes, per frame a header,
    /// two fields and its bytes.
    public static func roomsBytesBound(_ rooms: [RoomStream]) -> Int {
        rooms.reduce(0) { $0 + 6 + 3 * 14 + 6 + $1.room.bytes.count + $1.position.epoch.utf8.count
            + $1.history.reduce(0) { $0 + 3 * 6 + 8 + $1.frame.count } }
    }

    /// At least the bytes `encode` writes for the cluster record `c`: its
    /// header, three integers, and per stream a header, the room's bytes and
    /// two integers, per position the room's bytes and three integers.
    public static func clusterBytesBound(_ c: Cluster) -> Int {
        c.streams.reduce(6 + 3 * 14) { $0 + 6 + 6 + $1.room.bytes.count + 2 * 14 }
            + c.positions.reduce(0) { $0 + 6 + 6 + $1.room.bytes.count + 3 * 14 }
    }

    /// At least the bytes of the header and the globals, with `writer`
    /// bytes of text in them (version, box name, socket options).
    public static func globalsBytesBound(writer: Int) -> Int { headerSize + 6 + 16 * 14 + writer }

    /// The bytes of this state in the current version: the header, then
    /// the payload's records (`payload`). O(total size): one buffer,
    /// records written in place and their lengths patched after.
    public func encode() -> [UInt8] {
        var w = Writer()
        w.bytes.reserveCapacity(Self.headerSize + 64 + connections.reduce(0) { $0 + 160 + $1.input.count + $1.output.count + ($1.identity?.count ?? 0) })
        w.bytes += Self.magic
        w.append(Self.currentVersion)
        w.append(UInt16(Self.headerSize))
        w.bytes += [UInt8](repeating: 0, count: Self.headerSize - 8)  // payload length and CRC, patched below
        Self.payload.writeFields(Payload(state: self), &w)
        let payloadBytes = w.bytes.count - Self.headerSize
        let crc = w.bytes.withUnsafeBytes { CRC32.checksum(UnsafeRawBufferPointer(rebasing: $0[Self.headerSize...])) }
        w.patch(at: 8, UInt64(payloadBytes))
        w.patch(at: 16, crc)
        return w.bytes
    }
}
