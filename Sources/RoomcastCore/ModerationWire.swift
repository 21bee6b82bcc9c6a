// ModerationWire.swift: how moderation (bans, mutes, room settings;
// docs/api.md "Moderation") is written into Redis and told to the other
// daemons of a cluster. Pure: no sockets, no clock.
//
// Everything is text an operator can read with redis-cli. Rooms, subs and
// reasons are percent-encoded (RFC 3986 §2.1; every byte but the
// unreserved ones), so no separator can occur inside them.
//
// - The hash `roomcast:NAME:moderation` holds every ban, mute and room
//   setting of the cluster, one field each:
//       ban:ROOM:SUB      -> "UNTIL_MS SET_MS REASON"
//       mute:ROOM:SUB     -> "UNTIL_MS SET_MS REASON"
//                            or "UNTIL_MS SET_MS !": removed at SET_MS
//       settings:ROOM     -> "SLOW_MODE_SECONDS SET_MS" (0: off)
//   UNTIL_MS and SET_MS are wall-clock ms since the epoch. A removal stays
//   in the hash until the entry would have expired, so that a daemon that
//   was cut off learns of it, and a hash that lost an entry (a Redis
//   restarted without persistence) is told it again by the daemons that
//   hold it. A daemon loads the hash (HGETALL) whenever its connections
//   come up; an expired entry is removed by the daemons that see it expire
//   (an HDEL only while the value is still the one that expired).
// - The channel `roomcast:NAME:control` carries the changes, one message
//   each, `ORIGIN set FIELD VALUE` (a removal too) or
//   `ORIGIN kick ROOM sub|name VALUE` (ORIGIN: the sender's 16 hex digits).
//   Daemons that predate it never subscribe to it.

/// Which list of a room an entry is on.
public enum ModerationKind: String, Sendable, CaseIterable {
    /// Refused joins; a member is removed at once.
    case ban
    /// Refused sends; the member stays.
    case mute
}

/// One ban or mute: `sub` (a signed join's subject) in `room`.
public struct ModerationKey: Hashable, Sendable {
    public var kind: ModerationKind
    public var room: RoomName
    /// The subject's bytes (compared as bytes, as `TokenClaims.sub`).
    public var sub: [UInt8]

    public init(_ kind: ModerationKind, room: RoomName, sub: [UInt8]) {
        self.kind = kind
        self.room = room
        self.sub = sub
    }

    /// The hash field: `ban:ROOM:SUB`, percent-encoded.
    public var field: String { "\(kind.rawValue):\(percentEncoded(room.bytes)):\(percentEncoded(sub))" }
}

/// A record of the moderation hash, or a change on the control channel.
public enum ModerationRecord: Equatable, Sendable {
    /// A ban or mute until `untilMs`, set at `setMs` (wall-clock ms).
    case entry(ModerationKey, untilMs: Int64, setMs: Int64, reason: String)
    /// A room's slow mode (0: off), set at `setMs`.
    case settings(RoomName, slowModeSeconds: Int, setMs: Int64)
    /// A ban or mute removed at `setMs` that was in force until `untilMs`.
    case removed(ModerationKey, untilMs: Int64, setMs: Int64)

    /// The hash field.
    public var field: String {
        switch self {
        case .entry(let key, _, _, _), .removed(let key, _, _): key.field
        case .settings(let room, _, _): "settings:" + percentEncoded(room.bytes)
        }
    }

    /// The hash value.
    public var value: String {
        switch self {
        case .entry(_, let until, let set, let reason): "\(until) \(set) \(percentEncoded(Array(reason.utf8)))"
        case .settings(_, let seconds, let set): "\(seconds) \(set)"
        case .removed(_, let until, let set): "\(until) \(set) !"
        }
    }

    public var setMs: Int64 {
        switch self {
        case .entry(_, _, let set, _), .settings(_, _, let set), .removed(_, _, let set): set
        }
    }

    /// Until when an entry or removal matters, wall-clock ms (nil: a setting, always).
    public var untilMs: Int64? {
        switch self {
        case .entry(_, let until, _, _), .removed(_, let until, _): until
        case .settings: nil
        }
    }

    /// Slow mode's interval when on, in s (docs/api.md "Moderation"; 0 is off).
    public static let slowModeRange = 3...120
    /// A reason's length at most, in bytes (docs/api.md "Moderation").
    public static let maxReasonBytes = 512
    /// The longest ban or mute, in s: 14 days (docs/api.md "Moderation";
    /// the API refuses `seconds` over it with 422).
    public static let maxSeconds = 1_209_600

    /// Decodes a field and its value; nil when either is not ours (the
    /// field names an unknown kind, a part is not percent-encoded text, a
    /// number is not one) or is outside what the API writes (docs/api.md
    /// "Moderation"): a slow mode other than 0 or 3 ... 120 s, a time
    /// before the epoch, a reason over `maxReasonBytes`, a ban or mute in
    /// force for longer than `maxSeconds` after it was set (the API writes
    /// `UNTIL_MS = SET_MS + seconds * 1000`; a removal keeps the `UNTIL_MS`
    /// of what it removed, which was set before it). The daemon's
    /// arithmetic relies on those bounds (a slow mode of 2^63 s overflowed
    /// its interval in ms; a ban until the year 285,000,000 was enforced,
    /// listed and kept). A reason that is not UTF-8 is decoded with
    /// replacement characters. What needs the clock is `refusal(wallMs:maxRoomBytes:)`'s.
    public init?(field: some Collection<UInt8>, value: some Collection<UInt8>) {
        let v = value.split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
        switch ModerationField(field) {
        case .settings(let room)?:
            guard v.count == 2, let seconds = Int(String(decoding: v[0], as: UTF8.self)),
                  seconds == 0 || Self.slowModeRange.contains(seconds),
                  let set = Int64(String(decoding: v[1], as: UTF8.self)), set >= 0 else { return nil }
            self = .settings(room, slowModeSeconds: seconds, setMs: set)
        case .entry(let key)?:
            guard v.count == 3, let until = Int64(String(decoding: v[0], as: UTF8.self)), until >= 0,
                  let set = Int64(String(decoding: v[1], as: UTF8.self)), set >= 0,
                  until - set <= Int64(Self.maxSeconds) * 1000 else { return nil }
            if v[2].elementsEqual("!".utf8) {
                self = .removed(key, untilMs: until, setMs: set)
                return
            }
            guard until > set, let reason = percentDecoded(v[2]), reason.count <= Self.maxReasonBytes else { return nil }
            self = .entry(key, untilMs: until, setMs: set, reason: String(decoding: reason, as: UTF8.self))
        case nil:
            return nil
        }
    }
}

/// What a hash field names: a ban or mute, or a room's settings.
public enum ModerationField: Equatable, Sendable {
    case entry(ModerationKey)
    case settings(RoomName)

    /// A sub's length at most, in bytes (docs/api.md "Moderation").
    public static let maxSubBytes = 1024

    /// Decodes `ban:ROOM:SUB`, `mute:ROOM:SUB` or `settings:ROOM`; nil when
    /// it is none of them, or its sub is over `maxSubBytes`.
    public init?(_ field: some Collection<UInt8>) {
        let f = field.split(separator: UInt8(ascii: ":"), omittingEmptySubsequences: false)
        guard let head = f.first.map({ String(decoding: $0, as: UTF8.self) }) else { return nil }
        if head == "settings" {
            guard f.count == 2, let room = percentDecoded(f[1]), !room.isEmpty else { return nil }
            self = .settings(RoomName(bytes: room))
            return
        }
        guard let kind = ModerationKind(rawValue: head), f.count == 3, let room = percentDecoded(f[1]), !room.isEmpty,
              let sub = percentDecoded(f[2]), !sub.isEmpty, sub.count <= Self.maxSubBytes else { return nil }
        self = .entry(ModerationKey(kind, room: RoomName(bytes: room), sub: sub))
    }
}

/// One message of the control channel.
public struct ControlMessage: Equatable, Sendable {
    public enum Operation: Equatable, Sendable {
        /// A record set (or replaced).
        case set(ModerationRecord)
        /// Remove the members of `room` whose sub (`bySub`) or name is `value`.
        case kick(RoomName, bySub: Bool, value: [UInt8])
    }

    /// The daemon that sent it (ClusterEnvelope's origin).
    public var origin: UInt64
    public var operation: Operation

    public init(origin: UInt64, _ operation: Operation) {
        self.origin = origin
        self.operation = operation
    }

    /// The message's bytes.
    public var encoded: [UInt8] {
        let head = ClusterEnvelope.hex(origin)
        switch operation {
        case .set(let r): return Array("\(head) set \(r.field) \(r.value)".utf8)
        case .kick(let room, let bySub, let value):
            return Array("\(head) kick \(percentEncoded(room.bytes)) \(bySub ? "sub" : "name") \(percentEncoded(value))".utf8)
        }
    }

    /// Decodes a message; nil when it is not one of ours.
    public init?(_ bytes: some Collection<UInt8>) {
        let parts = bytes.split(separator: UInt8(ascii: " "), maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].count == 16, let origin = UInt64(String(decoding: parts[0], as: UTF8.self), radix: 16) else {
            return nil
        }
        self.origin = origin
        let rest = parts[2]
        switch String(decoding: parts[1], as: UTF8.self) {
        case "set":
            let fv = rest.split(separator: UInt8(ascii: " "), maxSplits: 1, omittingEmptySubsequences: false)
            guard fv.count == 2, let record = ModerationRecord(field: fv[0], value: fv[1]) else { return nil }
            operation = .set(record)
        case "kick":
            let k = rest.split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
            guard k.count == 3, let room = percentDecoded(k[0]), !room.isEmpty, let value = percentDecoded(k[2]), !value.isEmpty else {
                return nil
            }
            let by = String(decoding: k[1], as: UTF8.self)
            guard by == "sub" || by == "name" else { return nil }
            operation = .kick(RoomName(bytes: room), bySub: by == "sub", value: value)
        default:
            return nil
        }
    }
}

/// Percent-encoding of every byte but the unreserved ones (RFC 3986 §2.3):
/// room bytes in an API cursor, rooms, subs and reasons in Redis.
public func percentEncoded(_ bytes: [UInt8]) -> String {
    var s = ""
    s.reserveCapacity(bytes.count)
    for c in bytes {
        if isUnreserved(c) { s.unicodeScalars.append(Unicode.Scalar(c)) } else { s += "%" + (c < 16 ? "0" : "") + String(c, radix: 16, uppercase: true) }
    }
    return s
}

/// Percent-decoding (RFC 3986 §2.1); nil when a `%` is not followed by two
/// hex digits or, when `strict`, a byte is neither that nor unreserved
/// (the inverse of `percentEncoded`).
public func percentDecoded(_ text: some Collection<UInt8>, strict: Bool = true) -> [UInt8]? {
    var out: [UInt8] = []
    let b = Array(text)
    out.reserveCapacity(b.count)
    var i = 0
    func hex(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: c - 0x30
        case 0x41...0x46: c - 0x37
        case 0x61...0x66: c - 0x57
        default: nil
        }
    }
    while i < b.count {
        if b[i] == 0x25 {
            guard i + 2 < b.count, let h = hex(b[i + 1]), let l = hex(b[i + 2]) else { return nil }
            out.append(h << 4 | l)
            i += 3
        } else {
            guard !strict || isUnreserved(b[i]) else { return nil }
            out.append(b[i])
            i += 1
        }
    }
    return out
}

/// ALPHA, DIGIT, `-`, `.`, `_`, `~` (RFC 3986 §2.3).
private func isUnreserved(_ c: UInt8) -> Bool {
    switch c {
    case 0x30...0x39, 0x41...0x5A, 0x61...0x7A, 0x2D, 0x2E, 0x5F, 0x7E: true
    default: false
    }
}
