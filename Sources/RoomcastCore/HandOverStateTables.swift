// The record kinds of the hand-over state, one table each (the format:
// HandOverState.swift; the codec that walks the tables:
// HandOverStateCodec.swift). A row is one field: its tag, where it lives in
// the value, how its bytes read and when it is left out. Carrying a new
// field is one row with a tag new to its table; a reader before it skips
// the record, a writer before it leaves it out and the field reads as its
// default. A row's place in its table is the order its record is written in.
//
// Tags run from 1 in each table. A field added beside other work takes a tag
// far from the sequence (0x4101 signed joins, 0x5001 positions, 0x5701
// WebSocket, 0x5801 slow mode, 0x5E01 shedding), so that fields added
// meanwhile on another branch cannot collide with it.
extension HandOverState {
    /// The payload's records (the format: HandOverState.swift).
    static let payload = RecordKind<Payload>(blank: Payload(), fields: [
        .group(1, globals),
        // One record per connection, in order: tag 4 for a WebSocket one, so
        // that a reader before tag 4 skips it (and serves the descriptor afresh).
        Field(tag: 2, write: { p, w in
                  let kind = connection
                  for c in p.state.connections { w.record(c.webSocket == nil ? 2 : 4) { w in kind.writeFields(c, &w) } }
              },
              read: { p, v throws(DecodeError) in p.state.connections.append(try connection.read(v)) }),
        Field(tag: 4, write: { _, _ in },  // written by tag 2's row
              read: { p, v throws(DecodeError) in
                  let r = try connection.read(v)
                  guard r.dialect == .webSocket, r.webSocket != nil else { throw .damaged("a WebSocket connection record without its WebSocket state") }
                  p.state.connections.append(r)
                  p.webSocketsRead += 1
              }),
        .optional(3, \.state.cluster, cluster.coder),
        // One outside today's bounds (a ban an earlier release took from
        // Redis for 285,000,000 years) is dropped, not the state.
        .repeated(5, \.state.moderation, moderation.coder, stored: { ModerationText($0) }, kept: { ModerationRecord(field: $0.field, value: $0.value) }),
        .repeated(6, \.state.rooms, room.coder),
    ], check: { p throws(DecodeError) in
        let plain = p.state.connections.count - p.webSocketsRead
        if let said = p.saidConnections, said != UInt32(clamping: plain) {
            throw .damaged("\(plain) connection records, the globals say \(said)")
        }
        if p.saidWebSockets != UInt32(clamping: p.webSocketsRead) {
            throw .damaged("\(p.webSocketsRead) WebSocket connection records, the globals say \(p.saidWebSockets)")
        }
    })

    /// Tag 1: the state's own fields, and the number of connection records
    /// of each tag (a cross-check: a record cut out is found).
    static let globals = RecordKind<Payload>(blank: Payload(), fields: [
        .field(1, \.state.stoppedReadingMs, .u64("stopped-reading time")),
        .field(2, \.state.writer, .text("writer")),
        .computed(3, .u32("connection count"), get: { UInt32($0.plainConnections) }, set: { $0.saidConnections = $1 }),
        .computed(0x5701, .u32("WebSocket connection count"), get: { UInt32($0.webSocketConnections) }, set: { $0.saidWebSockets = $1 }, omit: 0),
        .field(4, \.state.boxName, .text("box name")),
        .field(5, \.state.socketOptions, .text("socket options")),
        .field(6, \.state.handOvers, .u64("hand-over count"), omit: 0),
    ])

    /// Tags 2 and 4: one connection (`Record`).
    static let connection = RecordKind<Record>(blank: Record(key: 0), required: [1], missing: "a connection record without its key", fields: [
        .field(1, \.key, .u64("key")),
        .field(2, \.dialect, .u8("dialect").validated({ b throws(DecodeError) in
            guard let d = Dialect(rawValue: b) else { throw .damaged("unknown dialect \(b)") }
            return d
        }, { $0.rawValue })),
        .field(3, \.peerAddress, .text("peer address")),
        .optional(4, \.room, .room),
        .optional(5, \.identity, .bytes),
        .optional(6, \.nickname, .text("nickname")),
        .field(7, \.input, .bytes, omit: []),
        .field(8, \.output, .bytes, omit: []),
        .optional(9, \.heartbeatRemainingMs, .u32("heartbeat time remaining")),
        .optional(10, \.partialFrameRemainingMs, .u32("partial frame time remaining")),
        .field(11, \.violations, .u32("violations"), omit: 0),
        .optional(12, \.frameMilliTokens, .i64("frame tokens")),
        .optional(13, \.byteMilliTokens, .i64("byte tokens")),
        .field(14, \.draining, .bool("draining"), omit: false),
        .field(15, \.tornBytes, .u64("torn bytes"), omit: 0),
        .optional(16, \.softLimitElapsedMs, .u32("time over output_soft_bytes")),
        .optional(0x4101, \.authClaims, .bytes.validated({ b throws(DecodeError) in
            do { return try TokenClaims(json: b) } catch { throw .damaged("verified claims: \(error)") }
        }, { $0.json })),
        .optional(0x5701, \.webSocket, webSocket.coder),
        .field(0x5001, \.positions, .bool("positions"), omit: false),
        .field(0x5E01, \.textsShed, .u32("texts shed"), omit: 0),
        .optional(0x5801, \.lastTextMs, .u64("last text time")),
    ], check: { r throws(DecodeError) in
        guard r.tornBytes <= UInt64(r.output.count) else { throw .damaged("\(r.tornBytes) torn bytes in \(r.output.count) bytes of owed output") }
        guard (r.webSocket == nil) == (r.dialect != .webSocket) else {
            throw .damaged("a \(r.dialect) connection record with\(r.webSocket == nil ? "out" : "") WebSocket state")
        }
        if let d = r.webSocket?.decoder, d.checkedOfPartialFrame > r.input.count {
            throw .damaged("\(d.checkedOfPartialFrame) bytes of a WebSocket frame checked, \(r.input.count) unconsumed")
        }
    })

    /// Inside a connection, tag 0x5701: its WebSocket state (`WebSocket`).
    static let webSocket = RecordKind<WebSocket>(blank: WebSocket(), fields: [
        .field(1, \.upgraded, .bool("WebSocket upgraded")),
        .field(2, \.subprotocol, .text("WebSocket subprotocol").validated({ name throws(DecodeError) in
            guard let p = WebSocketSubprotocol(rawValue: name) else { throw .damaged("unknown WebSocket subprotocol '\(name)'") }
            return p
        }, { $0.rawValue })),
        .field(3, \.echo, .bool("WebSocket echo"), omit: false),
        .optional(4, \.decoder.messageOpcode, .u8("WebSocket message opcode").validated({ b throws(DecodeError) in
            guard let op = WebSocketOpcode(rawValue: b), op == .text || op == .binary else { throw .damaged("a fragmented WebSocket message of opcode \(b)") }
            return op
        }, { $0.rawValue })),
        .field(5, \.decoder.message, .bytes, omit: []),
        .field(6, \.decoder.utf8, .utf8State),
        .field(7, \.decoder.checkedOfPartialFrame, .count("WebSocket checked bytes"), if: { $0.decoder.checkedOfPartialFrame > 0 }),
        .field(8, \.decoder.partialUTF8, .utf8State, if: { $0.decoder.checkedOfPartialFrame > 0 }),
        .optional(9, \.upgradeRemainingMs, .u32("WebSocket upgrade time remaining")),
        .optional(10, \.nextPingMs, .u32("WebSocket time to the next ping")),
    ], check: { ws throws(DecodeError) in
        if ws.decoder.messageOpcode == nil && !ws.decoder.message.isEmpty { throw .damaged("a WebSocket message without its opcode") }
    })

    /// Tag 3: the cluster link (`Cluster`).
    static let cluster = RecordKind<Cluster>(blank: Cluster(origin: 0, lastStream: 0, streams: []), fields: [
        .field(1, \.origin, .u64("cluster origin")),
        .field(2, \.lastStream, .u64("cluster stream")),
        .optional(5, \.returnByMs, .u64("cluster return deadline")),
        .repeated(3, \.streams, clusterStream.coder),
        .repeated(4, \.positions, clusterPosition.coder),
    ], check: { c throws(DecodeError) in
        guard c.origin != 0 else { throw .damaged("a cluster record without its origin") }
    })

    /// Inside the cluster link, tag 3: one room's stream.
    static let clusterStream = RecordKind<Cluster.Stream>(blank: .init(room: RoomName(bytes: []), id: 0, seq: 0), fields: [
        .field(10, \.room, .room),
        .field(11, \.id, .u64("cluster stream id")),
        .field(12, \.seq, .u64("cluster stream number")),
    ])

    /// Inside the cluster link, tag 4: one position of the receiving side.
    static let clusterPosition = RecordKind<ClusterSequenceTracker.Carried>(blank: .init(room: RoomName(bytes: []), origin: 0, stream: 0, seq: 0), fields: [
        .field(10, \.room, .room),
        .field(13, \.origin, .u64("cluster position origin")),
        .field(11, \.stream, .u64("cluster position stream")),
        .field(12, \.seq, .u64("cluster position number")),
    ])

    /// Tag 5: one ban, mute or room setting, as its hash field and value (ModerationWire.swift).
    static let moderation = RecordKind<ModerationText>(blank: ModerationText(), required: [1, 2],
                                                       missing: "a moderation record that is not a field and its value", fields: [
        .field(1, \.field, .bytes),
        .field(2, \.value, .bytes),
    ])

    /// Tag 6: one room's stream (docs/protocol/positions.md §4).
    static let room = RecordKind<RoomStream>(blank: RoomStream(room: RoomName(bytes: []), position: RoomPosition(epoch: "", seq: 0), history: []),
                                             required: [1], missing: "a room record without its name or epoch", fields: [
        .field(1, \.room, .room),
        .field(2, \.position.epoch, .text("room epoch")),
        .field(3, \.position.seq, .i64("room seq")),
        .repeated(4, \.history, roomFrame.coder),
    ], check: { s throws(DecodeError) in
        guard !s.position.epoch.isEmpty else { throw .damaged("a room record without its name or epoch") }
    })

    /// Inside a room, tag 4: one recent frame.
    static let roomFrame = RecordKind<NumberedFrame>(blank: NumberedFrame(seq: 0, frame: []), fields: [
        .field(10, \.seq, .i64("history frame seq")),
        .field(11, \.frame, .bytes),
    ])
}

// MARK: - The values the tables read into

extension HandOverState {
    /// What the payload is read into: the state, and what its globals say
    /// the connection records number, checked once all are read.
    struct Payload: Sendable {
        var state = HandOverState()
        /// What the globals say: tag 2 records (nil: not said), tag 4 records.
        var saidConnections: UInt32?
        var saidWebSockets: UInt32 = 0
        /// Tag 4 records read so far.
        var webSocketsRead = 0

        /// Connections written as tag 4 records, and as tag 2 records.
        var webSocketConnections: Int { state.connections.reduce(0) { $0 + ($1.webSocket == nil ? 0 : 1) } }
        var plainConnections: Int { state.connections.count - webSocketConnections }
    }

    /// A moderation record as it travels: its hash field and value, bytes.
    struct ModerationText: Equatable, Sendable {
        var field: [UInt8] = []
        var value: [UInt8] = []
    }
}

extension HandOverState.ModerationText {
    init(_ m: ModerationRecord) { self.init(field: Array(m.field.utf8), value: Array(m.value.utf8)) }
}

extension HandOverState.Coder where Value == UTF8Validator {
    /// A WebSocket UTF-8 state (`UTF8Validator.packed`).
    static var utf8State: Self {
        HandOverState.Coder<[UInt8]>.bytes.validated({ b throws(HandOverState.DecodeError) in
            guard let u = UTF8Validator(packed: b) else { throw .damaged("WebSocket UTF-8 state \(b)") }
            return u
        }, { $0.packed })
    }
}
