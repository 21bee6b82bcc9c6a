// The hand-over state's bytes pinned: a rich state (every field of every
// record kind set, LTB, JSON and WebSocket connections interleaved, a
// cluster with streams and positions, moderation, rooms with frames)
// encodes to the golden bytes the hand-written codec wrote before the
// table-driven one replaced it (Tests/Fixtures/handover-state-golden.hex),
// and those bytes decode to the same value. An old and a new binary hand
// over to each other during an upgrade: the bytes must never drift.
import Foundation
import Testing
@testable import RoomcastCore

@Suite("Hand-over state: golden bytes")
struct HandOverStateGoldenTests {
    /// Every field of every record kind set to a value other than its
    /// default (and some at a boundary). Frozen with the fixture.
    static var rich: HandOverState {
        var ltb = HandOverState.Record(key: 0x0102_0304_0506_0708)
        ltb.dialect = .ltb
        ltb.peerAddress = "198.51.100.4:40000"
        ltb.room = "lobby \u{0}"
        ltb.identity = [0x08, 0x02, 0x12, 0x03] + Array("bob".utf8)
        ltb.input = [0x02, 0x00, 0x00, 0x00, 0x09]
        ltb.output = [9, 8, 7, 6, 5, 4, 3, 2, 1]
        ltb.heartbeatRemainingMs = 29_999
        ltb.violations = 7
        ltb.frameMilliTokens = Int64.min
        ltb.byteMilliTokens = Int64.max
        ltb.tornBytes = 4
        ltb.softLimitElapsedMs = 1_500
        ltb.authClaims = TokenClaims(sub: "u-42", exp: 1_800_000_000, nbf: 1_700_000_000, name: "Bob", level: 3,
                                     icon: "https://i.example/b.png", rooms: ["lobby \u{0}", "*"], role: .moderator, may: [2, 3, 77])
        ltb.positions = true
        ltb.textsShed = 12
        ltb.lastTextMs = 987_654_321

        var json = HandOverState.Record(key: 2)
        json.dialect = .json
        json.peerAddress = "[2001:db8::7]:443"
        json.room = RoomName(bytes: [0xFF, 0xFE])
        json.identity = []
        json.nickname = "nick ü"
        json.input = [0x00, 0x00, 0x00]
        json.partialFrameRemainingMs = 0
        json.draining = true
        json.output = [0xAA]

        var upgrading = HandOverState.Record(key: 3)
        upgrading.dialect = .webSocket
        upgrading.peerAddress = "10.0.0.1:1"
        upgrading.input = Array("GET /?room=lobby HTTP/1.1\r\n".utf8)
        var u = HandOverState.WebSocket()
        u.upgradeRemainingMs = 4_321
        upgrading.webSocket = u

        var midMessage = HandOverState.Record(key: 4)
        midMessage.dialect = .webSocket
        midMessage.room = "lobby \u{0}"
        midMessage.identity = [0x0A, 0x01, 0x78]
        midMessage.heartbeatRemainingMs = 1
        midMessage.input = [0x80, 0x83, 9, 9, 9, 9, 0x20]
        midMessage.output = [0x81, 0x02, 0x68, 0x69]
        midMessage.tornBytes = 2
        midMessage.violations = 1
        var m = HandOverState.WebSocket()
        m.upgraded = true
        m.subprotocol = .json
        var validator = UTF8Validator()
        let message = Array("{\"text\":\"na\u{00EF}".utf8).dropLast()  // ends inside ï
        let fed = validator.feed(Array(message))
        var partial = validator
        let fedPartial = partial.feed([0xAF])
        precondition(fed && fedPartial && !validator.isComplete)
        m.decoder = .init(messageOpcode: .text, message: Array(message), utf8: validator, checkedOfPartialFrame: 1, partialUTF8: partial)
        m.nextPingMs = 20_000
        midMessage.webSocket = m

        var binary = HandOverState.Record(key: 5)
        binary.dialect = .webSocket
        binary.room = "r2"
        var b = HandOverState.WebSocket()
        b.upgraded = true
        b.subprotocol = .ltb
        b.decoder = .init(messageOpcode: .binary, message: [6, 0, 0, 0, 2, 0])
        b.nextPingMs = 0
        binary.webSocket = b

        var echo = HandOverState.Record(key: 6)
        echo.dialect = .webSocket
        var e = HandOverState.WebSocket()
        (e.upgraded, e.echo) = (true, true)
        echo.webSocket = e

        let blank = HandOverState.Record(key: 0)

        // WebSocket records between the others: the encoder keeps the order.
        var s = HandOverState(stoppedReadingMs: 0xFEDC_BA98_7654_3210, writer: "roomcastd 1.2.3-golden",
                              connections: [ltb, upgrading, json, midMessage, blank, binary, echo])
        s.boxName = "livebox-7"
        s.socketOptions = "30000/5/3"
        s.handOvers = 17
        var cluster = HandOverState.Cluster(origin: 0xC0FF_EE00_0000_0001, lastStream: 44,
                                            streams: [.init(room: "lobby \u{0}", id: 43, seq: 1_000),
                                                      .init(room: RoomName(bytes: [0xFF, 0x00]), id: 44, seq: 0)],
                                            positions: [.init(room: "lobby \u{0}", origin: 9, stream: 3, seq: 77),
                                                        .init(room: "r2", origin: UInt64.max, stream: 1, seq: 2)])
        cluster.returnByMs = 123_456_789_012
        s.cluster = cluster
        s.moderation = [
            .entry(ModerationKey(.ban, room: "lobby \u{0}", sub: Array("u:1".utf8)), untilMs: 9_000_000, setMs: 8_000_000, reason: "spam, twice"),
            .entry(ModerationKey(.mute, room: "r2", sub: [0xFF]), untilMs: 5_000, setMs: 4_000, reason: ""),
            .settings("lobby \u{0}", slowModeSeconds: 30, setMs: 7_000),
            .removed(ModerationKey(.ban, room: "r2", sub: Array("x".utf8)), untilMs: 3_000, setMs: 2_000),
        ]
        s.rooms = [
            RoomStream(room: "lobby \u{0}", position: RoomPosition(epoch: "e-1a2b", seq: 1_002),
                       history: [NumberedFrame(seq: 1_001, frame: [2, 0, 0, 0, 1, 0, 0x41]),
                                 NumberedFrame(seq: 1_002, frame: [2, 0, 0, 0, 0, 0])]),
            RoomStream(room: "r2", position: RoomPosition(epoch: "e-zz", seq: -1), history: []),
        ]
        return s
    }

    static let goldenURL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/handover-state-golden.hex")

    /// The fixture's bytes (hex, any whitespace between digit pairs ignored).
    static func golden() throws -> [UInt8] {
        let text = try String(contentsOf: goldenURL, encoding: .utf8).filter(\.isHexDigit)
        var bytes: [UInt8] = []
        var i = text.startIndex
        while i < text.endIndex {
            let j = text.index(i, offsetBy: 2)
            bytes.append(UInt8(text[i..<j], radix: 16)!)
            i = j
        }
        return bytes
    }

    static func hex(_ bytes: [UInt8]) -> String {
        stride(from: 0, to: bytes.count, by: 32).map { start in
            bytes[start..<min(start + 32, bytes.count)].map { String(format: "%02x", $0) }.joined()
        }.joined(separator: "\n") + "\n"
    }

    @Test("the rich state encodes to the golden bytes, byte for byte")
    func encodesToTheGoldenBytes() throws {
        let golden = try Self.golden()
        let bytes = Self.rich.encode()
        #expect(bytes.count == golden.count)
        if let i = zip(bytes, golden).enumerated().first(where: { $0.element.0 != $0.element.1 })?.offset {
            Issue.record("first difference at byte \(i) of \(golden.count)")
        }
        #expect(bytes == golden)
    }

    @Test("the golden bytes decode to the rich state, and encode back to themselves")
    func goldenBytesDecode() throws {
        let golden = try Self.golden()
        let state = try HandOverState.decode(golden)
        #expect(state == Self.rich)
        for (x, y) in zip(state.connections, Self.rich.connections) { #expect(x == y, "connection \(y.key)") }
        #expect(state.cluster == Self.rich.cluster)
        #expect(state.moderation == Self.rich.moderation)
        #expect(state.rooms == Self.rich.rooms)
        #expect(state.encode() == golden)
    }

    @Test("the rich state round-trips, and so does each of its parts alone")
    func roundTrips() throws {
        let s = Self.rich
        #expect(try HandOverState.decode(s.encode()) == s)
        for c in s.connections {
            let one = HandOverState(connections: [c])
            #expect(try HandOverState.decode(one.encode()) == one, "connection \(c.key)")
        }
        var parts = HandOverState()
        parts.cluster = s.cluster
        #expect(try HandOverState.decode(parts.encode()) == parts)
        parts = HandOverState()
        parts.moderation = s.moderation
        #expect(try HandOverState.decode(parts.encode()) == parts)
        parts = HandOverState()
        parts.rooms = s.rooms
        #expect(try HandOverState.decode(parts.encode()) == parts)
        // Both byte-string fields at their empty values, and the empty state.
        var empty = HandOverState.Record(key: 1)
        (empty.room, empty.identity, empty.nickname) = ("", [], "")
        let e = HandOverState(connections: [empty])
        #expect(try HandOverState.decode(e.encode()) == e)
        #expect(try HandOverState.decode(HandOverState().encode()) == HandOverState())
    }

    @Test("the size bounds a writer keeps the state under hold for the rich state")
    func sizeBoundsHold() {
        let s = Self.rich
        var bound = HandOverState.globalsBytesBound(writer: s.writer.utf8.count + s.boxName.utf8.count + s.socketOptions.utf8.count)
        for c in s.connections {
            bound += HandOverState.recordBytesBound(address: c.peerAddress.utf8.count, room: c.room?.bytes.count ?? 0,
                                                    identity: c.identity?.count ?? 0, nickname: c.nickname?.utf8.count ?? 0,
                                                    input: c.input.count, output: c.output.count, claims: c.authClaims?.json.count ?? 0,
                                                    webSocketMessage: c.webSocket.map { $0.decoder.message.count + 1 } ?? 0)
        }
        bound += HandOverState.clusterBytesBound(s.cluster!) + HandOverState.moderationBytesBound(s.moderation)
            + HandOverState.roomsBytesBound(s.rooms)
        #expect(s.encode().count <= bound, "\(s.encode().count) bytes, bound \(bound)")
    }

    /// Writes the golden fixture; run once by hand, with the encoder whose
    /// bytes are to be pinned, by
    /// `ROOMCAST_WRITE_GOLDEN=1 swift test --filter HandOverStateGoldenTests`.
    @Test func writeGoldenWhenAsked() throws {
        guard ProcessInfo.processInfo.environment["ROOMCAST_WRITE_GOLDEN"] == "1" else { return }
        try Self.hex(Self.rich.encode()).write(to: Self.goldenURL, atomically: true, encoding: .utf8)
    }
}
