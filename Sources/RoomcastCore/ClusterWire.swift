// What the daemons of a cluster say to each other through Redis pub/sub
// (issue 14; docs/protocol/across-daemons.md §12): the channel names, the envelope around
// every relayed frame, and the sequence numbers that let a daemon drop late
// duplicates and count what it never received. Pure: no sockets, no Redis.

/// The channels of one cluster. Every name starts with `roomcast:NAME:`, so
/// clusters with different names can share one Redis. Room names go in as
/// their UTF-8 bytes (Redis channel names are binary-safe).
public struct ClusterChannels: Sendable {
    /// `roomcast:NAME:room:` as bytes.
    public let roomPrefix: [UInt8]
    /// `roomcast:NAME:hb:` as bytes.
    public let heartbeatPrefix: [UInt8]
    /// `roomcast:NAME:daemons`: every daemon's heartbeat, its bye and its hand-overs, for all the others.
    public let daemons: [UInt8]
    /// `roomcast:NAME:control`: moderation changes and kicks (ModerationWire.swift).
    public let control: [UInt8]
    /// `roomcast:NAME:moderation`: the key of the hash of bans, mutes and settings.
    public let moderation: [UInt8]

    public init(name: String) {
        roomPrefix = Array("roomcast:\(name):room:".utf8)
        heartbeatPrefix = Array("roomcast:\(name):hb:".utf8)
        daemons = Array("roomcast:\(name):daemons".utf8)
        control = Array("roomcast:\(name):control".utf8)
        moderation = Array("roomcast:\(name):moderation".utf8)
    }

    /// `roomcast:NAME:room:ROOM`: where every frame relayed to ROOM goes.
    public func room(_ room: RoomName) -> [UInt8] { roomPrefix + room.bytes }

    /// `roomcast:NAME:hb:ORIGIN` (16 lowercase hex digits): a daemon's
    /// heartbeat to itself, the proof that Redis still relays.
    public func heartbeat(origin: UInt64) -> [UInt8] { heartbeatPrefix + Array(ClusterEnvelope.hex(origin).utf8) }
}

/// The payload of every cluster message: one relayed frame, byte for byte
/// as the origin relayed it, with what a receiver needs around it.
/// Integers are little-endian. Version 1 (what every daemon reads):
///
///     offset size
///     0      1    version (1)
///     1      1    kind: 0 heartbeat, 1 LTB frame with a little-endian header, 2 big-endian,
///                 3 bye (the origin stops; no room, no frame),
///                 4 counts (the origin's members per room, `ClusterCounts`, in place of the frame)
///                 5 handing over (the origin handed its clients to systemd's fd store, for
///                   a restart or a stop it cannot tell apart: back within `seq` ms, or gone;
///                   no room, no frame)
///     2      2    room length R
///     4      1    address length A
///     5      8    origin: the sending daemon, a random number drawn at each start
///     13     8    stream: which run of the room at the origin (see `ClusterStreams`)
///     21     8    seq: 1, 2, 3 ... within the stream
///     29     R    room name (UTF-8)
///     29+R   A    the address of the client the frame came from, as its daemon saw it
///                 (`203.0.113.7:51234`, `[2001:db8::1]:51234`); JSON clients get it as `addr`
///     29+R+A      the frame: 6-byte header + body; for a heartbeat, the envelope
///                 versions its origin reads, one byte each (empty: 1 only)
///
/// Version 2 is version 1 with the sender's verified `sub` (signed joins,
/// docs/protocol/tokens.md §13) after the address: 2 bytes of sub length S at
/// offset 29 (so the room starts at 31), then room, address, the S bytes
/// of the sub (S = 0: no verified sub) and the frame. A version 1 decoder
/// refuses it, so a daemon sends it only while every daemon it hears
/// advertises version 2 in its heartbeat (docs/protocol/across-daemons.md §12).
public struct ClusterEnvelope: Equatable, Sendable {
    /// The form every daemon reads (and the one heartbeats, byes, counts
    /// and hand-overs always use).
    public static let version: UInt8 = 1
    /// The form that carries the sender's sub.
    public static let versionWithSub: UInt8 = 2
    /// Bytes before the room name (version 1).
    public static let fixedSize = 29
    /// Bytes before the room name in version 2 (the sub's length added).
    public static let fixedSizeWithSub = 31
    /// What this daemon's heartbeats carry in place of a frame: the
    /// versions it reads, one byte each.
    public static let readableVersions: [UInt8] = [version, versionWithSub]

    /// Whether a daemon whose heartbeat carried `advert` (its frame bytes)
    /// reads envelopes of `version`: every daemon reads version 1; a
    /// heartbeat with no bytes is one of a daemon that reads only that.
    public static func reads(_ version: UInt8, advert: UnsafeRawBufferPointer) -> Bool {
        version == Self.version || advert.contains(version)
    }

    public enum Kind: UInt8, Sendable {
        case heartbeat = 0
        case littleEndianFrame = 1
        case bigEndianFrame = 2
        case bye = 3
        /// The origin's viewer counts, on the daemons channel (`ClusterCounts`).
        case counts = 4
        /// The origin handed its clients over (a restart, or a stop under
        /// systemd): it is back within `seq` ms under the same origin, or
        /// gone (docs/protocol/across-daemons.md §12, "Leaves").
        case handingOver = 5

        /// The kind of a frame in `byteOrder`.
        public init(_ byteOrder: ByteOrder) { self = byteOrder == .little ? .littleEndianFrame : .bigEndianFrame }
    }

    /// A decoded envelope: views into the payload, valid as long as it is.
    public struct View {
        public var kind: Kind
        public var origin: UInt64
        public var stream: UInt64
        public var seq: UInt64
        public var room: UnsafeRawBufferPointer
        public var address: UnsafeRawBufferPointer
        /// The sender's verified sub (empty: none, or a version 1 envelope).
        public var sub: UnsafeRawBufferPointer
        public var frame: UnsafeRawBufferPointer
        /// 1 or 2.
        public var version: UInt8
    }

    /// Why a payload is not an envelope this daemon can use.
    public enum DecodeError: Error, Equatable, Sendable {
        case tooShort
        case unknownVersion(UInt8)
        case unknownKind(UInt8)
        /// The frame's header does not match the bytes after it.
        case badFrame
    }

    /// Appends the envelope of `frame` to `out` (emptied first, capacity
    /// kept), in version 1 (`sub` nil) or version 2 carrying `sub` (empty:
    /// the sender has no verified sub). Not generic: it is on the publish
    /// path of every frame, and an unspecialized generic append from
    /// another module goes byte by byte. An address over 255 bytes (never,
    /// for a numeric one) is cut; so is a sub over 65535 bytes (never: a
    /// token is at most a few KiB).
    public static func encode(kind: Kind, origin: UInt64, stream: UInt64, seq: UInt64, room: RoomName,
                              address: String, sub: String? = nil, frame: UnsafeRawBufferPointer, into out: inout [UInt8]) {
        let roomLength = room.bytes.count, addressLength = min(address.utf8.count, Int(UInt8.max))
        precondition(roomLength <= Int(UInt16.max))
        out.removeAll(keepingCapacity: true)
        out.append(sub == nil ? version : versionWithSub)
        out.append(kind.rawValue)
        withUnsafeBytes(of: UInt16(roomLength).littleEndian) { out.append(contentsOf: $0) }
        out.append(UInt8(addressLength))
        withUnsafeBytes(of: origin.littleEndian) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: stream.littleEndian) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: seq.littleEndian) { out.append(contentsOf: $0) }
        var subLength = 0
        if let sub {
            subLength = min(sub.utf8.count, Int(UInt16.max))
            withUnsafeBytes(of: UInt16(subLength).littleEndian) { out.append(contentsOf: $0) }
        }
        out.append(contentsOf: room.bytes)
        out.append(contentsOf: address.utf8.prefix(addressLength))
        if let sub, subLength > 0 { out.append(contentsOf: sub.utf8.prefix(subLength)) }
        out.append(contentsOf: frame)
    }

    /// Reads an envelope of version 1 or 2 without copying. A frame's
    /// 6-byte header must announce exactly the bytes that follow it (in
    /// the byte order `kind` names).
    public static func decode(_ p: UnsafeRawBufferPointer) -> Result<View, DecodeError> {
        guard p.count >= fixedSize else { return .failure(.tooShort) }
        let v = p[0]
        guard v == version || v == versionWithSub else { return .failure(.unknownVersion(v)) }
        guard let kind = Kind(rawValue: p[1]) else { return .failure(.unknownKind(p[1])) }
        let roomLength = Int(UInt16(littleEndian: p.loadUnaligned(fromByteOffset: 2, as: UInt16.self)))
        let addressLength = Int(p[4])
        var roomStart = fixedSize, subLength = 0
        if v == versionWithSub {
            guard p.count >= fixedSizeWithSub else { return .failure(.tooShort) }
            subLength = Int(UInt16(littleEndian: p.loadUnaligned(fromByteOffset: fixedSize, as: UInt16.self)))
            roomStart = fixedSizeWithSub
        }
        let addressStart = roomStart + roomLength
        let subStart = addressStart + addressLength
        let frameStart = subStart + subLength
        guard p.count >= frameStart else { return .failure(.tooShort) }
        let frame = UnsafeRawBufferPointer(rebasing: p[frameStart...])
        switch kind {
        case .heartbeat, .bye, .counts, .handingOver:
            break
        case .littleEndianFrame, .bigEndianFrame:
            let order: ByteOrder = kind == .littleEndianFrame ? .little : .big
            guard case .frame(_, let length) = FrameCodec.parse(frame, byteOrder: order, maxFrameBytes: Int.max),
                  FrameCodec.headerSize + length == frame.count else { return .failure(.badFrame) }
        }
        return .success(View(kind: kind,
                             origin: UInt64(littleEndian: p.loadUnaligned(fromByteOffset: 5, as: UInt64.self)),
                             stream: UInt64(littleEndian: p.loadUnaligned(fromByteOffset: 13, as: UInt64.self)),
                             seq: UInt64(littleEndian: p.loadUnaligned(fromByteOffset: 21, as: UInt64.self)),
                             room: UnsafeRawBufferPointer(rebasing: p[roomStart..<addressStart]),
                             address: UnsafeRawBufferPointer(rebasing: p[addressStart..<subStart]),
                             sub: UnsafeRawBufferPointer(rebasing: p[subStart..<frameStart]),
                             frame: frame, version: v))
    }

    /// The frame's header rewritten into `byteOrder` (same type and length):
    /// for a daemon whose clients use the other byte order.
    public static func convertHeader(_ frame: UnsafeRawBufferPointer, from: ByteOrder, to: ByteOrder, into out: inout [UInt8]) {
        out.removeAll(keepingCapacity: true)
        guard case .frame(let type, let length) = FrameCodec.parse(frame, byteOrder: from, maxFrameBytes: Int.max) else { return }
        FrameCodec.appendHeader(type: type, length: UInt32(length), byteOrder: to, to: &out)
        out.append(contentsOf: frame[FrameCodec.headerSize...])
    }

    /// 16 lowercase hex digits.
    public static func hex(_ v: UInt64) -> String {
        let s = String(v, radix: 16)
        return String(repeating: "0", count: 16 - s.count) + s
    }
}

/// The sending side's numbering. Each room this daemon has members in is a
/// stream with an id of its own (drawn from one counter, so a later run of
/// the same room always has a larger id) and its frames are numbered 1, 2, 3
/// ... within it. A frame this daemon could not publish (Redis down, output
/// over the limit) still takes its number, so the receivers see the gap.
/// A frame relayed to a room that has no member here any more (the last
/// member's leave) goes out alone, as a stream of one frame.
public struct ClusterStreams {
    public struct Stream {
        public var id: UInt64
        public var seq: UInt64 = 0
        /// The room's channel, made once per stream.
        public var channel: [UInt8]
    }

    private var streams: [RoomName: Stream] = [:]
    private var lastID: UInt64 = 0
    private let channels: ClusterChannels

    public init(channels: ClusterChannels) {
        self.channels = channels
    }

    /// Rooms with a stream: those with members here.
    public var count: Int { streams.count }

    /// The last stream id drawn.
    public var lastStreamID: UInt64 { lastID }

    /// `room`'s stream: its id and the last number drawn; nil: none.
    public func position(_ room: RoomName) -> (id: UInt64, seq: UInt64)? { streams[room].map { ($0.id, $0.seq) } }

    /// `room` got its first member here: a new stream (or the one carried
    /// over a restart for it, `restore`).
    public mutating func open(_ room: RoomName) {
        guard streams[room] == nil else { return }
        lastID += 1
        streams[room] = Stream(id: lastID, channel: channels.room(room))
    }

    /// The last stream id drawn, and every open stream: what a restart
    /// carries over (`HandOverState.Cluster`).
    public var snapshot: (lastID: UInt64, streams: [(room: RoomName, id: UInt64, seq: UInt64)]) {
        (lastID, streams.map { (room: $0.key, id: $0.value.id, seq: $0.value.seq) })
    }

    /// Takes over the numbering of the previous process: its streams go on
    /// where it stopped, and new ones are numbered after its last.
    public mutating func restore(lastID: UInt64, streams carried: [(room: RoomName, id: UInt64, seq: UInt64)]) {
        self.lastID = max(self.lastID, lastID)
        for s in carried {
            streams[s.room] = Stream(id: s.id, seq: s.seq, channel: channels.room(s.room))
            self.lastID = max(self.lastID, s.id)
        }
    }

    /// Drops the streams of rooms not in `keep` (carried over, but no member came back to them).
    public mutating func retain(_ keep: Set<RoomName>) {
        streams = streams.filter { keep.contains($0.key) }
    }

    /// `room` lost its last member here.
    public mutating func close(_ room: RoomName) {
        streams[room] = nil
    }

    /// The next number for a frame to `room`, with the room's channel.
    public mutating func next(_ room: RoomName) -> (stream: UInt64, seq: UInt64, channel: [UInt8]) {
        if streams[room] != nil {
            return withNext(&streams[room]!)
        }
        lastID += 1
        return (lastID, 1, channels.room(room))
    }

    private func withNext(_ s: inout Stream) -> (stream: UInt64, seq: UInt64, channel: [UInt8]) {
        s.seq += 1
        return (s.id, s.seq, s.channel)
    }
}

/// The receiving side: per room and origin, the last stream and number
/// delivered. Frames of one origin arrive in order over Redis, except after a
/// reconnect of its publisher (commands the old connection had sent may run
/// later): a frame at or behind the last one delivered is late and dropped,
/// so nothing is delivered twice and each sender's order holds; a frame
/// further ahead than the next counts the frames in between as lost.
public struct ClusterSequenceTracker {
    public enum Verdict: Equatable, Sendable {
        /// Deliver it; `missed` frames of its stream before it never arrived.
        case deliver(missed: UInt64)
        /// At or behind the last frame delivered from its origin: drop it.
        case late
    }

    private struct Position {
        var stream: UInt64
        var seq: UInt64
    }

    /// The last frame delivered from `origin` in `room`: what a restart
    /// carries over (`HandOverState.Cluster.positions`), so that the frames
    /// an origin published while no process of this daemon listened count
    /// as missed, where a fresh tracker would take them as never sent.
    public struct Carried: Equatable, Hashable, Sendable {
        public var room: RoomName
        public var origin: UInt64
        public var stream: UInt64
        public var seq: UInt64
        public init(room: RoomName, origin: UInt64, stream: UInt64, seq: UInt64) {
            self.room = room; self.origin = origin; self.stream = stream; self.seq = seq
        }
    }

    private var rooms: [RoomName: [UInt64: Position]] = [:]

    /// Rooms whose positions changed since `takeChanged` (only while
    /// `tracksChanges`: the crash path logs them once per loop turn).
    public var tracksChanges = false
    private var changedRooms: Set<RoomName> = []

    public init() {}

    /// Every position, in no particular order.
    public var carried: [Carried] {
        rooms.flatMap { room, origins in origins.map { Carried(room: room, origin: $0.key, stream: $0.value.stream, seq: $0.value.seq) } }
    }

    /// Takes over positions a previous process carried (`carried`); a
    /// position with stream 0 is none.
    public mutating func restore(_ positions: [Carried]) {
        for p in positions where p.stream != 0 { rooms[p.room, default: [:]][p.origin] = Position(stream: p.stream, seq: p.seq) }
    }

    /// Every position of each room changed since the last call (empty: the
    /// room has none any more, its positions were forgotten).
    public mutating func takeChanged() -> [RoomName: [Carried]] {
        guard !changedRooms.isEmpty else { return [:] }
        defer { changedRooms.removeAll(keepingCapacity: true) }
        var out: [RoomName: [Carried]] = [:]
        for room in changedRooms {
            out[room] = (rooms[room] ?? [:]).map { Carried(room: room, origin: $0.key, stream: $0.value.stream, seq: $0.value.seq) }
        }
        return out
    }

    /// Origins with state, over all rooms (for tests and the stats).
    public var count: Int { rooms.values.reduce(0) { $0 + $1.count } }

    /// Decides about one frame and remembers it if delivered. The first
    /// frame seen from an origin in a room starts its count: frames before
    /// it were sent before this daemon listened, not lost.
    public mutating func check(room: RoomName, origin: UInt64, stream: UInt64, seq: UInt64) -> Verdict {
        guard let last = rooms[room]?[origin] else {
            rooms[room, default: [:]][origin] = Position(stream: stream, seq: seq)
            if tracksChanges { changedRooms.insert(room) }
            return .deliver(missed: 0)
        }
        if stream < last.stream || (stream == last.stream && seq <= last.seq) { return .late }
        rooms[room]![origin] = Position(stream: stream, seq: seq)
        if tracksChanges { changedRooms.insert(room) }
        // A new run of the room at the origin: the frames of it before this one were lost.
        return .deliver(missed: stream == last.stream ? seq - last.seq - 1 : max(seq, 1) - 1)
    }

    /// `origin` is gone (it said bye, or was silent for `cluster.timeout`):
    /// its positions in every room. O(rooms).
    public mutating func forget(origin: UInt64) {
        for room in rooms.keys where rooms[room]![origin] != nil {
            rooms[room]![origin] = nil
            if tracksChanges { changedRooms.insert(room) }
            if rooms[room]!.isEmpty { rooms[room] = nil }
        }
    }

    /// This daemon stopped listening to `room` (its last member left): what
    /// is published there meanwhile is not lost to anyone here.
    public mutating func forget(room: RoomName) {
        if tracksChanges && rooms[room] != nil { changedRooms.insert(room) }
        rooms[room] = nil
    }
}
