// The record kinds of the hand-over state, one table each (the format:
// HandOverState.swift; the codec that walks the tables:
// HandOverStateCodec.swift). A row is one field: its tag, its value coder
// (how its bytes read, the name its errors give it), where it lives (a get
// and a set closure) and the default left out (`omit:`). A row's place in
// its table is the order its record is written in.
//
// Carrying a new field is one row with a tag new to its table, e.g.
//     .field(0x6101, .u32("replays"), { $0.replays }, { $0.replays = $1 }, omit: 0),
// a reader before it skips the record; a writer before it leaves it out, and
// the field reads as its default. A new kind of record is a table and a row
// in `payload`.
//
// Tags run from 1 in each table. A field added beside other work takes a tag
// far from the sequence (0x4101 signed joins, 0x5001 positions, 0x5701
// WebSocket, 0x5801 slow mode, 0x5E01 shedding), so that fields added
// meanwhile on another branch cannot collide with it.
extension HandOverState {
    /// The payload's records (the format: HandOverState.swift), in the order they are written.
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
        .optional(3, cluster.coder, { $0.state.cluster }, { $0.state.cluster = $1 }),
        // One outside today's bounds (a ban an earlier release took from
        // Redis for 285,000,000 years) is dropped, not the state.
        .repeated(5, moderation.coder, { $0.state.moderation.map(ModerationText.init) }, { p, m in
            if let record = ModerationRecord(field: m.field, value: m.value) { p.state.moderation.append(record) }
        }),
        .repeated(6, room.coder, { $0.state.rooms }, { $0.state.rooms.append($1) }),
        // One outside the API's bounds, or past the cache's capacity, is dropped, not the state.
        .repeated(0x4901, idempotency.coder, { $0.state.idempotency }, { p, e in
            if e.isWellFormed && p.state.idempotency.count < IdempotencyEntry.maxEntries { p.state.idempotency.append(e) }
        }),
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
    /// of each tag (written from the connections, read into what the
    /// globals say: a cross-check that finds a record cut out).
    static let globals = RecordKind<Payload>(blank: Payload(), fields: [
        .field(1, .u64("stopped-reading time"), { $0.state.stoppedReadingMs }, { $0.state.stoppedReadingMs = $1 }),
        .field(2, .text("writer"), { $0.state.writer }, { $0.state.writer = $1 }),
        .field(3, .u32("connection count"), { UInt32($0.plainConnections) }, { $0.saidConnections = $1 }),
        .field(0x5701, .u32("WebSocket connection count"), { UInt32($0.webSocketConnections) }, { $0.saidWebSockets = $1 }, omit: 0),
        .field(4, .text("box name"), { $0.state.boxName }, { $0.state.boxName = $1 }),
        .field(5, .text("socket options"), { $0.state.socketOptions }, { $0.state.socketOptions = $1 }),
        .field(6, .u64("hand-over count"), { $0.state.handOvers }, { $0.state.handOvers = $1 }, omit: 0),
    ])

    /// Tags 2 and 4: one connection (`Record`).
    static let connection = RecordKind<Record>(blank: Record(key: 0), required: [1], missing: "a connection record without its key", fields: [
        .field(1, .u64("key"), { $0.key }, { $0.key = $1 }),
        .field(2, .dialect, { $0.dialect }, { $0.dialect = $1 }),
        .field(3, .text("peer address"), { $0.peerAddress }, { $0.peerAddress = $1 }),
        .optional(4, .room, { $0.room }, { $0.room = $1 }),
        .optional(5, .bytes, { $0.identity }, { $0.identity = $1 }),
        .optional(6, .text("nickname"), { $0.nickname }, { $0.nickname = $1 }),
        .field(7, .bytes, { $0.input }, { $0.input = $1 }, omit: []),
        .field(8, .bytes, { $0.output }, { $0.output = $1 }, omit: []),
        .optional(9, .u32("heartbeat time remaining"), { $0.heartbeatRemainingMs }, { $0.heartbeatRemainingMs = $1 }),
        .optional(10, .u32("partial frame time remaining"), { $0.partialFrameRemainingMs }, { $0.partialFrameRemainingMs = $1 }),
        .field(11, .u32("violations"), { $0.violations }, { $0.violations = $1 }, omit: 0),
        .optional(12, .i64("frame tokens"), { $0.frameMilliTokens }, { $0.frameMilliTokens = $1 }),
        .optional(13, .i64("byte tokens"), { $0.byteMilliTokens }, { $0.byteMilliTokens = $1 }),
        .field(14, .bool("draining"), { $0.draining }, { $0.draining = $1 }, omit: false),
        .field(15, .u64("torn bytes"), { $0.tornBytes }, { $0.tornBytes = $1 }, omit: 0),
        .optional(16, .u32("time over output_soft_bytes"), { $0.softLimitElapsedMs }, { $0.softLimitElapsedMs = $1 }),
        .optional(0x4101, .claims, { $0.authClaims }, { $0.authClaims = $1 }),
        .optional(0x5701, webSocket.coder, { $0.webSocket }, { $0.webSocket = $1 }),
        .field(0x5001, .bool("positions"), { $0.positions }, { $0.positions = $1 }, omit: false),
        .field(0x5E01, .u32("texts shed"), { $0.textsShed }, { $0.textsShed = $1 }, omit: 0),
        .optional(0x5801, .u64("last text time"), { $0.lastTextMs }, { $0.lastTextMs = $1 }),
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
        .field(1, .bool("WebSocket upgraded"), { $0.upgraded }, { $0.upgraded = $1 }),
        .field(2, .subprotocol, { $0.subprotocol }, { $0.subprotocol = $1 }),
        .field(3, .bool("WebSocket echo"), { $0.echo }, { $0.echo = $1 }, omit: false),
        .optional(4, .messageOpcode, { $0.decoder.messageOpcode }, { $0.decoder.messageOpcode = $1 }),
        .field(5, .bytes, { $0.decoder.message }, { $0.decoder.message = $1 }, omit: []),
        .field(6, .utf8State, { $0.decoder.utf8 }, { $0.decoder.utf8 = $1 }),
        // Both written only while part of a text frame is checked.
        .field(7, .count("WebSocket checked bytes"), { $0.decoder.checkedOfPartialFrame }, { $0.decoder.checkedOfPartialFrame = $1 },
               if: { $0.decoder.checkedOfPartialFrame > 0 }),
        .field(8, .utf8State, { $0.decoder.partialUTF8 }, { $0.decoder.partialUTF8 = $1 }, if: { $0.decoder.checkedOfPartialFrame > 0 }),
        .optional(9, .u32("WebSocket upgrade time remaining"), { $0.upgradeRemainingMs }, { $0.upgradeRemainingMs = $1 }),
        .optional(10, .u32("WebSocket time to the next ping"), { $0.nextPingMs }, { $0.nextPingMs = $1 }),
    ], check: { ws throws(DecodeError) in
        if ws.decoder.messageOpcode == nil && !ws.decoder.message.isEmpty { throw .damaged("a WebSocket message without its opcode") }
    })

    /// Tag 3: the cluster link (`Cluster`).
    static let cluster = RecordKind<Cluster>(blank: Cluster(origin: 0, lastStream: 0, streams: []), fields: [
        .field(1, .u64("cluster origin"), { $0.origin }, { $0.origin = $1 }),
        .field(2, .u64("cluster stream"), { $0.lastStream }, { $0.lastStream = $1 }),
        .optional(5, .u64("cluster return deadline"), { $0.returnByMs }, { $0.returnByMs = $1 }),
        .repeated(3, clusterStream.coder, { $0.streams }, { $0.streams.append($1) }),
        .repeated(4, clusterPosition.coder, { $0.positions }, { $0.positions.append($1) }),
    ], check: { c throws(DecodeError) in
        guard c.origin != 0 else { throw .damaged("a cluster record without its origin") }
    })

    /// Inside the cluster link, tag 3: one room's stream.
    static let clusterStream = RecordKind<Cluster.Stream>(blank: .init(room: RoomName(bytes: []), id: 0, seq: 0), fields: [
        .field(10, .room, { $0.room }, { $0.room = $1 }),
        .field(11, .u64("cluster stream id"), { $0.id }, { $0.id = $1 }),
        .field(12, .u64("cluster stream number"), { $0.seq }, { $0.seq = $1 }),
    ])

    /// Inside the cluster link, tag 4: one position of the receiving side.
    static let clusterPosition = RecordKind<ClusterSequenceTracker.Carried>(blank: .init(room: RoomName(bytes: []), origin: 0, stream: 0, seq: 0), fields: [
        .field(10, .room, { $0.room }, { $0.room = $1 }),
        .field(13, .u64("cluster position origin"), { $0.origin }, { $0.origin = $1 }),
        .field(11, .u64("cluster position stream"), { $0.stream }, { $0.stream = $1 }),
        .field(12, .u64("cluster position number"), { $0.seq }, { $0.seq = $1 }),
    ])

    /// Tag 5: one ban, mute or room setting, as its hash field and value (ModerationWire.swift).
    static let moderation = RecordKind<ModerationText>(blank: ModerationText(), required: [1, 2],
                                                       missing: "a moderation record that is not a field and its value", fields: [
        .field(1, .bytes, { $0.field }, { $0.field = $1 }),
        .field(2, .bytes, { $0.value }, { $0.value = $1 }),
    ])

    /// Tag 6: one room's stream (docs/protocol/positions.md §4).
    static let room = RecordKind<RoomStream>(blank: RoomStream(room: RoomName(bytes: []), position: RoomPosition(epoch: "", seq: 0), history: []),
                                             required: [1], missing: "a room record without its name or epoch", fields: [
        .field(1, .room, { $0.room }, { $0.room = $1 }),
        .field(2, .text("room epoch"), { $0.position.epoch }, { $0.position.epoch = $1 }),
        .field(3, .i64("room seq"), { $0.position.seq }, { $0.position.seq = $1 }),
        .repeated(4, roomFrame.coder, { $0.history }, { $0.history.append($1) }),
    ], check: { s throws(DecodeError) in
        guard !s.position.epoch.isEmpty else { throw .damaged("a room record without its name or epoch") }
    })

    /// Tag 0x4901: one remembered Idempotency-Key (HandOverStateIdempotency.swift).
    static let idempotency = RecordKind<IdempotencyEntry>(blank: IdempotencyEntry(key: [], fingerprint: [], delivered: 0, remainingMs: 0), fields: [
        .field(1, .bytes, { $0.key }, { $0.key = $1 }),
        .field(2, .bytes, { $0.fingerprint }, { $0.fingerprint = $1 }),
        .field(3, .u64("idempotency delivered count"), { $0.delivered }, { $0.delivered = $1 }),
        .field(4, .u32("idempotency time left"), { $0.remainingMs }, { $0.remainingMs = $1 }),
    ])

    /// Inside a room, tag 4: one recent frame.
    static let roomFrame = RecordKind<NumberedFrame>(blank: NumberedFrame(seq: 0, frame: []), fields: [
        .field(10, .i64("history frame seq"), { $0.seq }, { $0.seq = $1 }),
        .field(11, .bytes, { $0.frame }, { $0.frame = $1 }),
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

// MARK: - The coders that check what they read

extension HandOverState.Coder where Value == HandOverState.Dialect {
    /// A dialect, as its raw u8.
    static var dialect: Self {
        HandOverState.Coder<UInt8>.u8("dialect").validated({ b throws(HandOverState.DecodeError) in
            guard let d = HandOverState.Dialect(rawValue: b) else { throw .damaged("unknown dialect \(b)") }
            return d
        }, { $0.rawValue })
    }
}

extension HandOverState.Coder where Value == TokenClaims {
    /// Verified claims, as `TokenClaims.json`.
    static var claims: Self {
        HandOverState.Coder<[UInt8]>.bytes.validated({ b throws(HandOverState.DecodeError) in
            do { return try TokenClaims(json: b) } catch { throw .damaged("verified claims: \(error)") }
        }, { $0.json })
    }
}

extension HandOverState.Coder where Value == WebSocketSubprotocol {
    /// A WebSocket subprotocol, as its name.
    static var subprotocol: Self {
        HandOverState.Coder<String>.text("WebSocket subprotocol").validated({ name throws(HandOverState.DecodeError) in
            guard let p = WebSocketSubprotocol(rawValue: name) else { throw .damaged("unknown WebSocket subprotocol '\(name)'") }
            return p
        }, { $0.rawValue })
    }
}

extension HandOverState.Coder where Value == WebSocketOpcode {
    /// The opcode of a fragmented message: text or binary, as its raw u8.
    static var messageOpcode: Self {
        HandOverState.Coder<UInt8>.u8("WebSocket message opcode").validated({ b throws(HandOverState.DecodeError) in
            guard let op = WebSocketOpcode(rawValue: b), op == .text || op == .binary else {
                throw .damaged("a fragmented WebSocket message of opcode \(b)")
            }
            return op
        }, { $0.rawValue })
    }
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
