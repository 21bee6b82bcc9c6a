/// The recent lines of one room (`[rooms] history` and `history_bytes`,
/// docs/protocol.md §4 "Recent lines on join"): the last text and gift
/// frames relayed to it, whole (6-byte header + body, as relayed), oldest
/// first, bounded both in frames and in bytes. Appending is amortized O(1);
/// the oldest frames are dropped to stay within both bounds.
public struct RoomHistory: Sendable {
    private var frames: [[UInt8]] = []
    /// Index of the oldest frame still held (the ones before it are dropped
    /// and compacted away once they are the larger part of `frames`).
    private var head = 0
    /// Bytes of the frames held (headers included).
    public private(set) var bytes = 0

    public init() {}

    /// Frames held.
    public var count: Int { frames.count - head }

    /// The frames held, oldest first.
    public var all: ArraySlice<[UInt8]> { frames[head...] }

    /// Keeps `frame` as the newest, then drops the oldest until at most
    /// `maxFrames` frames of at most `maxBytes` bytes in all are held. A
    /// frame larger than `maxBytes` alone is not kept (the others are).
    public mutating func append(_ frame: UnsafeRawBufferPointer, maxFrames: Int, maxBytes: Int) {
        guard frame.count <= maxBytes, maxFrames > 0 else { return }
        frames.append(Array(frame))
        bytes += frame.count
        trim(maxFrames: maxFrames, maxBytes: maxBytes)
    }

    /// Drops the oldest frames until both bounds hold (after a reload that
    /// lowered them, or an append).
    public mutating func trim(maxFrames: Int, maxBytes: Int) {
        while count > maxFrames || bytes > maxBytes {
            bytes -= frames[head].count
            frames[head] = []
            head += 1
        }
        if head > 32 && head * 2 > frames.count {
            frames.removeFirst(head)
            head = 0
        }
    }
}
