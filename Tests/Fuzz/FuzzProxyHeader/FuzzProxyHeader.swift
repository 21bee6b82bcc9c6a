// libFuzzer target: the PROXY header parser (docs/protocol/proxy.md §14) on any
// bytes must agree with itself on prefixes: a header found in the stream is
// found the same in exactly its own bytes, and every shorter prefix asks for
// more; a stream that asks for more has no prefix that is already an error.
// The same bytes as text go through `IPPrefix`, whose canonical form must
// parse back to itself. Build and run: `make fuzz`.
import RoomcastCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzProxyHeader(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let step = ProxyHeader.parse(input)
    switch step {
    case .header(let h):
        precondition(h.length <= input.count, "a header longer than the input")
        precondition(h.version == 1 ? h.length <= ProxyHeader.v1MaxBytes : h.length >= ProxyHeader.v2FixedBytes, "bad length \(h.length)")
        precondition(ProxyHeader.parse(Array(input[0..<h.length])) == step, "the header alone parses differently")
        precondition(ProxyHeader.parse(Array(input[0..<(h.length - 1)])) == .needMore, "a header cut short is not need-more")
        if let s = h.source { precondition(s.ip.count == 4 || s.ip.count == 16) }
    case .needMore:
        precondition(input.count < ProxyHeader.v2FixedBytes + 65_535, "need-more past the longest header")
        for n in stride(from: 0, to: input.count, by: max(1, input.count / 16)) {
            precondition(ProxyHeader.parse(Array(input[0..<n])) == .needMore, "a prefix of a need-more stream is not need-more")
        }
    case .invalid:
        break
    }
    if let prefix = IPPrefix(String(decoding: input.prefix(64), as: UTF8.self)) {
        precondition(IPPrefix(prefix.description) == prefix, "\(prefix) does not parse back")
    }
    return 0
}
