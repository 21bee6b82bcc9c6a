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
public struct Notice: Equatable, Sendable {
    /// Field 1, required string: a stable snake_case code (`token_invalid` ...).
    public var code: String
    /// Field 2, optional string: a sentence for a human (never a token).
    public var text: String?
    /// Field 3, optional int64: when a retry may succeed, in ms (nil: no hint).
    public var retryAfterMs: Int64?
    /// Field 4, optional int64: how many times this happened (e.g. violations so far).
    public var count: Int64?
    /// Fields 5 (`epoch`, string) and 6 (`seq`, int64): a room's position
    /// (notices `history`, `history_lost`, `position`; docs/protocol/positions.md §4).
    /// Decoded only when field 5 is present (field 6 absent: 0).
    public var position: RoomPosition?

    public init(code: String, text: String? = nil, retryAfterMs: Int64? = nil, count: Int64? = nil, position: RoomPosition? = nil) {
        self.code = code
        self.text = text
        self.retryAfterMs = retryAfterMs
        self.count = count
        self.position = position
    }

    /// The proto2 encoding in field-number order, as Google's `SerializeToString()`.
    public func serialized() -> [UInt8] {
        var writer = ProtoWriter(capacity: code.utf8.count + (text?.utf8.count ?? 0) + 30)
        writer.writeString(1, code)
        if let text { writer.writeString(2, text) }
        if let retryAfterMs { writer.writeInt64(3, retryAfterMs) }
        if let count { writer.writeInt64(4, count) }
        if let position {
            writer.writeString(5, position.epoch)
            writer.writeInt64(6, position.seq)
        }
        return writer.bytes
    }

    /// Decodes a Notice body (clients; tests).
    /// - Throws: `ProtoError` when malformed, a known field has the wrong
    ///   wire type, a string is not UTF-8, or `code` is missing.
    public init(protobuf body: [UInt8]) throws(ProtoError) {
        let result = body.withUnsafeBytes { bytes in
            Result { () throws(ProtoError) -> Notice in
                var reader = ProtoReader(bytes)
                var code: String?
                var notice = Notice(code: "")
                var epoch: String?, seq: Int64 = 0
                while let (field, wireType) = try reader.readTag() {
                    switch field {
                    case 1: code = decodeUTF8(bytes, try reader.readString(wireType, "Notice", 1, "code"))
                    case 2: notice.text = decodeUTF8(bytes, try reader.readString(wireType, "Notice", 2, "text"))
                    case 3: notice.retryAfterMs = Int64(bitPattern: try reader.readVarintField(wireType, "Notice", 3, "retry_after_ms"))
                    case 4: notice.count = Int64(bitPattern: try reader.readVarintField(wireType, "Notice", 4, "count"))
                    case 5: epoch = decodeUTF8(bytes, try reader.readString(wireType, "Notice", 5, "epoch"))
                    case 6: seq = Int64(bitPattern: try reader.readVarintField(wireType, "Notice", 6, "seq"))
                    default: try reader.skip(field: field, wireType: wireType, depth: maxDepth)
                    }
                }
                guard let code else { throw .missingRequired(message: "Notice", name: "code") }
                notice.code = code
                notice.position = epoch.map { RoomPosition(epoch: $0, seq: seq) }
                return notice
            }
        }
        self = try result.get()
    }

    public static func == (a: Notice, b: Notice) -> Bool {
        sameBytes(a.code, b.code) && sameBytes(a.text, b.text) && a.retryAfterMs == b.retryAfterMs && a.count == b.count
            && a.position == b.position
    }
}

/// A text message (docs/protocol/ltb.md §2 type 2, §3).
public struct ChatMessage: Equatable, Sendable {
    /// Field 1, required embedded `UserInfo`.
    public var user: UserInfo
    /// Field 2, required string.
    public var text: String

    /// A text message from `user`.
    public init(user: UserInfo, text: String) {
        self.user = user
        self.text = text
    }

    /// Decodes a proto2 `ChatMessage` body.
    /// - Throws: `ProtoError` as `UserInfo.init(protobuf:)` does, for this message and its `user`.
    public init(protobuf body: UnsafeRawBufferPointer) throws(ProtoError) {
        var reader = ProtoReader(body)
        var fields = ChatMessageFields()
        try fields.scan(&reader)
        let user = try fields.checkedUser(body)
        let text = try string(body, fields.text, "ChatMessage", "text")
        self.init(user: user, text: text)
    }

    /// Decodes a proto2 `ChatMessage` body; see `init(protobuf:)` for what throws.
    public init(protobuf body: [UInt8]) throws(ProtoError) {
        self = try withBytes(body) { bytes throws(ProtoError) in try ChatMessage(protobuf: bytes) }
    }

    /// The proto2 encoding, byte-identical to Google's `SerializeToString()`.
    public func serialized() -> [UInt8] {
        let userSize = user.serializedSize
        var writer = ProtoWriter(
            capacity: ProtoWriter.lengthDelimitedSize(field: 1, length: userSize)
                + ProtoWriter.lengthDelimitedSize(field: 2, length: text.utf8.count))
        user.write(field: 1, to: &writer)
        writer.writeString(2, text)
        return writer.bytes
    }

    /// Equal when the fields are, strings byte for byte (see `UserInfo.==`).
    public static func == (a: ChatMessage, b: ChatMessage) -> Bool {
        a.user == b.user && sameBytes(a.text, b.text)
    }
}

/// A gift message (docs/protocol/ltb.md §2 type 3, §3).
public struct GiftMessage: Equatable, Sendable {
    /// Field 1, required embedded `UserInfo`.
    public var user: UserInfo
    /// Field 2, required string.
    public var giftname: String
    /// Field 3, required string.
    public var giftURL: String
    /// Field 4, required int32 (negative values are legal and take 10 bytes on the wire).
    public var giftcount: Int32

    /// A gift of `giftcount` × `giftname` from `user`.
    public init(user: UserInfo, giftname: String, giftURL: String, giftcount: Int32) {
        self.user = user
        self.giftname = giftname
        self.giftURL = giftURL
        self.giftcount = giftcount
    }

    /// Decodes a proto2 `GiftMessage` body.
    /// - Throws: `ProtoError` as `UserInfo.init(protobuf:)` does, for this message and its `user`.
    public init(protobuf body: UnsafeRawBufferPointer) throws(ProtoError) {
        var reader = ProtoReader(body)
        var fields = GiftMessageFields()
        try fields.scan(&reader)
        let user = try fields.checkedUser(body)
        let giftname = try string(body, fields.giftname, "GiftMessage", "giftname")
        let giftURL = try string(body, fields.giftURL, "GiftMessage", "giftURL")
        guard let giftcount = fields.giftcount else {
            throw .missingRequired(message: "GiftMessage", name: "giftcount")
        }
        self.init(user: user, giftname: giftname, giftURL: giftURL, giftcount: giftcount)
    }

    /// Decodes a proto2 `GiftMessage` body; see `init(protobuf:)` for what throws.
    public init(protobuf body: [UInt8]) throws(ProtoError) {
        self = try withBytes(body) { bytes throws(ProtoError) in try GiftMessage(protobuf: bytes) }
    }

    /// The proto2 encoding, byte-identical to Google's `SerializeToString()`.
    public func serialized() -> [UInt8] {
        let userSize = user.serializedSize
        var writer = ProtoWriter(
            capacity: ProtoWriter.lengthDelimitedSize(field: 1, length: userSize)
                + ProtoWriter.lengthDelimitedSize(field: 2, length: giftname.utf8.count)
                + ProtoWriter.lengthDelimitedSize(field: 3, length: giftURL.utf8.count)
                + ProtoWriter.int32Size(field: 4, giftcount))
        user.write(field: 1, to: &writer)
        writer.writeString(2, giftname)
        writer.writeString(3, giftURL)
        writer.writeInt32(4, giftcount)
        return writer.bytes
    }

    /// Equal when the fields are, strings byte for byte (see `UserInfo.==`).
    public static func == (a: GiftMessage, b: GiftMessage) -> Bool {
        a.user == b.user && sameBytes(a.giftname, b.giftname) && sameBytes(a.giftURL, b.giftURL) && a.giftcount == b.giftcount
    }
}

/// The message type a frame body should hold (docs/protocol/ltb.md §2: join and leave
/// carry `userInfo`, text `chatMessage`, gift `giftMessage`).
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

// MARK: - Scanning: field positions first, Strings only once the body is valid

/// Where each UserInfo field was found. A later occurrence overwrites an
/// earlier one, and scanning a second `user` into the same value merges them.
struct UserInfoFields {
    var level: Int32?
    var name: Range<Int>?
    var iconURL: Range<Int>?
    var room: Range<Int>?
    var token: Range<Int>?
    var positions: Bool?
    var sinceEpoch: Range<Int>?
    var sinceSeq: Int64?

    mutating func scan(_ reader: inout ProtoReader, context: String, depth: Int) throws(ProtoError) {
        while let (field, wireType) = try reader.readTag() {
            switch field {
            case 1: level = try reader.readInt32(wireType, context, 1, "level")
            case 2: name = try reader.readString(wireType, context, 2, "name")
            case 3: iconURL = try reader.readString(wireType, context, 3, "iconURL")
            case 4: room = try reader.readString(wireType, context, 4, "room")
            case 5: token = try reader.readString(wireType, context, 5, "token")
            case 6: positions = try reader.readVarintField(wireType, context, 6, "positions") != 0
            case 7: sinceEpoch = try reader.readString(wireType, context, 7, "since_epoch")
            case 8: sinceSeq = Int64(bitPattern: try reader.readVarintField(wireType, context, 8, "since_seq"))
            default: try reader.skip(field: field, wireType: wireType, depth: depth)
            }
        }
    }

    func checkRequired(context: String) throws(ProtoError) {
        if level == nil { throw .missingRequired(message: context, name: "level") }
        if name == nil { throw .missingRequired(message: context, name: "name") }
        if iconURL == nil { throw .missingRequired(message: context, name: "iconURL") }
    }

    func build(_ body: UnsafeRawBufferPointer, context: String) throws(ProtoError) -> UserInfo {
        try checkRequired(context: context)
        return UserInfo(
            level: level!,
            name: try string(body, name, context, "name"),
            iconURL: try string(body, iconURL, context, "iconURL"),
            room: room.map { decodeUTF8(body, $0) },
            token: token.map { decodeUTF8(body, $0) },
            positions: positions,
            since: sinceEpoch.map { RoomPosition(epoch: decodeUTF8(body, $0), seq: sinceSeq ?? 0) })
    }
}

struct ChatMessageFields {
    var user: UserInfoFields?
    var text: Range<Int>?

    mutating func scan(_ reader: inout ProtoReader) throws(ProtoError) {
        while let (field, wireType) = try reader.readTag() {
            switch field {
            case 1: try reader.readUser(wireType, "ChatMessage", "ChatMessage.user", into: &user)
            case 2: text = try reader.readString(wireType, "ChatMessage", 2, "text")
            default: try reader.skip(field: field, wireType: wireType, depth: maxDepth)
            }
        }
    }

    func checkRequired() throws(ProtoError) {
        guard let user else { throw .missingRequired(message: "ChatMessage", name: "user") }
        try user.checkRequired(context: "ChatMessage.user")
        if text == nil { throw .missingRequired(message: "ChatMessage", name: "text") }
    }

    func checkedUser(_ body: UnsafeRawBufferPointer) throws(ProtoError) -> UserInfo {
        try checkRequired()
        return try user!.build(body, context: "ChatMessage.user")
    }
}

struct GiftMessageFields {
    var user: UserInfoFields?
    var giftname: Range<Int>?
    var giftURL: Range<Int>?
    var giftcount: Int32?

    mutating func scan(_ reader: inout ProtoReader) throws(ProtoError) {
        while let (field, wireType) = try reader.readTag() {
            switch field {
            case 1: try reader.readUser(wireType, "GiftMessage", "GiftMessage.user", into: &user)
            case 2: giftname = try reader.readString(wireType, "GiftMessage", 2, "giftname")
            case 3: giftURL = try reader.readString(wireType, "GiftMessage", 3, "giftURL")
            case 4: giftcount = try reader.readInt32(wireType, "GiftMessage", 4, "giftcount")
            default: try reader.skip(field: field, wireType: wireType, depth: maxDepth)
            }
        }
    }

    func checkRequired() throws(ProtoError) {
        guard let user else { throw .missingRequired(message: "GiftMessage", name: "user") }
        try user.checkRequired(context: "GiftMessage.user")
        if giftname == nil { throw .missingRequired(message: "GiftMessage", name: "giftname") }
        if giftURL == nil { throw .missingRequired(message: "GiftMessage", name: "giftURL") }
        if giftcount == nil { throw .missingRequired(message: "GiftMessage", name: "giftcount") }
    }

    func checkedUser(_ body: UnsafeRawBufferPointer) throws(ProtoError) -> UserInfo {
        try checkRequired()
        return try user!.build(body, context: "GiftMessage.user")
    }
}

extension ProtoReader {
    private func expect(
        _ wireType: WireType, _ expected: WireType, _ context: String, _ field: Int, _ name: String
    ) throws(ProtoError) {
        guard wireType == expected else {
            throw .wrongWireType(
                message: context, field: field, name: name,
                wireType: Int(wireType.rawValue), expected: Int(expected.rawValue))
        }
    }

    fileprivate mutating func readVarintField(
        _ wireType: WireType, _ context: String, _ field: Int, _ name: String
    ) throws(ProtoError) -> UInt64 {
        try expect(wireType, .varint, context, field, name)
        return try readVarint()
    }

    /// An int32 is a varint truncated to its low 32 bits, as Google does.
    fileprivate mutating func readInt32(
        _ wireType: WireType, _ context: String, _ field: Int, _ name: String
    ) throws(ProtoError) -> Int32 {
        try expect(wireType, .varint, context, field, name)
        return Int32(truncatingIfNeeded: try readVarint())
    }

    fileprivate mutating func readString(
        _ wireType: WireType, _ context: String, _ field: Int, _ name: String
    ) throws(ProtoError) -> Range<Int> {
        try expect(wireType, .lengthDelimited, context, field, name)
        let range = try readLengthDelimited(field: field)
        if let bad = firstInvalidUTF8(bytes, range) {
            throw .invalidUTF8(message: context, field: field, name: name, offset: bad)
        }
        return range
    }

    /// Field 1 of ChatMessage and GiftMessage: merged into `user` if repeated.
    /// `userContext` is a literal such as "ChatMessage.user", so errors allocate nothing.
    fileprivate mutating func readUser(
        _ wireType: WireType, _ context: String, _ userContext: String,
        into user: inout UserInfoFields?
    ) throws(ProtoError) {
        try expect(wireType, .lengthDelimited, context, 1, "user")
        let range = try readLengthDelimited(field: 1)
        var inner = ProtoReader(bytes, from: range.lowerBound, to: range.upperBound)
        var fields = user ?? UserInfoFields()
        // The embedded message is one nesting level, as in upb.
        try fields.scan(&inner, context: userContext, depth: maxDepth - 1)
        user = fields
    }
}

/// The String at an already validated range; throws if the required field is absent.
private func string(
    _ body: UnsafeRawBufferPointer, _ range: Range<Int>?, _ context: String, _ name: String
) throws(ProtoError) -> String {
    guard let range else { throw .missingRequired(message: context, name: name) }
    return decodeUTF8(body, range)
}

private func decodeUTF8(_ body: UnsafeRawBufferPointer, _ range: Range<Int>) -> String {
    String(decoding: UnsafeRawBufferPointer(rebasing: body[range]), as: UTF8.self)
}

/// Runs a typed-throwing body on an array's bytes.
private func withBytes<T>(
    _ array: [UInt8], _ body: (UnsafeRawBufferPointer) throws(ProtoError) -> T
) throws(ProtoError) -> T {
    let result = array.withUnsafeBytes { bytes in
        Result { () throws(ProtoError) -> T in try body(bytes) }
    }
    return try result.get()
}
