// Reading a live log back (the record format and the writers: LiveLog.swift).
extension LiveLog {
    /// The generation a log says it is (nil: not a live log).
    public static func generation(_ bytes: UnsafeRawBufferPointer) -> UInt32? {
        guard bytes.count >= headerSize, bytes.prefix(4).elementsEqual(magic) else { return nil }
        return get(bytes, 8, UInt32.self)
    }

    /// The connections alive at the end of the committed records, by serial
    /// (version 1's 32-bit serials widened).
    /// - Throws: `HandOverState.DecodeError`: not a live log, a newer
    ///   version, or a record cut short inside the committed part.
    public static func replay(_ bytes: UnsafeRawBufferPointer) throws(HandOverState.DecodeError) -> [UInt64: Connection] {
        try replayAll(bytes).connections
    }

    /// What a log holds at the end of its committed records.
    public struct Replayed: Sendable {
        /// The connections alive, by serial.
        public var connections: [UInt64: Connection] = [:]
        /// The cluster link's state when the log has its origin (nil: no
        /// cluster, or a writer before these records).
        public var cluster: HandOverState.Cluster?
        /// The last moderation record of each field, in the order first logged
        /// (a record that does not parse is skipped).
        public var moderation: [ModerationRecord] = []
    }

    /// The connections, the cluster link's state and the moderation records.
    /// - Throws: as `replay`.
    public static func replayAll(_ bytes: UnsafeRawBufferPointer) throws(HandOverState.DecodeError) -> Replayed {
        guard bytes.count >= headerSize, bytes.prefix(4).elementsEqual(magic) else { throw .damaged("not a live log") }
        let v = get(bytes, 4, UInt16.self)
        guard v >= 1 else { throw .damaged("live log version 0") }
        guard v <= version else { throw .unknownVersion(v) }
        let committed = get(bytes, committedOffset, UInt64.self)
        guard committed <= UInt64(bytes.count - headerSize) else { throw .damaged("\(committed) bytes committed in a \(bytes.count)-byte log") }
        let end = headerSize + Int(committed)
        let serialBytes = v == 1 ? 4 : 8
        var live: [UInt64: Connection] = [:]
        var origin: (UInt64, UInt64)?
        var streams: [RoomName: (id: UInt64, seq: UInt64)] = [:]
        var positions: [RoomName: [ClusterSequenceTracker.Carried]] = [:]
        var moderation: [ModerationRecord] = []
        var moderationIndex: [String: Int] = [:]
        var offset = headerSize
        while offset < end {
            guard end - offset >= 5 + serialBytes else { throw .damaged("a record header cut off at \(offset)") }
            let length = Int(get(bytes, offset, UInt32.self))
            guard length >= 1 + serialBytes, length <= end - offset - 4 else { throw .damaged("a record of \(length) bytes at \(offset)") }
            let kind = bytes[offset + 4]
            let serial = v == 1 ? UInt64(get(bytes, offset + 5, UInt32.self)) : get(bytes, offset + 5, UInt64.self)
            var p = Payload(bytes, start: offset + 5 + serialBytes, end: offset + 4 + length)
            switch Kind(rawValue: kind) {
            case .open:
                var c = Connection()
                guard let d = HandOverState.Dialect(rawValue: try p.u8()) else { throw .damaged("unknown dialect") }
                c.dialect = d
                c.peerAddress = String(decoding: try p.bytes(Int(try p.u16())), as: UTF8.self)
                if d == .webSocket { c.webSocket = HandOverState.WebSocket() }
                live[serial] = c
            case .webSocket:
                let flags = try p.u8()
                let name = String(decoding: try p.bytes(Int(try p.u8())), as: UTF8.self)
                guard let subprotocol = WebSocketSubprotocol(rawValue: name) else { throw .damaged("unknown WebSocket subprotocol '\(name)'") }
                guard live[serial]?.webSocket != nil else { break }
                live[serial]!.webSocket!.upgraded = flags & 1 != 0
                live[serial]!.webSocket!.echo = flags & 2 != 0
                live[serial]!.webSocket!.subprotocol = subprotocol
            case .webSocketMessage, .webSocketFragment:
                let raw = try p.u8()
                let opcode = WebSocketOpcode(rawValue: raw)
                guard raw == 0 || opcode == .text || opcode == .binary else { throw .damaged("a fragmented WebSocket message of opcode \(raw)") }
                guard let utf8 = UTF8Validator(packed: Array(try p.bytes(3))) else { throw .damaged("a WebSocket UTF-8 state out of range") }
                let payload = try p.bytes(Int(try p.u32()))
                guard live[serial]?.webSocket != nil else { break }
                if Kind(rawValue: kind) == .webSocketMessage {
                    live[serial]!.webSocket!.decoder.message = Array(payload)
                } else {
                    live[serial]!.webSocket!.decoder.message.append(contentsOf: payload)
                }
                live[serial]!.webSocket!.decoder.messageOpcode = opcode
                live[serial]!.webSocket!.decoder.utf8 = utf8
            case .room:
                let flags = try p.u8()
                let room = try p.bytes(Int(try p.u32()))
                let identity = try p.bytes(Int(try p.u32()))
                live[serial]?.room = flags & 1 != 0 ? RoomName(bytes: Array(room)) : nil
                live[serial]?.identity = flags & 2 != 0 ? Array(identity) : nil
            case .input:
                live[serial]?.input = Array(try p.bytes(Int(try p.u32())))
            case .inputAppend:
                let more = try p.bytes(Int(try p.u32()))
                live[serial]?.input.append(contentsOf: more)
            case .torn:
                live[serial]?.torn = Array(try p.bytes(Int(try p.u32())))
            case .close:
                live[serial] = nil
            case .auth:
                live[serial]?.authClaims = try? TokenClaims(json: Array(try p.bytes(Int(try p.u32()))))
            case .clusterOrigin:
                origin = (try p.u64(), try p.u64())
            case .clusterStream:
                let room = RoomName(bytes: Array(try p.bytes(Int(try p.u32()))))
                let id = try p.u64(), seq = try p.u64()
                streams[room] = id == 0 ? nil : (id, seq)
            case .clusterPositions:
                let room = RoomName(bytes: Array(try p.bytes(Int(try p.u32()))))
                let count = Int(try p.u32())
                guard count <= (p.end - p.at) / 24 else { throw .damaged("\(count) cluster positions in a short record") }
                var list: [ClusterSequenceTracker.Carried] = []
                for _ in 0..<count { list.append(.init(room: room, origin: try p.u64(), stream: try p.u64(), seq: try p.u64())) }
                positions[room] = list.isEmpty ? nil : list
            case .moderation:
                let field = try p.bytes(Int(try p.u32()))
                let value = try p.bytes(Int(try p.u32()))
                guard let record = ModerationRecord(field: field, value: value) else { break }
                if let i = moderationIndex[record.field] { moderation[i] = record } else {
                    moderationIndex[record.field] = moderation.count
                    moderation.append(record)
                }
            case nil:
                break
            }
            offset += 4 + length
        }
        let cluster = origin.map { o in
            HandOverState.Cluster(origin: o.0, lastStream: o.1,
                                  streams: streams.map { .init(room: $0.key, id: $0.value.id, seq: $0.value.seq) },
                                  positions: positions.values.flatMap { $0 })
        }
        return Replayed(connections: live, cluster: cluster?.origin == 0 ? nil : cluster, moderation: moderation)
    }

    struct Payload {
        let bytes: UnsafeRawBufferPointer
        var at: Int
        let end: Int

        init(_ bytes: UnsafeRawBufferPointer, start: Int, end: Int) {
            self.bytes = bytes
            self.at = start
            self.end = end
        }

        mutating func bytes(_ n: Int) throws(HandOverState.DecodeError) -> UnsafeRawBufferPointer.SubSequence {
            guard n >= 0, n <= end - at else { throw .damaged("a field of \(n) bytes runs past its record") }
            defer { at += n }
            return bytes[at..<(at + n)]
        }

        mutating func u8() throws(HandOverState.DecodeError) -> UInt8 { try bytes(1).first! }

        mutating func u16() throws(HandOverState.DecodeError) -> UInt16 {
            let b = try bytes(2)
            return UInt16(b[b.startIndex]) | UInt16(b[b.startIndex + 1]) << 8
        }

        mutating func u32() throws(HandOverState.DecodeError) -> UInt32 {
            let b = try bytes(4)
            return (0..<4).reduce(UInt32(0)) { $0 | UInt32(b[b.startIndex + $1]) << (8 * UInt32($1)) }
        }

        mutating func u64() throws(HandOverState.DecodeError) -> UInt64 {
            let b = try bytes(8)
            return (0..<8).reduce(UInt64(0)) { $0 | UInt64(b[b.startIndex + $1]) << (8 * UInt64($1)) }
        }
    }
}
