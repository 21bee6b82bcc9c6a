// libFuzzer target: FrameDecoder fed the same byte stream in chunks derived
// from the input must give exactly what decoding the whole stream at once
// gives (frames, then the same error or the same leftover), and the frames
// re-encoded must be the stream's prefix. Input: [flags, limit, seed, seed] + stream.
// Build and run: `make fuzz`.
import RoomcastCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrameDecoder(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 4 else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    let order: ByteOrder = input[0] & 1 == 0 ? .little : .big
    let maxChunk = [1, 2, 7, 64, 1024, 70_000][Int(input[0] >> 1) % 6]
    let limit = [0, 1, 5, 16, 255, 1024, 65_536, 1 << 30, Int.max][Int(input[1]) % 9]
    var seed = UInt32(input[2]) | UInt32(input[3]) << 8 | 0x9E37_0000
    let stream = Array(input[4...])

    // The whole stream at once.
    var whole = FrameDecoder(byteOrder: order, maxFrameBytes: limit)
    whole.append(stream)
    var expected: [Frame] = []
    var expectedError: FrameTooLarge?
    while true {
        do {
            guard let f = try whole.next() else { break }
            expected.append(f)
        } catch {
            expectedError = error
            break
        }
    }

    // The same stream in chunks of 1...maxChunk bytes (xorshift from the seed).
    var chunked = FrameDecoder(byteOrder: order, maxFrameBytes: limit)
    var got: [Frame] = []
    var gotError: FrameTooLarge?
    var offset = 0
    feeding: while offset < stream.count {
        seed ^= seed << 13; seed ^= seed >> 17; seed ^= seed << 5
        let n = min(stream.count - offset, 1 + Int(seed % UInt32(maxChunk)))
        chunked.append(stream[offset..<offset + n])
        offset += n
        while true {
            do {
                guard let f = try chunked.next() else { break }
                got.append(f)
            } catch {
                gotError = error
                break feeding
            }
        }
    }

    precondition(got == expected, "chunked decoding gave \(got.count) frames, whole-stream decoding \(expected.count)")
    precondition(gotError == expectedError, "errors differ: \(String(describing: gotError)) vs \(String(describing: expectedError))")
    if expectedError == nil {
        precondition(chunked.bufferedBytes == whole.bufferedBytes, "leftover differs")
    }
    var encoded: [UInt8] = []
    for f in expected {
        precondition(f.body.count <= limit, "a frame over max_frame_bytes was returned")
        encoded += FrameCodec.encode(type: f.type, body: f.body, byteOrder: order)
    }
    precondition(encoded.count <= stream.count && encoded[...] == stream[..<encoded.count], "frames are not the stream's prefix")
    if expectedError == nil {
        precondition(whole.bufferedBytes == stream.count - encoded.count, "bytes lost")
    }
    return 0
}
