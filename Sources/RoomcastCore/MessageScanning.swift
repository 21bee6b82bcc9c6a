// Scanning a proto2 body (docs/protocol/ltb.md §3): field positions first, Strings only once
// the body is valid. Used by the decoding initializers and validateBody (Messages.swift).

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
    func expect(
        _ wireType: WireType, _ expected: WireType, _ context: String, _ field: Int, _ name: String
    ) throws(ProtoError) {
        guard wireType == expected else {
            throw .wrongWireType(
                message: context, field: field, name: name,
                wireType: Int(wireType.rawValue), expected: Int(expected.rawValue))
        }
    }

    mutating func readVarintField(
        _ wireType: WireType, _ context: String, _ field: Int, _ name: String
    ) throws(ProtoError) -> UInt64 {
        try expect(wireType, .varint, context, field, name)
        return try readVarint()
    }

    /// An int32 is a varint truncated to its low 32 bits, as Google does.
    mutating func readInt32(
        _ wireType: WireType, _ context: String, _ field: Int, _ name: String
    ) throws(ProtoError) -> Int32 {
        try expect(wireType, .varint, context, field, name)
        return Int32(truncatingIfNeeded: try readVarint())
    }

    mutating func readString(
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
    mutating func readUser(
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
func string(
    _ body: UnsafeRawBufferPointer, _ range: Range<Int>?, _ context: String, _ name: String
) throws(ProtoError) -> String {
    guard let range else { throw .missingRequired(message: context, name: name) }
    return decodeUTF8(body, range)
}

func decodeUTF8(_ body: UnsafeRawBufferPointer, _ range: Range<Int>) -> String {
    String(decoding: UnsafeRawBufferPointer(rebasing: body[range]), as: UTF8.self)
}

/// Runs a typed-throwing body on an array's bytes.
func withBytes<T>(
    _ array: [UInt8], _ body: (UnsafeRawBufferPointer) throws(ProtoError) -> T
) throws(ProtoError) -> T {
    let result = array.withUnsafeBytes { bytes in
        Result { () throws(ProtoError) -> T in try body(bytes) }
    }
    return try result.get()
}
