/// Length-type-body framing (docs/protocol/ltb.md §1):
///
///     +----------------+------------+-------------------+
///     | length: u32    | type: u16  | body: length bytes|
///     +----------------+------------+-------------------+
///
/// `length` counts the body only. The codec works on borrowed bytes and never
/// allocates: callers own the buffers (see `FrameDecoder` for an owning one).
public enum FrameCodec {
    /// Size of the header in bytes (4-byte length + 2-byte type).
    public static let headerSize = 6

    /// The result of looking at the start of a byte stream.
    public enum Step: Equatable, Sendable {
        /// A whole frame is present: `6 + bodyLength` bytes starting at offset 0.
        case frame(type: UInt16, bodyLength: Int)
        /// Fewer bytes than the next frame needs; nothing is consumed.
        case needMore
        /// The header claims a body longer than the limit. Decided on the 6
        /// header bytes alone, before any allocation (docs/protocol/ltb.md §1).
        case tooLarge(claimed: UInt32)
    }

    /// Reads the header at the start of `bytes` and says whether a complete
    /// frame follows. `maxFrameBytes` is the largest body accepted, in bytes.
    /// Lengths are compared as 64-bit integers, so no hostile value can trap.
    @inlinable
    public static func parse(_ bytes: UnsafeRawBufferPointer, byteOrder: ByteOrder, maxFrameBytes: Int) -> Step {
        guard bytes.count >= headerSize else { return .needMore }
        let rawLength = bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self)
        let rawType = bytes.loadUnaligned(fromByteOffset: 4, as: UInt16.self)
        let length: UInt32
        let type: UInt16
        switch byteOrder {
        case .little: length = UInt32(littleEndian: rawLength); type = UInt16(littleEndian: rawType)
        case .big: length = UInt32(bigEndian: rawLength); type = UInt16(bigEndian: rawType)
        }
        if UInt64(length) > UInt64(max(0, maxFrameBytes)) { return .tooLarge(claimed: length) }
        let body = Int(length)
        guard bytes.count - headerSize >= body else { return .needMore }
        return .frame(type: type, bodyLength: body)
    }

    /// Appends the 6-byte header for a body of `length` bytes to `out`.
    @inlinable
    public static func appendHeader(type: UInt16, length: UInt32, byteOrder: ByteOrder, to out: inout [UInt8]) {
        let l = byteOrder == .little ? length.littleEndian : length.bigEndian
        let t = byteOrder == .little ? type.littleEndian : type.bigEndian
        withUnsafeBytes(of: l) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: t) { out.append(contentsOf: $0) }
    }

    /// One whole frame (header + body) as bytes. The body must be shorter
    /// than 4 GiB; longer bodies are a programming error and trap.
    public static func encode(type: UInt16, body: some Collection<UInt8>, byteOrder: ByteOrder) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(headerSize + body.count)
        appendHeader(type: type, length: UInt32(body.count), byteOrder: byteOrder, to: &out)
        out.append(contentsOf: body)
        return out
    }
}

/// One decoded frame: its type and a copy of its body.
public struct Frame: Equatable, Sendable {
    public var type: UInt16
    public var body: [UInt8]
    public init(type: UInt16, body: [UInt8]) { self.type = type; self.body = body }
}

/// Thrown when a frame header claims a body over the limit (docs/protocol/ltb.md §1).
public struct FrameTooLarge: Error, Equatable, Sendable, CustomStringConvertible {
    /// The body length the header claimed, in bytes.
    public var claimed: UInt32
    /// The limit in force, in bytes.
    public var limit: Int
    public var description: String { "frame length \(claimed) bytes exceeds max_frame_bytes \(limit)" }
}

/// An owning, incremental decoder for clients and tests: feed it bytes as
/// they arrive (any split, any coalescing), take whole frames out. The
/// buffer grows with the bytes received, never with the length claimed.
public struct FrameDecoder: Sendable {
    public let byteOrder: ByteOrder
    public let maxFrameBytes: Int
    private var buffer: [UInt8] = []
    private var start = 0

    /// - Parameters:
    ///   - byteOrder: header byte order (docs/protocol/ltb.md §1).
    ///   - maxFrameBytes: the largest body accepted, in bytes.
    public init(byteOrder: ByteOrder = .little, maxFrameBytes: Int = 64 * 1024) {
        self.byteOrder = byteOrder
        self.maxFrameBytes = maxFrameBytes
    }

    /// Bytes received but not yet returned as frames.
    public var bufferedBytes: Int { buffer.count - start }

    /// Adds received bytes.
    public mutating func append(_ bytes: some Sequence<UInt8>) {
        if start > 0 && start == buffer.count { buffer.removeAll(keepingCapacity: true); start = 0 }
        buffer.append(contentsOf: bytes)
    }

    /// The next whole frame, or nil until more bytes arrive.
    /// - Throws: `FrameTooLarge` when the next header claims too much; the
    ///   stream cannot be resynchronised after that.
    public mutating func next() throws(FrameTooLarge) -> Frame? {
        let limit = maxFrameBytes
        let order = byteOrder
        let from = start
        let step = buffer.withUnsafeBytes { FrameCodec.parse(UnsafeRawBufferPointer(rebasing: $0[from...]), byteOrder: order, maxFrameBytes: limit) }
        switch step {
        case .needMore:
            if start > 4096 && start * 2 > buffer.count { buffer.removeSubrange(0..<start); start = 0 }
            return nil
        case .tooLarge(let claimed):
            throw FrameTooLarge(claimed: claimed, limit: limit)
        case .frame(let type, let length):
            let bodyStart = start + FrameCodec.headerSize
            let frame = Frame(type: type, body: Array(buffer[bodyStart..<bodyStart + length]))
            start = bodyStart + length
            return frame
        }
    }
}

/// The JSON dialect's framing (docs/protocol/json.md §7): a u32 little-endian body length,
/// then the JSON body; no type field.
public enum JSONFrameCodec {
    /// Size of the header in bytes.
    public static let headerSize = 4

    /// Like `FrameCodec.parse`, for 4-byte headers; `.frame`'s type is 0.
    @inlinable
    public static func parse(_ bytes: UnsafeRawBufferPointer, maxFrameBytes: Int) -> FrameCodec.Step {
        guard bytes.count >= headerSize else { return .needMore }
        let length = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt32.self))
        if UInt64(length) > UInt64(max(0, maxFrameBytes)) { return .tooLarge(claimed: length) }
        guard bytes.count - headerSize >= Int(length) else { return .needMore }
        return .frame(type: 0, bodyLength: Int(length))
    }

    /// One whole frame: the 4-byte length and `body`.
    public static func encode(_ body: some Collection<UInt8>) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(headerSize + body.count)
        withUnsafeBytes(of: UInt32(body.count).littleEndian) { out.append(contentsOf: $0) }
        out.append(contentsOf: body)
        return out
    }
}
