import Foundation
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

/// The JSON dialect's commands and the JSON form of LTB frames (docs/protocol/json.md §7).
@Suite struct JSONDialectTests {
    static func decode(_ text: String) -> Result<JSONDialect.Command, JSONBodyError> {
        Array(text.utf8).withUnsafeBytes { JSONDialect.decode($0) }
    }

    @Test func commandsAsTheSeedClientSendsThem() {
        #expect(Self.decode("{\n  \"cmd\" : \"nickname\",\n  \"nickname\" : \"guest232\"\n}") == .success(.nickname("guest232")))
        #expect(Self.decode(#"{"content":"hi","cmd":"msg","extra":[1,{"x":null}]}"#) == .success(.msg("hi")))
        #expect(Self.decode(#"{"cmd":"leave"}"#) == .success(.leave))
        #expect(Self.decode(#"{"cmd":"dance"}"#) == .success(.unknown("dance")))
    }

    @Test(arguments: [
        ("", "invalid JSON"), ("{", "invalid JSON"), ("[1]", "not a JSON object"), ("\"msg\"", "not a JSON object"),
        ("{}", "missing 'cmd'"), (#"{"cmd":1}"#, "'cmd' is not a string"), (#"{"cmd":"msg"}"#, "missing string 'content'"),
        (#"{"cmd":"msg","content":["x"]}"#, "'content' is not a string"), (#"{"cmd":"nickname"}"#, "missing string 'nickname'"),
        (#"{"cmd":null}"#, "'cmd' is null"),
    ])
    func malformed(text: String, reason: String) {
        guard case .failure(let e) = Self.decode(text) else { Issue.record("accepted \(text)"); return }
        #expect(e.reason.contains(reason), "\(e.reason)")
    }

    static func translate(_ type: UInt16, _ body: [UInt8], _ s: RelaySettings = RelaySettings()) -> String? {
        FrameCodec.encode(type: type, body: body, byteOrder: s.byteOrder).withUnsafeBytes {
            JSONDialect.translate($0, settings: s, senderAddress: "203.0.113.7:51234")
        }.map { frame in
            #expect(frame.count >= 4)
            let length = Int(frame[0]) | Int(frame[1]) << 8 | Int(frame[2]) << 16 | Int(frame[3]) << 24
            #expect(length == frame.count - 4)
            return String(decoding: frame.dropFirst(4), as: UTF8.self)
        }
    }

    @Test func translations() {
        let alice = UserInfo(level: 9, name: "alice", iconURL: "https://i/a.png", room: "r")
        #expect(Self.translate(0, alice.serialized()) == #"{"addr":"203.0.113.7:51234","cmd":"join","nickname":"alice"}"#)
        #expect(Self.translate(1, alice.serialized()) == #"{"addr":"203.0.113.7:51234","cmd":"leave","nickname":"alice"}"#)
        #expect(Self.translate(2, ChatMessage(user: alice, text: "a \"b\" / c").serialized()) == #"{"cmd":"msg","content":"a \"b\" / c","from":"alice"}"#)
        #expect(Self.translate(3, GiftMessage(user: alice, giftname: "yacht", giftURL: "https://g/y", giftcount: -2).serialized())
                == #"{"cmd":"gift","from":"alice","giftURL":"https://g/y","giftcount":-2,"giftname":"yacht"}"#)
        // No JSON form: heartbeats, opaque types, bodies that do not decode.
        #expect(Self.translate(8, []) == nil)
        #expect(Self.translate(99, [1, 2]) == nil)
        #expect(Self.translate(2, [0xFF]) == nil)
        // Configured control codes and byte order are followed.
        let s = RelaySettings(byteOrder: .big, joinType: 3, leaveType: 5, heartbeatType: 1)
        #expect(Self.translate(3, alice.serialized(), s)?.contains(#""cmd":"join""#) == true)
    }

    @Test func ltbFrameOfAJSONClient() throws {
        let frame = JSONDialect.ltbFrame(type: 2, nickname: "guest232", text: "hi", settings: RelaySettings())
        var d = FrameDecoder()
        d.append(frame)
        let f = try #require(try d.next())
        #expect(f.type == 2)
        #expect(try ChatMessage(protobuf: f.body) == ChatMessage(user: UserInfo(level: 0, name: "guest232", iconURL: ""), text: "hi"))
    }
}

/// The one JSON string escaper (client --json, bench report, log lines)
/// against Foundation's parser: every string round-trips and stays on one line.
@Suite struct JSONStringLiteralTests {
    @Test func roundTripsThroughJSONSerialization() throws {
        var rng = SeededGenerator(state: 11)
        let alphabet: [Unicode.Scalar] = ["a", "\"", "\\", "\n", "\r", "\t", "\u{0}", "\u{1}", "\u{1F}", "\u{7F}", "é", "世", "😀", "/", " "]
        for _ in 0..<500 {
            var s = String.UnicodeScalarView()
            for _ in 0..<Int.random(in: 0...20, using: &rng) { s.append(alphabet.randomElement(using: &rng)!) }
            let text = String(s)
            let literal = jsonStringLiteral(text)
            #expect(!literal.contains("\n") && !literal.contains("\r"))
            let parsed = try JSONSerialization.jsonObject(with: Data(literal.utf8), options: [.fragmentsAllowed]) as? String
            #expect(parsed == text, "\(literal)")
        }
    }
}
