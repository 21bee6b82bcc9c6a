/// Byte order of the integers in a frame header (docs/protocol/ltb.md §1): one order
/// per listener, never guessed per frame. The original phone clients write little-endian.
public enum ByteOrder: String, Sendable, Equatable, CaseIterable {
    case little
    case big
}
