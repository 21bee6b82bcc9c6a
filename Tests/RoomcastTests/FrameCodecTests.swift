import Testing
@testable import RoomcastCore

/// Frame decoder tests (docs/protocol/ltb.md §1): splits, coalescing, empty bodies,
/// the size limit, hostile lengths in both byte orders.
@Suite struct FrameCodecTests {
    /// A stream of frames of varied types and sizes, including empty bodies.
    static func sampleFrames() -> [Frame] {
        [Frame(type: 0, body: Array("join".utf8)), Frame(type: 2, body: []), Frame(type: 8, body: Array("this is a heartBeat message ".utf8)),
         Frame(type: 99, body: (0..<300).map { UInt8($0 & 0xFF) }), Frame(type: 0xFFFF, body: [0]), Frame(type: 3, body: [])]
    }

    static func encode(_ frames: [Frame], _ order: ByteOrder) -> [UInt8] {
        frames.flatMap { FrameCodec.encode(type: $0.type, body: $0.body, byteOrder: order) }
    }

    static func decodeAll(_ chunks: [ArraySlice<UInt8>], order: ByteOrder, max: Int = 64 * 1024) throws -> [Frame] {
        var d = FrameDecoder(byteOrder: order, maxFrameBytes: max)
        var out: [Frame] = []
        for c in chunks {
            d.append(c)
            while let f = try d.next() { out.append(f) }
        }
        #expect(d.bufferedBytes == 0)
        return out
    }

    @Test(arguments: ByteOrder.allCases)
    func headerLayout(order: ByteOrder) {
        let bytes = FrameCodec.encode(type: 0x0102, body: [0xAA, 0xBB, 0xCC], byteOrder: order)
        if order == .little {
            #expect(bytes == [3, 0, 0, 0, 0x02, 0x01, 0xAA, 0xBB, 0xCC])
        } else {
            #expect(bytes == [0, 0, 0, 3, 0x01, 0x02, 0xAA, 0xBB, 0xCC])
        }
    }

    @Test(arguments: ByteOrder.allCases)
    func everySplitPointInTwoWrites(order: ByteOrder) throws {
        let frames = Self.sampleFrames()
        let stream = Self.encode(frames, order)
        for k in 0...stream.count {
            let got = try Self.decodeAll([stream[0..<k], stream[k...]], order: order)
            #expect(got == frames, "split at \(k)")
        }
    }

    @Test func oneBytePerWrite() throws {
        let frames = Self.sampleFrames()
        let stream = Self.encode(frames, .little)
        let chunks = stream.indices.map { stream[$0..<$0 + 1] }
        #expect(try Self.decodeAll(chunks, order: .little) == frames)
    }

    @Test func coalescedThousandsInOneWrite() throws {
        var frames = (0..<10_000).map { _ in Frame(type: 8, body: []) }
        frames.append(Frame(type: 2, body: Array("after".utf8)))
        let stream = Self.encode(frames, .little)
        #expect(try Self.decodeAll([stream[...]], order: .little) == frames)
    }

    @Test func zeroLengthFrameIsComplete() {
        let bytes = FrameCodec.encode(type: 99, body: [], byteOrder: .little)
        #expect(bytes.count == 6)
        let step = bytes.withUnsafeBytes { FrameCodec.parse($0, byteOrder: .little, maxFrameBytes: 0) }
        #expect(step == .frame(type: 99, bodyLength: 0))
    }

    @Test(arguments: ByteOrder.allCases)
    func limitExactlyAtAndOneOver(order: ByteOrder) throws {
        let atLimit = FrameCodec.encode(type: 2, body: [UInt8](repeating: 7, count: 1024), byteOrder: order)
        #expect(try Self.decodeAll([atLimit[...]], order: order, max: 1024).map(\.body.count) == [1024])

        var d = FrameDecoder(byteOrder: order, maxFrameBytes: 1024)
        d.append(FrameCodec.encode(type: 2, body: [UInt8](repeating: 7, count: 1025), byteOrder: order).prefix(6))
        #expect(throws: FrameTooLarge(claimed: 1025, limit: 1024)) { try d.next() }
    }

    /// Hostile lengths are refused on the 6 header bytes alone: nothing is
    /// allocated for them and no arithmetic traps.
    @Test(arguments: ByteOrder.allCases, [UInt32(0x8000_0000), 0xFFFF_FFFF, 0xFFFF_FFFA, 65537, 0x2020_5447])
    func hostileLengths(order: ByteOrder, length: UInt32) {
        var header: [UInt8] = []
        FrameCodec.appendHeader(type: 2, length: length, byteOrder: order, to: &header)
        let step = header.withUnsafeBytes { FrameCodec.parse($0, byteOrder: order, maxFrameBytes: 64 * 1024) }
        #expect(step == .tooLarge(claimed: length))
        // Even with the largest possible limit, a huge claim just waits for bytes.
        let lenient = header.withUnsafeBytes { FrameCodec.parse($0, byteOrder: order, maxFrameBytes: Int.max) }
        #expect(lenient == .needMore)
    }

    /// An HTTP request line read as a little-endian header claims ~542 MB
    /// ("GET " = 0x20544547): refused before the 7th byte.
    @Test func otherProtocolsAreRefusedAtTheHeader() {
        let http = Array("GET / HTTP/1.1\r\n".utf8)
        let step = http.withUnsafeBytes { FrameCodec.parse(UnsafeRawBufferPointer(rebasing: $0[0..<6]), byteOrder: .little, maxFrameBytes: 64 * 1024) }
        #expect(step == .tooLarge(claimed: 0x2054_4547))
    }

    @Test func fewerThanSixBytesNeedMore() {
        for n in 0..<6 {
            let bytes = [UInt8](repeating: 0, count: n)
            #expect(bytes.withUnsafeBytes { FrameCodec.parse($0, byteOrder: .little, maxFrameBytes: 10) } == .needMore)
        }
    }
}
