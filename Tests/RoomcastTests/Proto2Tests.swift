// Unit tests for the proto2 codec (docs/protocol/ltb.md §3). Golden bytes come from
// Google's protobuf 7.36.2 (Reference/proto_ref.py, "encode" op).
import Testing
@testable import RoomcastCore

// MARK: - Helpers shared with Proto2ReferenceTests

/// A decoded body of any of the three kinds.
enum Decoded: Equatable {
    case user(UserInfo), chat(ChatMessage), gift(GiftMessage)
}

/// Decodes `bytes` as `kind`, and checks `validateBody` gives the same verdict and error.
func decode(_ kind: BodyKind, _ bytes: [UInt8]) -> Result<Decoded, ProtoError> {
    let result: Result<Decoded, ProtoError> = Result { () throws(ProtoError) -> Decoded in
        switch kind {
        case .userInfo: .user(try UserInfo(protobuf: bytes))
        case .chatMessage: .chat(try ChatMessage(protobuf: bytes))
        case .giftMessage: .gift(try GiftMessage(protobuf: bytes))
        }
    }
    let validation = bytes.withUnsafeBytes { body in
        Result { () throws(ProtoError) in try validateBody(kind, body) }
    }
    switch (result, validation) {
    case (.success, .success): break
    case (.failure(let error), .failure(let validationError)):
        #expect(error == validationError, "validateBody and init disagree on \(hex(bytes))")
    default:
        Issue.record("validateBody and init disagree on \(hex(bytes)): \(result) vs \(validation)")
    }
    return result
}

func hex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef")
    return String(bytes.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 15)]] })
}

func bytes(_ hex: String) -> [UInt8] {
    let chars = Array(hex.utf8)
    func nibble(_ c: UInt8) -> UInt8 { c <= 57 ? c - 48 : (c | 0x20) - 87 }
    return stride(from: 0, to: chars.count, by: 2).map { nibble(chars[$0]) << 4 | nibble(chars[$0 + 1]) }
}

/// Wire-format builders for hand-made bodies.
func varint(_ value: UInt64) -> [UInt8] {
    var writer = ProtoWriter(capacity: 10)
    writer.writeVarint(value)
    return writer.bytes
}
func tag(_ field: Int, _ wireType: UInt8) -> [UInt8] { varint(UInt64(field) << 3 | UInt64(wireType)) }
func int32Field(_ field: Int, _ value: Int32) -> [UInt8] {
    tag(field, 0) + varint(UInt64(bitPattern: Int64(value)))
}
func lengthDelimited(_ field: Int, _ payload: [UInt8]) -> [UInt8] {
    tag(field, 2) + varint(UInt64(payload.count)) + payload
}
func stringField(_ field: Int, _ value: String) -> [UInt8] { lengthDelimited(field, Array(value.utf8)) }

// MARK: - Golden bytes and round trips

struct Golden: Sendable, CustomTestStringConvertible {
    let value: Decoded
    let hex: String
    var testDescription: String { hex }

    static let all: [Golden] = [
        Golden(
            value: .user(UserInfo(level: 5, name: "alice", iconURL: "http://x/a.png")),
            hex: "08051205616c6963651a0e687474703a2f2f782f612e706e67"),
        Golden(
            value: .user(UserInfo(level: -1, name: "", iconURL: "", room: "lobby")),
            hex: "08ffffffffffffffffff0112001a0022056c6f626279"),
        Golden(
            value: .chat(ChatMessage(user: UserInfo(level: 3, name: "李雷", iconURL: "u"), text: "hi 👋")),
            hex: "0a0d08031206e69d8ee99bb71a01751207686920f09f918b"),
        Golden(
            value: .gift(GiftMessage(
                user: UserInfo(level: 300, name: "bob", iconURL: "i", room: "r1"),
                giftname: "rose", giftURL: "g", giftcount: -2)),
            hex: "0a0f08ac021203626f621a0169220272311204726f73651a016720feffffffffffffffff01"),
        Golden(
            value: .gift(GiftMessage(
                user: UserInfo(level: .min, name: "", iconURL: ""), giftname: "", giftURL: "", giftcount: .max)),
            hex: "0a0f0880808080f8ffffffff0112001a0012001a0020ffffffff07"),
    ]
}

extension Decoded {
    var kind: BodyKind {
        switch self {
        case .user: .userInfo
        case .chat: .chatMessage
        case .gift: .giftMessage
        }
    }
    func serialized() -> [UInt8] {
        switch self {
        case .user(let m): m.serialized()
        case .chat(let m): m.serialized()
        case .gift(let m): m.serialized()
        }
    }
}

@Suite struct Proto2Tests {
    @Test(arguments: Golden.all) func goldenBytes(_ golden: Golden) throws {
        #expect(hex(golden.value.serialized()) == golden.hex)
        #expect(try decode(golden.value.kind, bytes(golden.hex)).get() == golden.value)
    }

    @Test func roundTripsOddValues() throws {
        let names = ["", "a", "👩‍👩‍👧‍👦", "\u{0}", "\u{10FFFF}\u{FFFF}\u{E000}", "é\u{301}", String(repeating: "长", count: 300)]
        for name in names {
            for level: Int32 in [0, 1, -1, 127, 128, .min, .max] {
                let user = UserInfo(level: level, name: name, iconURL: name + "x", room: level < 0 ? nil : name)
                let messages: [Decoded] = [
                    .user(user), .chat(ChatMessage(user: user, text: name)),
                    .gift(GiftMessage(user: user, giftname: name, giftURL: "", giftcount: level)),
                ]
                for message in messages {
                    #expect(try decode(message.kind, message.serialized()).get() == message)
                }
            }
        }
    }

    @Test func bufferAndArrayInitsAgree() throws {
        let body = bytes(Golden.all[3].hex)
        let fromBuffer = try body.withUnsafeBytes { buffer in try GiftMessage(protobuf: buffer) }
        #expect(try GiftMessage(protobuf: body) == fromBuffer)
    }

    // MARK: Truncation and required fields

    @Test(arguments: Golden.all) func truncationAtEveryByte(_ golden: Golden) {
        let full = bytes(golden.hex)
        for length in 0..<full.count {
            let prefix = Array(full[..<length])
            switch decode(golden.value.kind, prefix) {
            case .failure: break
            case .success(let value):
                // Only dropping the optional `room` as a whole leaves a valid UserInfo.
                guard case .user(var user) = golden.value else {
                    Issue.record("prefix \(hex(prefix)) accepted"); continue
                }
                user.room = nil
                #expect(value == .user(user) && prefix == user.serialized(), "prefix \(hex(prefix))")
            }
        }
    }

    @Test func missingRequiredFields() {
        let level = int32Field(1, 7), name = stringField(2, "n"), icon = stringField(3, "i")
        #expect(decode(.userInfo, name + icon) == .failure(.missingRequired(message: "UserInfo", name: "level")))
        #expect(decode(.userInfo, level + icon) == .failure(.missingRequired(message: "UserInfo", name: "name")))
        #expect(decode(.userInfo, level + name) == .failure(.missingRequired(message: "UserInfo", name: "iconURL")))
        #expect(decode(.userInfo, []) == .failure(.missingRequired(message: "UserInfo", name: "level")))

        let user = lengthDelimited(1, level + name + icon), text = stringField(2, "t")
        #expect(decode(.chatMessage, text) == .failure(.missingRequired(message: "ChatMessage", name: "user")))
        #expect(decode(.chatMessage, user) == .failure(.missingRequired(message: "ChatMessage", name: "text")))
        #expect(
            decode(.chatMessage, lengthDelimited(1, level + icon) + text)
                == .failure(.missingRequired(message: "ChatMessage.user", name: "name")))
        #expect(
            decode(.chatMessage, lengthDelimited(1, []) + text)
                == .failure(.missingRequired(message: "ChatMessage.user", name: "level")))

        let giftname = stringField(2, "g"), giftURL = stringField(3, "u"), count = int32Field(4, 1)
        let parts = [user, giftname, giftURL, count]
        for (index, missing) in ["user", "giftname", "giftURL", "giftcount"].enumerated() {
            var without = parts
            without.remove(at: index)
            #expect(
                decode(.giftMessage, without.flatMap { $0 })
                    == .failure(.missingRequired(message: "GiftMessage", name: missing)))
        }
        #expect(
            decode(.giftMessage, lengthDelimited(1, level + name) + giftname + giftURL + count)
                == .failure(.missingRequired(message: "GiftMessage.user", name: "iconURL")))
    }

    // MARK: Repeated fields: last wins, `user` merges

    @Test func repeatedFieldsLastWinsAndUserMerges() throws {
        let body = int32Field(1, 1) + stringField(2, "a") + stringField(3, "i") + int32Field(1, -5) + stringField(2, "b")
        #expect(try decode(.userInfo, body).get() == .user(UserInfo(level: -5, name: "b", iconURL: "i")))

        // The first `user` lacks iconURL, the second supplies it: valid after the merge.
        let chat = lengthDelimited(1, int32Field(1, 9) + stringField(2, "x") + stringField(4, "room"))
            + stringField(2, "first") + lengthDelimited(1, stringField(3, "icon") + stringField(2, "y"))
            + stringField(2, "second")
        let expected = UserInfo(level: 9, name: "y", iconURL: "icon", room: "room")
        #expect(try decode(.chatMessage, chat).get() == .chat(ChatMessage(user: expected, text: "second")))

        let gift = lengthDelimited(1, int32Field(1, 1)) + stringField(2, "g") + stringField(3, "u")
            + int32Field(4, 3) + lengthDelimited(1, stringField(2, "n") + stringField(3, "i")) + int32Field(4, 4)
        #expect(
            try decode(.giftMessage, gift).get()
                == .gift(GiftMessage(user: UserInfo(level: 1, name: "n", iconURL: "i"), giftname: "g", giftURL: "u", giftcount: 4)))
    }

    // MARK: Integers

    @Test func int32Encoding() throws {
        #expect(int32Field(1, -1) == bytes("08ffffffffffffffffff01"))
        #expect(UserInfo(level: -1, name: "", iconURL: "").serialized().count == 15)
        let rest = stringField(2, "") + stringField(3, "")
        func level(_ hexVarint: String) -> Result<Int32, ProtoError> {
            decode(.userInfo, bytes("08" + hexVarint) + rest).map { decoded -> Int32 in
                guard case .user(let user) = decoded else { return 0 }
                return user.level
            }
        }
        #expect(level("ffffffff0f") == .success(-1))  // 32-bit two's complement form, as Google accepts
        #expect(level("8080808010") == .success(0))  // 2^32 truncates to 0
        #expect(level("ffffffff07") == .success(.max))
        #expect(level("8100") == .success(1))  // non-minimal varint
        #expect(level("ffffffffffffffffff7f") == .success(-1))  // bits beyond 64 dropped, as Google does
        #expect(level("ffffffffffffffffffff01") == .failure(.varintTooLong(offset: 1)))
        #expect(level("8080808080808080808080") == .failure(.varintTooLong(offset: 1)))
        #expect(decode(.userInfo, [0x08, 0xFF]) == .failure(.truncatedVarint(offset: 1)))
    }

    // MARK: UTF-8

    static let invalidUTF8: [[UInt8]] = [
        [0x80], [0xBF], [0xC0, 0x80], [0xC1, 0xBF], [0xE0, 0x80, 0x80], [0xE0, 0x9F, 0xBF],
        [0xED, 0xA0, 0x80], [0xED, 0xBF, 0xBF], [0xF0, 0x80, 0x80, 0x80], [0xF0, 0x8F, 0xBF, 0xBF],
        [0xF4, 0x90, 0x80, 0x80], [0xF5, 0x80, 0x80, 0x80], [0xF8], [0xFE], [0xFF],
        [0xE6, 0x9D], [0xF0, 0x9F, 0x98], [0xF0, 0x80], [0xC3], [0xC3, 0x41], [0xE6, 0x41, 0x8E],
        [0x61, 0xF0, 0x9F, 0x98, 0x41],
    ]

    @Test(arguments: invalidUTF8) func rejectsInvalidUTF8(_ bad: [UInt8]) {
        let good = stringField(2, "n") + stringField(3, "i")
        let offset = 10 + bad.firstIndex { $0 >= 0x80 }!  // 8 bytes of fields, tag, length
        for (field, name) in [(2, "name"), (3, "iconURL"), (4, "room")] {
            let body = int32Field(1, 1) + good + lengthDelimited(field, bad)
            #expect(
                decode(.userInfo, body)
                    == .failure(.invalidUTF8(message: "UserInfo", field: field, name: name, offset: offset)))
        }
        // Even an occurrence a later one overwrites is rejected (stricter than Google).
        let overwritten = int32Field(1, 1) + lengthDelimited(2, bad) + good
        #expect(throws: ProtoError.self) { try UserInfo(protobuf: overwritten) }
        let chat = lengthDelimited(1, int32Field(1, 1) + good) + lengthDelimited(2, bad)
        #expect(throws: ProtoError.self) { try ChatMessage(protobuf: chat) }
        let nested = lengthDelimited(1, int32Field(1, 1) + good + lengthDelimited(4, bad)) + stringField(2, "t")
        guard case .failure(.invalidUTF8(message: "ChatMessage.user", field: 4, name: "room", _)) = decode(.chatMessage, nested) else {
            Issue.record("nested invalid UTF-8 not reported as ChatMessage.user room"); return
        }
    }

    @Test func utf8ValidatorMatchesStandardLibrary() {
        var sequence: [UInt8] = [0, 0, 0, 0]
        var checked = 0
        func check(_ count: Int) {
            let bytes = Array(sequence[..<count])
            let valid = bytes.withUnsafeBytes { firstInvalidUTF8($0, 0..<count) == nil }
            if valid != (String(validating: bytes, as: UTF8.self) != nil) {
                Issue.record("validator disagrees with the standard library on \(hex(bytes))")
            }
            checked += 1
        }
        for first in 0...255 {
            sequence[0] = UInt8(first)
            check(1)
            for second in 0...255 {
                sequence[1] = UInt8(second)
                check(2)
                guard first >= 0xE0 else { continue }
                for third: UInt8 in [0x41, 0x80, 0xBF, 0xC0] {
                    sequence[2] = third
                    check(3)
                    guard first >= 0xF0 else { continue }
                    for fourth: UInt8 in [0x41, 0x80, 0xBF, 0xC0] {
                        sequence[3] = fourth
                        check(4)
                    }
                }
            }
        }
        #expect(checked > 100_000)
    }

    // MARK: Wire types and unknown fields

    @Test func wrongWireTypesAreErrors() {
        let valid: [(Int, UInt8)] = [(1, 0), (2, 2), (3, 2), (4, 2)]
        let names = ["level", "name", "iconURL", "room"]
        for (field, expected) in valid {
            for wireType: UInt8 in [0, 1, 2, 3, 5] where wireType != expected {
                let payload: [UInt8] = switch wireType {
                case 0: [1]
                case 1: [0, 0, 0, 0, 0, 0, 0, 0]
                case 2: [0]
                case 3: tag(field, 4)
                default: [0, 0, 0, 0]
                }
                let body = int32Field(1, 1) + stringField(2, "n") + stringField(3, "i") + tag(field, wireType) + payload
                #expect(
                    decode(.userInfo, body)
                        == .failure(.wrongWireType(
                            message: "UserInfo", field: field, name: names[field - 1],
                            wireType: Int(wireType), expected: Int(expected))))
            }
        }
        #expect(
            decode(.chatMessage, int32Field(1, 3))
                == .failure(.wrongWireType(message: "ChatMessage", field: 1, name: "user", wireType: 0, expected: 2)))
        #expect(
            decode(.giftMessage, stringField(4, "3"))
                == .failure(.wrongWireType(message: "GiftMessage", field: 4, name: "giftcount", wireType: 2, expected: 0)))
        #expect(
            ProtoError.wrongWireType(message: "UserInfo", field: 1, name: "level", wireType: 2, expected: 0).description
                == "UserInfo field 1 (level): wire type 2, expected 0")
    }

    static let unknownFields: [[UInt8]] = [
        // (field 5 is UserInfo.token since signed joins, 6-8 positions and resume)
        tag(11, 0) + varint(.max),
        tag(16, 1) + [1, 2, 3, 4, 5, 6, 7, 8],
        lengthDelimited(17, [0xFF, 0xC0, 0x80]),  // unknown bytes need not be UTF-8
        tag(18, 5) + [1, 2, 3, 4],
        tag(9, 3) + tag(1, 0) + [1] + tag(10, 3) + lengthDelimited(2, [0xFF]) + tag(10, 4) + tag(9, 4),
        tag(536_870_911, 0) + [0],  // the largest field number
        bytes("cd80808000") + [1, 2, 3, 4],  // a 5-byte tag: field 9, fixed32
    ]

    @Test(arguments: unknownFields) func unknownFieldsAreSkipped(_ unknown: [UInt8]) throws {
        let user = UserInfo(level: 2, name: "n", iconURL: "i", room: "r")
        let fields = [int32Field(1, 2), stringField(2, "n"), stringField(3, "i"), stringField(4, "r")]
        for position in 0...fields.count {
            var parts = fields
            parts.insert(unknown, at: position)
            let inner = parts.flatMap { $0 }
            #expect(try decode(.userInfo, inner).get() == .user(user))
            let chat = unknown + lengthDelimited(1, inner) + unknown + stringField(2, "t") + unknown
            #expect(try decode(.chatMessage, chat).get() == .chat(ChatMessage(user: user, text: "t")))
        }
    }

    @Test func malformedTagsAndGroups() {
        let user = int32Field(1, 1) + stringField(2, "n") + stringField(3, "i")
        func err(_ extra: [UInt8]) -> ProtoError? {
            guard case .failure(let error) = decode(.userInfo, user + extra) else { return nil }
            return error
        }
        let at = user.count
        #expect(err(tag(9, 6)) == .invalidWireType(field: 9, wireType: 6, offset: at))
        #expect(err(tag(9, 7) + [0]) == .invalidWireType(field: 9, wireType: 7, offset: at))
        #expect(err([0x00]) == .invalidTag(offset: at))  // field number 0
        #expect(err(bytes("ad8080808000") + [1, 2, 3, 4]) == .invalidTag(offset: at))  // 6-byte tag
        #expect(err(bytes("ffffffff1f")) == .invalidTag(offset: at))  // above 2^32 - 1
        #expect(err(tag(9, 4)) == .unmatchedEndGroup(field: 9, offset: at + 1))
        #expect(err(tag(9, 3) + tag(8, 4)) == .unmatchedEndGroup(field: 8, offset: at + 2))
        #expect(err(tag(9, 3) + int32Field(1, 1)) == .unterminatedGroup(field: 9, offset: at + 1))
        #expect(err(tag(9, 1) + [1, 2, 3]) == .truncatedField(field: 9, wireType: 1, offset: at + 1, length: 8, available: 3))
        #expect(err(tag(9, 5) + [1]) == .truncatedField(field: 9, wireType: 5, offset: at + 1, length: 4, available: 1))

        // Groups nest 100 deep at the top level, as in Google's parser; 101 is too deep.
        let open = (0..<100).flatMap { tag(9 + $0, 3) }, close = (0..<100).reversed().flatMap { tag(9 + $0, 4) }
        #expect(err(open + close) == nil)
        guard case .nestingTooDeep = err(tag(200, 3) + open + close + tag(200, 4)) else {
            Issue.record("101 nested groups accepted"); return
        }
        // An embedded user is one level, so 99 groups fit in it.
        let chat = { (groups: Int) in
            lengthDelimited(1, user + (0..<groups).flatMap { tag(9 + $0, 3) } + (0..<groups).reversed().flatMap { tag(9 + $0, 4) })
                + stringField(2, "t")
        }
        #expect((try? decode(.chatMessage, chat(99)).get()) != nil)
        guard case .failure(.nestingTooDeep) = decode(.chatMessage, chat(100)) else {
            Issue.record("100 groups inside user accepted"); return
        }
    }

    @Test func hostileLengths() {
        let user = int32Field(1, 1) + stringField(2, "n") + stringField(3, "i")
        for length: UInt64 in [.max, 1 << 63, UInt64(Int.max), UInt64(Int.max) + 1, 1 << 32, 1 << 31, 6] {
            for field in [2, 4, 9] {
                let body = user + tag(field, 2) + varint(length) + [1, 2, 3, 4, 5]
                #expect(
                    decode(.userInfo, body)
                        == .failure(.truncatedField(field: field, wireType: 2, offset: user.count + 1, length: length, available: 5)))
            }
            let chat = tag(1, 2) + varint(length) + user
            #expect(
                length <= user.count ||
                decode(.chatMessage, chat)
                    == .failure(.truncatedField(field: 1, wireType: 2, offset: 1, length: length, available: user.count)))
            // A `user` shorter than its content: the inner string cannot run past it.
            let cut = lengthDelimited(1, Array(user.dropLast(1))) + [0x69]
            guard case .failure(.truncatedField(field: 3, _, _, _, available: 0)) = decode(.chatMessage, cut) else {
                Issue.record("string ran past the end of its embedded message"); return
            }
        }
        #expect(
            ProtoError.truncatedField(field: 3, wireType: 2, offset: 7, length: .max, available: 2).description
                == "truncated length-delimited field 3 at byte 7: needs 18446744073709551615 bytes, 2 left")
    }

    @Test func errorDescriptions() {
        #expect(ProtoError.varintTooLong(offset: 1).description == "varint longer than 10 bytes at byte 1")
        #expect(
            ProtoError.invalidUTF8(message: "UserInfo", field: 2, name: "name", offset: 5).description
                == "UserInfo field 2 (name): invalid UTF-8 at byte 5")
        #expect(
            ProtoError.missingRequired(message: "UserInfo", name: "iconURL").description
                == "UserInfo: required field 'iconURL' missing")
    }
}
