// libFuzzer target: the WebSocket upgrade parser and the RFC 6455 client-frame
// decoder, each fed the same bytes whole and in chunks derived from the input,
// must reach the same result (request or error; the same events, then the same
// failure or the same leftover). Every message returned stays within the bound
// and every text message is valid UTF-8. Input: [flags, limit, seed] + stream;
// flags bit 0 set: the stream is an HTTP head, else frames.
// Build and run: `make fuzz`.
import RoomcastCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWebSocket(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 3 else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    let maxChunk = [1, 2, 7, 64, 1024, 70_000][Int(input[0] >> 1) % 6]
    let limit = [0, 1, 5, 125, 126, 1024, 65_536, 1 << 20][Int(input[1]) % 8]
    var seed = UInt32(input[2]) | 0x9E37_0000
    let stream = Array(input[3...])
    func nextChunk(_ left: Int) -> Int {
        seed ^= seed << 13; seed ^= seed >> 17; seed ^= seed << 5
        return min(left, 1 + Int(seed % UInt32(maxChunk)))
    }

    if input[0] & 1 == 1 {
        var whole = HTTPRequestParser()
        let expected = stream.withUnsafeBytes { whole.parse($0) }
        var chunked = HTTPRequestParser()
        var got = HTTPRequestParser.Step.needMore
        var end = 0
        while end < stream.count, got == .needMore {
            end += nextChunk(stream.count - end)
            got = stream.withUnsafeBytes { chunked.parse(UnsafeRawBufferPointer(rebasing: $0[0..<end])) }
        }
        precondition(got == expected, "chunked parse gave \(got), whole \(expected)")
        if case .request(let r, let n) = got {
            precondition(n <= HTTPRequestParser.maxHeadBytes && n <= stream.count, "head length out of bounds")
            _ = try? WebSocketHandshake.evaluate(r, policy: WebSocketPolicy(webSocketPaths: ["/"], pagePaths: ["/"], allowedOrigins: ["http://a"]))
        }
        return 0
    }

    func run(_ chunks: [Int]) -> ([WebSocketDecoder.Event], WebSocketFailure?, Int) {
        var d = WebSocketDecoder(maxMessageBytes: limit)
        var events: [WebSocketDecoder.Event] = []
        var buffer: [UInt8] = []
        var offset = 0
        for n in chunks {
            buffer += stream[offset..<offset + n]
            offset += n
            while true {
                switch buffer.withUnsafeBytes({ d.next($0) }) {
                case .needMore:
                    break
                case .failure(let f):
                    return (events, f, buffer.count + stream.count - offset)
                case .event(let e, let consumed):
                    precondition(consumed > 0 && consumed <= buffer.count, "consumed out of bounds")
                    buffer.removeFirst(consumed)
                    events.append(e)
                    continue
                }
                break
            }
        }
        return (events, nil, buffer.count)
    }
    var chunks: [Int] = []
    var left = stream.count
    while left > 0 { let n = nextChunk(left); chunks.append(n); left -= n }
    let (expected, expectedFailure, expectedLeft) = run(stream.isEmpty ? [] : [stream.count])
    let (got, gotFailure, gotLeft) = run(chunks)
    precondition(got == expected, "chunked decoding gave \(got.count) events, whole \(expected.count)")
    precondition(gotFailure == expectedFailure, "failures differ")
    if expectedFailure == nil { precondition(gotLeft == expectedLeft, "leftover differs") }
    for e in expected {
        switch e {
        case .message(let op, let payload):
            precondition(payload.count <= limit, "a message over max_message_bytes was returned")
            if op == .text { precondition(String(validating: payload, as: UTF8.self) != nil, "invalid UTF-8 passed") }
        case .ping(let p), .pong(let p):
            precondition(p.count <= 125, "control payload over 125 bytes")
        default:
            break
        }
    }
    return 0
}
