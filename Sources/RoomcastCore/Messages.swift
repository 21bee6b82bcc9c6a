// The three proto2 bodies of docs/protocol/ltb.md §3 (the original clients' IMMessage.proto):
//
//   message UserInfo    { required int32 level = 1; required string name = 2;
//                         required string iconURL = 3; optional string room = 4;
//                         optional string token = 5; optional bool positions = 6;
//                         optional string since_epoch = 7; optional int64 since_seq = 8; }
//   message ChatMessage { required UserInfo user = 1; required string text = 2; }
//   message GiftMessage { required UserInfo user = 1; required string giftname = 2;
//                         required string giftURL = 3; required int32 giftcount = 4; }
//   message Notice      { required string code = 1; optional string text = 2;
//                         optional int64 retry_after_ms = 3; optional int64 count = 4;
//                         optional string epoch = 5; optional int64 seq = 6; }
//
// Parsing matches Google's proto2 parser except where roomcast is stricter:
// - a repeated scalar or string field: the last one wins (as Google);
// - a repeated `user`: the occurrences are merged (as Google), and required
//   fields are checked after the merge;
// - unknown fields of wire types 0, 1, 2, 5 and groups are skipped (as Google);
// - STRICTER: a known field with the wrong wire type is an error. Google
//   (C++, and upb behind Python protobuf 7.36.2) keeps it as an unknown field,
//   which then usually leaves a required field missing anyway;
// - STRICTER: a missing required field is an error (Python's ParseFromString
//   accepts it and reports IsInitialized() == false);
// - STRICTER: every string occurrence must be valid UTF-8, including ones a
//   later occurrence overwrites (Python accepts invalid UTF-8 in proto2).
// Serialization writes fields in field-number order and omits a nil `room`,
// which is byte-identical to Google's SerializeToString().

/// Why a body is not a valid `UserInfo`, `ChatMessage` or `GiftMessage`.
/// Offsets are byte positions in the whole body, from 0.
public enum ProtoError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The body ends inside the varint (tag, integer or length) starting at `offset`.
    case truncatedVarint(offset: Int)
    /// The varint at `offset` has no final byte within 10 bytes.
    case varintTooLong(offset: Int)
    /// The tag at `offset` is longer than 5 bytes, above 2^32 - 1, or has field number 0.
    case invalidTag(offset: Int)
    /// The tag at `offset` has wire type 6 or 7, which do not exist.
    case invalidWireType(field: Int, wireType: Int, offset: Int)
    /// The payload at `offset` needs `length` bytes (a length prefix, or 4 or 8
    /// for fixed32/fixed64) but only `available` are left in the enclosing message.
    case truncatedField(field: Int, wireType: Int, offset: Int, length: UInt64, available: Int)
    /// An end-group tag at `offset` with no open group of the same field number.
    case unmatchedEndGroup(field: Int, offset: Int)
    /// The group starting at `offset` has no end-group tag before its message ends.
    case unterminatedGroup(field: Int, offset: Int)
    /// Groups and embedded messages nest deeper than 100 at `offset`.
    case nestingTooDeep(offset: Int)
    /// A known field arrived with the wrong wire type (see the file comment).
    /// `message` is e.g. "UserInfo" or "ChatMessage.user".
    case wrongWireType(message: String, field: Int, name: String, wireType: Int, expected: Int)
    /// A string field is not valid UTF-8; `offset` is the first bad byte.
    case invalidUTF8(message: String, field: Int, name: String, offset: Int)
    /// A required field is absent (after merging repeated `user` fields).
    case missingRequired(message: String, name: String)

    /// One line for the log, e.g. "UserInfo: required field 'iconURL' missing".
    public var description: String {
        switch self {
        case .truncatedVarint(let offset):
            "truncated varint at byte \(offset)"
        case .varintTooLong(let offset):
            "varint longer than 10 bytes at byte \(offset)"
        case .invalidTag(let offset):
            "malformed tag at byte \(offset) (over 5 bytes, over 32 bits, or field number 0)"
        case .invalidWireType(let field, let wireType, let offset):
            "field \(field): wire type \(wireType) does not exist (byte \(offset))"
        case .truncatedField(let field, let wireType, let offset, let length, let available):
            "truncated \(wireType == 2 ? "length-delimited" : wireType == 1 ? "fixed64" : "fixed32") field \(field)"
                + " at byte \(offset): needs \(length) bytes, \(available) left"
        case .unmatchedEndGroup(let field, let offset):
            "end-group tag for field \(field) without a matching start-group (byte \(offset))"
        case .unterminatedGroup(let field, let offset):
            "group field \(field) starting at byte \(offset) is not terminated"
        case .nestingTooDeep(let offset):
            "groups and messages nested more than \(maxDepth) deep at byte \(offset)"
        case .wrongWireType(let message, let field, let name, let wireType, let expected):
            "\(message) field \(field) (\(name)): wire type \(wireType), expected \(expected)"
        case .invalidUTF8(let message, let field, let name, let offset):
            "\(message) field \(field) (\(name)): invalid UTF-8 at byte \(offset)"
        case .missingRequired(let message, let name):
            "\(message): required field '\(name)' missing"
        }
    }
}

/// A chat user (docs/protocol/ltb.md §3): sent alone as the body of join/leave frames
/// and embedded as `user` in `ChatMessage` and `GiftMessage`.
public struct UserInfo: Equatable, Sendable {
    /// Field 1, required int32 (negative values are legal and take 10 bytes on the wire).
    public var level: Int32
    /// Field 2, required string.
    public var name: String
    /// Field 3, required string.
    public var iconURL: String
    /// Field 4, optional string: roomcast's extension naming the room; nil means
    /// the default room. Omitted from the encoding when nil.
    public var room: String?
    /// Field 5, optional string: the signed-join token of a join
    /// (docs/protocol/tokens.md §13). The daemon removes it before relaying.
    /// Omitted from the encoding when nil.
    public var token: String?
    /// Field 6, optional bool: a join asking for the notice `position`
    /// after each pass that carried its room's frames (docs/protocol/positions.md §4,
    /// "Positions and resume"). The daemon removes it before relaying.
    public var positions: Bool?
    /// Fields 7 (`since_epoch`, string) and 8 (`since_seq`, int64, absent:
    /// 0): a join resuming a room from the position it last had (§4). The
    /// daemon removes both before relaying; nil when field 7 is absent.
    public var since: RoomPosition?

    /// A user; `room` nil means the default room (docs/protocol/ltb.md §3).
    public init(level: Int32, name: String, iconURL: String, room: String? = nil, token: String? = nil,
                positions: Bool? = nil, since: RoomPosition? = nil) {
        self.level = level
        self.name = name
        self.iconURL = iconURL
        self.room = room
        self.token = token
        self.positions = positions
        self.since = since
    }

    /// Decodes a proto2 `UserInfo` body.
    /// - Throws: `ProtoError` if the body is malformed, lacks a required field,
    ///   has a known field with the wrong wire type, or a string that is not UTF-8.
    public init(protobuf body: UnsafeRawBufferPointer) throws(ProtoError) {
        var reader = ProtoReader(body)
        var fields = UserInfoFields()
        try fields.scan(&reader, context: "UserInfo", depth: maxDepth)
        self = try fields.build(body, context: "UserInfo")
    }

    /// Decodes a proto2 `UserInfo` body; see `init(protobuf:)` for what throws.
    public init(protobuf body: [UInt8]) throws(ProtoError) {
        self = try withBytes(body) { bytes throws(ProtoError) in try UserInfo(protobuf: bytes) }
    }

    /// The proto2 encoding, byte-identical to Google's `SerializeToString()`.
    public func serialized() -> [UInt8] {
        var writer = ProtoWriter(capacity: serializedSize)
        write(to: &writer)
        return writer.bytes
    }

    var serializedSize: Int {
        ProtoWriter.int32Size(field: 1, level)
            + ProtoWriter.lengthDelimitedSize(field: 2, length: name.utf8.count)
            + ProtoWriter.lengthDelimitedSize(field: 3, length: iconURL.utf8.count)
            + (room.map { ProtoWriter.lengthDelimitedSize(field: 4, length: $0.utf8.count) } ?? 0)
            + (token.map { ProtoWriter.lengthDelimitedSize(field: 5, length: $0.utf8.count) } ?? 0)
            + (positions == nil ? 0 : 2)
            + (since.map { ProtoWriter.lengthDelimitedSize(field: 7, length: $0.epoch.utf8.count) + 1 + ProtoWriter.varintSize(UInt64(bitPattern: $0.seq)) } ?? 0)
    }

    func write(to writer: inout ProtoWriter) {
        writer.writeInt32(1, level)
        writer.writeString(2, name)
        writer.writeString(3, iconURL)
        if let room { writer.writeString(4, room) }
        if let token { writer.writeString(5, token) }
        if let positions { writer.writeInt64(6, positions ? 1 : 0) }
        if let since {
            writer.writeString(7, since.epoch)
            writer.writeInt64(8, since.seq)
        }
    }

    /// Writes this as embedded message field `field`.
    func write(field: Int, to writer: inout ProtoWriter) {
        writer.writeTag(field, .lengthDelimited)
        writer.writeVarint(UInt64(serializedSize))
        write(to: &writer)
    }

    /// Equal when the fields are, strings byte for byte (proto2 strings are
    /// bytes on the wire; `String ==` would make NFC and NFD spellings of a
    /// name or room equal, see PeerText.swift).
    public static func == (a: UserInfo, b: UserInfo) -> Bool {
        a.level == b.level && sameBytes(a.name, b.name) && sameBytes(a.iconURL, b.iconURL) && sameBytes(a.room, b.room)
            && sameBytes(a.token, b.token) && a.positions == b.positions && a.since == b.since
    }

    /// Whether a join with these fields is relayed changed: it carries a
    /// field only the daemon reads (5-8, `removingDaemonFields`).
    public var hasDaemonFields: Bool { token != nil || positions != nil || since != nil }

    /// `body` (a valid UserInfo) without any of fields 5-8 (`token`,
    /// `positions`, `since_epoch`, `since_seq`: addressed to the daemon
    /// alone), every other byte as it was, in its order: the join the daemon
    /// relays (docs/protocol/ltb.md §3, §4, §13). Nil when `body` has none of
    /// them (relay it as it is) or is not well-formed protobuf.
    public static func removingDaemonFields(_ body: UnsafeRawBufferPointer) -> [UInt8]? {
        var reader = ProtoReader(body)
        var cut: [Range<Int>] = []
        do {
            while true {
                let start = reader.position
                guard let (field, wireType) = try reader.readTag() else { break }
                try reader.skip(field: field, wireType: wireType, depth: maxDepth)
                if (5...8).contains(field) { cut.append(start..<reader.position) }
            }
        } catch {
            return nil
        }
        guard !cut.isEmpty else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(body.count)
        var from = 0
        for r in cut {
            out.append(contentsOf: body[from..<r.lowerBound])
            from = r.upperBound
        }
        out.append(contentsOf: body[from...])
        return out
    }
}

/// A server notice (docs/protocol/notices.md §13): the body of a frame of type
/// `protocol.notice_type` the daemon sends to tell one client why it
/// refused something. Clients never send it.
public enum BodyKind: Sendable {
    /// Join (type 0) and leave (type 1).
    case userInfo
    /// Text (type 2).
    case chatMessage
    /// Gift (type 3).
    case giftMessage
}

/// Checks that `body` is a valid message of `kind` exactly as the decoding
/// initializers would (well-formed, required fields present, strings valid
/// UTF-8; docs/protocol/ltb.md §3) without building it: UTF-8 is validated in place and
/// nothing is allocated on success. The relay calls this on every type 0-3 frame.
/// - Throws: the `ProtoError` the matching `init(protobuf:)` would throw.
public func validateBody(_ kind: BodyKind, _ body: UnsafeRawBufferPointer) throws(ProtoError) {
    var reader = ProtoReader(body)
    switch kind {
    case .userInfo:
        var fields = UserInfoFields()
        try fields.scan(&reader, context: "UserInfo", depth: maxDepth)
        try fields.checkRequired(context: "UserInfo")
    case .chatMessage:
        var fields = ChatMessageFields()
        try fields.scan(&reader)
        try fields.checkRequired()
    case .giftMessage:
        var fields = GiftMessageFields()
        try fields.scan(&reader)
        try fields.checkRequired()
    }
}
