// Reading a hand-over state (the format: HandOverState.swift; the tags: HandOverStateTags.swift).
extension HandOverState {
    /// Why a state could not be read; `reason` is the log's `REASON=` code.
    public enum DecodeError: Error, Equatable, CustomStringConvertible {
        /// Written by a newer format than this binary knows.
        case unknownVersion(UInt16)
        /// Truncated, corrupted or not a hand-over state at all.
        case damaged(String)

        public var reason: String {
            switch self {
            case .unknownVersion: "handover_state_version"
            case .damaged: "handover_state_damaged"
            }
        }

        public var description: String {
            switch self {
            case .unknownVersion(let v): "hand-over state version \(v) is newer than this binary's (\(HandOverState.currentVersion))"
            case .damaged(let why): "hand-over state damaged: \(why)"
            }
        }
    }

    // MARK: - Decoding

    /// Reads a state written by this version or any earlier one.
    /// - Throws: `DecodeError.unknownVersion` for a newer version,
    ///   `.damaged` for anything truncated, corrupted or inconsistent.
    public static func decode(_ bytes: [UInt8]) throws(DecodeError) -> HandOverState {
        let result = bytes.withUnsafeBytes { raw in Result { () throws(DecodeError) in try decode(raw) } }
        return try result.get()
    }

    /// `decode` on bytes in place (e.g. a mapped memfd).
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(DecodeError) -> HandOverState {
        guard bytes.count >= 8 else { throw .damaged("\(bytes.count) bytes, shorter than a header") }
        guard bytes.prefix(4).elementsEqual(magic) else { throw .damaged("no RCHO magic") }
        let version = readLE(bytes, 4, as: UInt16.self)
        guard version >= 1 else { throw .damaged("version 0") }
        guard version <= currentVersion else { throw .unknownVersion(version) }
        let headerBytes = Int(readLE(bytes, 6, as: UInt16.self))
        guard headerBytes >= headerSize, bytes.count >= headerBytes else {
            throw .damaged("header of \(headerBytes) bytes in a \(bytes.count)-byte state")
        }
        let payloadBytes = readLE(bytes, 8, as: UInt64.self)
        guard payloadBytes == UInt64(bytes.count - headerBytes) else {
            throw .damaged("payload of \(bytes.count - headerBytes) bytes, header says \(payloadBytes) (truncated?)")
        }
        let payload = UnsafeRawBufferPointer(rebasing: bytes[headerBytes...])
        let crc = readLE(bytes, 16, as: UInt32.self)
        guard CRC32.checksum(payload) == crc else { throw .damaged("checksum mismatch") }
        // Version 1 is the only version so far; a version 2 that changes a
        // field's meaning adds its own branch here and keeps this one.
        return try decodeV1(payload)
    }

    private static func decodeV1(_ payload: UnsafeRawBufferPointer) throws(DecodeError) -> HandOverState {
        var state = HandOverState()
        var expectedCount: UInt32?
        var expectedWebSockets: UInt32 = 0
        var webSockets = 0
        var reader = Reader(payload)
        while let (tag, value) = try reader.next() {
            switch RecordTag(rawValue: tag) {
            case .globals:
                var globals = Reader(value)
                while let (g, v) = try globals.next() {
                    switch GlobalTag(rawValue: g) {
                    case .stoppedReadingMs: state.stoppedReadingMs = try Reader.u64(v, "stopped-reading time")
                    case .writer: state.writer = try Reader.text(v, "writer")
                    case .connectionCount: expectedCount = try Reader.u32(v, "connection count")
                    case .boxName: state.boxName = try Reader.text(v, "box name")
                    case .socketOptions: state.socketOptions = try Reader.text(v, "socket options")
                    case .handOvers: state.handOvers = try Reader.u64(v, "hand-over count")
                    case .webSocketCount: expectedWebSockets = try Reader.u32(v, "WebSocket connection count")
                    case nil: break
                    }
                }
            case .connection:
                state.connections.append(try decodeRecord(value))
            case .cluster:
                state.cluster = try decodeCluster(value)
            case .moderation:
                var fields = Reader(value)
                var field: UnsafeRawBufferPointer?, text: UnsafeRawBufferPointer?
                while let (f, v) = try fields.next() {
                    switch ModerationTag(rawValue: f) {
                    case .field: field = v
                    case .value: text = v
                    case nil: break
                    }
                }
                guard let field, let text else { throw .damaged("a moderation record that is not a field and its value") }
                // One outside today's bounds (a ban an earlier release took
                // from Redis for 285,000,000 years) is dropped, not the state.
                if let record = ModerationRecord(field: field, value: text) { state.moderation.append(record) }
            case .room:
                state.rooms.append(try decodeRoom(value))
            case .idempotency:
                // Idempotency-Keys (HandOverStateIdempotency.swift): one outside
                // the API's bounds, or past the cache's capacity, is dropped, not the state.
                var fields = Reader(value)
                var e = IdempotencyEntry(key: [], fingerprint: [], delivered: 0, remainingMs: 0)
                while let (f, v) = try fields.next() {
                    switch IdempotencyTag(rawValue: f) {
                    case .key: e.key = Array(v)
                    case .fingerprint: e.fingerprint = Array(v)
                    case .delivered: e.delivered = try Reader.u64(v, "idempotency delivered count")
                    case .remainingMs: e.remainingMs = try Reader.u32(v, "idempotency time left")
                    case nil: break
                    }
                }
                if e.isWellFormed && state.idempotency.count < IdempotencyEntry.maxEntries { state.idempotency.append(e) }
            case .webSocketConnection:
                let r = try decodeRecord(value)
                guard r.dialect == .webSocket, r.webSocket != nil else { throw .damaged("a WebSocket connection record without its WebSocket state") }
                state.connections.append(r)
                webSockets += 1
            case nil:
                break
            }
        }
        if let expectedCount, expectedCount != UInt32(clamping: state.connections.count - webSockets) {
            throw .damaged("\(state.connections.count - webSockets) connection records, the globals say \(expectedCount)")
        }
        if expectedWebSockets != UInt32(clamping: webSockets) {
            throw .damaged("\(webSockets) WebSocket connection records, the globals say \(expectedWebSockets)")
        }
        return state
    }

    private static func decodeRoom(_ bytes: UnsafeRawBufferPointer) throws(DecodeError) -> RoomStream {
        var stream = RoomStream(room: RoomName(bytes: []), position: RoomPosition(epoch: "", seq: 0), history: [])
        var named = false
        var reader = Reader(bytes)
        while let (tag, v) = try reader.next() {
            switch RoomTag(rawValue: tag) {
            case .name: stream.room = RoomName(bytes: Array(v)); named = true
            case .epoch: stream.position.epoch = try Reader.text(v, "room epoch")
            case .seq: stream.position.seq = Int64(bitPattern: try Reader.u64(v, "room seq"))
            case .frame:
                var f = NumberedFrame(seq: 0, frame: [])
                var fields = Reader(v)
                while let (t, fv) = try fields.next() {
                    switch RoomTag(rawValue: t) {
                    case .frameSeq: f.seq = Int64(bitPattern: try Reader.u64(fv, "history frame seq"))
                    case .frameBytes: f.frame = Array(fv)
                    default: break
                    }
                }
                stream.history.append(f)
            default: break
            }
        }
        guard named, !stream.position.epoch.isEmpty else { throw .damaged("a room record without its name or epoch") }
        return stream
    }

    private static func decodeCluster(_ bytes: UnsafeRawBufferPointer) throws(DecodeError) -> Cluster {
        var c = Cluster(origin: 0, lastStream: 0, streams: [])
        var reader = Reader(bytes)
        while let (tag, v) = try reader.next() {
            switch ClusterTag(rawValue: tag) {
            case .origin: c.origin = try Reader.u64(v, "cluster origin")
            case .lastStream: c.lastStream = try Reader.u64(v, "cluster stream")
            case .returnBy: c.returnByMs = try Reader.u64(v, "cluster return deadline")
            case .stream:
                var s = Cluster.Stream(room: RoomName(bytes: []), id: 0, seq: 0)
                var fields = Reader(v)
                while let (f, fv) = try fields.next() {
                    switch ClusterTag(rawValue: f) {
                    case .room: s.room = RoomName(bytes: Array(fv))
                    case .id: s.id = try Reader.u64(fv, "cluster stream id")
                    case .seq: s.seq = try Reader.u64(fv, "cluster stream number")
                    default: break
                    }
                }
                c.streams.append(s)
            case .position:
                var p = ClusterSequenceTracker.Carried(room: RoomName(bytes: []), origin: 0, stream: 0, seq: 0)
                var fields = Reader(v)
                while let (f, fv) = try fields.next() {
                    switch ClusterTag(rawValue: f) {
                    case .room: p.room = RoomName(bytes: Array(fv))
                    case .positionOrigin: p.origin = try Reader.u64(fv, "cluster position origin")
                    case .id: p.stream = try Reader.u64(fv, "cluster position stream")
                    case .seq: p.seq = try Reader.u64(fv, "cluster position number")
                    default: break
                    }
                }
                c.positions.append(p)
            default: break
            }
        }
        guard c.origin != 0 else { throw .damaged("a cluster record without its origin") }
        return c
    }

    private static func decodeRecord(_ bytes: UnsafeRawBufferPointer) throws(DecodeError) -> Record {
        var key: UInt64?
        var r = Record(key: 0)
        var reader = Reader(bytes)
        while let (tag, v) = try reader.next() {
            switch FieldTag(rawValue: tag) {
            case .key: key = try Reader.u64(v, "key")
            case .dialect:
                guard let d = Dialect(rawValue: try Reader.u8(v, "dialect")) else { throw .damaged("unknown dialect \(v.first ?? 0)") }
                r.dialect = d
            case .peerAddress: r.peerAddress = try Reader.text(v, "peer address")
            case .room: r.room = RoomName(bytes: Array(v))  // byte strings, not necessarily UTF-8
            case .identity: r.identity = Array(v)
            case .nickname: r.nickname = try Reader.text(v, "nickname")
            case .input: r.input = Array(v)
            case .output: r.output = Array(v)
            case .heartbeatRemainingMs: r.heartbeatRemainingMs = try Reader.u32(v, "heartbeat time remaining")
            case .partialFrameRemainingMs: r.partialFrameRemainingMs = try Reader.u32(v, "partial frame time remaining")
            case .violations: r.violations = try Reader.u32(v, "violations")
            case .frameMilliTokens: r.frameMilliTokens = Int64(bitPattern: try Reader.u64(v, "frame tokens"))
            case .byteMilliTokens: r.byteMilliTokens = Int64(bitPattern: try Reader.u64(v, "byte tokens"))
            case .draining: r.draining = try Reader.u8(v, "draining") != 0
            case .tornBytes: r.tornBytes = try Reader.u64(v, "torn bytes")
            case .softLimitElapsedMs: r.softLimitElapsedMs = try Reader.u32(v, "time over output_soft_bytes")
            case .authClaims:
                do { r.authClaims = try TokenClaims(json: Array(v)) } catch { throw .damaged("verified claims: \(error)") }
            case .webSocket: r.webSocket = try decodeWebSocket(v)
            case .positions: r.positions = try Reader.u8(v, "positions") != 0
            case .textsShed: r.textsShed = try Reader.u32(v, "texts shed")
            case .lastTextMs: r.lastTextMs = try Reader.u64(v, "last text time")
            case nil: break
            }
        }
        guard let key else { throw .damaged("a connection record without its key") }
        guard r.tornBytes <= UInt64(r.output.count) else { throw .damaged("\(r.tornBytes) torn bytes in \(r.output.count) bytes of owed output") }
        guard (r.webSocket == nil) == (r.dialect != .webSocket) else { throw .damaged("a \(r.dialect) connection record with\(r.webSocket == nil ? "out" : "") WebSocket state") }
        if let d = r.webSocket?.decoder, d.checkedOfPartialFrame > r.input.count {
            throw .damaged("\(d.checkedOfPartialFrame) bytes of a WebSocket frame checked, \(r.input.count) unconsumed")
        }
        r.key = key
        return r
    }

    private static func decodeWebSocket(_ bytes: UnsafeRawBufferPointer) throws(DecodeError) -> WebSocket {
        var ws = WebSocket()
        var reader = Reader(bytes)
        func utf8(_ v: UnsafeRawBufferPointer) throws(DecodeError) -> UTF8Validator {
            guard let u = UTF8Validator(packed: Array(v)) else { throw .damaged("WebSocket UTF-8 state \(Array(v))") }
            return u
        }
        while let (tag, v) = try reader.next() {
            switch WebSocketTag(rawValue: tag) {
            case .upgraded: ws.upgraded = try Reader.u8(v, "WebSocket upgraded") != 0
            case .subprotocol:
                let name = try Reader.text(v, "WebSocket subprotocol")
                guard let p = WebSocketSubprotocol(rawValue: name) else { throw .damaged("unknown WebSocket subprotocol '\(name)'") }
                ws.subprotocol = p
            case .echo: ws.echo = try Reader.u8(v, "WebSocket echo") != 0
            case .messageOpcode:
                let op = WebSocketOpcode(rawValue: try Reader.u8(v, "WebSocket message opcode"))
                guard op == .text || op == .binary else { throw .damaged("a fragmented WebSocket message of opcode \(v.first ?? 0)") }
                ws.decoder.messageOpcode = op
            case .message: ws.decoder.message = Array(v)
            case .utf8: ws.decoder.utf8 = try utf8(v)
            case .checkedOfPartialFrame: ws.decoder.checkedOfPartialFrame = Int(clamping: try Reader.u64(v, "WebSocket checked bytes"))
            case .partialUTF8: ws.decoder.partialUTF8 = try utf8(v)
            case .upgradeRemainingMs: ws.upgradeRemainingMs = try Reader.u32(v, "WebSocket upgrade time remaining")
            case .nextPingMs: ws.nextPingMs = try Reader.u32(v, "WebSocket time to the next ping")
            case nil: break
            }
        }
        if ws.decoder.messageOpcode == nil && !ws.decoder.message.isEmpty { throw .damaged("a WebSocket message without its opcode") }
        return ws
    }
}

/// Walks tag-length-value records; every length is checked against what is left.
private struct Reader {
    let bytes: UnsafeRawBufferPointer
    var offset = 0

    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    /// The next record; nil at the end.
    mutating func next() throws(HandOverState.DecodeError) -> (UInt16, UnsafeRawBufferPointer)? {
        guard offset < bytes.count else { return nil }
        guard bytes.count - offset >= 6 else { throw .damaged("a record header cut off at byte \(offset)") }
        let tag = readLE(bytes, offset, as: UInt16.self)
        let length = Int(readLE(bytes, offset + 2, as: UInt32.self))
        offset += 6
        guard length <= bytes.count - offset else {
            throw .damaged("record \(tag) claims \(length) bytes, \(bytes.count - offset) are left")
        }
        defer { offset += length }
        return (tag, UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + length)]))
    }

    static func u8(_ v: UnsafeRawBufferPointer, _ what: String) throws(HandOverState.DecodeError) -> UInt8 {
        guard v.count == 1 else { throw .damaged("\(what): \(v.count) bytes, expected 1") }
        return v[0]
    }

    static func u32(_ v: UnsafeRawBufferPointer, _ what: String) throws(HandOverState.DecodeError) -> UInt32 {
        guard v.count == 4 else { throw .damaged("\(what): \(v.count) bytes, expected 4") }
        return readLE(v, 0, as: UInt32.self)
    }

    static func u64(_ v: UnsafeRawBufferPointer, _ what: String) throws(HandOverState.DecodeError) -> UInt64 {
        guard v.count == 8 else { throw .damaged("\(what): \(v.count) bytes, expected 8") }
        return readLE(v, 0, as: UInt64.self)
    }

    static func text(_ v: UnsafeRawBufferPointer, _ what: String) throws(HandOverState.DecodeError) -> String {
        guard let s = String(validating: v, as: UTF8.self) else { throw .damaged("\(what) is not UTF-8") }
        return s
    }
}

private func readLE<T: FixedWidthInteger>(_ bytes: UnsafeRawBufferPointer, _ offset: Int, as: T.Type) -> T {
    T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
}
