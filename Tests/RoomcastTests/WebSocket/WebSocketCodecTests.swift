import Testing
@testable import RoomcastCore

/// A client frame as a browser sends it: masked with `key` (RFC 6455 §5.3).
/// `first` is the whole first byte (FIN, RSV, opcode) so that hostile
/// frames can be built too; `masked: false` leaves the mask out.
func clientFrame(_ first: UInt8, _ payload: [UInt8], key: [UInt8] = [0x37, 0xFA, 0x21, 0x3D], masked: Bool = true,
                 lengthForm: Int? = nil) -> [UInt8] {
    var out: [UInt8] = [first]
    let n = payload.count
    let form = lengthForm ?? (n <= 125 ? 0 : n <= 0xFFFF ? 2 : 8)
    let maskBit: UInt8 = masked ? 0x80 : 0
    switch form {
    case 0: out.append(maskBit | UInt8(n))
    case 2: out += [maskBit | 126, UInt8(n >> 8), UInt8(n & 0xFF)]
    default: out.append(maskBit | 127); for s in stride(from: 56, through: 0, by: -8) { out.append(UInt8((UInt64(n) >> UInt64(s)) & 0xFF)) }
    }
    if masked {
        out += key
        for (i, b) in payload.enumerated() { out.append(b ^ key[i % 4]) }
    } else {
        out += payload
    }
    return out
}

/// Every frame of `stream`, decoded step by step; stops at the first failure.
func decodeStream(_ stream: [UInt8], max: Int = 1 << 20) -> (events: [WebSocketDecoder.Event], failure: WebSocketFailure?, left: Int) {
    var d = WebSocketDecoder(maxMessageBytes: max)
    var events: [WebSocketDecoder.Event] = []
    var offset = 0
    while true {
        let step = stream.withUnsafeBytes { d.next(UnsafeRawBufferPointer(rebasing: $0[offset...])) }
        switch step {
        case .needMore: return (events, nil, stream.count - offset)
        case .failure(let f): return (events, f, stream.count - offset)
        case .event(let e, let consumed): events.append(e); offset += consumed
        }
    }
}

/// RFC 6455 §5 framing: the examples of §5.7, every rule a client frame can
/// break with its close code, reassembly and the UTF-8 checks across fragments.
@Suite struct WebSocketCodecTests {
    let hello = Array("Hello".utf8)

    // MARK: RFC 6455 §5.7

    @Test func rfcUnmaskedTextIsWhatTheServerSends() {
        #expect(WebSocketFrameEncoder.encode(.text, payload: hello) == [0x81, 0x05, 0x48, 0x65, 0x6C, 0x6C, 0x6F])
    }

    @Test func rfcUnmaskedTextFromAClientIsAProtocolError() {
        let r = decodeStream([0x81, 0x05, 0x48, 0x65, 0x6C, 0x6C, 0x6F])
        #expect(r.failure?.code == .protocolError)
        #expect(r.events.isEmpty)
    }

    @Test func rfcMaskedText() {
        let r = decodeStream([0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58])
        #expect(r.events == [.message(.text, hello)])
        #expect(r.failure == nil && r.left == 0)
    }

    @Test func rfcFragmentedText() {
        // §5.7's fragments "Hel" + "lo", masked as a client must.
        let stream = clientFrame(0x01, Array("Hel".utf8)) + clientFrame(0x80, Array("lo".utf8), key: [1, 2, 3, 4])
        #expect(decodeStream(stream).events == [.fragment, .message(.text, hello)])
    }

    @Test func rfcPingAndMaskedPong() {
        #expect(WebSocketFrameEncoder.encode(.ping, payload: hello) == [0x89, 0x05, 0x48, 0x65, 0x6C, 0x6C, 0x6F])
        let r = decodeStream([0x8A, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58])
        #expect(r.events == [.pong(hello)])
    }

    @Test func rfcLengthForms() {
        let b256 = [UInt8](repeating: 0xAB, count: 256)
        let f256 = WebSocketFrameEncoder.encode(.binary, payload: b256)
        #expect(Array(f256.prefix(4)) == [0x82, 0x7E, 0x01, 0x00] && f256.count == 4 + 256)
        let b64k = [UInt8](repeating: 1, count: 65_536)
        let f64k = WebSocketFrameEncoder.encode(.binary, payload: b64k)
        #expect(Array(f64k.prefix(10)) == [0x82, 0x7F, 0, 0, 0, 0, 0, 0x01, 0x00, 0x00] && f64k.count == 10 + 65_536)
        // The boundaries of the three header sizes.
        for (n, h) in [(0, 2), (125, 2), (126, 4), (65_535, 4), (65_536, 10)] {
            #expect(WebSocketFrameEncoder.headerSize(payloadLength: n) == h)
            #expect(WebSocketFrameEncoder.encode(.text, payload: [UInt8](repeating: 0x61, count: n)).count == n + h)
        }
        // And the decoder reads each form back (masked).
        for n in [0, 125, 126, 65_535, 65_536, 70_000] {
            let p = (0..<n).map { UInt8($0 & 0x7F) }
            #expect(decodeStream(clientFrame(0x82, p)).events == [.message(.binary, p)], "\(n) bytes")
        }
    }

    // MARK: partial input

    @Test func everySplitPointNeedsMoreUntilTheFrameIsWhole() {
        let frame = clientFrame(0x81, Array("héllo wörld, a text of some length ✓".utf8)) + clientFrame(0x82, [UInt8](repeating: 7, count: 300))
        let whole = decodeStream(frame)
        #expect(whole.events.count == 2)
        for k in 0..<frame.count {
            var d = WebSocketDecoder(maxMessageBytes: 1 << 20)
            let step = frame.withUnsafeBytes { d.next(UnsafeRawBufferPointer(rebasing: $0[0..<k])) }
            let firstLength = frame.count - (4 + 4 + 300)
            if k < firstLength { #expect(step == .needMore, "prefix \(k)") }
        }
    }

    // MARK: rules and close codes

    @Test func rsvBitsWithoutAnExtension() {
        for rsv: UInt8 in [0x40, 0x20, 0x10, 0x70] {
            #expect(decodeStream(clientFrame(0x81 | rsv, hello)).failure?.code == .protocolError)
        }
    }

    @Test func reservedOpcodes() {
        for op: UInt8 in [3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF] {
            #expect(decodeStream(clientFrame(0x80 | op, [])).failure?.code == .protocolError, "opcode \(op)")
        }
    }

    @Test func controlFramesAreSmallAndWhole() {
        let big = [UInt8](repeating: 0x61, count: 126)
        #expect(decodeStream(clientFrame(0x89, [UInt8](repeating: 0x61, count: 125))).events.count == 1)
        #expect(decodeStream(clientFrame(0x89, big)).failure?.code == .protocolError)
        // Decided on the 2-byte header alone, before the 126 bytes arrive.
        var d = WebSocketDecoder(maxMessageBytes: 1 << 20)
        #expect([UInt8]([0x89, 0xFE]).withUnsafeBytes { d.next($0) } == .failure(WebSocketFailure(.protocolError, "ping frame over 125 bytes (RFC 6455 §5.5)")))
        #expect(decodeStream(clientFrame(0x09, hello)).failure?.code == .protocolError)  // FIN clear
        #expect(decodeStream(clientFrame(0x08, [])).failure?.code == .protocolError)
    }

    @Test func controlFramesInterleavedWithFragments() {
        let stream = clientFrame(0x01, Array("Hel".utf8)) + clientFrame(0x89, Array("p".utf8))
            + clientFrame(0x00, Array("l".utf8)) + clientFrame(0x8A, []) + clientFrame(0x80, Array("o".utf8))
        #expect(decodeStream(stream).events == [.fragment, .ping(Array("p".utf8)), .fragment, .pong([]), .message(.text, hello)])
    }

    @Test func continuationWithoutAMessageAndANewMessageMidway() {
        #expect(decodeStream(clientFrame(0x80, hello)).failure?.code == .protocolError)
        #expect(decodeStream(clientFrame(0x00, hello)).failure?.code == .protocolError)
        let midway = clientFrame(0x01, hello) + clientFrame(0x82, hello)
        let r = decodeStream(midway)
        #expect(r.events == [.fragment] && r.failure?.code == .protocolError)
    }

    @Test func oversizedMessageRefusedOnItsHeader() {
        // 10-byte header claiming 1 GiB: refused before any payload.
        var header: [UInt8] = [0x82, 0xFF, 0, 0, 0, 0, 0x40, 0, 0, 0]
        header += [1, 2, 3, 4]
        var d = WebSocketDecoder(maxMessageBytes: 64 << 10)
        guard case .failure(let f) = header.withUnsafeBytes({ d.next($0) }) else { Issue.record("not refused"); return }
        #expect(f.code == .messageTooBig)
        // The most significant bit of the 64-bit length.
        let msb: [UInt8] = [0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0]
        #expect(decodeStream(msb).failure?.code == .protocolError)
        // Exactly the bound passes, one more fails.
        #expect(decodeStream(clientFrame(0x82, [UInt8](repeating: 0, count: 100)), max: 100).events.count == 1)
        #expect(decodeStream(clientFrame(0x82, [UInt8](repeating: 0, count: 101)), max: 100).failure?.code == .messageTooBig)
    }

    @Test func fragmentsReassembledWithinTheBound() {
        let part = [UInt8](repeating: 0x62, count: 40)
        let three = clientFrame(0x02, part) + clientFrame(0x00, part) + clientFrame(0x80, part)
        #expect(decodeStream(three, max: 120).events == [.fragment, .fragment, .message(.binary, part + part + part)])
        let r = decodeStream(three, max: 119)
        #expect(r.events == [.fragment, .fragment] && r.failure?.code == .messageTooBig)
    }

    @Test func invalidUTF8SplitAcrossFragmentsFailsAtTheFragment() {
        // "κό" with its 2-byte sequence cut: CE | BA E1 BD B9; then an invalid continuation.
        let good = clientFrame(0x01, [0xCE]) + clientFrame(0x80, [0xBA, 0xE1, 0xBD, 0xB9])
        #expect(decodeStream(good).events == [.fragment, .message(.text, [0xCE, 0xBA, 0xE1, 0xBD, 0xB9])])
        // E0 then 80: overlong, decided at the second fragment, before the final one.
        let bad = clientFrame(0x01, [0x61, 0xE0]) + clientFrame(0x00, [0x80, 0x80]) + clientFrame(0x80, [0x61])
        let r = decodeStream(bad)
        #expect(r.events == [.fragment] && r.failure?.code == .invalidPayload)
        // A message that ends inside a sequence.
        let cut = clientFrame(0x01, [0x61]) + clientFrame(0x80, [0xF0, 0x9F, 0x98])
        #expect(decodeStream(cut).failure?.code == .invalidPayload)
        // Binary is not checked.
        #expect(decodeStream(clientFrame(0x82, [0xFF, 0xFE])).events == [.message(.binary, [0xFF, 0xFE])])
        // A surrogate (ED A0 80) and a code point above U+10FFFF (F4 90 80 80).
        #expect(decodeStream(clientFrame(0x81, [0xED, 0xA0, 0x80])).failure?.code == .invalidPayload)
        #expect(decodeStream(clientFrame(0x81, [0xF4, 0x90, 0x80, 0x80])).failure?.code == .invalidPayload)
    }

    @Test func closePayloadRules() {
        #expect(decodeStream(clientFrame(0x88, [])).events == [.close(nil, "")])
        #expect(decodeStream(clientFrame(0x88, [0x03, 0xE8] + Array("bye ✓".utf8))).events == [.close(.normal, "bye ✓")])
        #expect(decodeStream(clientFrame(0x88, [0x03])).failure?.code == .protocolError)
        for bad: UInt16 in [0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65_535] {
            #expect(decodeStream(clientFrame(0x88, [UInt8(bad >> 8), UInt8(bad & 0xFF)])).failure?.code == .protocolError, "code \(bad)")
        }
        for good: UInt16 in [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999] {
            #expect(decodeStream(clientFrame(0x88, [UInt8(good >> 8), UInt8(good & 0xFF)])).events.count == 1, "code \(good)")
        }
        #expect(decodeStream(clientFrame(0x88, [0x03, 0xE8, 0xCE])).failure?.code == .invalidPayload)
    }

    @Test func serverCloseFrameFitsTheControlLimit() {
        let f = WebSocketFrameEncoder.close(.messageTooBig, reason: String(repeating: "é", count: 200))
        #expect(f[0] == 0x88 && Int(f[1]) <= 125 && f[2] == 0x03 && f[3] == 0xF1)
        // Cut at a character boundary: the reason is still UTF-8.
        #expect(String(validating: f[4...], as: UTF8.self) != nil)
    }

    @Test func decoderStateIsAPlainValue() {
        var d = WebSocketDecoder(maxMessageBytes: 100)
        let first = clientFrame(0x01, [0x61, 0xCE])
        _ = first.withUnsafeBytes { d.next($0) }
        var copy = d  // what a hand-over would carry
        #expect(copy == d && copy.messageOpcode == .text && copy.message == [0x61, 0xCE] && !copy.utf8.isComplete)
        let last = clientFrame(0x80, [0xBA])
        #expect(last.withUnsafeBytes { copy.next($0) } == .event(.message(.text, [0x61, 0xCE, 0xBA]), consumed: last.count))
        #expect(d.messageOpcode == .text)  // the original did not move
    }
}

/// The incremental UTF-8 validator against the standard library's.
@Suite struct UTF8ValidatorTests {
    @Test func agreesWithTheStandardLibraryOnRandomBytesInRandomSplits() {
        var seed: UInt64 = 0x9E37_79B9_7F4A_7C15
        func rand() -> UInt64 { seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17; return seed }
        let interesting: [UInt8] = [0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF, 0x9F, 0xA0, 0x8F, 0x90]
        for _ in 0..<20_000 {
            let n = Int(rand() % 12)
            let bytes = (0..<n).map { _ in rand() % 3 == 0 ? UInt8(truncatingIfNeeded: rand()) : interesting[Int(rand() % UInt64(interesting.count))] }
            let expected = String(validating: bytes, as: UTF8.self) != nil
            let cut = n == 0 ? 0 : Int(rand() % UInt64(n + 1))
            var v = UTF8Validator()
            let ok = v.feed(Array(bytes[..<cut])) && v.feed(Array(bytes[cut...])) && v.isComplete
            #expect(ok == expected, "\(bytes) split at \(cut)")
        }
    }
}

/// Invalid text is refused as it arrives, before its frame is complete
/// (RFC 6455 §8.1; Autobahn's "fail fast" cases 6.4.x).
@Suite struct WebSocketFailFastTests {
    @Test func invalidUTF8InAFrameStillArrivingFailsAtOnce() {
        // A 1,000-byte text frame: valid start, then F4 90 (above U+10FFFF) at payload byte 10.
        var payload = [UInt8](repeating: 0x61, count: 1_000)
        payload[10] = 0xF4; payload[11] = 0x90
        let frame = clientFrame(0x81, payload)
        var d = WebSocketDecoder(maxMessageBytes: 1 << 20)
        // Header (4 bytes) + mask (4) + 10 valid bytes: nothing wrong yet.
        #expect(frame.withUnsafeBytes { d.next(UnsafeRawBufferPointer(rebasing: $0[0..<18])) } == .needMore)
        #expect(d.checkedOfPartialFrame == 10)
        // Two more bytes arrive: refused with 988 bytes still to come.
        guard case .failure(let f) = frame.withUnsafeBytes({ d.next(UnsafeRawBufferPointer(rebasing: $0[0..<20])) }) else {
            Issue.record("not refused early"); return
        }
        #expect(f.code == .invalidPayload)
    }

    @Test func validTextDeliveredWholeAfterAnyPartialReads() {
        let text = Array("κόσμε, a text with a few multi-byte characters: ✓ 🎉".utf8)
        let stream = clientFrame(0x01, Array(text[0..<7])) + clientFrame(0x80, Array(text[7...]))
        for step in [1, 2, 3, 5, 11] {
            var d = WebSocketDecoder(maxMessageBytes: 1 << 20)
            var events: [WebSocketDecoder.Event] = []
            var start = 0, end = 0
            while start < stream.count {
                end = min(stream.count, end + step)
                switch stream.withUnsafeBytes({ d.next(UnsafeRawBufferPointer(rebasing: $0[start..<end])) }) {
                case .needMore: continue
                case .failure(let f): Issue.record("step \(step): \(f)"); return
                case .event(let e, let consumed): events.append(e); start += consumed
                }
            }
            #expect(events == [.fragment, .message(.text, text)], "reads of \(step) bytes")
        }
    }
}
