// The hand-over state's reading rules, pinned record by record on bytes
// built by hand: every error a damaged state is refused with (the exact
// case and text the log shows), what is skipped (unknown tags at every
// level, whatever their bytes), and what a repeated record or field does.
import Foundation
import Testing
@testable import RoomcastCore

/// Tag-length-value records built by hand, little-endian (the format:
/// HandOverState.swift).
enum TLV {
    static func le<T: FixedWidthInteger>(_ v: T) -> [UInt8] { withUnsafeBytes(of: v.littleEndian) { Array($0) } }
    static func record(_ tag: UInt16, _ value: [UInt8]) -> [UInt8] { le(tag) + le(UInt32(value.count)) + value }
    static func u8(_ tag: UInt16, _ v: UInt8) -> [UInt8] { record(tag, [v]) }
    static func u32(_ tag: UInt16, _ v: UInt32) -> [UInt8] { record(tag, le(v)) }
    static func u64(_ tag: UInt16, _ v: UInt64) -> [UInt8] { record(tag, le(v)) }
    static func text(_ tag: UInt16, _ s: String) -> [UInt8] { record(tag, Array(s.utf8)) }
    /// A version-1 state around `payload`: header, length and CRC.
    static func sealed(_ payload: [UInt8]) -> [UInt8] {
        Array("RCHO".utf8) + le(UInt16(1)) + le(UInt16(24)) + le(UInt64(payload.count)) + le(CRC32.checksum(payload)) + le(UInt32(0)) + payload
    }
    /// A connection record (tag 2) with key 1 and `fields`.
    static func connection(_ fields: [UInt8]) -> [UInt8] { record(2, u64(1, 1) + fields) }
    /// A WebSocket connection record (tag 4) with key 1 and its WebSocket state `fields`.
    static func webSocket(_ fields: [UInt8], input: [UInt8] = []) -> [UInt8] {
        record(4, u64(1, 1) + u8(2, 2) + (input.isEmpty ? [] : record(7, input)) + record(0x5701, fields))
    }
}

@Suite("Hand-over state: reading rules")
struct HandOverStateWireTests {
    static func decode(_ payload: [UInt8]) throws(HandOverState.DecodeError) -> HandOverState {
        try HandOverState.decode(TLV.sealed(payload))
    }

    static func error(_ payload: [UInt8]) -> HandOverState.DecodeError? {
        do { _ = try decode(payload); return nil } catch { return error }
    }

    @Test("header errors: each with its own text")
    func headerErrors() {
        func error(_ bytes: [UInt8]) -> HandOverState.DecodeError? {
            do { _ = try HandOverState.decode(bytes); return nil } catch { return error }
        }
        let good = TLV.sealed(TLV.u64(0x63, 1))
        #expect(error([1, 2, 3]) == .damaged("3 bytes, shorter than a header"))
        var bad = good
        bad[0] = 0x58
        #expect(error(bad) == .damaged("no RCHO magic"))
        bad = good
        bad[4] = 0
        #expect(error(bad) == .damaged("version 0"))
        bad[4] = 7
        #expect(error(bad) == .unknownVersion(7))
        bad = good
        bad[6] = 10
        #expect(error(bad) == .damaged("header of 10 bytes in a 38-byte state"))
        bad[6] = 0xFF
        #expect(error(bad) == .damaged("header of 255 bytes in a 38-byte state"))
        #expect(error(Array(good.prefix(20))) == .damaged("header of 24 bytes in a 20-byte state"))
        #expect(error(good + [0]) == .damaged("payload of 15 bytes, header says 14 (truncated?)"))
        #expect(error(good.dropLast()) == .damaged("payload of 13 bytes, header says 14 (truncated?)"))
        bad = good
        bad[30] ^= 1
        #expect(error(bad) == .damaged("checksum mismatch"))
        // Header bytes past 24 are skipped.
        var longer = Array(good.prefix(24)) + [0xEE, 0xEE] + Array(good[24...])
        longer[6] = 26
        #expect(error(longer) == nil)
    }

    @Test("record framing errors, at the top and inside a record")
    func framingErrors() {
        #expect(Self.error([0x63, 0x00, 0x01]) == .damaged("a record header cut off at byte 0"))
        #expect(Self.error(TLV.u64(0x63, 1) + [0x63]) == .damaged("a record header cut off at byte 14"))
        #expect(Self.error([0x02, 0x00, 0xFF, 0xFF, 0x00, 0x00, 1]) == .damaged("record 2 claims 65535 bytes, 1 are left"))
        #expect(Self.error(TLV.record(2, TLV.u64(1, 1) + [9, 9])) == .damaged("a record header cut off at byte 14"))
        #expect(Self.error(TLV.record(2, [0x07, 0x00, 0x09, 0x00, 0x00, 0x00, 1])) == .damaged("record 7 claims 9 bytes, 1 are left"))
    }

    /// Where a field sits: the bytes of its record around it.
    enum Place: CaseIterable {
        case globals, connection, webSocket, cluster, stream, position, room, frame
        func wrap(_ field: [UInt8]) -> [UInt8] {
            switch self {
            case .globals: TLV.record(1, field)
            case .connection: TLV.connection(field)
            case .webSocket: TLV.webSocket(field)
            case .cluster: TLV.record(3, field)
            case .stream: TLV.record(3, TLV.record(3, field))
            case .position: TLV.record(3, TLV.record(4, field))
            case .room: TLV.record(6, field)
            case .frame: TLV.record(6, TLV.record(4, field))
            }
        }
    }

    /// Every integer and text field, with the name its errors give it and its width (0: text).
    static let scalars: [(Place, UInt16, String, Int)] = [
        (.globals, 1, "stopped-reading time", 8), (.globals, 2, "writer", 0), (.globals, 3, "connection count", 4),
        (.globals, 4, "box name", 0), (.globals, 5, "socket options", 0), (.globals, 6, "hand-over count", 8),
        (.globals, 0x5701, "WebSocket connection count", 4),
        (.connection, 1, "key", 8), (.connection, 2, "dialect", 1), (.connection, 3, "peer address", 0), (.connection, 6, "nickname", 0),
        (.connection, 9, "heartbeat time remaining", 4), (.connection, 10, "partial frame time remaining", 4),
        (.connection, 11, "violations", 4), (.connection, 12, "frame tokens", 8), (.connection, 13, "byte tokens", 8),
        (.connection, 14, "draining", 1), (.connection, 15, "torn bytes", 8), (.connection, 16, "time over output_soft_bytes", 4),
        (.connection, 0x5001, "positions", 1), (.connection, 0x5E01, "texts shed", 4), (.connection, 0x5801, "last text time", 8),
        (.webSocket, 1, "WebSocket upgraded", 1), (.webSocket, 2, "WebSocket subprotocol", 0), (.webSocket, 3, "WebSocket echo", 1),
        (.webSocket, 4, "WebSocket message opcode", 1), (.webSocket, 7, "WebSocket checked bytes", 8),
        (.webSocket, 9, "WebSocket upgrade time remaining", 4), (.webSocket, 10, "WebSocket time to the next ping", 4),
        (.cluster, 1, "cluster origin", 8), (.cluster, 2, "cluster stream", 8), (.cluster, 5, "cluster return deadline", 8),
        (.stream, 11, "cluster stream id", 8), (.stream, 12, "cluster stream number", 8),
        (.position, 13, "cluster position origin", 8), (.position, 11, "cluster position stream", 8), (.position, 12, "cluster position number", 8),
        (.room, 2, "room epoch", 0), (.room, 3, "room seq", 8), (.frame, 10, "history frame seq", 8),
    ]

    @Test("each integer of the wrong width and each text that is not UTF-8 is refused, naming the field")
    func scalarErrors() {
        for (place, tag, name, width) in Self.scalars {
            if width == 0 {
                #expect(Self.error(place.wrap(TLV.record(tag, [0x61, 0xFF]))) == .damaged("\(name) is not UTF-8"), "\(place) \(tag)")
            } else {
                for wrong in [0, width - 1, width + 1] where wrong != width {
                    let expected = HandOverState.DecodeError.damaged("\(name): \(wrong) bytes, expected \(width)")
                    #expect(Self.error(place.wrap(TLV.record(tag, [UInt8](repeating: 0, count: wrong)))) == expected, "\(place) \(tag)")
                }
            }
        }
    }

    @Test("records that do not add up are refused, each with its own text")
    func recordErrors() {
        // Globals and cross-checks.
        #expect(Self.error(TLV.record(1, TLV.u32(3, 1)) + TLV.connection([]) + TLV.connection([])) == .damaged("2 connection records, the globals say 1"))
        #expect(Self.error(TLV.record(1, TLV.u32(3, 3)) + TLV.connection([])) == .damaged("1 connection records, the globals say 3"))
        #expect(Self.error(TLV.webSocket([])) == .damaged("1 WebSocket connection records, the globals say 0"))
        #expect(Self.error(TLV.record(1, TLV.u32(0x5701, 2)) + TLV.webSocket([])) == .damaged("1 WebSocket connection records, the globals say 2"))
        #expect(Self.error(TLV.record(4, TLV.u64(1, 1))) == .damaged("a WebSocket connection record without its WebSocket state"))
        // Connections.
        #expect(Self.error(TLV.record(2, TLV.u8(2, 0))) == .damaged("a connection record without its key"))
        #expect(Self.error(TLV.record(2, [])) == .damaged("a connection record without its key"))
        #expect(Self.error(TLV.connection(TLV.u8(2, 9))) == .damaged("unknown dialect 9"))
        #expect(Self.error(TLV.connection(TLV.record(8, [1, 2]) + TLV.u64(15, 3))) == .damaged("3 torn bytes in 2 bytes of owed output"))
        #expect(Self.error(TLV.connection(TLV.u64(15, 1))) == .damaged("1 torn bytes in 0 bytes of owed output"))
        #expect(Self.error(TLV.connection(TLV.u8(2, 2))) == .damaged("a webSocket connection record without WebSocket state"))
        #expect(Self.error(TLV.connection(TLV.record(0x5701, []))) == .damaged("a ltb connection record with WebSocket state"))
        #expect(Self.error(TLV.connection(TLV.u8(2, 1) + TLV.record(0x5701, []))) == .damaged("a json connection record with WebSocket state"))
        guard case .damaged(let claims)? = Self.error(TLV.connection(TLV.text(0x4101, "{}"))) else { Issue.record("claims"); return }
        #expect(claims.hasPrefix("verified claims: "), "\(claims)")
        // WebSocket state.
        let one = TLV.record(1, TLV.u32(0x5701, 1))
        #expect(Self.error(one + TLV.webSocket(TLV.text(2, "chat"))) == .damaged("unknown WebSocket subprotocol 'chat'"))
        #expect(Self.error(one + TLV.webSocket(TLV.u8(4, 9))) == .damaged("a fragmented WebSocket message of opcode 9"))
        #expect(Self.error(one + TLV.webSocket(TLV.u8(4, 0))) == .damaged("a fragmented WebSocket message of opcode 0"))
        #expect(Self.error(one + TLV.webSocket(TLV.record(6, [4, 0x80, 0xBF]))) == .damaged("WebSocket UTF-8 state [4, 128, 191]"))
        #expect(Self.error(one + TLV.webSocket(TLV.record(8, [1, 0x90]))) == .damaged("WebSocket UTF-8 state [1, 144]"))
        #expect(Self.error(one + TLV.webSocket(TLV.record(5, [1]))) == .damaged("a WebSocket message without its opcode"))
        #expect(Self.error(one + TLV.webSocket(TLV.u64(7, 5), input: [1, 2])) == .damaged("5 bytes of a WebSocket frame checked, 2 unconsumed"))
        #expect(Self.error(one + TLV.webSocket(TLV.u64(7, 2), input: [1, 2])) == nil)
        // Cluster, moderation, rooms.
        #expect(Self.error(TLV.record(3, TLV.u64(2, 5))) == .damaged("a cluster record without its origin"))
        #expect(Self.error(TLV.record(3, TLV.u64(1, 0))) == .damaged("a cluster record without its origin"))
        #expect(Self.error(TLV.record(5, TLV.text(1, "settings:r"))) == .damaged("a moderation record that is not a field and its value"))
        #expect(Self.error(TLV.record(5, TLV.text(2, "30 7000"))) == .damaged("a moderation record that is not a field and its value"))
        #expect(Self.error(TLV.record(6, TLV.text(2, "e"))) == .damaged("a room record without its name or epoch"))
        #expect(Self.error(TLV.record(6, TLV.text(1, "r"))) == .damaged("a room record without its name or epoch"))
        #expect(Self.error(TLV.record(6, TLV.text(1, "r") + TLV.text(2, ""))) == .damaged("a room record without its name or epoch"))
    }

    @Test("unknown tags are skipped at every level, whatever their bytes, and so are tags of another level")
    func unknownTagsSkipped() throws {
        let junk: [UInt8] = [0xFF, 0xFE, 0x00]
        var s = try Self.decode(TLV.record(0, junk) + TLV.record(0x63, junk) + TLV.record(7, junk)
                                + TLV.record(1, TLV.u64(1, 5) + TLV.record(7, junk) + TLV.record(0x5702, junk) + TLV.text(2, "w"))
                                + TLV.connection(TLV.record(0, junk) + TLV.record(17, junk) + TLV.record(0x4102, junk) + TLV.text(3, "a:1"))
                                + TLV.record(3, TLV.u64(1, 9) + TLV.record(10, junk) + TLV.record(13, junk) + TLV.record(6, junk)
                                             + TLV.record(3, TLV.text(10, "r") + TLV.record(13, junk) + TLV.record(1, junk) + TLV.u64(11, 2))
                                             + TLV.record(4, TLV.text(10, "r") + TLV.record(1, junk) + TLV.record(5, junk) + TLV.u64(13, 4)))
                                + TLV.record(5, TLV.text(1, "settings:r") + TLV.record(3, junk) + TLV.text(2, "30 7000"))
                                + TLV.record(6, TLV.text(1, "r") + TLV.record(10, junk) + TLV.record(11, junk) + TLV.text(2, "e")
                                             + TLV.record(4, TLV.record(1, junk) + TLV.record(4, junk) + TLV.u64(10, 3))))
        var expected = HandOverState(stoppedReadingMs: 5, writer: "w")
        var c = HandOverState.Record(key: 1)
        c.peerAddress = "a:1"
        expected.connections = [c]
        expected.cluster = .init(origin: 9, lastStream: 0, streams: [.init(room: "r", id: 2, seq: 0)],
                                 positions: [.init(room: "r", origin: 4, stream: 0, seq: 0)])
        expected.moderation = [.settings("r", slowModeSeconds: 30, setMs: 7_000)]
        expected.rooms = [RoomStream(room: "r", position: RoomPosition(epoch: "e", seq: 0), history: [NumberedFrame(seq: 3, frame: [])])]
        #expect(s == expected)
        // Inside a WebSocket state.
        s = try Self.decode(TLV.record(1, TLV.u32(0x5701, 1)) + TLV.webSocket(TLV.record(11, junk) + TLV.record(0, junk) + TLV.u8(3, 1)))
        #expect(s.connections.first?.webSocket?.echo == true && s.connections.first?.webSocket?.upgraded == false)
    }

    @Test("a moderation record outside today's bounds is dropped, not the state")
    func moderationOutOfBoundsDropped() throws {
        let s = try Self.decode(TLV.record(5, TLV.text(1, "settings:r") + TLV.text(2, "not a number"))
                                + TLV.record(5, TLV.text(1, "nonsense") + TLV.text(2, "1 2")))
        #expect(s.moderation.isEmpty)
    }

    @Test("a repeated field: the last one wins; a repeated record: globals merge, a cluster or WebSocket state replaces")
    func repeatedFieldsAndRecords() throws {
        var s = try Self.decode(TLV.record(1, TLV.u64(1, 5) + TLV.text(2, "a") + TLV.u64(6, 2))
                                + TLV.record(1, TLV.text(2, "b") + TLV.text(2, "c"))
                                + TLV.connection(TLV.text(3, "x") + TLV.u32(11, 4) + TLV.u32(11, 6) + TLV.u64(1, 8))
                                + TLV.record(3, TLV.u64(1, 1) + TLV.record(3, TLV.text(10, "r")) + TLV.u64(5, 77))
                                + TLV.record(3, TLV.u64(1, 2) + TLV.u64(2, 3))
                                + TLV.record(5, TLV.text(1, "bogus") + TLV.text(1, "settings:r") + TLV.text(2, "x") + TLV.text(2, "10 5")))
        #expect((s.stoppedReadingMs, s.writer, s.handOvers) == (5, "c", 2))
        #expect(s.connections.map(\.key) == [8] && s.connections[0].violations == 6 && s.connections[0].peerAddress == "x")
        #expect(s.cluster == .init(origin: 2, lastStream: 3, streams: []))
        #expect(s.moderation == [.settings("r", slowModeSeconds: 10, setMs: 5)])
        s = try Self.decode(TLV.record(1, TLV.u32(0x5701, 1)) + TLV.record(4, TLV.u64(1, 1) + TLV.u8(2, 2)
                                + TLV.record(0x5701, TLV.u8(3, 1) + TLV.u8(1, 1)) + TLV.record(0x5701, TLV.text(2, "roomcast.ltb.v1"))))
        var ws = HandOverState.WebSocket()
        ws.subprotocol = .ltb
        #expect(s.connections.first?.webSocket == ws, "the second WebSocket state replaces the first")
        // Repeated fields of a list: each one an element, in order.
        s = try Self.decode(TLV.record(6, TLV.text(1, "r") + TLV.text(2, "e") + TLV.record(4, TLV.u64(10, 2)) + TLV.record(4, TLV.u64(10, 1))))
        #expect(s.rooms.first?.history.map(\.seq) == [2, 1])
    }

    @Test("booleans read any non-zero byte as true; an integer field takes the bit pattern")
    func valueReadings() throws {
        let s = try Self.decode(TLV.connection(TLV.u8(14, 2) + TLV.u8(0x5001, 0xFF) + TLV.u64(12, UInt64.max) + TLV.record(8, [1]) + TLV.u64(15, 1)))
        #expect(s.connections[0].draining && s.connections[0].positions && s.connections[0].frameMilliTokens == -1)
        #expect(s.connections[0].tornBytes == 1)
        // The checked count clamps to Int, then fails the check against the unconsumed bytes.
        #expect(Self.error(TLV.record(1, TLV.u32(0x5701, 1)) + TLV.webSocket(TLV.u64(7, UInt64.max), input: [1]))
                == .damaged("\(Int.max) bytes of a WebSocket frame checked, 1 unconsumed"))
    }

    @Test("the size bounds count more fields than the tables have, so a new row keeps them bounds")
    func boundsCoverTheTables() {
        #expect(HandOverState.connection.fields.count < HandOverState.maxConnectionFields)
        #expect(HandOverState.webSocket.fields.count < HandOverState.maxWebSocketFields)
        #expect(HandOverState.globals.fields.count < 16, "globalsBytesBound counts 16")
    }
}
