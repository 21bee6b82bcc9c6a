import RoomcastCore
import RoomcastIO

// The fan-out's writes: the end-of-pass send of each range, the hard limit, torn frames, idle buffers, translation (Fanout.swift holds its state and the broadcast).
extension Fanout {
    /// What `settle` did.
    enum Settled {
        /// What the kernel refused is in the queue, within the limit.
        case kept
        /// Its own backlog, after the kernel took what it could, is over the
        /// limit: `pending` bytes; its range was dropped.
        case overLimit(pending: Int)
        /// send(2) failed; its range was dropped.
        case failed(Int32)
    }

    /// A range that stopped being adjacent would take the queue past the
    /// hard limit if it were copied: the kernel takes what it can of queue
    /// and range first (this pass's write attempt, made early), and only
    /// the rest is copied. Rare: only a recipient whose pass holds more than
    /// the limit and whose frames are not adjacent (JSON, several rooms).
    /// The limit is judged as in `write` (`unsentFromBefore`).
    @inline(never)
    func settle(_ id: Int, _ box: inout Outbox, hard: Int, tracksTorn: Bool) -> Settled {
        let before = box.pending
        let queued = box.queue.count
        defer { bytesOut &+= UInt64(before - box.pending) }  // rare: the class property is fine here
        switch send(&box, keepCapacity: .max, tracksTorn: tracksTorn) {
        case .all:
            return .kept
        case .failed(let e):
            dropRange(&box)
            return .failed(e)
        case .blocked:
            let pending = box.pending
            if queued > hard, unsentFromBefore(id, queued: queued, taken: before - pending) > hard {
                dropOverLimit(&box)
                return .overLimit(pending: pending)
            }
            noteQueueGrows(id, queued: box.queue.count)
            if box.batchEnd > box.batchStart { keep(&box) }
            return .kept
        }
    }

    /// The hard output limit's measure (docs/protocol/rooms.md §6): of the
    /// bytes `id` owed before this loop pass (its queue as this pass first
    /// touched it: `carried`), those the kernel has still not taken after a
    /// send that took `taken` bytes of a queue holding `queued`. This pass's
    /// own frames never count: a pass may read a whole burst for everyone
    /// before a reader that reads is scheduled at all, so only what a
    /// reader left unread from an earlier pass says that it does not read.
    /// Called only after a send the kernel refused part of, with `queued > 0`.
    @inline(never)
    func unsentFromBefore(_ id: Int, queued: Int, taken: Int) -> Int {
        let left = max(0, (carried[id] ?? queued) - taken)  // the queue is sent before the range
        carried[id] = left
        return left
    }

    /// Before this pass adds to the queue of `id` (a copy of its range, a
    /// unicast), notes what the queue held from earlier passes (`queued`), if
    /// this pass has not yet: what was added this pass is not counted by
    /// `unsentFromBefore`. Only cold paths call it (nothing per delivery).
    func noteQueueGrows(_ id: Int, queued: Int) {
        if carried[id] == nil { carried[id] = queued }
    }

    /// How a send of what a recipient is owed ended.
    enum Sent { case all, blocked, failed(Int32) }

    /// Sends what `box` is owed (its queue, then its batch range) with as
    /// few send(2) calls as the kernel allows (one, when it takes
    /// everything). Consumes what was written; copies nothing.
    @inline(__always)
    func send(_ box: inout Outbox, keepCapacity: Int, tracksTorn: Bool) -> Sent {
        let fd = box.fd
        let tls = box.tls
        while box.pending > 0 {
            let queued = box.queue.count
            let range = box.batchStart..<box.batchEnd
            let region = box.batchForm.rawValue
            let r = box.queue.withReadableBytes { q in
                batches[region].withReadableBytes { b in
                    let second = UnsafeRawBufferPointer(rebasing: b[range])
                    // TLS: one SSL_write of the backlog, else of the pass's whole range
                    // (one encryption per recipient per pass, records up to 16 KiB).
                    guard let tls else { return Sys.send(fd, q, second) }
                    return TLSIO.write(tls, q.isEmpty ? second : q)
                }
            }
            switch r {
            case .done(let n):
                if tracksTorn && !box.isWebSocket || box.webSocketFramed { box.torn = n >= queued + range.count ? 0 : torn(after: n, of: box, range) }
                box.queue.consume(min(n, queued), keepCapacity: keepCapacity)
                box.batchStart += max(0, n - queued)
                if box.batchStart == box.batchEnd { (box.batchStart, box.batchEnd) = (0, 0) }
            case .failed(let e):
                return .failed(e)
            case .wouldBlock, .endOfFile:
                return .blocked
            }
        }
        return .all
    }

    /// Closes `id`, whose own backlog passed `output_hard_bytes`, with the
    /// warning the operator sees (docs/protocol/rooms.md §6).
    func closeOverLimit(_ id: Int, pending: Int) {
        if outboxes[id].webSocketFramed {
            slowWebSockets.append((id, pending))  // its close frame is queued by the server
            return
        }
        table?.close(id, overLimitText(pending: pending), warning: "output_hard_limit")
    }

    /// Why a connection with `pending` bytes of its own backlog is closed
    /// for `output_hard_bytes` (docs/protocol/rooms.md §6).
    func overLimitText(pending: Int) -> String {
        "slow consumer: \(pending) bytes pending after the kernel took what it could, more than "
            + "output_hard_bytes (\(formatSize(outputHardBytes))) of them owed since an earlier loop turn"
    }

    /// The end of a loop pass: every recipient was flushed (or closed), so
    /// no range points into the batch any more; it is emptied.
    func endPass() {
        assert(outboxes.allSatisfy { $0.batchStart == $0.batchEnd }, "a batch range outlived its pass")
        if !carried.isEmpty { carried.removeAll(keepingCapacity: true) }
        for i in batches.indices where batches[i].capacity > 0 {
            batches[i].consume(batches[i].count, keepCapacity: Self.retainedBatchBytes)
        }
    }

    /// What one flush did.
    enum Written: Equatable {
        /// Nothing to do: nothing owed, or the connection is closing or gone.
        case nothing
        /// Everything owed was written. `hadBacklog`: its queue held bytes
        /// refused in an earlier pass, so EPOLLOUT was armed for it (it is
        /// armed exactly while the queue holds a backlog).
        case all(hadBacklog: Bool, draining: Bool)
        /// The kernel refused the rest: `pending` bytes are now in its queue.
        /// `becameSlow`: the pending output just went above `softBytes`.
        case partial(pending: Int, hadBacklog: Bool, becameSlow: Bool)
        /// The kernel refused the rest, and the `pending` bytes that are the
        /// connection's own backlog now are over `output_hard_bytes`: it is
        /// being closed (`ConnectionTable.close`); nothing was copied.
        case overLimit(pending: Int)
        /// send(2) failed with this errno.
        case failed(Int32)
    }

    /// Writes what `id` is owed (its queue, then its batch range) with as
    /// few send(2) calls as the kernel allows (one, when it takes
    /// everything), under one exclusive access. What the kernel refuses of
    /// the batch range is copied into the queue. A drained queue keeps up to
    /// `keepCapacity` bytes of buffer for the next pass, and is noted for
    /// the sweep. The slow-consumer clock (`softSinceMs`) starts when the
    /// pending output goes above `softBytes` and stops when it is below.
    /// When what it owed from before this pass and the kernel still refused
    /// is more than `output_hard_bytes` (`unsentFromBefore`), the connection
    /// is closed instead (`.overLimit`) and nothing is copied:
    /// docs/protocol/rooms.md §6 counts its own backlog from earlier passes
    /// after this send, never this pass's frames.
    func write(_ id: Int, keepCapacity: Int, softBytes: Int = .max, nowMs: UInt64 = 0) -> Written {
        var retain = false
        let tracksTorn = tracksTornFrames
        let hard = outputHardBytes
        var sent = 0  // bytes the kernel took, added to `bytesOut` once, after the closure
        var wasSlow = false  // above the soft limit before this send: a shedding episode may end
        let written: Written = outboxes.withUnsafeMutableBufferPointer { boxes in
            boxes[id].queued = false
            guard let state = boxes[id].state, state != .closing, boxes[id].pending > 0 else { return .nothing }
            wasSlow = boxes[id].softSinceMs != nil
            let hadBacklog = boxes[id].writeArmed
            let before = boxes[id].pending
            let queued = boxes[id].queue.count
            let result = self.send(&boxes[id], keepCapacity: keepCapacity, tracksTorn: tracksTorn)
            sent = before - boxes[id].pending
            switch result {
            case .failed(let e):
                self.dropRange(&boxes[id])
                return .failed(e)
            case .blocked:
                // The hard limit counts what is left of what it owed before
                // this pass, never this pass's frames (a queue of only this
                // pass's copies, or none, cannot be over it).
                let pending = boxes[id].pending
                if queued > hard, self.unsentFromBefore(id, queued: queued, taken: sent) > hard {
                    self.dropOverLimit(&boxes[id])
                    return .overLimit(pending: pending)
                }
                if boxes[id].batchEnd > boxes[id].batchStart {
                    self.noteQueueGrows(id, queued: boxes[id].queue.count)
                    self.keep(&boxes[id])
                }
                var becameSlow = false
                if pending <= softBytes {
                    boxes[id].softSinceMs = nil
                } else if boxes[id].softSinceMs == nil {
                    boxes[id].softSinceMs = nowMs
                    becameSlow = true
                }
                return .partial(pending: pending, hadBacklog: hadBacklog, becameSlow: becameSlow)
            case .all:
                boxes[id].softSinceMs = nil
                retain = boxes[id].queue.capacity > 0 && !boxes[id].retained
                return .all(hadBacklog: hadBacklog, draining: state == .draining)
            }
        }
        bytesOut &+= UInt64(sent)
        if retain { retainDrainedBuffer(id) }
        switch written {
        case .overLimit(let pending): closeOverLimit(id, pending: pending)
        case .all, .partial: if wasSlow { endSheddingIfCaughtUp(id) }  // a flush that keeps up touches no dictionary
        case .nothing, .failed: break
        }
        return written
    }

    /// Where the frame that byte `n` of a write falls in ends, relative to
    /// `n`: the bytes of a partly written frame still to send. The write was
    /// the queue (whose first `box.torn` bytes end a frame, and which ends
    /// at a frame boundary), then `range` of the batch (whole frames).
    /// Walks the headers of what was written: only after a partial write.
    @inline(never)
    func torn(after n: Int, of box: Outbox, _ range: Range<Int>) -> Int {
        if box.webSocketFramed {
            // The server's WebSocket frames (unmasked, RFC 6455 §5.2): 2
            // bytes, then a 16-bit or 64-bit big-endian length when the
            // 7-bit one is 126 or 127.
            return walkFrames(after: n, of: box, range) { at in
                guard at.count >= 2 else { return nil }
                let short = Int(at[1] & 0x7f)
                guard at.count >= (short == 127 ? 10 : short == 126 ? 4 : 2) else { return nil }
                switch short {
                case 126: return 4 + (Int(at[2]) << 8 | Int(at[3]))
                case 127: return 10 + Int(UInt64(bigEndian: at.loadUnaligned(fromByteOffset: 2, as: UInt64.self)))
                default: return 2 + short
                }
            }
        }
        let header = box.json ? JSONFrameCodec.headerSize : FrameCodec.headerSize
        let order = box.json ? ByteOrder.little : relaySettings.byteOrder
        return walkFrames(after: n, of: box, range) { at in
            let raw = at.loadUnaligned(as: UInt32.self)
            return header + Int(order == .little ? UInt32(littleEndian: raw) : UInt32(bigEndian: raw))
        }
    }

    /// Walks the frames of `box`'s queue, then of `range` of its batch, from
    /// `box.torn` until past `n` written bytes; `frameBytes` gives the size
    /// of the frame starting at a position (nil: bytes that are not a whole
    /// header, never expected: the walk ends, nothing is torn).
    /// - Returns: the bytes of the frame at `n` still owed.
    func walkFrames(after n: Int, of box: Outbox, _ range: Range<Int>,
                            _ frameBytes: (UnsafeRawBufferPointer) -> Int?) -> Int {
        let region = box.batchForm.rawValue
        return box.queue.withReadableBytes { q in
            batches[region].withReadableBytes { b in
                var p = box.torn
                while p < n {
                    let at = p < q.count ? UnsafeRawBufferPointer(rebasing: q[p...])
                                         : UnsafeRawBufferPointer(rebasing: b[(range.lowerBound + p - q.count)...])
                    guard let size = frameBytes(at) else { return 0 }
                    p += size
                }
                return p - n
            }
        }
    }

    /// Notes that `id` drained its output and kept the buffer for the next
    /// iteration (no malloc per broadcast while it is busy).
    func retainDrainedBuffer(_ id: Int) {
        guard outboxes[id].queue.capacity > 0, !outboxes[id].retained else { return }
        outboxes[id].retained = true
        retainedList.append(id)
    }

    /// Frees the kept buffers of connections that got nothing since the last
    /// sweep, so idle connections cost no output memory. Work is proportional
    /// to the connections holding a buffer, not to all connections.
    /// - Returns: the bytes freed.
    func sweepIdleBuffers() -> Int {
        var freed = 0
        retainedList.removeAll { id in
            guard outboxes[id].retained else { return true }  // the slot was reused
            if outboxes[id].recent {
                outboxes[id].recent = false
                return false
            }
            if outboxes[id].queue.isEmpty {
                freed += outboxes[id].queue.capacity
                outboxes[id].queue.release()
            }
            outboxes[id].retained = false
            return true
        }
        return freed
    }

    func address(of id: Int) -> String { id < 0 ? remoteSenderAddress : table?.address(of: id) ?? "" }

    /// The JSON form of an LTB frame for JSON clients (nil: none).
    func translate(_ frame: UnsafeRawBufferPointer, from sender: Int) -> [UInt8]? {
        JSONDialect.translate(frame, settings: relaySettings, senderAddress: address(of: sender))
    }
}
