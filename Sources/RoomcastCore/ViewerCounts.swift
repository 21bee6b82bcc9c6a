// The folding of viewer counts into notices (docs/protocol/notices.md §13, notice
// `viewers`; `[rooms] counts`): one sweep every interval over the rooms
// with members here; a room whose count differs from the one its members
// were last told is told again. Pure: the caller gives the counts and the
// clock, and sends the notices.

/// What each room was last told, and when the next sweep is due.
public struct ViewerCountSweep: Sendable {
    /// The count each room's members were last told (rooms with members here).
    public private(set) var told: [RoomName: Int] = [:]
    /// When the next sweep is due, in ms (`UInt64.max`: never, counts off).
    public private(set) var nextMs: UInt64 = .max
    private var intervalMs: UInt64 = 0

    public init() {}

    /// Arms the sweep every `intervalMs` from `nowMs` (0: off, and
    /// nothing is remembered, so that turning it on again tells every room).
    public mutating func schedule(intervalMs: UInt64, nowMs: UInt64) {
        guard intervalMs != self.intervalMs || nextMs == .max else { return }
        self.intervalMs = intervalMs
        if intervalMs == 0 {
            nextMs = .max
            told = [:]
        } else {
            nextMs = nowMs + intervalMs
        }
    }

    /// One sweep at `nowMs` over `counts` (every room with members here
    /// and its viewer count): the rooms to tell, with their count. Rooms
    /// not in `counts` are forgotten (a room opened again is told anew).
    /// O(rooms); at most one notice per room per interval, whatever the joins.
    public mutating func sweep(_ counts: [(room: RoomName, viewers: Int)], nowMs: UInt64) -> [(room: RoomName, viewers: Int)] {
        nextMs = intervalMs == 0 ? .max : nowMs + intervalMs
        var next: [RoomName: Int] = [:]
        next.reserveCapacity(counts.count)
        var tell: [(room: RoomName, viewers: Int)] = []
        for (room, viewers) in counts {
            next[room] = viewers
            if told[room] != viewers { tell.append((room, viewers)) }
        }
        told = next
        return tell
    }
}
