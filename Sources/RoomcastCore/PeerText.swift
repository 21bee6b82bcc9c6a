// Strings that come from peers (room names, user names, JSON commands) are
// byte strings on the wire (proto2 `string`, JSON text): two are the same only
// when their UTF-8 bytes are equal. Swift's `String ==` and `String` hashing
// use Unicode canonical equivalence instead, so "café" spelled with U+00E9
// (NFC) and with "e" + U+0301 (NFD) would be one room, one user, one key.
// Everything here compares, hashes and shortens them as bytes.

/// Whether two peer-supplied strings are the same byte string (no Unicode
/// normalization, unlike `==`).
@inlinable
public func sameBytes(_ a: String, _ b: String) -> Bool {
    a.utf8.elementsEqual(b.utf8)
}

/// Whether two optional peer-supplied strings are the same byte string (or both nil).
@inlinable
public func sameBytes(_ a: String?, _ b: String?) -> Bool {
    switch (a, b) {
    case (nil, nil): true
    case let (a?, b?): sameBytes(a, b)
    default: false
    }
}

/// A room name as the wire carries it (docs/protocol/ltb.md §3, `UserInfo.room`):
/// its UTF-8 bytes, compared and hashed byte for byte, so rooms whose names
/// only look alike (NFC and NFD spellings) are different rooms.
public struct RoomName: Hashable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral {
    /// The name's UTF-8 bytes, exactly as received.
    public let bytes: [UInt8]

    public init(bytes: [UInt8]) { self.bytes = bytes }

    /// The bytes of `name` (a `String` keeps the UTF-8 it was made from).
    public init(_ name: String) { self.bytes = Array(name.utf8) }

    public init(stringLiteral value: String) { self.init(value) }

    /// The name as text (for logs and events).
    public var string: String { String(decoding: bytes, as: UTF8.self) }

    public var description: String { string }

    /// Length in bytes, as `[protocol] max_room_bytes` counts it.
    public var count: Int { bytes.count }
}

/// Default `maxBytes` of ``clipForLog(_:maxBytes:)``: a sane length for one
/// peer-supplied string in a log line.
public let logClipBytes = 256

/// `text` for a log line: unchanged when it is at most `maxBytes` bytes of
/// UTF-8; otherwise its first `maxBytes` bytes or fewer, cut at a character
/// (Unicode scalar) boundary, then `…(N bytes)` with the original length.
/// A peer can make a room or user name as long as a frame (64 KiB by
/// default); a log line must not be.
public func clipForLog(_ text: String, maxBytes: Int = logClipBytes) -> String {
    let utf8 = text.utf8
    guard utf8.count > maxBytes else { return text }
    var end = utf8.index(utf8.startIndex, offsetBy: max(0, maxBytes))
    // Back up to the start of a scalar: continuation bytes are 10xxxxxx.
    while end > utf8.startIndex && utf8[end] & 0xC0 == 0x80 { end = utf8.index(before: end) }
    return String(decoding: utf8[..<end], as: UTF8.self) + "…(\(utf8.count) bytes)"
}
