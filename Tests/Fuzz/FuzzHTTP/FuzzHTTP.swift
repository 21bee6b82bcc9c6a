// libFuzzer target: the API's request reader (HTTPRequestReader) fed the
// same bytes whole and in chunks derived from the input must return the
// same requests (method, target, fields, body, keep-alive) and end the same
// way (the same error, or the same bytes left over). No body is over the
// bound and every request consumes at least its head. Input: [chunk, seed]
// + stream. Build and run: `make fuzz`.
import RoomcastCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 2 else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    let maxChunk = [1, 2, 7, 64, 1024, 100_000][Int(input[0]) % 6]
    let limit = 1024  // small, so that the fuzzer reaches 413 and whole bodies alike
    var seed = UInt32(input[1]) | 0x9E37_0000
    let stream = Array(input[2...])
    func nextChunk(_ left: Int) -> Int {
        seed ^= seed << 13; seed ^= seed >> 17; seed ^= seed << 5
        return min(left, 1 + Int(seed % UInt32(maxChunk)))
    }
    struct Seen: Equatable { var request: HTTPRequest; var body: [UInt8]; var keepAlive: Bool }

    func run(_ chunks: [Int]) -> ([Seen], HTTPError?, Int) {
        var reader = HTTPRequestReader(maxBodyBytes: limit)
        var buffer: [UInt8] = []
        var seen: [Seen] = []
        var offset = 0
        for n in chunks {
            buffer += stream[offset..<offset + n]
            offset += n
            while true {
                switch buffer.withUnsafeBytes({ reader.next($0) }) {
                case .needMore:
                    break
                case .error(let e):
                    return (seen, e, 0)
                case .request(let r, let body, let consumed, let keepAlive):
                    precondition(body.count <= limit, "a body over the bound")
                    precondition(body.upperBound == consumed && consumed <= buffer.count && body.lowerBound > 0, "consumed out of bounds")
                    seen.append(Seen(request: r, body: Array(buffer[body]), keepAlive: keepAlive))
                    buffer.removeFirst(consumed)
                    continue
                }
                break
            }
        }
        return (seen, nil, buffer.count)
    }
    var chunks: [Int] = []
    var left = stream.count
    while left > 0 { let n = nextChunk(left); chunks.append(n); left -= n }
    let whole = run(stream.isEmpty ? [] : [stream.count])
    let split = run(chunks)
    precondition(whole.0 == split.0, "chunked reading gave \(split.0.count) requests, whole \(whole.0.count)")
    precondition(whole.1 == split.1, "errors differ: \(String(describing: split.1)) vs \(String(describing: whole.1))")
    precondition(whole.2 == split.2, "leftover differs")
    return 0
}
