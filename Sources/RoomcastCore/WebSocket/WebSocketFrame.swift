// RFC 6455 §5.2 base framing: opcodes, close codes, and the encoder of
// server frames. Server frames are never masked (§5.1), so a frame's bytes
// do not depend on its recipient: one broadcast is framed once.
//
//      0                   1                   2                   3
//     +-+-+-+-+-------+-+-------------+-------------------------------+
//     |F|R|R|R| opcode|M| Payload len |    Extended payload length    |
//     |I|S|S|S|  (4)  |A|     (7)     |             (16/64)           |
//     |N|V|V|V|       |S|             |   (if payload len==126/127)   |
//     +-+-+-+-+-------+-+-------------+ - - - - - - - - - - - - - - - +
//     |     Masking-key, if MASK set to 1 (4 bytes)  |  Payload Data  |

/// A frame's opcode (RFC 6455 §5.2, §11.8). Values 3-7 and 0xB-0xF are
/// reserved and never constructed.
public enum WebSocketOpcode: UInt8, Equatable, Sendable {
    case continuation = 0x0
    case text = 0x1
    case binary = 0x2
    case close = 0x8
    case ping = 0x9
    case pong = 0xA

    /// Close, ping and pong (RFC 6455 §5.5): at most 125 bytes, never fragmented.
    public var isControl: Bool { rawValue & 0x8 != 0 }
}

/// A close status code (RFC 6455 §7.4). What a client should do on each is
/// in docs/protocol/websocket.md §15 ("Close codes").
public struct WebSocketCloseCode: RawRepresentable, Equatable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    /// 1000: the purpose of the connection is fulfilled.
    public static let normal = WebSocketCloseCode(rawValue: 1000)
    /// 1001: the server is going away (stopping).
    public static let goingAway = WebSocketCloseCode(rawValue: 1001)
    /// 1002: a protocol error (RFC 6455 framing broken).
    public static let protocolError = WebSocketCloseCode(rawValue: 1002)
    /// 1003: a message type the endpoint cannot accept.
    public static let unsupportedData = WebSocketCloseCode(rawValue: 1003)
    /// 1007: a text message (or close reason) that is not UTF-8.
    public static let invalidPayload = WebSocketCloseCode(rawValue: 1007)
    /// 1008: a policy violation (too many bad messages, a ban, a refused token).
    public static let policyViolation = WebSocketCloseCode(rawValue: 1008)
    /// 1009: a message over `[websocket] max_message_bytes`.
    public static let messageTooBig = WebSocketCloseCode(rawValue: 1009)
    /// 1011: the server met an unexpected condition.
    public static let internalError = WebSocketCloseCode(rawValue: 1011)
    /// 1013: try again later (the server is overloaded: a slow consumer).
    public static let tryAgainLater = WebSocketCloseCode(rawValue: 1013)

    /// Whether a peer may send this code in a close frame (RFC 6455 §7.4.1,
    /// §7.4.2 and the IANA registry of §11.7): 1000-1003, 1007-1014 and the
    /// 3000-4999 range for libraries and applications. 1004-1006 and 1015
    /// are reserved or must never be sent; everything else is unassigned.
    public var isValidOnTheWire: Bool {
        switch rawValue {
        case 1000...1003, 1007...1014, 3000...4999: true
        default: false
        }
    }

    public var description: String { String(rawValue) }
}

/// The encoder of server frames (RFC 6455 §5.2): FIN set, no RSV bits, no
/// mask, the shortest length form (2-byte header up to 125 bytes of
/// payload, 4 bytes up to 65,535, 10 beyond).
public enum WebSocketFrameEncoder {
    /// The header size of an unmasked frame of `payloadLength` bytes: 2, 4 or 10.
    @inlinable
    public static func headerSize(payloadLength: Int) -> Int {
        payloadLength <= 125 ? 2 : payloadLength <= 0xFFFF ? 4 : 10
    }

    /// Appends the header of one final, unmasked frame of `payloadLength`
    /// bytes to `out`.
    @inlinable
    public static func appendHeader(_ opcode: WebSocketOpcode, payloadLength n: Int, to out: inout [UInt8]) {
        precondition(n >= 0)
        out.append(0x80 | opcode.rawValue)
        if n <= 125 {
            out.append(UInt8(n))
        } else if n <= 0xFFFF {
            out.append(126)
            out.append(UInt8(n >> 8))
            out.append(UInt8(n & 0xFF))
        } else {
            out.append(127)
            let v = UInt64(n)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((v >> UInt64(shift)) & 0xFF)) }
        }
    }

    /// One whole, final, unmasked frame (header + payload).
    public static func encode(_ opcode: WebSocketOpcode, payload: UnsafeRawBufferPointer) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(headerSize(payloadLength: payload.count) + payload.count)
        appendHeader(opcode, payloadLength: payload.count, to: &out)
        out.append(contentsOf: payload)
        return out
    }

    /// One whole, final, unmasked frame (header + payload).
    public static func encode(_ opcode: WebSocketOpcode, payload: [UInt8]) -> [UInt8] {
        payload.withUnsafeBytes { encode(opcode, payload: $0) }
    }

    /// A close frame (RFC 6455 §5.5.1): the 2-byte big-endian code, then
    /// `reason` cut to fit the 125-byte control-frame limit at a character
    /// boundary.
    public static func close(_ code: WebSocketCloseCode, reason: String = "") -> [UInt8] {
        var payload: [UInt8] = [UInt8(code.rawValue >> 8), UInt8(code.rawValue & 0xFF)]
        var used = 0
        for ch in reason.unicodeScalars {
            let n = String(ch).utf8.count
            if used + n > 123 { break }
            payload.append(contentsOf: String(ch).utf8)
            used += n
        }
        return encode(.close, payload: payload)
    }
}
