// The WebSocket part of the hand-over state (docs/protocol/websocket.md §15): a
// connection's phase, subprotocol and decoder round-trip beside the other
// dialects' records, in a record tag a reader before it skips; states
// written before it (the version-1 fixture) still read; a decoder carried
// across goes on as if it had never stopped.
import Foundation
import Testing
@testable import RoomcastCore

@Suite("Hand-over state: WebSocket connections")
struct HandOverWebSocketStateTests {
    /// An LTB record and WebSocket records in every phase: upgrading, open on
    /// each subprotocol mid-message (a fragmented text message ending inside
    /// a UTF-8 sequence, an incomplete text frame partly checked), echo.
    static var mixed: HandOverState {
        var ltb = HandOverState.Record(key: 1)
        ltb.room = "r1"
        var upgrading = HandOverState.Record(key: 2)
        upgrading.dialect = .webSocket
        upgrading.input = Array("GET / HTTP/1.1\r\nHost: x\r\n".utf8)
        var u = HandOverState.WebSocket()
        u.upgradeRemainingMs = 3_250
        upgrading.webSocket = u
        var json = HandOverState.Record(key: 3)
        json.dialect = .webSocket
        json.room = "r1"
        json.heartbeatRemainingMs = 29_000
        json.input = [0x80, 0x85, 1, 2, 3, 4, 0x41]  // a final fragment's header, key and one payload byte
        json.output = [0x81, 0x03, 0x61]  // the rest of a frame the client got part of
        var j = HandOverState.WebSocket()
        j.upgraded = true
        j.subprotocol = .json
        var validator = UTF8Validator()
        let fed = validator.feed(Array("{\"msg\":\"caf".utf8) + [0xC3])
        var partial = validator
        let fedPartial = partial.feed([0xA9])
        precondition(fed && fedPartial && !validator.isComplete && partial.isComplete)
        j.decoder = .init(messageOpcode: .text, message: Array("{\"msg\":\"caf".utf8) + [0xC3], utf8: validator,
                          checkedOfPartialFrame: 1, partialUTF8: partial)
        j.nextPingMs = 12_000
        json.webSocket = j
        var binary = HandOverState.Record(key: 4)
        binary.dialect = .webSocket
        binary.room = RoomName(bytes: [0xFF, 0x00])
        var b = HandOverState.WebSocket()
        b.upgraded = true
        b.subprotocol = .ltb
        b.decoder = .init(messageOpcode: .binary, message: [6, 0, 0, 0, 2, 0])
        binary.webSocket = b
        var echo = HandOverState.Record(key: 5)
        echo.dialect = .webSocket
        var e = HandOverState.WebSocket()
        (e.upgraded, e.echo) = (true, true)
        echo.webSocket = e
        return HandOverState(stoppedReadingMs: 9, writer: "t", connections: [ltb, upgrading, json, binary, echo])
    }

    @Test("every WebSocket field round-trips beside the other dialects' records")
    func roundTrip() throws {
        let s = Self.mixed
        let back = try HandOverState.decode(s.encode())
        #expect(back == s)
        #expect(back.connections.map(\.dialect) == [.ltb, .webSocket, .webSocket, .webSocket, .webSocket])
    }

    @Test("WebSocket records are tag 4, outside the count of tag 2 records that a reader before them checks")
    func olderReadersSkipThem() throws {
        let bytes = Self.mixed.encode()
        var tags: [UInt16] = []
        var offset = 24
        var count: UInt32?
        while offset < bytes.count {
            let tag = UInt16(bytes[offset]) | UInt16(bytes[offset + 1]) << 8
            let length = Int(bytes[offset + 2]) | Int(bytes[offset + 3]) << 8 | Int(bytes[offset + 4]) << 16 | Int(bytes[offset + 5]) << 24
            if tag == 1 {
                var g = offset + 6
                while g < offset + 6 + length {
                    let t = UInt16(bytes[g]) | UInt16(bytes[g + 1]) << 8
                    let l = Int(bytes[g + 2]) | Int(bytes[g + 3]) << 8
                    if t == 3 { count = UInt32(bytes[g + 6]) | UInt32(bytes[g + 7]) << 8 }
                    g += 6 + l
                }
            }
            tags.append(tag)
            offset += 6 + length
        }
        #expect(tags == [1, 2, 4, 4, 4, 4])
        #expect(count == 1, "the globals' connection count is the tag 2 records' (a version without tag 4 cross-checks it)")
    }

    @Test("states written before WebSocket records existed read with no WebSocket state")
    func version1FixtureHasNone() throws {
        let bytes = try [UInt8](Data(contentsOf: HandOverStateTests.fixtureURL))
        let state = try HandOverState.decode(bytes)
        #expect(!state.connections.isEmpty && state.connections.allSatisfy { $0.webSocket == nil && $0.dialect != .webSocket })
        #expect(try HandOverState.decode(HandOverStateTests.full.encode()) == HandOverStateTests.full, "no WebSocket state: as before")
    }

    @Test("a WebSocket record that does not add up is refused, never misread")
    func damagedWebSocketState() {
        func refused(_ edit: (inout HandOverState.Record) -> Void) -> Bool {
            var s = Self.mixed
            edit(&s.connections[2])
            do { _ = try HandOverState.decode(s.encode()); return false } catch { return true }
        }
        #expect(refused { $0.dialect = .ltb }, "an LTB record with WebSocket state")
        #expect(refused { $0.webSocket!.decoder.checkedOfPartialFrame = 100 }, "more checked than the unconsumed bytes")
        #expect(refused { $0.webSocket!.decoder.messageOpcode = .ping }, "a control frame cannot be fragmented")
        #expect(refused { $0.webSocket!.decoder.messageOpcode = nil }, "a message without its opcode")
        #expect(!refused { _ in }, "the unedited state reads")
        // A WebSocket dialect in a tag 2 record without its state.
        var plain = HandOverState.Record(key: 8)
        plain.dialect = .webSocket
        #expect(throws: HandOverState.DecodeError.self) { try HandOverState.decode(HandOverState(connections: [plain]).encode()) }
        #expect(UTF8Validator(packed: [4, 0x80, 0xBF]) == nil && UTF8Validator(packed: [1, 0x90, 0x8F]) == nil)
        #expect(UTF8Validator(packed: UTF8Validator().packed) == UTF8Validator())
    }

    @Test("the size bound still holds with a WebSocket message in reassembly")
    func sizeBound() {
        var r = Self.mixed.connections[2]
        r.webSocket!.decoder.message = [UInt8](repeating: 7, count: 5_000)
        let s = HandOverState(connections: [r])
        let bound = HandOverState.globalsBytesBound(writer: 0)
            + HandOverState.recordBytesBound(address: 0, room: 2, identity: 0, nickname: 0, input: r.input.count, output: r.output.count,
                                             webSocketMessage: 1 + 5_000)
        #expect(s.encode().count <= bound)
    }

    @Test("a decoder carried mid-message gives the message a decoder that never stopped gives")
    func decoderCarriedAcross() {
        // "Hé" + "llo wörld" in two text fragments; the é split across them, the second fragment cut in the middle.
        let text = Array("Hé".utf8)
        let first = clientFrame(0x01, Array(text[0..<2]))  // H and the first byte of é
        let second = clientFrame(0x80, Array(text[2...]) + Array("llo wörld".utf8))
        let stream = first + second
        for cut in first.count..<stream.count {
            var d = WebSocketDecoder(maxMessageBytes: 1 << 16)
            var offset = 0
            var events: [WebSocketDecoder.Event] = []
            func run(_ d: inout WebSocketDecoder, upTo end: Int) {
                while true {
                    let step = stream[offset..<end].withUnsafeBytes { d.next($0) }
                    guard case .event(let e, let used) = step else { break }
                    events.append(e)
                    offset += used
                }
            }
            run(&d, upTo: cut)
            var next = WebSocketDecoder(maxMessageBytes: 1 << 16, carried: d.carried)
            #expect(next == d, "cut at \(cut): the carried state is the whole state")
            run(&next, upTo: stream.count)
            #expect(events == [.fragment, .message(.text, Array("Héllo wörld".utf8))], "cut at \(cut)")
        }
    }
}
