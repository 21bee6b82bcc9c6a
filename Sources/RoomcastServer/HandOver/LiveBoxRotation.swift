import Glibc
import RoomcastCore
import RoomcastIO

// The live box's side of crash recovery (LiveStore.swift has the store and
// the log): once per loop turn, new connections into the box; the box
// rebuilt when dead entries or their queued bytes outgrow the live ones,
// within the descriptors in flight RLIMIT_NOFILE allows and the entries the
// fd store has room for (HandOverBudget.swift), with backoff when it cannot.
extension Server {
    // MARK: - Once per iteration

    /// The end of each iteration: rooms and identities that changed go into
    /// the log, new connections into the box (one sendmsg per 253), and
    /// stores PID 1 did not take are retried. Never blocks.
    func liveEndOfIteration() {
        guard let live else { return }
        for id in relay.takeChanged() where live.slot(id).serial != 0 && table.slots[id] != nil {
            logLive(LiveLog.room(live.slots[id].serial, room: relay.roomName(of: id), identity: relay.identity(of: id)))
            if let claims = table.slots[id]!.auth?.claims { logLive(LiveLog.auth(live.slots[id].serial, claims)) }
        }
        cluster?.logLivePositions()
        if !live.toBox.isEmpty {
            var broken = live.box == nil
            let room = inFlightRoom()
            if room < live.toBox.count, live.rebuildTrouble == nil {
                liveBoxTrouble("RLIMIT_NOFILE (\(descriptorLimit)) allows no more descriptors in flight (\(live.boxed) in the live box)",
                               live.boxed - live.dead + live.toBox.count, clock())
            }
            if let box = live.box, room > 0 {
                let (n, error) = box.put(live.toBox.prefix(room))
                live.boxed += n
                live.toBox.removeFirst(n)
                if let error {
                    broken = true
                    if live.rebuildTrouble == nil { logger.warning("live box: \(error.description); rebuilding it", ["REASON": "handover_failed"]) }
                }
            }
            // Full: one more box; broken: a new generation.
            if !live.toBox.isEmpty && inFlightRoom() > 0 { if broken { rebuildLiveBox() } else { addLiveBox() } }
        } else if live.box == nil || live.incomplete {
            rebuildLiveBox()  // an earlier rebuild failed (retried with backoff)
        }
        // Closed entries outnumber open ones (or pin too much kernel memory),
        // or a rebuild (the old box and a new one with every open connection,
        // in flight at once) would soon no longer fit under RLIMIT_NOFILE (HandOverBudget).
        let open = live.boxed - live.dead
        if live.dead >= LiveStore.deadBeforeRebuild && (live.dead > open || open + 256 > inFlightRoom()) || live.deadBytes > live.deadBytesBeforeRebuild {
            rebuildLiveBox()
        }
        if !live.pendingStores.isEmpty { sendLiveStores() }
    }

    /// The current box is full: one more box for this generation, stored
    /// under the same name (PID 1 keeps several descriptors per name).
    private func addLiveBox() {
        guard let live, let current = live.box else { return }
        guard fdStoreRoom() >= 1, let box = try? HandOverBox.make(sendBuffer: live.boxSendBuffer) else { return rebuildLiveBox() }
        let (n, _) = box.put(live.toBox.prefix(max(0, inFlightRoom())))
        guard n > 0 else {
            Sys.close(box.writeEnd)
            Sys.close(box.readEnd)
            return rebuildLiveBox()
        }
        live.fullBoxes.append(current)
        live.box = box
        live.boxed += n
        live.toBox.removeFirst(n)
        queueLiveStore(name: "livebox-\(live.boxGeneration)", fds: [box.readEnd], thenRemove: nil)
        logger.debug("live box \(live.boxGeneration): a box of \(live.fullBoxes.count + 1) filled up, another one added")
    }

    /// A new box with every open connection, stored as the next generation;
    /// the old one is removed from the store once the new one is in. Never
    /// replaces a stored box with one that holds fewer connections or that
    /// the store has no room for: the old one stays, and the rebuild is
    /// retried with backoff (`LiveStore.rebuildRetryMs`), logged once.
    func rebuildLiveBox() {
        guard let live else { return }
        let now = clock()
        guard now >= live.rebuildRetryMs else { return }
        let entries = table.ids.compactMap { id -> (key: UInt64, fd: Int32)? in
            let serial = live.slot(id).serial
            return serial == 0 ? nil : (serial, table.slots[id]!.fd)
        }
        // The old boxes stay in flight until the new ones are stored.
        guard entries.count <= inFlightRoom() else {
            return liveBoxTrouble("a rebuild would put \(live.boxed + entries.count) descriptors in flight, over RLIMIT_NOFILE (\(descriptorLimit)) less a margin of \(Self.inFlightMargin)",
                                  entries.count, now)
        }
        let room = fdStoreRoom()
        guard room >= 1 else {
            return liveBoxTrouble("systemd's fd store is full (FDSTORE=\(systemd.fdStoreMax), \(systemd.fdStoreMax - room) in use)", entries.count, now)
        }
        // As many boxes as it takes (each holds thousands), no more than the store has room for.
        var boxes: [HandOverBox] = []
        var n = 0
        var failure: SystemError?
        while n < entries.count || boxes.isEmpty {
            guard boxes.count < room else {
                failure = SystemError("systemd's fd store (FDSTORE=\(systemd.fdStoreMax)) has room for \(room) boxes", errno: ENOSPC)
                break
            }
            let box: HandOverBox
            do { box = try HandOverBox.make(sendBuffer: live.boxSendBuffer) } catch {
                failure = error
                break
            }
            boxes.append(box)
            let (put, trouble) = box.put(entries[n...])
            n += put
            if trouble != nil || put == 0 {
                failure = trouble
                break
            }
        }
        if n < entries.count && live.box != nil {
            // The stored boxes keep more: keep them (descriptors in flight count
            // against RLIMIT_NOFILE, so a rebuild needs room for a second copy).
            for box in boxes {
                Sys.close(box.writeEnd)
                Sys.close(box.readEnd)
            }
            return liveBoxTrouble("new boxes took \(n) of \(entries.count) (\(failure?.description ?? "full"))", entries.count, now)
        }
        guard let box = boxes.last else { return liveBoxTrouble(failure?.description ?? "no box", entries.count, now) }
        if n < entries.count {
            logger.error("live box holds \(n) of \(entries.count) connections (\(failure?.description ?? "full")): a crash would drop the rest",
                         ["REASON": "handover_failed"])
        } else if live.rebuildTrouble != nil {
            logger.info("live box rebuilt with all \(plural(n, "connection")): a crash keeps every client again")
        }
        live.rebuildTrouble = nil
        live.rebuildBackoffMs = 0
        live.rebuildRetryMs = 0
        for old in live.fullBoxes + (live.box.map { [$0] } ?? []) {
            Sys.close(old.writeEnd)
            Sys.close(old.readEnd)
        }
        live.fullBoxes = Array(boxes.dropLast())
        live.box = box
        live.boxed = n
        live.dead = 0
        live.deadBytes = 0
        live.incomplete = n < entries.count
        live.toBox.removeAll()
        live.boxGeneration += 1
        // All of the generation's boxes in one notification: PID 1 takes them
        // together, before the older generation is removed.
        queueLiveStore(name: "livebox-\(live.boxGeneration)", fds: boxes.map(\.readEnd),
                       thenRemove: live.boxGeneration > handOver.previousLiveGeneration + 1 ? "livebox-\(live.boxGeneration - 1)" : nil)
    }

    /// A rebuild that could not be done: the old box stays, the next try
    /// waits (100 ms doubling to 10 s), and only the first trouble is logged.
    private func liveBoxTrouble(_ why: String, _ count: Int, _ now: UInt64) {
        guard let live else { return }
        live.rebuildBackoffMs = min(max(100, live.rebuildBackoffMs * 2), 10_000)
        live.rebuildRetryMs = now + live.rebuildBackoffMs
        if live.rebuildTrouble == nil {
            let kept = live.box == nil ? "no live box" : "the live box keeps \(live.boxed - live.dead) of \(count) connections"
            logger.error("cannot rebuild the live box: \(why); \(kept) (a crash drops the others); retrying with backoff up to 10 s",
                         ["REASON": "handover_failed", "DETAIL": why])
        }
        live.rebuildTrouble = why
    }

    /// Descriptors this process may still put in flight, in descriptors: the
    /// kernel refuses every SCM_RIGHTS message, those to the notify socket
    /// too, once the user's descriptors in flight exceed RLIMIT_NOFILE
    /// (unix(7), ETOOMANYREFS); `inFlightMargin` keeps room for the stores.
    func inFlightRoom() -> Int {
        Int(clamping: descriptorLimit) - (live?.boxed ?? 0) - Self.inFlightMargin
    }

    /// What `inFlightRoom` keeps free, in descriptors: the kernel checks the
    /// limit before a message, so one message may pass it by 253; and the
    /// stores of a log, a box or the state.
    static let inFlightMargin = 2 * Sys.maxDescriptorsPerMessage + 64

    /// How many more descriptors systemd's fd store takes (`$FDSTORE`, the
    /// unit's FileDescriptorStoreMax=, less what this process keeps there:
    /// listeners, live boxes and logs, stores not yet sent). PID 1 drops
    /// what does not fit and tells only its journal (systemd.service(5)).
    func fdStoreRoom() -> Int {
        let live = self.live.map { $0.inStore.values.reduce(0, +) } ?? 0
        return systemd.fdStoreMax - handOver.listenersInStore - live
    }
}
