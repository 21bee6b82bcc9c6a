// Differential tests of the proto2 codec against Google's protobuf, run as
// `python3 Reference/proto_ref.py` (JSON lines in and out; see that file).
// Needs python3 and `pip install protobuf`; without them these tests FAIL.
import Foundation
import Testing
@testable import RoomcastCore

/// Runs `python3 Reference/SCRIPT` once with `lines` (JSON lines) on its
/// standard input, through a file so neither side can block on a full pipe.
/// - Parameter needs: what the script needs, for the error (`pip install protobuf`).
/// - Returns: its standard output and standard error.
/// - Throws: `ReferenceFailure` when it cannot run or exits non-zero.
func runReferenceScript(_ name: String, lines: [String], needs: String) throws -> (stdout: Data, stderr: String) {
    let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Reference/\(name)")
    let input = FileManager.default.temporaryDirectory
        .appendingPathComponent("\(name)-\(ProcessInfo.processInfo.processIdentifier)-\(UUID().uuidString).jsonl")
    try Data((lines.joined(separator: "\n") + "\n").utf8).write(to: input)
    defer { try? FileManager.default.removeItem(at: input) }

    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["python3", script.path]
    process.standardInput = try FileHandle(forReadingFrom: input)
    let output = Pipe(), errors = Pipe()
    process.standardOutput = output
    process.standardError = errors
    try process.run()
    let stdout = output.fileHandleForReading.readDataToEndOfFile()
    let stderr = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw ReferenceFailure(
            "python3 \(script.path) exited with \(process.terminationStatus); it needs python3 and \(needs). stderr: \(stderr)")
    }
    return (stdout, stderr)
}

/// Runs proto_ref.py once over all `requests` (JSON lines) and returns one
/// decoded JSON object per request.
func runReference(_ requests: [String]) throws -> [[String: Any]] {
    let (stdout, stderr) = try runReferenceScript("proto_ref.py", lines: requests, needs: "`pip install protobuf`")
    let lines = stdout.split(separator: UInt8(ascii: "\n"))
    guard lines.count == requests.count else {
        throw ReferenceFailure("\(requests.count) requests but \(lines.count) responses; stderr: \(stderr)")
    }
    return try lines.map { line in
        guard let object = try JSONSerialization.jsonObject(with: Data(line)) as? [String: Any] else {
            throw ReferenceFailure("not a JSON object: \(String(decoding: line, as: UTF8.self))")
        }
        return object
    }
}

struct ReferenceFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// SplitMix64: a fixed seed gives the same cases on every machine.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

// MARK: - Random values

extension SeededGenerator {
    mutating func chance(_ percent: Int) -> Bool { Int.random(in: 0..<100, using: &self) < percent }

    mutating func int32() -> Int32 {
        switch Int.random(in: 0..<5, using: &self) {
        case 0: Int32.random(in: -3...3, using: &self)
        case 1: [Int32.min, .max, -1, 127, 128, -128, 16384].randomElement(using: &self)!
        case 2: Int32.random(in: -300...300, using: &self)
        default: Int32.random(in: .min ... .max, using: &self)
        }
    }

    /// Strings from ASCII, accented Latin, CJK, emoji (with ZWJ), NUL and plane edges.
    mutating func string() -> String {
        if chance(15) { return "" }
        let pools: [ClosedRange<UInt32>] = [
            0x20...0x7E, 0x0...0x1F, 0xA0...0x17F, 0x4E00...0x9FFF, 0x1F300...0x1FAFF,
            0x300...0x36F, 0xE000...0xF8FF, 0xFFF0...0xFFFF, 0x10000...0x10FFFF, 0x200D...0x200D,
        ]
        var result = ""
        for _ in 0..<Int.random(in: 1...12, using: &self) {
            let pool = chance(50) ? pools[0] : pools.randomElement(using: &self)!
            result.unicodeScalars.append(Unicode.Scalar(UInt32.random(in: pool, using: &self))!)
        }
        return result
    }

    mutating func user() -> UserInfo {
        UserInfo(level: int32(), name: string(), iconURL: string(), room: chance(50) ? string() : nil, token: chance(20) ? string() : nil)
    }

    mutating func message() -> Decoded {
        switch Int.random(in: 0..<3, using: &self) {
        case 0: .user(user())
        case 1: .chat(ChatMessage(user: user(), text: string()))
        default: .gift(GiftMessage(user: user(), giftname: string(), giftURL: string(), giftcount: int32()))
        }
    }

    mutating func bytes(_ count: ClosedRange<Int>) -> [UInt8] {
        (0..<Int.random(in: count, using: &self)).map { _ in UInt8.random(in: 0...255, using: &self) }
    }

    /// One field of a "field soup": usually a known field with a plausible
    /// value, sometimes bad UTF-8, a wrong wire type or an unknown field.
    mutating func soupField(_ kind: BodyKind, depth: Int = 0) -> [UInt8] {
        let stringBytes: [UInt8] =
            chance(10) ? [[0xC0, 0x80], [0xED, 0xA0, 0x80], [0xF0, 0x9F, 0x98], [0xFF]].randomElement(using: &self)!
            : Array(string().utf8)
        let field = chance(85) ? Int.random(in: 1...4, using: &self) : Int.random(in: 5...20, using: &self)
        let isInt = field == 1 && kind == .userInfo || field == 4 && kind == .giftMessage
        let isUser = field == 1 && kind != .userInfo
        if chance(8) {  // any wire type, any payload
            return tag(field, [0, 1, 2, 5].randomElement(using: &self)!) + varint(UInt64(int32() & 0x7F)) + bytes(0...8)
        }
        if field > 4 || kind == .chatMessage && field > 2 {
            return chance(20) ? tag(field, 3) + soupField(.userInfo, depth: depth) + tag(field, 4)
                : lengthDelimited(field, bytes(0...6))
        }
        if isInt { return int32Field(field, int32()) }
        if isUser && depth == 0 {
            return lengthDelimited(1, (0..<Int.random(in: 0...6, using: &self)).flatMap { _ in soupField(.userInfo, depth: 1) })
        }
        return lengthDelimited(field, stringBytes)
    }

    /// A valid encoding, mutated: bit flips, truncation, insertion, deletion,
    /// duplicated slices, concatenation of two messages.
    mutating func mutate(_ valid: [UInt8]) -> [UInt8] {
        var bytes = valid
        for _ in 0..<Int.random(in: 1...3, using: &self) {
            let index = Int.random(in: 0...bytes.count, using: &self)
            switch Int.random(in: 0..<6, using: &self) {
            case 0 where index < bytes.count:
                bytes[index] ^= 1 << UInt8.random(in: 0...7, using: &self)
            case 1:
                bytes.removeLast(bytes.count - index)
            case 2:
                bytes.insert(contentsOf: self.bytes(1...4), at: index)
            case 3 where index < bytes.count:
                bytes.removeSubrange(index..<min(bytes.count, index + Int.random(in: 1...4, using: &self)))
            case 4:
                let end = Int.random(in: index...bytes.count, using: &self)
                bytes.insert(contentsOf: bytes[index..<end], at: Int.random(in: 0...bytes.count, using: &self))
            default:
                bytes += valid
            }
        }
        return bytes
    }
}

// MARK: - JSON conversion

extension BodyKind {
    var typeName: String {
        switch self {
        case .userInfo: "UserInfo"
        case .chatMessage: "ChatMessage"
        case .giftMessage: "GiftMessage"
        }
    }
}

func json(_ string: String) -> String { "\"\(hex(Array(string.utf8)))\"" }

func json(_ user: UserInfo) -> String {
    "{\"level\":\(user.level),\"name\":\(json(user.name)),\"iconURL\":\(json(user.iconURL))"
        + (user.room.map { ",\"room\":\(json($0))" } ?? "") + (user.token.map { ",\"token\":\(json($0))" } ?? "") + "}"
}

func encodeRequest(_ message: Decoded) -> String {
    let msg = switch message {
    case .user(let m): json(m)
    case .chat(let m): "{\"user\":\(json(m.user)),\"text\":\(json(m.text))}"
    case .gift(let m):
        "{\"user\":\(json(m.user)),\"giftname\":\(json(m.giftname)),\"giftURL\":\(json(m.giftURL)),\"giftcount\":\(m.giftcount)}"
    }
    return "{\"op\":\"encode\",\"type\":\"\(message.kind.typeName)\",\"msg\":\(msg)}"
}

func decodeRequest(_ kind: BodyKind, _ body: [UInt8]) -> String {
    "{\"op\":\"decode\",\"type\":\"\(kind.typeName)\",\"hex\":\"\(hex(body))\"}"
}

/// The complete value in Python's "msg", or nil if a field is missing.
func value(_ kind: BodyKind, _ msg: [String: Any]) -> Decoded? {
    func string(_ key: String, _ object: [String: Any]) -> String? {
        (object[key] as? String).map { String(decoding: bytes($0), as: UTF8.self) }
    }
    func int(_ key: String, _ object: [String: Any]) -> Int32? { (object[key] as? NSNumber)?.int32Value }
    func user(_ object: [String: Any]?) -> UserInfo? {
        guard let object, let level = int("level", object), let name = string("name", object),
            let icon = string("iconURL", object)
        else { return nil }
        return UserInfo(level: level, name: name, iconURL: icon, room: string("room", object), token: string("token", object),
                        positions: (object["positions"] as? NSNumber)?.boolValue,
                        since: string("since_epoch", object).map { RoomPosition(epoch: $0, seq: (object["since_seq"] as? NSNumber)?.int64Value ?? 0) })
    }
    switch kind {
    case .userInfo:
        return user(msg).map { .user($0) }
    case .chatMessage:
        guard let u = user(msg["user"] as? [String: Any]), let text = string("text", msg) else { return nil }
        return .chat(ChatMessage(user: u, text: text))
    case .giftMessage:
        guard let u = user(msg["user"] as? [String: Any]), let name = string("giftname", msg),
            let url = string("giftURL", msg), let count = int("giftcount", msg)
        else { return nil }
        return .gift(GiftMessage(user: u, giftname: name, giftURL: url, giftcount: count))
    }
}

// MARK: - Tests

@Suite struct Proto2ReferenceTests {
    @Test func referenceIsGoogleProtobuf() throws {
        let version = try runReference(["{\"op\":\"version\"}"])[0]
        let protobuf = try #require(version["protobuf"] as? String)
        #expect(protobuf.split(separator: ".").first.flatMap { Int($0) }.map { $0 >= 4 } == true, "protobuf \(protobuf)")
    }

    /// Random valid messages: byte-identical encodings, and each side decodes the other's bytes.
    @Test func validMessagesMatchGoogle() throws {
        var random = SeededGenerator(state: 0x726F_6F6D_6361_7374)  // "roomcast"
        let messages = (0..<600).map { _ in random.message() }
        var requests: [String] = []
        for message in messages {
            requests.append(encodeRequest(message))
            requests.append(decodeRequest(message.kind, message.serialized()))
        }
        let responses = try runReference(requests)
        for (index, message) in messages.enumerated() {
            let swiftBytes = message.serialized()
            let pythonHex = try #require(responses[2 * index]["hex"] as? String)
            #expect(hex(swiftBytes) == pythonHex, "case \(index): \(message)")
            #expect(try decode(message.kind, bytes(pythonHex)).get() == message, "case \(index): \(pythonHex)")
            let decoded = responses[2 * index + 1]
            #expect(decoded["ok"] as? Bool == true && decoded["initialized"] as? Bool == true, "\(hex(swiftBytes))")
            let msg = try #require(decoded["msg"] as? [String: Any])
            #expect(value(message.kind, msg) == message, "Python read \(hex(swiftBytes)) differently: \(msg)")
        }
    }

    /// Garbage, field soups and mutated encodings: roomcast accepts exactly
    /// what Google accepts, except where it is stricter by design (see Messages.swift).
    @Test func hostileBodiesAgreeWithGoogle() throws {
        var random = SeededGenerator(state: 0x7072_6F74_6F32)  // "proto2"
        var cases: [(BodyKind, [UInt8])] = []
        for index in 0..<6000 {
            let kind = [BodyKind.userInfo, .chatMessage, .giftMessage].randomElement(using: &random)!
            func soup(_ count: ClosedRange<Int>) -> [UInt8] {
                (0..<Int.random(in: count, using: &random)).flatMap { _ in random.soupField(kind) }
            }
            func message() -> Decoded {
                var message = random.message()
                while message.kind != kind { message = random.message() }
                return message
            }
            switch index % 4 {
            case 0:
                cases.append((kind, random.bytes(0...40)))
            case 1:
                cases.append((kind, soup(1...9)))
            case 2:
                // A valid message between soups: tests last-wins and `user` merging.
                cases.append((kind, soup(0...3) + message().serialized() + soup(0...3)))
            default:
                // Mostly an encoding of the right type; sometimes of another type.
                var message = random.message()
                while message.kind != kind && random.chance(70) { message = random.message() }
                cases.append((kind, random.mutate(message.serialized())))
            }
        }
        let responses = try runReference(cases.map { decodeRequest($0.0, $0.1) })

        var accepted = 0, rejectedByBoth = 0, stricter = 0
        for ((kind, body), python) in zip(cases, responses) {
            let label = "\(kind.typeName) \(hex(body)) python: \(python)"
            let pythonOK = python["ok"] as? Bool == true && python["initialized"] as? Bool == true
            let pythonValue = pythonOK ? value(kind, python["msg"] as? [String: Any] ?? [:]) : nil
            switch decode(kind, body) {
            case .success(let swiftValue):
                accepted += 1
                #expect(pythonOK && python["utf8"] as? Bool == true, "Swift accepts, Python does not: \(label)")
                #expect(pythonValue == swiftValue, "values differ: \(label) swift: \(swiftValue)")
            case .failure(let error):
                guard pythonOK else { rejectedByBoth += 1; continue }
                // Python accepted a complete message; roomcast may only be stricter on
                // UTF-8 (every occurrence) and on known fields with the wrong wire type.
                stricter += 1
                let everyStringValid = python["utf8_all"] as? Bool == true
                let wrongWireType = python["known_unknown"] as? Bool == true
                #expect(!everyStringValid || wrongWireType, "Python accepts, Swift rejects (\(error)): \(label)")
                switch error {
                case .invalidUTF8: #expect(!everyStringValid, "\(error): \(label)")
                case .wrongWireType: #expect(wrongWireType, "\(error): \(label)")
                default: Issue.record("Python accepts, Swift rejects (\(error)): \(label)")
                }
            }
        }
        // The generators must reach every branch, or the test proves little.
        #expect(accepted >= 300 && rejectedByBoth >= 1000 && stricter >= 50,
                "accepted \(accepted), rejected by both \(rejectedByBoth), stricter \(stricter)")
        print("proto2 vs Google: \(cases.count) cases, \(accepted) accepted by both, "
              + "\(rejectedByBoth) rejected by both, \(stricter) rejected only by roomcast (by design)")
    }
}
