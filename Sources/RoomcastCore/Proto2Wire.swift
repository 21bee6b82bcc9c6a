// Low-level proto2 wire format (https://protobuf.dev/programming-guides/encoding/)
// for the three bodies of docs/protocol/ltb.md §3. Standard library only.
//
// Limits follow Google's upb parser (the one behind Python protobuf 7.x), so
// that anything Google accepts as well-formed we accept too:
// - a varint has at most 10 bytes; bits above 64 in the 10th byte are dropped;
// - a tag has at most 5 bytes, fits in 32 bits and has a field number >= 1;
// - groups and embedded messages nest at most `maxDepth` (100) deep.
// Every offset and length is checked against the remaining byte count before
// any arithmetic, so hostile lengths (up to 2^64 - 1) throw instead of trapping.

/// Proto2 wire types. 6 and 7 do not exist and are rejected.
enum WireType: UInt8, Sendable {
    case varint = 0, fixed64 = 1, lengthDelimited = 2, startGroup = 3, endGroup = 4, fixed32 = 5
}

/// Maximum nesting of groups and embedded messages (upb's default, also 100).
let maxDepth = 100

/// A cursor over `bytes[position..<end]`. Offsets stay absolute in `bytes`,
/// so errors from an embedded message point into the whole body.
struct ProtoReader {
    let bytes: UnsafeRawBufferPointer
    private(set) var position: Int
    let end: Int

    init(_ bytes: UnsafeRawBufferPointer) {
        self.init(bytes, from: 0, to: bytes.count)
    }

    init(_ bytes: UnsafeRawBufferPointer, from start: Int, to end: Int) {
        self.bytes = bytes
        self.position = start
        self.end = end
    }

    var isAtEnd: Bool { position >= end }

    /// Reads a varint of at most 10 bytes; bits beyond 64 are dropped, as Google does.
    mutating func readVarint() throws(ProtoError) -> UInt64 {
        let start = position
        var result: UInt64 = 0
        for index in 0..<10 {
            guard position < end else { throw .truncatedVarint(offset: start) }
            let byte = bytes[position]
            position += 1
            result |= UInt64(byte & 0x7F) << UInt64(7 * index)  // shift 63 keeps 1 bit; no trap
            if byte & 0x80 == 0 { return result }
        }
        throw .varintTooLong(offset: start)
    }

    /// Reads a tag. Returns nil at the end of the range.
    mutating func readTag() throws(ProtoError) -> (field: Int, wireType: WireType)? {
        guard !isAtEnd else { return nil }
        let start = position
        let tag = try readVarint()
        guard position - start <= 5, tag <= UInt64(UInt32.max), tag >> 3 != 0 else {
            throw .invalidTag(offset: start)
        }
        let field = Int(tag >> 3)
        guard let wireType = WireType(rawValue: UInt8(tag & 7)) else {
            throw .invalidWireType(field: field, wireType: Int(tag & 7), offset: start)
        }
        return (field, wireType)
    }

    /// Reads a length prefix and returns the payload's range, moving past it.
    mutating func readLengthDelimited(field: Int) throws(ProtoError) -> Range<Int> {
        let start = position
        let length = try readVarint()
        let available = end - position
        guard length <= UInt64(available) else {
            throw .truncatedField(field: field, wireType: 2, offset: start, length: length, available: available)
        }
        let range = position..<(position + Int(length))
        position = range.upperBound
        return range
    }

    /// Skips the payload of a field whose tag was just read. `depth` is the
    /// nesting still allowed; a group consumes one level.
    mutating func skip(field: Int, wireType: WireType, depth: Int) throws(ProtoError) {
        switch wireType {
        case .varint:
            _ = try readVarint()
        case .fixed64, .fixed32:
            let size = wireType == .fixed64 ? 8 : 4
            let available = end - position
            guard size <= available else {
                throw .truncatedField(
                    field: field, wireType: Int(wireType.rawValue), offset: position,
                    length: UInt64(size), available: available)
            }
            position += size
        case .lengthDelimited:
            _ = try readLengthDelimited(field: field)
        case .startGroup:
            try skipGroup(field: field, depth: depth)
        case .endGroup:
            throw .unmatchedEndGroup(field: field, offset: position)
        }
    }

    /// Skips a group's fields up to its end-group tag for the same field number.
    private mutating func skipGroup(field: Int, depth: Int) throws(ProtoError) {
        let start = position
        guard depth > 0 else { throw .nestingTooDeep(offset: start) }
        while let (inner, wireType) = try readTag() {
            if wireType == .endGroup {
                guard inner == field else { throw .unmatchedEndGroup(field: inner, offset: position) }
                return
            }
            try skip(field: inner, wireType: wireType, depth: depth - 1)
        }
        throw .unterminatedGroup(field: field, offset: start)
    }
}

/// Appends proto2 fields to a byte array, in the order they are written.
struct ProtoWriter {
    var bytes: [UInt8] = []

    init(capacity: Int) { bytes.reserveCapacity(capacity) }

    static func varintSize(_ value: UInt64) -> Int {
        // 1 byte per started group of 7 significant bits; 0 takes 1 byte.
        let bits = 64 - value.leadingZeroBitCount
        return bits == 0 ? 1 : (bits + 6) / 7
    }

    static func tagSize(_ field: Int) -> Int { varintSize(UInt64(field) << 3) }

    /// Size of a length-delimited field with a payload of `length` bytes.
    static func lengthDelimitedSize(field: Int, length: Int) -> Int {
        tagSize(field) + varintSize(UInt64(length)) + length
    }

    /// Size of an int32 field: negative values take 10 bytes (sign-extended to 64 bits).
    static func int32Size(field: Int, _ value: Int32) -> Int {
        tagSize(field) + varintSize(UInt64(bitPattern: Int64(value)))
    }

    mutating func writeVarint(_ value: UInt64) {
        var value = value
        while value >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        bytes.append(UInt8(value))
    }

    mutating func writeTag(_ field: Int, _ wireType: WireType) {
        writeVarint(UInt64(field) << 3 | UInt64(wireType.rawValue))
    }

    /// int32 is sign-extended to 64 bits, so a negative value is a 10-byte varint.
    mutating func writeInt32(_ field: Int, _ value: Int32) {
        writeTag(field, .varint)
        writeVarint(UInt64(bitPattern: Int64(value)))
    }

    /// int64 (and bool, as 0 or 1): the value's two's-complement bits as a varint.
    mutating func writeInt64(_ field: Int, _ value: Int64) {
        writeTag(field, .varint)
        writeVarint(UInt64(bitPattern: value))
    }

    mutating func writeString(_ field: Int, _ value: String) {
        var value = value
        value.withUTF8 { utf8 in
            writeTag(field, .lengthDelimited)
            writeVarint(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }
}

/// Checks `bytes[range]` is well-formed UTF-8 per Unicode §3.9 Table 3-7:
/// no overlong forms, no surrogates (ED A0..BF), nothing above U+10FFFF,
/// no truncated sequences. Returns the offset of the first bad byte, or nil.
/// Allocation-free.
func firstInvalidUTF8(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Int? {
    var i = range.lowerBound
    let end = range.upperBound
    while i < end {
        let lead = bytes[i]
        if lead < 0x80 { i += 1; continue }
        let count: Int
        var low: UInt8 = 0x80, high: UInt8 = 0xBF  // allowed range of the 2nd byte
        switch lead {
        case 0xC2...0xDF: count = 2
        case 0xE0: count = 3; low = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: count = 3
        case 0xED: count = 3; high = 0x9F
        case 0xF0: count = 4; low = 0x90
        case 0xF1...0xF3: count = 4
        case 0xF4: count = 4; high = 0x8F
        default: return i  // 80..C1 or F5..FF
        }
        guard end - i >= count else { return i }
        guard (low...high).contains(bytes[i + 1]) else { return i }
        for k in 2..<count where bytes[i + k] & 0xC0 != 0x80 { return i }
        i += count
    }
    return nil
}
