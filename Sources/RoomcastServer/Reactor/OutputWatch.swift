/// The connections whose output has a deadline, checked on the loop's
/// tick (Server.runTimers), and the schedule of the idle-buffer sweep:
/// slow consumers above `output_soft_bytes` (Output.swift,
/// `checkSoftLimits`; docs/protocol/rooms.md §6) and connections flushing what
/// they are owed before they close (ConnectionLifecycle.swift,
/// `checkDrainDeadlines`). A class, so that one list is changed while the
/// other is read (a close during the walk) without an overlapping access.
final class OutputWatch {
    /// Connections above `output_soft_bytes`, by id (Output.swift).
    var overSoft: [Int] = []
    /// Connections flushing owed output before they close, by id (ConnectionLifecycle.swift).
    var draining: [Int] = []
    /// When drained output buffers are next swept (Output.swift), in ms.
    var nextSweepMs: UInt64 = 0

    /// Whether a connection waits on the tick (soft limit or drain deadline).
    var hasDeadlines: Bool { !overSoft.isEmpty || !draining.isEmpty }
}
