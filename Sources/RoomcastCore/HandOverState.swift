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
///              tag 1: the globals (nested records)
///              tag 2: one connection (nested records)
///              tag 3: the cluster link (nested records), if any
///              tag 4: one WebSocket connection (the fields of tag 2 and
///                     its WebSocket record), a tag of its own so
///                     that a reader before it skips it (and closes or serves
///                     afresh the descriptor, instead of speaking LTB to it)
///              tag 5: one ban, mute or room setting (its hash field and
///                     value, ModerationWire.swift)
///              tag 6: one room's stream (name, epoch, seq, and
///                     each recent frame as a nested record of its seq and
///                     bytes; docs/protocol/positions.md §4, "Positions and resume")
///              tag 0x4901: one remembered Idempotency-Key (key,
///                     fingerprint, delivered, time left; docs/api.md)
///
/// Each kind of record is one table of fields in HandOverStateTables.swift
/// (tag, value coder, where the field lives), which one codec
/// (HandOverStateCodec.swift) writes and reads.
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
/// decoded by the tests of every later version;
/// `Tests/Fixtures/handover-state-golden.hex` pins the bytes of a state with
/// every field set (HandOverStateGoldenTests).
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
    /// The API's remembered Idempotency-Keys, oldest first
    /// (HandOverStateIdempotency.swift, record tag 0x4901); empty before
    /// they were added.
    public var idempotency: [IdempotencyEntry] = []

    /// What the cluster link carries over, so that the other daemons see the
    /// same daemon go on: its origin and, per room with members, its stream
    /// and the last number it gave (frames it could not publish meanwhile
    /// show as a gap, never as a new daemon).
    public struct Cluster: Equatable, Sendable {
        /// The daemon's origin id on the cluster channel (never 0).
        public var origin: UInt64
        /// The last stream id drawn (`ClusterStreams`).
        public var lastStream: UInt64
        /// Per room with members: its stream and last number.
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

        /// One room's publishing stream: its id and the last number given in it.
        public struct Stream: Equatable, Sendable {
            public var room: RoomName
            public var id: UInt64
            public var seq: UInt64
            /// A stream of `room`, its `id` and last number `seq`.
            public init(room: RoomName, id: UInt64, seq: UInt64) { self.room = room; self.id = id; self.seq = seq }
        }

        /// A link's carried state, with no return deadline (`returnByMs` nil).
        public init(origin: UInt64, lastStream: UInt64, streams: [Stream], positions: [ClusterSequenceTracker.Carried] = []) {
            self.origin = origin
            self.lastStream = lastStream
            self.streams = streams
            self.positions = positions
        }
    }

    /// A state with these fields, every other at its default.
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
        /// Not upgraded, every field at its default.
        public init() {}
    }

    /// Everything carried over for one connection. Times are durations
    /// ("time remaining"), never clock readings, so a reader need not share
    /// the writer's clock.
    public struct Record: Equatable, Sendable {
        /// Matches the connection's descriptor in the box (the writer's
        /// connection id).
        public var key: UInt64
        /// The protocol it speaks.
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
        /// The byte bucket, in milli-tokens as the frame bucket above.
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

        /// A record of connection `key`, every other field at its default.
        public init(key: UInt64) { self.key = key }
    }

    // MARK: - Format constants

    /// The first 4 bytes of every state.
    public static let magic: [UInt8] = Array("RCHO".utf8)
    /// The version `encode` writes.
    public static let currentVersion: UInt16 = 1
    static let headerSize = 24
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

    /// The CRC-32 of `bytes`.
    public static func checksum(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBytes { checksum($0) }
    }
}
