/// Where a room's stream stands (docs/protocol/positions.md §4, "Positions and
/// resume"): its `epoch`, 16 lowercase hex digits drawn when the room was
/// made on this daemon (a new one whenever its history was lost), and
/// `seq`, the number of the last text or gift frame relayed to it (1 for
/// the first; 0: none yet).
public struct RoomPosition: Equatable, Hashable, Sendable {
    public var epoch: String
    public var seq: Int64

    public init(epoch: String, seq: Int64) {
        self.epoch = epoch
        self.seq = seq
    }

    /// Byte for byte (an epoch is ASCII hex; anything else a client sends
    /// simply never matches).
    public static func == (a: RoomPosition, b: RoomPosition) -> Bool { a.seq == b.seq && sameBytes(a.epoch, b.epoch) }

    /// A fresh epoch: 64 random bits (the system's CSPRNG, getrandom(2)) as
    /// 16 lowercase hex digits.
    public static func newEpoch() -> String {
        var rng = SystemRandomNumberGenerator()
        let v = rng.next() as UInt64
        let hex = String(v, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}

/// The recent lines of one room (`[rooms] history` and `history_bytes`,
/// docs/protocol/positions.md §4 "Recent lines on join"): the last text and gift
/// frames relayed to it, whole (6-byte header + body, as relayed), each with
/// its room sequence number, oldest first, bounded both in frames and in
/// bytes. Appending is amortized O(1); the oldest frames are dropped to stay
/// within both bounds.
public struct RoomHistory: Sendable {
    private var frames: [[UInt8]] = []
    /// `seqs[i]` is the room sequence number of `frames[i]` (increasing).
    private var seqs: [Int64] = []
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

    /// The frames held with their sequence numbers, oldest first (the hand-over state).
    public var numbered: [NumberedFrame] { (head..<frames.count).map { NumberedFrame(seq: seqs[$0], frame: frames[$0]) } }

    /// The frames numbered after `seq` up to `last` (the room's newest
    /// number), oldest first, when every one of them is still held; nil
    /// when some are not (dropped for the bounds, or never kept: larger
    /// than `history_bytes`), or when `seq` is not in 0...`last`.
    public func frames(after seq: Int64, last: Int64) -> ArraySlice<[UInt8]>? {
        guard seq >= 0, seq <= last else { return nil }
        let missing = last - seq
        guard missing <= Int64(count) else { return nil }
        let start = frames.count - Int(missing)
        // Held frames are consecutive exactly when the oldest wanted one is seq + 1.
        guard missing == 0 || (seqs[start] == seq + 1 && seqs[frames.count - 1] == last) else { return nil }
        return frames[start...]
    }

    /// Keeps `frame`, numbered `seq`, as the newest, then drops the oldest
    /// until at most `maxFrames` frames of at most `maxBytes` bytes in all
    /// are held. A frame larger than `maxBytes` alone is not kept (the
    /// others are).
    public mutating func append(_ frame: UnsafeRawBufferPointer, seq: Int64, maxFrames: Int, maxBytes: Int) {
        guard frame.count <= maxBytes, maxFrames > 0 else { return }
        frames.append(Array(frame))
        seqs.append(seq)
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
            seqs.removeFirst(head)
            head = 0
        }
    }
}

/// A frame with its room sequence number (docs/protocol/positions.md §4).
public struct NumberedFrame: Equatable, Sendable {
    public var seq: Int64
    /// The whole frame (6-byte header + body) as relayed.
    public var frame: [UInt8]
    public init(seq: Int64, frame: [UInt8]) { self.seq = seq; self.frame = frame }
}

/// One room's stream as a restart carries it (the hand-over state): its
/// position and its recent frames, oldest first.
public struct RoomStream: Equatable, Sendable {
    public var room: RoomName
    public var position: RoomPosition
    public var history: [NumberedFrame]
    public init(room: RoomName, position: RoomPosition, history: [NumberedFrame]) {
        self.room = room
        self.position = position
        self.history = history
    }
}
