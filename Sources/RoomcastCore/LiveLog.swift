/// The crash-path state (docs/operations/restarts.md, "Restarts, upgrades and crashes"): an append-only log of what a crash must
/// not lose, written into a memfd in systemd's fd store as things happen,
/// so that the process restarted after a SIGKILL, a watchdog abort or a trap
/// puts every client back in its room. Its connections' descriptors are in
/// a live box (RoomcastServer's `LiveStore`), keyed by the same serials.
///
/// What it keeps per connection: dialect, peer address, room and identity
/// (the join's UserInfo), the partial input frame (losing part of a frame
/// would desynchronise the stream), and the rest of a frame the kernel took
/// only part of (`torn`: the client must get it whole before anything
/// else). A WebSocket connection's session (upgrading or upgraded,
/// subprotocol, `/echo`) and its fragmented message in progress are kept
/// too, the fragments appended per read (`webSocketFragment`), the 101
/// answer as `torn` while it is owed. The daemon's bans, mutes and slow
/// modes are logged as they change (`moderation`). Owed whole frames, violations and rate limits live only in
/// memory and are lost in a crash (a restart carries them, `HandOverState`).
///
/// A partial input frame is logged as it grows: each read appends only its
/// new bytes (`inputAppend`), and a read that completes a frame replaces
/// it with what is left (`input`), so a frame trickled in n pieces costs
/// O(n) log bytes, not O(n²).
///
/// ## The format (little-endian)
///
///     header   magic "RCLV" (4) | version u16 | 0 u16 | generation u32
///              | 0 u32 | committed bytes u64 | 0 u64            (32 bytes)
///     records  length u32 (of what follows) | kind u8 | serial | payload
///              serial: u64 in version 2, u32 in version 1 (still read)
///
/// `committed` counts the record bytes after the header that are complete:
/// the writer copies a record first and moves `committed` after it, so a
/// process killed in the middle of a record leaves it out. A reader skips
/// record kinds it does not know (a newer writer's); the meaning of a known
/// kind never changes within a version.
public enum LiveLog {
    public static let magic: [UInt8] = Array("RCLV".utf8)
    /// The version the writer writes: 2 has 64-bit serials (a 32-bit serial
    /// wraps after 2^32 accepts and could name two live connections) and
    /// `inputAppend`, which a version 1 reader would skip, splicing frames.
    public static let version: UInt16 = 2
    public static let headerSize = 32
    /// Offset of the `committed` word in the header.
    public static let committedOffset = 16

    public enum Kind: UInt8 {
        /// A new connection: dialect u8 | address length u16 | address.
        case open = 1
        /// Its room and identity now: flags u8 (1: in a room, 2: joined)
        /// | room length u32 | room | identity length u32 | identity.
        case room = 2
        /// Its partial input frame now (empty: none): length u32 | bytes.
        case input = 3
        /// Bytes that extend its partial input frame: length u32 | bytes.
        case inputAppend = 6
        /// The rest of a frame the kernel took part of (empty: none): length u32 | bytes.
        case torn = 4
        /// It is gone (its descriptor may still be in the box: close it).
        case close = 5
        /// A WebSocket connection's session now (docs/protocol/websocket.md §15):
        /// flags u8 (1: upgraded, the 101 answer queued; 2: `/echo`)
        /// | subprotocol length u8 | subprotocol. An `open` of dialect
        /// webSocket starts upgrading, before any such record.
        case webSocket = 7
        /// Its fragmented message in progress now (RFC 6455 §5.4; opcode 0:
        /// none): opcode u8 | UTF-8 state (3, `UTF8Validator.packed`)
        /// | length u32 | payload so far.
        case webSocketMessage = 8
        /// Fragments that extend that message, unmasked: opcode u8 | UTF-8
        /// state after them (3) | length u32 | payload. Appended per read,
        /// so a message of n fragments costs O(n) log bytes, not O(n²).
        case webSocketFragment = 9
        /// Its verified claims now (signed joins, docs/protocol/tokens.md §13):
        /// length u32 | TokenClaims.json. Numbered apart from the sequence
        /// above, so kinds other changes add there cannot collide with it.
        case auth = 0x41
        /// The cluster link (docs/cluster.md), serial 0: this daemon's
        /// origin u64 | the last stream id drawn u64.
        case clusterOrigin = 0x51
        /// One room's stream as this daemon numbers it, serial 0: room
        /// length u32 | room | stream id u64 | last number u64 (id 0: none).
        /// Written before the publisher sends any frame numbered past it.
        case clusterStream = 0x52
        /// Every position of one room (`ClusterSequenceTracker`), serial 0:
        /// room length u32 | room | count u32 | count x (origin u64 |
        /// stream u64 | seq u64); replaces the room's earlier positions.
        case clusterPositions = 0x53
        /// A ban, mute, removal or room setting taken here (docs/api.md
        /// "Moderation"), serial 0: field length u32 | field | value length
        /// u32 | value, the record as Redis's moderation hash holds it
        /// (`ModerationRecord`); a later record of the same field replaces it.
        case moderation = 0x61
    }

    /// One connection as the log leaves it.
    public struct Connection: Equatable, Sendable {
        public var dialect: HandOverState.Dialect = .ltb
        public var peerAddress = ""
        public var room: RoomName?
        public var identity: [UInt8]?
        public var input: [UInt8] = []
        public var torn: [UInt8] = []
        /// The claims of its last accepted token; nil: none (or unreadable: served as tokenless).
        public var authClaims: TokenClaims?
        /// A WebSocket connection's session and fragmented message (nil for
        /// the other dialects); its `input` is a partial request head or
        /// frame, its `torn` the 101 answer while it is owed.
        public var webSocket: HandOverState.WebSocket?
        public init() {}
    }

    /// The 32-byte header of generation `generation`, nothing committed.
    public static func header(generation: UInt32) -> [UInt8] {
        var out = magic
        put(&out, version)
        put(&out, UInt16(0))
        put(&out, generation)
        put(&out, UInt32(0))
        put(&out, UInt64(0))
        put(&out, UInt64(0))
        return out
    }

    // MARK: - Records

    public static func open(_ serial: UInt64, dialect: HandOverState.Dialect, address: String) -> [UInt8] {
        let a = Array(address.utf8.prefix(Int(UInt16.max)))
        var payload: [UInt8] = [dialect.rawValue]
        put(&payload, UInt16(a.count))
        payload += a
        return record(.open, serial, payload)
    }

    public static func room(_ serial: UInt64, room: RoomName?, identity: [UInt8]?) -> [UInt8] {
        let r = room?.bytes ?? []
        let i = identity ?? []
        var payload: [UInt8] = [(room != nil ? 1 : 0) | (identity != nil ? 2 : 0)]
        put(&payload, UInt32(r.count))
        payload += r
        put(&payload, UInt32(i.count))
        payload += i
        return record(.room, serial, payload)
    }

    public static func input(_ serial: UInt64, _ bytes: some Collection<UInt8>) -> [UInt8] { bytesRecord(.input, serial, bytes) }

    public static func inputAppend(_ serial: UInt64, _ bytes: some Collection<UInt8>) -> [UInt8] { bytesRecord(.inputAppend, serial, bytes) }

    public static func torn(_ serial: UInt64, _ bytes: some Collection<UInt8>) -> [UInt8] { bytesRecord(.torn, serial, bytes) }

    public static func close(_ serial: UInt64) -> [UInt8] { record(.close, serial, []) }

    /// A WebSocket connection's phase, subprotocol and `/echo` (Kind.webSocket).
    public static func webSocket(_ serial: UInt64, upgraded: Bool, subprotocol: WebSocketSubprotocol, echo: Bool) -> [UInt8] {
        let name = Array(subprotocol.rawValue.utf8.prefix(255))
        var payload: [UInt8] = [(upgraded ? 1 : 0) | (echo ? 2 : 0), UInt8(name.count)]
        payload += name
        return record(.webSocket, serial, payload)
    }

    /// The whole fragmented message in progress (Kind.webSocketMessage; opcode nil: none).
    public static func webSocketMessage(_ serial: UInt64, opcode: WebSocketOpcode?, utf8: UTF8Validator, _ payload: some Collection<UInt8>) -> [UInt8] {
        messageRecord(.webSocketMessage, serial, opcode, utf8, payload)
    }

    /// Fragments that extend the message in progress (Kind.webSocketFragment).
    public static func webSocketFragment(_ serial: UInt64, opcode: WebSocketOpcode, utf8: UTF8Validator, _ payload: some Collection<UInt8>) -> [UInt8] {
        messageRecord(.webSocketFragment, serial, opcode, utf8, payload)
    }

    static func messageRecord(_ kind: Kind, _ serial: UInt64, _ opcode: WebSocketOpcode?, _ utf8: UTF8Validator,
                                      _ bytes: some Collection<UInt8>) -> [UInt8] {
        var payload: [UInt8] = [opcode?.rawValue ?? 0]
        payload.reserveCapacity(8 + bytes.count)
        payload += utf8.packed
        put(&payload, UInt32(bytes.count))
        payload += bytes
        return record(kind, serial, payload)
    }

    /// The verified claims of connection `serial` (Kind.auth).
    public static func auth(_ serial: UInt64, _ claims: TokenClaims) -> [UInt8] { bytesRecord(.auth, serial, claims.json) }

    /// This daemon's cluster origin and the last stream id it drew.
    public static func clusterOrigin(_ origin: UInt64, lastStream: UInt64) -> [UInt8] {
        var payload: [UInt8] = []
        put(&payload, origin)
        put(&payload, lastStream)
        return record(.clusterOrigin, 0, payload)
    }

    /// `room`'s stream here: its id and the last number drawn (id 0: none).
    public static func clusterStream(_ room: RoomName, id: UInt64, seq: UInt64) -> [UInt8] {
        var payload: [UInt8] = []
        put(&payload, UInt32(room.bytes.count))
        payload += room.bytes
        put(&payload, id)
        put(&payload, seq)
        return record(.clusterStream, 0, payload)
    }

    /// Every position of `room` now (`positions` all of that room).
    public static func clusterPositions(_ room: RoomName, _ positions: [ClusterSequenceTracker.Carried]) -> [UInt8] {
        var payload: [UInt8] = []
        put(&payload, UInt32(room.bytes.count))
        payload += room.bytes
        put(&payload, UInt32(positions.count))
        for p in positions {
            put(&payload, p.origin)
            put(&payload, p.stream)
            put(&payload, p.seq)
        }
        return record(.clusterPositions, 0, payload)
    }

    /// A moderation record taken here (Kind.moderation).
    public static func moderation(_ change: ModerationRecord) -> [UInt8] {
        let field = Array(change.field.utf8), value = Array(change.value.utf8)
        var payload: [UInt8] = []
        payload.reserveCapacity(8 + field.count + value.count)
        put(&payload, UInt32(field.count))
        payload += field
        put(&payload, UInt32(value.count))
        payload += value
        return record(.moderation, 0, payload)
    }

    static func bytesRecord(_ kind: Kind, _ serial: UInt64, _ bytes: some Collection<UInt8>) -> [UInt8] {
        var payload: [UInt8] = []
        payload.reserveCapacity(4 + bytes.count)
        put(&payload, UInt32(bytes.count))
        payload += bytes
        return record(kind, serial, payload)
    }

    static func record(_ kind: Kind, _ serial: UInt64, _ payload: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(13 + payload.count)
        put(&out, UInt32(9 + payload.count))
        out.append(kind.rawValue)
        put(&out, serial)
        return out + payload
    }

    static func put<T: FixedWidthInteger>(_ out: inout [UInt8], _ value: T) {
        withUnsafeBytes(of: value.littleEndian) { out.append(contentsOf: $0) }
    }

    static func get<T: FixedWidthInteger>(_ bytes: UnsafeRawBufferPointer, _ offset: Int, _: T.Type) -> T {
        T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
    }
}
