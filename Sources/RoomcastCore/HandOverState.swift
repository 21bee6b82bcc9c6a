/// What one roomcastd process hands to the next across a restart or an
/// upgrade (docs/operations/restarts.md, "Restarts, upgrades and crashes"): per connection, everything the relay, the input and
/// output paths, the heartbeat wheels and the rate limits keep about it.
/// The descriptors themselves travel in a box (an AF_UNIX socketpair, see
/// RoomcastServer's `HandOverBox`); each is matched to its record by `key`.
///
/// ## The format (little-endian throughout)
///
///     header   magic "RCHO" (4) | version u16 | header bytes u16 (24)
///              | payload bytes u64 | CRC-32 of the payload u32 | 0 u32
///     payload  records: tag u16 | length u32 | value (length bytes)
///              tag 1: the globals (nested records, `GlobalTag`)
///              tag 2: one connection (nested records, `FieldTag`)
///              tag 3: the cluster link (nested records, `ClusterTag`), if any
///              tag 4: one WebSocket connection (the fields of tag 2 and
///                     its `FieldTag.webSocket` record), a tag of its own so
///                     that a reader before it skips it (and closes or serves
///                     afresh the descriptor, instead of speaking LTB to it)
///              tag 5: one ban, mute or room setting (`ModerationTag`: its
///                     hash field and value, ModerationWire.swift)
///              tag 6: one room's stream (`RoomTag`: name, epoch, seq, and
///                     each recent frame as a nested record of its seq and
///                     bytes; docs/protocol/positions.md §4, "Positions and resume")
///
/// Versioning rules, so that version N+1 reads version N:
/// - A reader skips records whose tag it does not know, and gives a field
///   that is absent its default. Adding a field is therefore NOT a new
///   version: an older reader ignores it, a newer one defaults it.
/// - A new version is for a change an older reader must not misread (a
///   field whose meaning or encoding changes). The decoder keeps a path for
///   every version it ever wrote; `decode` refuses a version above
///   `currentVersion` (`unknownVersion`), and the caller serves the
///   connections with fresh state.
/// - Header bytes past 24 (a larger `header bytes`) are skipped.
///
/// `Tests/Fixtures/handover-state-v1.bin` is a file written by version 1,
/// decoded by the tests of every later version.
///
/// Standard library only: the encoding is pure; the server writes the bytes
/// into a sealed memfd.
public struct HandOverState: Equatable, Sendable {
    /// The writer's monotonic clock, in ms, when it stopped reading: the
    /// reader (same machine, same clock) reports the gap from it.
    public var stoppedReadingMs: UInt64 = 0
    /// The writer's version string (`roomcastVersion`), for the log.
    public var writer: String = ""
    /// One record per connection handed over.
    public var connections: [Record] = []
    /// The FDNAME= of the box holding the connections' descriptors (absent
    /// before it was added: "box").
    public var boxName = "box"
    /// The socket options the writer set on its clients (`Socket.configureClient`),
    /// so that the reader sets them again only when they changed ("": unknown).
    public var socketOptions = ""
    /// The cluster link's identity and numbering (docs/protocol/across-daemons.md §12);
    /// nil: no cluster, or a writer before it was added.
    public var cluster: Cluster? = nil
    /// Bans, mutes and room settings in force (docs/api.md "Moderation");
    /// empty before they were added.
    public var moderation: [ModerationRecord] = []
    /// Each room's position and recent frames (docs/protocol/positions.md §4), so
    /// that positions survive the restart; empty before they were added
    /// (the next process then draws new epochs).
    public var rooms: [RoomStream] = []
    /// Hand-overs made since the daemon last started fresh or recovered
    /// from a crash, this one included (`roomcast_handovers_total`); 0 from
    /// a writer before it was added.
    public var handOvers: UInt64 = 0

    /// What the cluster link carries over, so that the other daemons see the
    /// same daemon go on: its origin and, per room with members, its stream
    /// and the last number it gave (frames it could not publish meanwhile
    /// show as a gap, never as a new daemon).
    public struct Cluster: Equatable, Sendable {
        public var origin: UInt64
        /// The last stream id drawn (`ClusterStreams`).
        public var lastStream: UInt64
        public var streams: [Stream]
        /// The receiving side's positions (`ClusterSequenceTracker.carried`).
        public var positions: [ClusterSequenceTracker.Carried] = []
        /// When the other daemons stop waiting for this one (the writer's
        /// CLOCK_MONOTONIC ms, which the reader on the same machine shares):
        /// the writer told them it hands over and is back by then
        /// (`[cluster] restart_grace`). A reader whose link comes up later
        /// announces its members again, since the others sent their leaves.
        /// nil: nothing announced (Redis was down), or an older writer.
        public var returnByMs: UInt64? = nil

        public struct Stream: Equatable, Sendable {
            public var room: RoomName
            public var id: UInt64
            public var seq: UInt64
            public init(room: RoomName, id: UInt64, seq: UInt64) { self.room = room; self.id = id; self.seq = seq }
        }

        public init(origin: UInt64, lastStream: UInt64, streams: [Stream], positions: [ClusterSequenceTracker.Carried] = []) {
            self.origin = origin
            self.lastStream = lastStream
            self.streams = streams
            self.positions = positions
        }
    }

    public init(stoppedReadingMs: UInt64 = 0, writer: String = "", connections: [Record] = []) {
        self.stoppedReadingMs = stoppedReadingMs
        self.writer = writer
        self.connections = connections
    }

    /// The protocol a connection speaks (RoomcastServer's `Dialect`).
    public enum Dialect: UInt8, Sendable {
        case ltb = 0
        case json = 1
        /// RFC 6455 (docs/protocol/websocket.md §15); its records carry `Record.webSocket`.
        case webSocket = 2
    }

    /// A WebSocket connection's protocol state (docs/protocol/websocket.md §15, RFC
    /// 6455), so that it goes on byte-exactly: its unconsumed bytes (a
    /// partial request head, or the start of a frame) are the record's
    /// `input`, the rest of a frame it was sent part of heads its `output`.
    public struct WebSocket: Equatable, Sendable {
        /// Upgraded (frames both ways); false: the HTTP upgrade request is
        /// still arriving, its bytes so far in `input`.
        public var upgraded = false
        /// The subprotocol spoken once upgraded.
        public var subprotocol: WebSocketSubprotocol = .json
        /// Connected to `/echo` (`[websocket] echo`): in no room.
        public var echo = false
        /// The frame decoder's state: a fragmented message so far, its
        /// UTF-8 state, how much of an incomplete text frame was checked.
        public var decoder = WebSocketDecoder.Carried()
        /// Time left for the upgrade to complete, in ms (5 s from accept);
        /// nil once upgraded.
        public var upgradeRemainingMs: UInt32? = nil
        /// Time until the server's next ping (`[websocket] ping_interval`),
        /// in ms; nil: unknown (the next process pings when it starts).
        public var nextPingMs: UInt32? = nil
        public init() {}
    }

    /// Everything carried over for one connection. Times are durations
    /// ("time remaining"), never clock readings, so a reader need not share
    /// the writer's clock.
    public struct Record: Equatable, Sendable {
        /// Matches the connection's descriptor in the box (the writer's
        /// connection id).
        public var key: UInt64
        public var dialect: Dialect = .ltb
        /// The peer, `1.2.3.4:P` or `[::1]:P`, as the writer logged it.
        public var peerAddress: String = ""
        /// The room it is in, its bytes as received; nil: none (it left).
        public var room: RoomName? = nil
        /// The UserInfo body of its last join (docs/protocol/rooms.md §4); nil: not joined.
        public var identity: [UInt8]? = nil
        /// A JSON client's nickname (docs/protocol/json.md §7); nil: none yet.
        public var nickname: String? = nil
        /// A partial input frame: bytes received, not yet a whole frame.
        public var input: [UInt8] = []
        /// Output owed to the peer: bytes the kernel had not taken.
        public var output: [UInt8] = []
        /// Time left before a heartbeat eviction, in ms; nil: no deadline.
        public var heartbeatRemainingMs: UInt32? = nil
        /// A JSON client's partial frame: time left to complete it, in ms; nil: none.
        public var partialFrameRemainingMs: UInt32? = nil
        /// Bad frames counted against `max_violations`.
        public var violations: UInt32 = 0
        /// The rate limits' token buckets, in milli-tokens; nil: no bucket.
        public var frameMilliTokens: Int64? = nil
        public var byteMilliTokens: Int64? = nil
        /// The peer had sent EOF: it has left its room and only its owed
        /// output is still being flushed.
        public var draining = false
        /// Bytes at the head of `output` that finish a frame the peer got
        /// only part of (0: `output` starts with a whole frame). Absent
        /// before this field was added: 0.
        public var tornBytes: UInt64 = 0
        /// How long the owed output had been above `output_soft_bytes`, in
        /// ms (docs/protocol/rooms.md §6: the slow-consumer clock goes on across a
        /// restart); nil: not above.
        public var softLimitElapsedMs: UInt32? = nil
        /// The verified claims of its last accepted token (TokenClaims.json;
        /// docs/protocol/tokens.md §13), nil: none. The next process recomputes the
        /// expiry from `exp`; the token itself is never kept.
        public var authClaims: TokenClaims? = nil
        /// A WebSocket connection's protocol state (`dialect` is
        /// `.webSocket`); nil for the other dialects. Absent before it was
        /// added: such writers closed their WebSocket connections instead.
        public var webSocket: WebSocket? = nil
        /// Its last join asked for the notice `position` (UserInfo field 6,
        /// docs/protocol/positions.md §4), which the relayed `identity` no longer carries.
        public var positions = false
        /// Texts withheld from it in its open shedding episode
        /// (docs/protocol/rooms.md §6, "Shedding"): the notice `skipped` it gets
        /// once caught up counts them too. 0: none; absent before it was added.
        public var textsShed: UInt32 = 0
        /// When it last had a text relayed, on the writer's CLOCK_MONOTONIC
        /// in ms (the same clock across exec on one boot, as
        /// `stoppedReadingMs`): slow mode's interval goes on across a restart
        /// (docs/api.md "Moderation"). nil: none, or a writer before it was added.
        public var lastTextMs: UInt64? = nil

        public init(key: UInt64) { self.key = key }
    }

    // MARK: - Format constants

    public static let magic: [UInt8] = Array("RCHO".utf8)
    /// The version `encode` writes.
    public static let currentVersion: UInt16 = 1
    static let headerSize = 24

    enum RecordTag: UInt16 {
        case globals = 1
        case connection = 2
        case cluster = 3
        case webSocketConnection = 4
        case moderation = 5
        case room = 6
    }

    enum RoomTag: UInt16 {
        case name = 1, epoch, seq, frame
        /// Inside a frame record.
        case frameSeq = 10, frameBytes
    }

    enum ModerationTag: UInt16 {
        case field = 1, value
    }

    enum ClusterTag: UInt16 {
        case origin = 1, lastStream, stream
        /// A tracker position: room, origin (`positionOrigin`), id (its stream), seq.
        case position = 4
        /// `Cluster.returnByMs` (an older reader skips it).
        case returnBy = 5
        /// Inside a stream or position record.
        case room = 10, id, seq, positionOrigin
    }

    enum GlobalTag: UInt16 {
        case stoppedReadingMs = 1
        case writer = 2
        /// The number of connection records, a cross-check.
        case connectionCount = 3
        case boxName = 4
        case socketOptions = 5
        case handOvers = 6
        /// The number of WebSocket connection records (tag 4), a cross-check;
        /// far from the sequence above, so that tags other changes add there cannot collide.
        case webSocketCount = 0x5701
    }

    enum WebSocketTag: UInt16 {
        case upgraded = 1, subprotocol, echo, messageOpcode, message, utf8, checkedOfPartialFrame, partialUTF8
        case upgradeRemainingMs, nextPingMs
    }

    enum FieldTag: UInt16 {
        case key = 1, dialect, peerAddress, room, identity, nickname, input, output
        case heartbeatRemainingMs, partialFrameRemainingMs, violations, frameMilliTokens, byteMilliTokens, draining
        case tornBytes = 15, softLimitElapsedMs = 16
        /// Signed joins: far from the sequence above, so fields other changes add there cannot collide with it.
        case authClaims = 0x4101
        /// Positions (docs/protocol/positions.md §4): far from the others for the same reason.
        case positions = 0x5001
        /// Texts shed in the open episode: far from the others for the same reason.
        case textsShed = 0x5E01
        /// Slow mode's last text time: far from the others for the same reason.
        case lastTextMs = 0x5801
        /// A WebSocket connection's state (nested records, `WebSocketTag`).
        case webSocket = 0x5701

        /// More than the number of fields (tags need not be dense).
        static let allCount = 32
    }

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

    // MARK: - Encoding

    /// At least the bytes `encode` writes for one connection with fields of
    /// these sizes (in bytes), so that a writer can keep a state under what
    /// its reader accepts before it encodes anything.
    public static func recordBytesBound(address: Int, room: Int, identity: Int, nickname: Int, input: Int, output: Int,
                                        claims: Int = 0, webSocketMessage: Int = 0) -> Int {
        // 6 per record header, 8 per integer, every field present.
        6 + FieldTag.allCount * 14 + address + room + identity + nickname + input + output + claims
            + (webSocketMessage > 0 ? 6 + 16 * 14 + webSocketMessage : 0)
    }

    /// At least the bytes `encode` writes for the cluster record `c`: its
    /// header, three integers, and per stream a header, the room's bytes and
    /// two integers.
    /// At least the bytes of the moderation records.
    public static func moderationBytesBound(_ records: [ModerationRecord]) -> Int {
        records.reduce(0) { $0 + 3 * 6 + $1.field.utf8.count + $1.value.utf8.count }
    }

    /// At least the bytes of the room stream records.
    public static func roomsBytesBound(_ rooms: [RoomStream]) -> Int {
        rooms.reduce(0) { $0 + 6 + 3 * 14 + 6 + $1.room.bytes.count + $1.position.epoch.utf8.count
            + $1.history.reduce(0) { $0 + 3 * 6 + 8 + $1.frame.count } }
    }

    public static func clusterBytesBound(_ c: Cluster) -> Int {
        c.streams.reduce(6 + 3 * 14) { $0 + 6 + 6 + $1.room.bytes.count + 2 * 14 }
            + c.positions.reduce(0) { $0 + 6 + 6 + $1.room.bytes.count + 3 * 14 }
    }

    /// At least the bytes of the header and the globals, with `writer`
    /// bytes of text in them (version, box name, socket options).
    public static func globalsBytesBound(writer: Int) -> Int { headerSize + 6 + 16 * 14 + writer }

    /// The bytes of this state in the current version. O(total size): one
    /// buffer, records written in place and their lengths patched after.
    public func encode() -> [UInt8] {
        var w = Writer()
        w.bytes.reserveCapacity(Self.headerSize + 64 + connections.reduce(0) { $0 + 160 + $1.input.count + $1.output.count + ($1.identity?.count ?? 0) })
        w.bytes += Self.magic
        appendLE(&w.bytes, Self.currentVersion)
        appendLE(&w.bytes, UInt16(Self.headerSize))
        w.bytes += [UInt8](repeating: 0, count: Self.headerSize - 8)  // payload length and CRC, patched below
        w.nested(RecordTag.globals.rawValue) { w in
            w.u64(GlobalTag.stoppedReadingMs.rawValue, stoppedReadingMs)
            w.bytes(GlobalTag.writer.rawValue, writer.utf8)
            let webSockets = connections.reduce(0) { $0 + ($1.webSocket == nil ? 0 : 1) }
            w.u32(GlobalTag.connectionCount.rawValue, UInt32(connections.count - webSockets))
            if webSockets > 0 { w.u32(GlobalTag.webSocketCount.rawValue, UInt32(webSockets)) }
            w.bytes(GlobalTag.boxName.rawValue, boxName.utf8)
            w.bytes(GlobalTag.socketOptions.rawValue, socketOptions.utf8)
            if handOvers > 0 { w.u64(GlobalTag.handOvers.rawValue, handOvers) }
        }
        for c in connections {
            w.nested(c.webSocket == nil ? RecordTag.connection.rawValue : RecordTag.webSocketConnection.rawValue) { w in
                w.u64(FieldTag.key.rawValue, c.key)
                w.u8(FieldTag.dialect.rawValue, c.dialect.rawValue)
                w.bytes(FieldTag.peerAddress.rawValue, c.peerAddress.utf8)
                if let room = c.room { w.bytes(FieldTag.room.rawValue, room.bytes) }
                if let identity = c.identity { w.bytes(FieldTag.identity.rawValue, identity) }
                if let nickname = c.nickname { w.bytes(FieldTag.nickname.rawValue, nickname.utf8) }
                if !c.input.isEmpty { w.bytes(FieldTag.input.rawValue, c.input) }
                if !c.output.isEmpty { w.bytes(FieldTag.output.rawValue, c.output) }
                if let ms = c.heartbeatRemainingMs { w.u32(FieldTag.heartbeatRemainingMs.rawValue, ms) }
                if let ms = c.partialFrameRemainingMs { w.u32(FieldTag.partialFrameRemainingMs.rawValue, ms) }
                if c.violations > 0 { w.u32(FieldTag.violations.rawValue, c.violations) }
                if let t = c.frameMilliTokens { w.u64(FieldTag.frameMilliTokens.rawValue, UInt64(bitPattern: t)) }
                if let t = c.byteMilliTokens { w.u64(FieldTag.byteMilliTokens.rawValue, UInt64(bitPattern: t)) }
                if c.draining { w.u8(FieldTag.draining.rawValue, 1) }
                if c.tornBytes > 0 { w.u64(FieldTag.tornBytes.rawValue, c.tornBytes) }
                if let ms = c.softLimitElapsedMs { w.u32(FieldTag.softLimitElapsedMs.rawValue, ms) }
                if let claims = c.authClaims { w.bytes(FieldTag.authClaims.rawValue, claims.json) }
                if let ws = c.webSocket { w.nested(FieldTag.webSocket.rawValue) { w in Self.encode(ws, &w) } }
                if c.positions { w.u8(FieldTag.positions.rawValue, 1) }
                if c.textsShed > 0 { w.u32(FieldTag.textsShed.rawValue, c.textsShed) }
                if let ms = c.lastTextMs { w.u64(FieldTag.lastTextMs.rawValue, ms) }
            }
        }
        if let cluster {
            w.nested(RecordTag.cluster.rawValue) { w in
                w.u64(ClusterTag.origin.rawValue, cluster.origin)
                w.u64(ClusterTag.lastStream.rawValue, cluster.lastStream)
                if let by = cluster.returnByMs { w.u64(ClusterTag.returnBy.rawValue, by) }
                for s in cluster.streams {
                    w.nested(ClusterTag.stream.rawValue) { w in
                        w.bytes(ClusterTag.room.rawValue, s.room.bytes)
                        w.u64(ClusterTag.id.rawValue, s.id)
                        w.u64(ClusterTag.seq.rawValue, s.seq)
                    }
                }
                for p in cluster.positions {
                    w.nested(ClusterTag.position.rawValue) { w in
                        w.bytes(ClusterTag.room.rawValue, p.room.bytes)
                        w.u64(ClusterTag.positionOrigin.rawValue, p.origin)
                        w.u64(ClusterTag.id.rawValue, p.stream)
                        w.u64(ClusterTag.seq.rawValue, p.seq)
                    }
                }
            }
        }
        for m in moderation {
            w.nested(RecordTag.moderation.rawValue) { w in
                w.bytes(ModerationTag.field.rawValue, m.field.utf8)
                w.bytes(ModerationTag.value.rawValue, m.value.utf8)
            }
        }
        for room in rooms {
            w.nested(RecordTag.room.rawValue) { w in
                w.bytes(RoomTag.name.rawValue, room.room.bytes)
                w.bytes(RoomTag.epoch.rawValue, room.position.epoch.utf8)
                w.u64(RoomTag.seq.rawValue, UInt64(bitPattern: room.position.seq))
                for f in room.history {
                    w.nested(RoomTag.frame.rawValue) { w in
                        w.u64(RoomTag.frameSeq.rawValue, UInt64(bitPattern: f.seq))
                        w.bytes(RoomTag.frameBytes.rawValue, f.frame)
                    }
                }
            }
        }
        let payloadBytes = w.bytes.count - Self.headerSize
        let crc = w.bytes.withUnsafeBytes { CRC32.checksum(UnsafeRawBufferPointer(rebasing: $0[Self.headerSize...])) }
        w.patch(at: 8, UInt64(payloadBytes))
        w.patch(at: 16, crc)
        return w.bytes
    }

    private static func encode(_ ws: WebSocket, _ w: inout Writer) {
        w.u8(WebSocketTag.upgraded.rawValue, ws.upgraded ? 1 : 0)
        w.bytes(WebSocketTag.subprotocol.rawValue, ws.subprotocol.rawValue.utf8)
        if ws.echo { w.u8(WebSocketTag.echo.rawValue, 1) }
        let d = ws.decoder
        if let op = d.messageOpcode { w.u8(WebSocketTag.messageOpcode.rawValue, op.rawValue) }
        if !d.message.isEmpty { w.bytes(WebSocketTag.message.rawValue, d.message) }
        w.bytes(WebSocketTag.utf8.rawValue, d.utf8.packed)
        if d.checkedOfPartialFrame > 0 {
            w.u64(WebSocketTag.checkedOfPartialFrame.rawValue, UInt64(d.checkedOfPartialFrame))
            w.bytes(WebSocketTag.partialUTF8.rawValue, d.partialUTF8.packed)
        }
        if let ms = ws.upgradeRemainingMs { w.u32(WebSocketTag.upgradeRemainingMs.rawValue, ms) }
        if let ms = ws.nextPingMs { w.u32(WebSocketTag.nextPingMs.rawValue, ms) }
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

// MARK: - Records

/// Appends tag-length-value records to one buffer.
private struct Writer {
    var bytes: [UInt8] = []

    mutating func bytes(_ tag: UInt16, _ value: some Collection<UInt8>) {
        appendLE(&bytes, tag)
        appendLE(&bytes, UInt32(value.count))
        bytes += value
    }

    mutating func u8(_ tag: UInt16, _ v: UInt8) {
        appendLE(&bytes, tag)
        appendLE(&bytes, UInt32(1))
        bytes.append(v)
    }

    mutating func u32(_ tag: UInt16, _ v: UInt32) {
        appendLE(&bytes, tag)
        appendLE(&bytes, UInt32(4))
        appendLE(&bytes, v)
    }

    mutating func u64(_ tag: UInt16, _ v: UInt64) {
        appendLE(&bytes, tag)
        appendLE(&bytes, UInt32(8))
        appendLE(&bytes, v)
    }

    /// A record whose value is the records `body` writes, in place: its
    /// length is patched once they are written.
    mutating func nested(_ tag: UInt16, _ body: (inout Writer) -> Void) {
        appendLE(&bytes, tag)
        let lengthAt = bytes.count
        appendLE(&bytes, UInt32(0))
        body(&self)
        patch(at: lengthAt, UInt32(bytes.count - lengthAt - 4))
    }

    mutating func patch<T: FixedWidthInteger>(at offset: Int, _ value: T) {
        withUnsafeBytes(of: value.littleEndian) { v in
            for i in 0..<v.count { bytes[offset + i] = v[i] }
        }
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

private func appendLE<T: FixedWidthInteger>(_ out: inout [UInt8], _ value: T) {
    var v = value.littleEndian
    withUnsafeBytes(of: &v) { out.append(contentsOf: $0) }
}

private func readLE<T: FixedWidthInteger>(_ bytes: UnsafeRawBufferPointer, _ offset: Int, as: T.Type) -> T {
    T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
}

/// CRC-32 (IEEE 802.3, the polynomial of zlib and PNG), table-driven: a
/// damaged hand-over state is found before any of it is believed.
public enum CRC32 {
    private static let table: [UInt32] = (0..<256).map { n in
        var c = UInt32(n)
        for _ in 0..<8 { c = c & 1 != 0 ? 0xEDB8_8320 ^ (c >> 1) : c >> 1 }
        return c
    }

    /// The CRC-32 of `bytes` ("123456789" gives 0xCBF43926).
    public static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        table.withUnsafeBufferPointer { t in
            for b in bytes { crc = t[Int((crc ^ UInt32(b)) & 0xFF)] ^ (crc >> 8) }
        }
        return crc ^ 0xFFFF_FFFF
    }

    public static func checksum(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBytes { checksum($0) }
    }
}
