import CShim
import RoomcastCore
import RoomcastIO

// Output.swift owns the write side of a connection: the one send(2) per
// connection per loop iteration, write interest (EPOLLOUT armed only while
// the kernel refuses bytes), the slow-consumer rule and the sweep of idle
// output buffers. It never reads, and never decides anything about rooms.

extension Server {
    /// Output buffer capacity a drained connection keeps, in bytes.
    static let retainedOutputBytes = 16 * 1024
    /// How often drained output buffers of connections that got nothing
    /// since the last sweep are freed, in ms.
    static let bufferSweepMs: UInt64 = 1_000
    /// Freed output buffer bytes after which a sweep calls malloc_trim(3).
    static let trimAfterFreedBytes = 1 << 20

    /// Writes what `id` is owed (`Fanout.write`: one send of its backlog and
    /// this pass's frames); arms EPOLLOUT only when the kernel refused
    /// bytes, disarms it when the queue drains. A draining connection that
    /// is done is closed; one whose own backlog is then over
    /// `output_hard_bytes` is closed by the fan-out (docs/protocol/rooms.md §6).
    func flush(_ id: Int, now: UInt64) {
        switch table.fanout.write(id, keepCapacity: Self.retainedOutputBytes, softBytes: config.limits.outputSoftBytes, nowMs: now) {
        case .nothing:
            break
        case .failed(let e):
            table.close(id, SystemError("send", errno: e).description)
        case .overLimit:
            break  // closed by the fan-out, with the slow-consumer warning
        case .all(let hadBacklog, let draining):
            // Only a connection with a backlog can be paused (`pauseInput` arms
            // EPOLLOUT): no lookup for the others. Its reading comes back with
            // the disarm below (`setWriteInterest` reads `inputPaused`).
            if hadBacklog, table.fanout.outboxes[id].inputPaused { table.fanout.outboxes[id].inputPaused = false }
            // A torn frame, or a WebSocket's 101 answer (`liveUpgraded`), is written now.
            if let live, hadBacklog || (id < live.slots.count && live.slots[id].loggedTorn) { liveTorn(id) }
            if draining {
                table.close(id, stopping ? "daemon stopping" : "closed by peer")
            } else if hadBacklog {
                setWriteInterest(id, false)
            }
        case .partial(let pending, let hadBacklog, let becameSlow):
            if live != nil { liveTorn(id) }  // the rest of a frame the kernel took part of
            if table.fanout.outboxes[id].inputPaused, pending <= config.limits.outputSoftBytes {
                table.fanout.outboxes[id].inputPaused = false
                setWriteInterest(id, true)  // reading again, still writable
            } else if !hadBacklog { setWriteInterest(id, true) }
            if becameSlow {
                watch.overSoft.append(id)
                table.fanout.someoneSlow = true
            }
        }
    }

    /// Backpressure on a sender (docs/protocol/rooms.md §6): its own backlog
    /// (bytes the kernel refused in earlier passes: its echoes, notices,
    /// the room's frames) is above `output_soft_bytes`, so its input is not
    /// read until that drains: what it sends would only add to what it does
    /// not read (a publisher whose echoes pile up; the closed loop of a load
    /// generator bounds only the other members). EPOLLIN goes off; the
    /// flush that brings the backlog to `output_soft_bytes` or under turns
    /// it on again. The soft and hard limits still cut it.
    func pauseInput(_ id: Int) {
        table.fanout.outboxes[id].inputPaused = true
        setWriteInterest(id, true)
    }

    /// Watches `id` for writability (only while output is refused) and,
    /// while open, for input. Costs no system call when nothing changes.
    func setWriteInterest(_ id: Int, _ on: Bool) {
        guard let r = table.fanout.outboxes[id].registration else { return }
        table.fanout.outboxes[id].writeArmed = on
        do {
            // No reading while a hand-over flushes (HandOver.swift).
            // Nor while its own backlog holds its input back (`pauseInput`).
            try selector.setInterest(r, readable: table.isOpen(id) && !handOver.pending && !table.fanout.outboxes[id].inputPaused, writable: on)
        } catch {
            table.close(id, error.description)
        }
    }

    /// Reaps connections marked for close and flushes queued output, until
    /// neither produces more work (a reap may queue leave frames; a failed
    /// write may mark another close). Terminates: connections only go away.
    /// Shedding episodes are logged and their `skipped` notices queued on
    /// the way (`reportShedding`). Then logs the frames skipped for their size.
    func reapAndFlush(now: UInt64) {
        let fanout = table.fanout
        while !table.closeList.isEmpty || !fanout.flushList.isEmpty || !fanout.slowWebSockets.isEmpty || fanout.hasSheddingReports {
            // Episodes that ended in a flush (this loop's, or one on EPOLLOUT
            // before it) or in the soft-limit check: their `skipped` notices
            // are queued here and flushed below.
            if fanout.hasSheddingReports { reportShedding(now: now) }
            // First: a slow WebSocket's close frame must be queued before its next flush.
            while let (id, pending) = fanout.slowWebSockets.popLast() { closeOverHardLimit(id, pending: pending, now: now) }
            while let id = table.closeList.popLast() { reap(id) }
            let list = fanout.flushList
            fanout.flushList.removeAll(keepingCapacity: true)
            for id in list { flush(id, now: now) }
        }
        for skip in fanout.skips {
            switch skip.kind {
            case .overOutputLimit:
                logger.peerWarning(reason: "frame_over_output_limit", nowMs: now,
                                   "\(skip.address): a \(skip.bytes)-byte frame (as this client's dialect encodes it) exceeds "
                                   + "output_hard_bytes (\(formatSize(config.limits.outputHardBytes))) on its own; not delivered to this client",
                                   ["CLIENT_ADDR": skip.address, "LENGTH": String(skip.bytes)])
            case .overJSONLimit:
                logger.peerWarning(reason: "frame_over_json_limit", nowMs: now,
                                   "\(skip.address): a frame whose JSON form is \(skip.bytes) bytes, over json.max_frame_bytes "
                                   + "(\(formatSize(config.json.maxFrameBytes))), was not delivered to JSON clients",
                                   ["CLIENT_ADDR": skip.address, "LENGTH": String(skip.bytes)])
            }
        }
        fanout.skips.removeAll()
        fanout.endPass()
    }

    /// docs/protocol/rooms.md §6: above `output_soft_bytes` for
    /// `output_soft_seconds`, a connection is closed.
    func checkSoftLimits(now: UInt64) {
        let soft = config.limits.outputSoftBytes
        let window = config.limits.outputSoftMs
        watch.overSoft.removeAll { id in
            guard let state = table.state(id), state != .closing, let since = table.fanout.outboxes[id].softSinceMs else { return true }
            let pending = table.fanout.outboxes[id].pending
            if pending <= soft {
                table.fanout.outboxes[id].softSinceMs = nil
                table.fanout.endSheddingIfCaughtUp(id)  // its notice is queued by reapAndFlush
                return true
            }
            guard now &- since >= window else { return false }
            let address = table.address(of: id)
            logger.peerWarning(reason: "output_soft_limit", nowMs: now,
                               "\(address): slow consumer, \(pending) bytes pending for \(formatDuration(ms: now - since)); closing",
                               ["CLIENT_ADDR": address, "ROOM": relay.room(of: id) ?? ""])
            let why = "slow consumer: output above output_soft_bytes (\(formatSize(soft))) for \(formatDuration(ms: window))"
            if table.slots[id]!.webSocket?.isOpen == true {
                table.fanout.keepTornOnly(id)
                closeSlowWebSocket(id)
            } else {
                table.close(id, why)
            }
            return true
        }
        if watch.overSoft.isEmpty { table.fanout.someoneSlow = false }
    }

    /// Logs the shedding episodes (docs/protocol/rooms.md §6, "Shedding") that
    /// started (REASON=shedding) and ended (REASON=shedding_ended, with the
    /// count) since the last call, and queues for each that ended the notice
    /// `skipped` whose `count` is the texts withheld, in the client's dialect.
    func reportShedding(now: UInt64) {
        let fanout = table.fanout
        let soft = formatSize(config.limits.outputSoftBytes)
        for e in fanout.sheddingStarted {
            logger.peerWarning(reason: "shedding", nowMs: now,
                               "\(e.address): slow consumer, output above output_soft_bytes (\(soft)): "
                               + "text frames of others are not sent to it until it catches up",
                               ["CLIENT_ADDR": e.address, "ROOM": relay.room(of: e.id) ?? ""])
        }
        fanout.sheddingStarted.removeAll()
        let ended = fanout.sheddingEnded
        fanout.sheddingEnded.removeAll()
        for e in ended {
            logger.peerWarning(reason: "shedding_ended", nowMs: now,
                               "\(e.address): caught up (output at or under output_soft_bytes, \(soft)); \(e.count) text frames were not sent to it",
                               ["CLIENT_ADDR": e.address, "ROOM": relay.room(of: e.id) ?? "", "SKIPPED": String(e.count)])
            guard table.isOpen(e.id) else { continue }
            sendNotice(e.id, Notice(code: "skipped", count: Int64(e.count)))
        }
    }

    /// An upgraded WebSocket connection whose own backlog passed
    /// `output_hard_bytes` (`Fanout.slowWebSockets`: its queue holds only
    /// the rest of its torn frame): the journal line of the other dialects
    /// (REASON=output_hard_limit), then the close frame 1013.
    private func closeOverHardLimit(_ id: Int, pending: Int, now: UInt64) {
        guard table.isOpen(id) else { return }
        let text = table.fanout.overLimitText(pending: pending)
        guard table.slots[id]!.webSocket?.isOpen == true else {
            table.close(id, text, warning: "output_hard_limit")  // not upgraded: cut, as the other dialects
            return
        }
        let address = table.address(of: id)
        logger.peerWarning(reason: "output_hard_limit", nowMs: now, "\(address): closing: \(text)",
                           ["CLIENT_ADDR": address, "ROOM": relay.room(of: id) ?? ""])
        closeSlowWebSocket(id)
    }

    /// docs/protocol/websocket.md §15: a slow WebSocket consumer, whose queue now holds
    /// only the rest of the frame it is receiving (`Fanout.keepTornOnly`),
    /// gets the close frame 1013 after it; its room hears the leave now and
    /// the socket is closed once that is written, or at the drain deadline
    /// (`drainTimeoutMs`) if it still does not read.
    private func closeSlowWebSocket(_ id: Int) {
        table.slots[id]!.disconnectReason = .slowConsumer
        closeWebSocket(id, .tryAgainLater, "slow consumer")
    }

    /// After a burst (a reconnect storm's joins, say) hands the freed
    /// buffers back to the kernel, so idle connections cost no RSS.
    func sweepIdleBuffersIfDue(now: UInt64) {
        guard now >= watch.nextSweepMs else { return }
        if table.fanout.sweepIdleBuffers() >= Self.trimAfterFreedBytes { _ = cshim_malloc_trim() }
        watch.nextSweepMs = now + Self.bufferSweepMs
    }
}
