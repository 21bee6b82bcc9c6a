import RoomcastCore
import RoomcastIO

// The fan-out's shedding: the episodes of texts withheld from slow consumers (docs/protocol/rooms.md §6) (Fanout.swift holds its state and the broadcast).
extension Fanout {
    /// The type of an LTB frame (at least a header long) in the relay's byte order.
    @inline(__always)
    func frameType(_ frame: UnsafeRawBufferPointer) -> UInt16 {
        kindCodes.little ? UInt16(frame[4]) | UInt16(frame[5]) << 8 : UInt16(frame[4]) << 8 | UInt16(frame[5])
    }

    /// Counts a text withheld from each of `ids`, opening an episode for
    /// those not in one (`sheddingStarted`). Once per broadcast that sheds.
    @inline(never)
    func noteShed(_ ids: [Int]) {
        framesShed &+= UInt64(ids.count)
        for id in ids {
            if let n = shedding[id] {
                shedding[id] = n + 1
            } else {
                shedding[id] = 1
                sheddingStarted.append(SheddingEpisode(id: id, address: address(of: id), count: 1))
            }
        }
    }

    /// Ends the shedding episode of `id` if it has one and its backlog is
    /// no longer above `output_soft_bytes` (`softSinceMs` cleared): it goes
    /// to `sheddingEnded`, for its `skipped` notice. Called where the soft
    /// clock stops (`write`, `Server.checkSoftLimits`).
    func endSheddingIfCaughtUp(_ id: Int) {
        guard !shedding.isEmpty, outboxes[id].softSinceMs == nil, let n = shedding.removeValue(forKey: id) else { return }
        sheddingEnded.append(SheddingEpisode(id: id, address: address(of: id), count: n))
    }

    /// The open shedding episode of `id` as a restart carried it (its
    /// withheld count, docs/protocol.md §6): it goes on, and ends with its
    /// `skipped` notice at once if `id` is no longer above `output_soft_bytes`.
    func restoreShedding(_ id: Int, count: Int) {
        shedding[id] = count
        endSheddingIfCaughtUp(id)
    }

    /// Forgets the shedding episode of a connection that goes away (its slot is freed).
    func forgetShedding(_ id: Int) {
        if !shedding.isEmpty { shedding[id] = nil }
    }
}
