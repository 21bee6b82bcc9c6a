// The crash path's log: records appended as things happen,
// replayed by the process restarted after a crash.
import Testing
@testable import RoomcastCore

@Suite("Live log (crash path)")
struct LiveLogTests {
    static func log(_ records: [[UInt8]], committed: Int? = nil, version: UInt16 = LiveLog.version) -> [UInt8] {
        var bytes = LiveLog.header(generation: 7)
        let body = records.flatMap { $0 }
        bytes += body
        let c = UInt64(committed ?? body.count)
        for i in 0..<8 { bytes[LiveLog.committedOffset + i] = UInt8(truncatingIfNeeded: c >> (8 * UInt64(i))) }
        bytes[4] = UInt8(version)
        return bytes
    }

    static func replay(_ bytes: [UInt8]) throws(HandOverState.DecodeError) -> [UInt64: LiveLog.Connection] {
        try bytes.withUnsafeBytes { raw in Result { () throws(HandOverState.DecodeError) in try LiveLog.replay(raw) } }.get()
    }

    @Test func replayFollowsEveryRecord() throws {
        let identity: [UInt8] = [8, 1, 18, 5] + Array("alice".utf8)
        let bytes = Self.log([
            LiveLog.open(1, dialect: .ltb, address: "203.0.113.7:5"),
            LiveLog.open(2, dialect: .json, address: "[::1]:9"),
            LiveLog.open(3, dialect: .ltb, address: "x"),
            LiveLog.room(1, room: "r1", identity: identity),
            LiveLog.input(1, [1, 2, 3]),
            LiveLog.torn(2, [4, 5]),
            LiveLog.room(2, room: nil, identity: nil),
            LiveLog.close(3),
            LiveLog.input(1, []),
            LiveLog.input(1, [6]),
        ])
        let live = try Self.replay(bytes)
        #expect(Set(live.keys) == [1, 2])
        #expect(live[1]?.room == "r1" && live[1]?.identity == identity && live[1]?.input == [6] && live[1]?.peerAddress == "203.0.113.7:5")
        #expect(live[2]?.dialect == .json && live[2]?.room == nil && live[2]?.torn == [4, 5])
        #expect(bytes.withUnsafeBytes { LiveLog.generation($0) } == 7)
    }

    @Test func roomNamesAreBytes() throws {
        let room = RoomName(bytes: [0xC3, 0x28, 0x00])
        let live = try Self.replay(Self.log([LiveLog.open(1, dialect: .ltb, address: "a"), LiveLog.room(1, room: room, identity: nil)]))
        #expect(live[1]?.room == room)
    }

    @Test func onlyCommittedRecordsCount() throws {
        let records = [LiveLog.open(1, dialect: .ltb, address: "a"), LiveLog.room(1, room: "r", identity: [1])]
        // A record copied but not committed (the process died in between) is ignored.
        let live = try Self.replay(Self.log(records, committed: records[0].count))
        #expect(live[1]?.room == nil)
        #expect(try Self.replay(Self.log([])) == [:])
    }

    @Test func unknownKindsAreSkippedAndDamageIsFound() throws {
        var unknown: [UInt8] = [10, 0, 0, 0, 99, 1, 0, 0, 0, 0, 0, 0, 0, 42]  // kind 99, serial 1, one byte
        unknown += LiveLog.room(1, room: "r", identity: nil)
        let live = try Self.replay(Self.log([LiveLog.open(1, dialect: .ltb, address: "a"), unknown]))
        #expect(live[1]?.room == "r")
        #expect(throws: HandOverState.DecodeError.unknownVersion(3)) { try Self.replay(Self.log([], version: 3)) }
        #expect(throws: (any Error).self) { try Self.replay(Array(Self.log([LiveLog.open(1, dialect: .ltb, address: "abc")]).dropLast())) }
        var cut = Self.log([LiveLog.open(1, dialect: .ltb, address: "abc")])
        cut[LiveLog.headerSize] = 200  // a record claiming more than was committed
        #expect(throws: (any Error).self) { try Self.replay(cut) }
        #expect(throws: (any Error).self) { try Self.replay([1, 2, 3]) }
    }

    @Test("a partial frame is appended to read by read, replaced when a frame completes")
    func inputIsAppended() throws {
        let live = try Self.replay(Self.log([
            LiveLog.open(1, dialect: .ltb, address: "a"),
            LiveLog.inputAppend(1, [1, 2]),
            LiveLog.inputAppend(1, [3]),
            LiveLog.open(2, dialect: .ltb, address: "b"),
            LiveLog.inputAppend(2, [7, 7]),
            LiveLog.input(2, [8]),
            LiveLog.inputAppend(2, [9]),
        ]))
        #expect(live[1]?.input == [1, 2, 3] && live[2]?.input == [8, 9])
    }

    @Test("serials are 64-bit; a version 1 log (32-bit serials) is still read")
    func serialsAreWideAndVersion1Reads() throws {
        let big: UInt64 = 1 << 40 | 5
        let live = try Self.replay(Self.log([LiveLog.open(big, dialect: .ltb, address: "a"), LiveLog.open(5, dialect: .json, address: "b")]))
        #expect(live[big]?.peerAddress == "a" && live[5]?.peerAddress == "b", "a serial past 2^32 does not collide with its low half")
        // Version 1, as the previous release wrote it: length u32 | kind | serial u32 | payload.
        func v1(_ kind: UInt8, _ serial: UInt32, _ payload: [UInt8]) -> [UInt8] {
            withUnsafeBytes(of: UInt32(5 + payload.count).littleEndian, Array.init) + [kind] + withUnsafeBytes(of: serial.littleEndian, Array.init) + payload
        }
        let old = Self.log([v1(1, 9, [0, 1, 0, 0x78]), v1(3, 9, [2, 0, 0, 0, 4, 5]), v1(1, 10, [1, 0, 0]), v1(5, 10, [])], version: 1)
        let replayed = try Self.replay(old)
        #expect(Set(replayed.keys) == [9] && replayed[9]?.peerAddress == "x" && replayed[9]?.input == [4, 5])
    }

    @Test("the cluster records: the origin and last stream, each room's stream (the latest wins, id 0: none), each room's positions (replaced whole; none: forgotten)")
    func clusterRecords() throws {
        let bytes = Self.log([
            LiveLog.open(1, dialect: .ltb, address: "x"),
            LiveLog.clusterOrigin(0xABCD, lastStream: 3),
            LiveLog.clusterStream("r1", id: 2, seq: 10),
            LiveLog.clusterStream("r2", id: 3, seq: 1),
            LiveLog.clusterPositions("r1", [.init(room: "r1", origin: 7, stream: 4, seq: 9), .init(room: "r1", origin: 8, stream: 1, seq: 1)]),
            LiveLog.clusterPositions("r2", [.init(room: "r2", origin: 7, stream: 1, seq: 5)]),
            LiveLog.clusterStream("r1", id: 2, seq: 12),
            LiveLog.clusterStream("r2", id: 0, seq: 0),
            LiveLog.clusterPositions("r1", [.init(room: "r1", origin: 7, stream: 4, seq: 11)]),
            LiveLog.clusterPositions("r2", []),
            LiveLog.clusterOrigin(0xABCD, lastStream: 4),
        ])
        let replayed = try bytes.withUnsafeBytes { raw in
            Result { () throws(HandOverState.DecodeError) in try LiveLog.replayAll(raw) }
        }.get()
        let (live, cluster) = (replayed.connections, replayed.cluster)
        #expect(Set(live.keys) == [1])
        let c = try #require(cluster)
        #expect(c.origin == 0xABCD && c.lastStream == 4)
        #expect(c.streams == [.init(room: "r1", id: 2, seq: 12)])
        #expect(c.positions == [.init(room: "r1", origin: 7, stream: 4, seq: 11)])
        // A log without them (no cluster, or an older writer): none.
        let plain = Self.log([LiveLog.open(1, dialect: .ltb, address: "x")])
        #expect(try plain.withUnsafeBytes { raw in Result { () throws(HandOverState.DecodeError) in try LiveLog.replayAll(raw) } }.get().cluster == nil)
        // A count that overruns its record is damage, not a trap.
        var bad = LiveLog.clusterPositions("r1", [.init(room: "r1", origin: 7, stream: 4, seq: 11)])
        bad[13 + 4 + 2] = 0xFF
        #expect(throws: HandOverState.DecodeError.self) { try Self.replay(Self.log([bad])) }
    }

    @Test("moderation records replay as Redis's hash would hold them: the latest of each field wins, a removal included; a record that does not parse is skipped")
    func moderationReplays() throws {
        let ban = ModerationKey(.ban, room: "r1", sub: Array("troll".utf8))
        let mute = ModerationKey(.mute, room: "r2", sub: Array("loud".utf8))
        var garbage = LiveLog.moderation(.settings("r9", slowModeSeconds: 5, setMs: 1))
        garbage[garbage.count - 1] = UInt8(ascii: "x")  // "5 x": no setMs
        let bytes = Self.log([
            LiveLog.moderation(.entry(ban, untilMs: 5_000, setMs: 1_000, reason: "spam")),
            LiveLog.moderation(.entry(mute, untilMs: 9_000, setMs: 2_000, reason: "")),
            LiveLog.moderation(.settings("r1", slowModeSeconds: 10, setMs: 3_000)),
            LiveLog.moderation(.removed(mute, untilMs: 9_000, setMs: 4_000)),
            LiveLog.moderation(.entry(ban, untilMs: 8_000, setMs: 5_000, reason: "again")),
            garbage,
        ])
        let replayed = try bytes.withUnsafeBytes { raw in
            Result { () throws(HandOverState.DecodeError) in try LiveLog.replayAll(raw) }
        }.get()
        #expect(replayed.moderation.map { $0.field } == [ban.field, mute.field, ModerationRecord.settings("r1", slowModeSeconds: 0, setMs: 0).field])
        #expect(replayed.moderation.map { $0.value } == ["8000 5000 again", "9000 4000 !", "10 3000"])
        #expect(replayed.connections.isEmpty && replayed.cluster == nil)
    }
}

@Suite("Live log: WebSocket connections (crash path)")
struct LiveLogWebSocketTests {
    @Test("a WebSocket connection replays its phase, subprotocol, 101 owed and its fragmented message, fragment by fragment")
    func webSocketRecords() throws {
        var utf8 = UTF8Validator()
        _ = utf8.feed([0xE2, 0x82])  // inside a 3-byte sequence, across fragments
        let bytes = LiveLogTests.log([
            LiveLog.open(1, dialect: .webSocket, address: "127.0.0.1:5"),
            LiveLog.open(2, dialect: .webSocket, address: "127.0.0.1:6"),
            LiveLog.input(2, Array("GET / HT".utf8)),
            LiveLog.webSocket(1, upgraded: true, subprotocol: .ltb, echo: false),
            LiveLog.room(1, room: "lobby", identity: nil),
            LiveLog.torn(1, Array("HTTP/1.1 101".utf8)),
            LiveLog.torn(1, []),
            LiveLog.webSocketFragment(1, opcode: .binary, utf8: UTF8Validator(), [1, 2]),
            LiveLog.webSocketFragment(1, opcode: .binary, utf8: UTF8Validator(), [3]),
            LiveLog.webSocketMessage(1, opcode: nil, utf8: UTF8Validator(), []),  // that message ended
            LiveLog.webSocketFragment(1, opcode: .text, utf8: utf8, [0x61, 0xE2, 0x82]),
            LiveLog.inputAppend(1, [0x80, 0x02]),
        ])
        let live = try LiveLogTests.replay(bytes)
        let a = try #require(live[1]?.webSocket)
        #expect(live[1]?.dialect == .webSocket && live[1]?.room == "lobby" && live[1]?.torn == [])
        #expect(a.upgraded && a.subprotocol == .ltb && !a.echo)
        #expect(a.decoder.messageOpcode == .text && a.decoder.message == [0x61, 0xE2, 0x82] && a.decoder.utf8 == utf8)
        #expect(live[1]?.input == [0x80, 0x02])
        let b = try #require(live[2]?.webSocket)
        #expect(!b.upgraded && b.decoder.messageOpcode == nil && live[2]?.input == Array("GET / HT".utf8))
        #expect(live[1]?.webSocket != nil && LiveLog.Connection().webSocket == nil)
    }

    @Test("a fragment record costs its own bytes only: a message of n fragments is O(n) log bytes")
    func fragmentsAreAppends() {
        let chunk = [UInt8](repeating: 7, count: 100)
        let records = (0..<50).map { _ in LiveLog.webSocketFragment(1, opcode: .binary, utf8: UTF8Validator(), chunk) }
        #expect(records.allSatisfy { $0.count == 13 + 1 + 3 + 4 + chunk.count })
    }

    @Test("a WebSocket record of an unknown subprotocol, or a message of a control opcode, is damage")
    func damaged() {
        var bad = LiveLog.webSocketMessage(1, opcode: nil, utf8: UTF8Validator(), [])
        bad[13] = 9  // ping
        let log = LiveLogTests.log([LiveLog.open(1, dialect: .webSocket, address: "x"), bad])
        #expect(throws: HandOverState.DecodeError.self) { try LiveLogTests.replay(log) }
    }
}
