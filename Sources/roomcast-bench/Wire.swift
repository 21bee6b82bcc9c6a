import RoomcastCore

/// What goes on the wire for one target: hand-shakes (join / SUBSCRIBE),
/// heartbeats, and data frames whose body carries (publisher, sequence,
/// send time) at a fixed offset, so receivers find them without decoding.
///
/// Body layouts (the same bytes for both targets; Redis carries the body as
/// the PUBLISH payload):
/// - opaque: u32 publisher, u64 sequence, u64 CLOCK_MONOTONIC ns, all
///   little-endian, then filler up to `--size`;
/// - text: a proto2 `ChatMessage` of exactly `--size` bytes whose `text` starts
///   with 40 hex digits (8 publisher, 16 sequence, 16 time), so the daemon's
///   validation sees a well-formed body.
struct Wire {
    static let joinType: UInt16 = 0
    static let leaveType: UInt16 = 1
    static let textType: UInt16 = 2
    static let heartbeatType: UInt16 = 8
    static let binaryPayloadSize = 20
    static let hexPayloadSize = 40

    let target: Target
    let body: BodyKind
    let size: Int
    /// LTB type of the data frames.
    let dataType: UInt16
    /// Offset of the payload (publisher, sequence, time) in the body.
    let payloadOffset: Int

    init(_ o: Options) {
        target = o.target
        body = o.body
        size = o.size
        dataType = o.body == .text ? Self.textType : o.frameType
        payloadOffset = o.body == .text ? o.size - Self.textLength(size: o.size) : 0
    }

    /// Length of the `text` field that makes a ChatMessage body exactly `size` bytes.
    private static func textLength(size: Int) -> Int {
        // Try every plausible length; the varint of the text length changes the overhead.
        let user = UserInfo(level: 1, name: "p", iconURL: "")
        for length in stride(from: size, through: 0, by: -1) {
            let m = ChatMessage(user: user, text: String(repeating: "x", count: length))
            if m.serialized().count == size { return length }
        }
        fatalError("no ChatMessage of exactly \(size) bytes")
    }

    /// A body template: the payload of publisher `pub`, sequence 0, time 0.
    func bodyTemplate(publisher pub: Int) -> [UInt8] {
        switch body {
        case .opaque:
            var b = [UInt8](repeating: UInt8(ascii: "x"), count: size)
            withUnsafeBytes(of: UInt32(pub).littleEndian) { for i in 0..<4 { b[i] = $0[i] } }
            for i in 4..<Self.binaryPayloadSize { b[i] = 0 }
            return b
        case .text:
            let length = size - payloadOffset
            let text = hex(UInt64(pub), digits: 8) + String(repeating: "0", count: 32)
                + String(repeating: "x", count: length - Self.hexPayloadSize)
            let b = ChatMessage(user: UserInfo(level: 1, name: "p", iconURL: ""), text: text).serialized()
            precondition(b.count == size)
            return b
        }
    }

    /// One whole data message for `pub` (LTB frame, or RESP PUBLISH) and the
    /// offset of the body's payload in it.
    func dataTemplate(publisher pub: Int, channel: String) -> (bytes: [UInt8], payloadAt: Int) {
        let b = bodyTemplate(publisher: pub)
        switch target {
        case .roomcast:
            return (FrameCodec.encode(type: dataType, body: b, byteOrder: .little), FrameCodec.headerSize + payloadOffset)
        case .redis:
            var out = Array("*3\r\n$7\r\nPUBLISH\r\n$\(channel.utf8.count)\r\n\(channel)\r\n$\(b.count)\r\n".utf8)
            let at = out.count + payloadOffset
            out += b
            out += Array("\r\n".utf8)
            return (out, at)
        }
    }

    /// What a connection sends once connected: a join to `room` (LTB) or a
    /// SUBSCRIBE (Redis); empty for a Redis publisher or when `room` is nil.
    func handshake(name: String, room: String?, publisher: Bool) -> [UInt8] {
        guard let room else { return [] }
        switch target {
        case .roomcast:
            let body = UserInfo(level: 1, name: name, iconURL: "", room: room).serialized()
            return FrameCodec.encode(type: Self.joinType, body: body, byteOrder: .little)
        case .redis:
            if publisher { return [] }
            return Array("*2\r\n$9\r\nSUBSCRIBE\r\n$\(room.utf8.count)\r\n\(room)\r\n".utf8)
        }
    }

    /// The original clients' heartbeat (type 8, its UTF-8 text), or a Redis PING.
    func heartbeat() -> [UInt8] {
        switch target {
        case .roomcast: FrameCodec.encode(type: Self.heartbeatType, body: Array("this is a heartBeat message ".utf8), byteOrder: .little)
        case .redis: Array("*1\r\n$4\r\nPING\r\n".utf8)
        }
    }
}

private let hexDigits = Array("0123456789abcdef".utf8)

func hex(_ v: UInt64, digits: Int) -> String {
    var s = [UInt8](repeating: 0, count: digits)
    var x = v
    for i in stride(from: digits - 1, through: 0, by: -1) { s[i] = hexDigits[Int(x & 15)]; x >>= 4 }
    return String(decoding: s, as: UTF8.self)
}

/// Writes `v` as `digits` lowercase hex digits at `p`.
@inline(__always)
func storeHex(_ v: UInt64, digits: Int, at p: UnsafeMutableRawPointer) {
    var x = v
    var i = digits - 1
    while i >= 0 {
        let d = UInt8(truncatingIfNeeded: x & 15)
        p.storeBytes(of: d < 10 ? d &+ 48 : d &+ 87, toByteOffset: i, as: UInt8.self)
        x >>= 4
        i -= 1
    }
}

/// Reads `digits` hex digits at `p` (no validation beyond the digit set).
@inline(__always)
func loadHex(_ p: UnsafeRawPointer, digits: Int) -> UInt64 {
    var v: UInt64 = 0
    for i in 0..<digits {
        let c = p.load(fromByteOffset: i, as: UInt8.self)
        let d = c <= 57 ? c &- 48 : c &- 87
        v = v << 4 | UInt64(d & 15)
    }
    return v
}
