// The Notice, ChatMessage and GiftMessage bodies of docs/protocol/ltb.md §3 (schema and
// parsing rules: Messages.swift).

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
