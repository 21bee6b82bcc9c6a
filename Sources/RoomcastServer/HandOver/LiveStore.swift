import Glibc
import RoomcastCore
import RoomcastIO

// LiveStore.swift owns the crash path of a restart that keeps the clients
// (README.md, "Restarts, upgrades and crashes"): a
// SIGKILL, a watchdog abort or a trap gives no chance to hand anything
// over, so what a crash must not lose is in systemd's fd store all along:
//
// - a live box (`livebox-<generation>`): every client descriptor, appended
//   once per loop iteration through a non-blocking write end, keyed by a
//   serial; rebuilt when closed connections outnumber live ones or when it
//   fills up;
// - a live log (`livestate-<generation>`, `LiveLog`): a shared mapping of a
//   memfd to which opens, rooms and identities, partial input frames, torn
//   output frames and closes are appended as they happen (a memcpy each);
//   compacted into a new generation when full.
//
// After a crash the next process drains the box and replays the log:
// every connection the log says is alive goes back to its room; the
// descriptors of closed ones are closed. A graceful restart (HandOver.swift)
// does not need them: the next process closes their copies.
//
// Every close must shutdown(2) first while copies sit in the box
// (`Server.release`). Stores go through the non-blocking notify channel;
// what PID 1 did not take yet is retried every iteration.

/// The live box and log of one process, and the stores PID 1 has not taken yet.
final class LiveStore {
    /// A record's worth of bookkeeping per connection id.
    struct Slot {
        var serial: UInt32 = 0
        /// The log holds a partial input frame / a torn output frame for it.
        var loggedInput = false
        var loggedTorn = false
    }

    var slots: [Slot] = []
    var nextSerial: UInt32 = 1
    /// Opened since the last iteration: put into the box at its end.
    var toBox: [(key: UInt32, fd: Int32)] = []

    var box: HandOverBox?
    var boxGeneration: UInt32 = 0
    /// Entries in the current box, and how many of them are closed since.
    var boxed = 0
    var dead = 0
    /// The current box lacks some open connections (it filled up while it
    /// was rebuilt): a hand-over makes a box of its own.
    var incomplete = false

    var logFD: Int32 = -1
    var map: UnsafeMutableRawPointer?
    var capacity = 0
    /// Record bytes after the header.
    var committed = 0
    var logGeneration: UInt32 = 0

    /// A notification with descriptors PID 1 has not taken yet, and the
    /// names to remove from the store once it has.
    struct PendingStore {
        var name: String
        var fds: [Int32]
        var thenRemove: String?
    }
    var pendingStores: [PendingStore] = []

    /// Smallest log, in bytes; a new generation gets 4x its snapshot.
    static let minimumLogBytes = 1 << 20
    /// Closed entries a box may hold before it is rebuilt (when they also
    /// outnumber the live ones).
    static let deadBeforeRebuild = 64

    deinit {
        if let map { Sys.unmap(map, size: capacity) }
        if logFD >= 0 { Sys.close(logFD) }
        if let box {
            Sys.close(box.writeEnd)
            Sys.close(box.readEnd)
        }
        pendingStores.flatMap(\.fds).forEach(Sys.close)
    }

    func slot(_ id: Int) -> Slot { id < slots.count ? slots[id] : Slot() }

    /// Appends one record; false when it does not fit (the caller compacts:
    /// the snapshot already holds the change).
    func append(_ record: [UInt8]) -> Bool {
        guard let map, LiveLog.headerSize + committed + record.count <= capacity else { return false }
        record.withUnsafeBytes { (map + LiveLog.headerSize + committed).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        committed += record.count
        // Only now is the record part of the log (LiveLog: `committed`).
        map.storeBytes(of: UInt64(committed).littleEndian, toByteOffset: LiveLog.committedOffset, as: UInt64.self)
        return true
    }

    /// A new log generation holding `snapshot`, mapped; the old one is
    /// unmapped and closed (PID 1 keeps its copy until the new one is stored).
    func newLog(_ snapshot: [UInt8]) throws(SystemError) -> Int32 {
        logGeneration += 1
        let size = max(Self.minimumLogBytes, 4 * (LiveLog.headerSize + snapshot.count))
        let capacity = (size + 4095) & ~4095
        let fd = try Sys.memfd("roomcast-live-\(logGeneration)", size: capacity)
        let map: UnsafeMutableRawPointer
        do { map = try Sys.mapShared(fd, size: capacity) } catch {
            Sys.close(fd)
            throw error
        }
        LiveLog.header(generation: logGeneration).withUnsafeBytes { map.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        if let old = self.map { Sys.unmap(old, size: self.capacity) }
        if logFD >= 0 { Sys.close(logFD) }
        (self.logFD, self.map, self.capacity, self.committed) = (fd, map, capacity, 0)
        _ = append(snapshot)
        return fd
    }
}

extension Server {
    /// At start, after any restore: the first generation of box and log,
    /// with every connection there is.
    func startLiveStore() {
        guard canHandOver else { return }
        let store = LiveStore()
        // Names the previous process left are removed at restore: continue
        // after their generations so that no name is reused in flight.
        store.boxGeneration = handOver.previousLiveGeneration
        store.logGeneration = handOver.previousLiveGeneration
        live = store
        relay.tracksChanges = true
        table.fanout.tracksTornFrames = true
        for id in table.ids { assignSerial(id) }
        rebuildLiveLog()
        rebuildLiveBox()
    }

    private func assignSerial(_ id: Int) {
        guard let live else { return }
        if id >= live.slots.count { live.slots.append(contentsOf: repeatElement(LiveStore.Slot(), count: id + 1 - live.slots.count)) }
        live.slots[id] = LiveStore.Slot(serial: live.nextSerial)
        live.nextSerial &+= 1
        if live.nextSerial == 0 { live.nextSerial = 1 }
    }

    // MARK: - Events (each a memcpy into the log)

    /// `Server.open`: a new connection, boxed at the end of the iteration.
    func liveOpened(_ id: Int) {
        guard let live else { return }
        assignSerial(id)
        let c = table.slots[id]!
        let serial = live.slots[id].serial
        live.toBox.append((serial, c.fd))
        logLive(LiveLog.open(serial, dialect: c.dialect == .json ? .json : .ltb, address: c.address))
        logLive(LiveLog.room(serial, room: relay.roomName(of: id), identity: nil))  // the default room (docs/protocol.md §4)
    }

    /// `Server.release`, before the descriptor is closed: shutdown(2), since
    /// the box still holds a copy, then the close in the log.
    func liveClosing(_ id: Int, fd: Int32) {
        guard let live else { return }
        Sys.shutdownBoth(fd)
        let serial = live.slot(id).serial
        guard serial != 0 else { return }
        live.slots[id] = LiveStore.Slot()
        if let i = live.toBox.firstIndex(where: { $0.key == serial }) {
            live.toBox.remove(at: i)  // opened and closed in one iteration: never boxed
        } else {
            live.dead += 1
        }
        logLive(LiveLog.close(serial))
    }

    /// After a read: the partial input frame, when there is one or was one
    /// (read from the table: a compaction takes its snapshot from there).
    func liveInput(_ id: Int) {
        guard let live, id < live.slots.count, live.slots[id].serial != 0 else { return }
        let input = table.slots[id]!.input
        if input.isEmpty && !live.slots[id].loggedInput { return }
        live.slots[id].loggedInput = !input.isEmpty
        logLive(LiveLog.input(live.slots[id].serial, input))
    }

    /// After a flush: the rest of a frame the kernel took part of.
    func liveTorn(_ id: Int) {
        guard let live, id < live.slots.count, live.slots[id].serial != 0 else { return }
        let torn = table.fanout.outboxes[id].torn
        if torn == 0 && !live.slots[id].loggedTorn { return }
        live.slots[id].loggedTorn = torn > 0
        let bytes = table.fanout.outboxes[id].queue.withReadableBytes { Array($0.prefix(torn)) }
        logLive(LiveLog.torn(live.slots[id].serial, bytes))
    }

    private func logLive(_ record: [UInt8]) {
        guard let live, !live.append(record) else { return }
        rebuildLiveLog()  // full: a compacted generation (it already holds this change)
    }

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
        if !live.toBox.isEmpty {
            if let box = live.box {
                let (n, error) = box.put(live.toBox[...])
                live.boxed += n
                live.toBox.removeFirst(n)
                if let error { logger.warning("live box: \(error.description); rebuilding it", ["REASON": "handover_failed"]) }
            }
            if !live.toBox.isEmpty { rebuildLiveBox() }  // full (or broken): a new, larger generation
        }
        if live.dead >= LiveStore.deadBeforeRebuild && live.dead > live.boxed - live.dead { rebuildLiveBox() }
        if !live.pendingStores.isEmpty { sendLiveStores() }
    }

    /// A new box with every open connection, stored as the next generation;
    /// the old one is removed from the store once the new one is in.
    func rebuildLiveBox() {
        guard let live else { return }
        let entries = table.ids.compactMap { id -> (key: UInt32, fd: Int32)? in
            let serial = live.slot(id).serial
            return serial == 0 ? nil : (serial, table.slots[id]!.fd)
        }
        let box: HandOverBox
        do { box = try HandOverBox.make() } catch {
            logger.error("cannot make a live box: \(error.description): a crash now would drop the clients", ["REASON": "handover_failed"])
            return
        }
        let (n, error) = box.put(entries[...])
        if n < entries.count {
            logger.error("live box holds \(n) of \(entries.count) connections (\(error?.description ?? "full")): a crash would drop the rest",
                         ["REASON": "handover_failed"])
        }
        if let old = live.box {
            Sys.close(old.writeEnd)
            Sys.close(old.readEnd)
        }
        live.box = box
        live.boxed = n
        live.dead = 0
        live.incomplete = n < entries.count
        live.toBox.removeAll()
        live.boxGeneration += 1
        queueLiveStore(name: "livebox-\(live.boxGeneration)", fd: box.readEnd,
                       thenRemove: live.boxGeneration > handOver.previousLiveGeneration + 1 ? "livebox-\(live.boxGeneration - 1)" : nil)
    }

    /// A compacted log generation: a snapshot of every open connection.
    func rebuildLiveLog() {
        guard let live else { return }
        var snapshot: [UInt8] = []
        for id in table.ids {
            let serial = live.slot(id).serial
            guard serial != 0, let c = table.slots[id] else { continue }
            snapshot += LiveLog.open(serial, dialect: c.dialect == .json ? .json : .ltb, address: c.address)
            snapshot += LiveLog.room(serial, room: relay.roomName(of: id), identity: relay.identity(of: id))
            if let claims = c.auth?.claims { snapshot += LiveLog.auth(serial, claims) }
            if !c.input.isEmpty { snapshot += LiveLog.input(serial, c.input) }
            live.slots[id].loggedInput = !c.input.isEmpty
            let torn = table.fanout.outboxes[id].torn
            if torn > 0 { snapshot += LiveLog.torn(serial, table.fanout.outboxes[id].queue.withReadableBytes { Array($0.prefix(torn)) }) }
            live.slots[id].loggedTorn = torn > 0
        }
        do {
            let fd = try live.newLog(snapshot)
            queueLiveStore(name: "livestate-\(live.logGeneration)", fd: fd,
                           thenRemove: live.logGeneration > handOver.previousLiveGeneration + 1 ? "livestate-\(live.logGeneration - 1)" : nil)
        } catch {
            logger.error("cannot make a live log: \(error.description): a crash now would lose rooms", ["REASON": "handover_failed"])
        }
    }

    /// FDSTORE=1 of a copy of `fd` (ours stays in use), sent now if PID 1
    /// takes it, else at the end of a later iteration.
    private func queueLiveStore(name: String, fd: Int32, thenRemove: String?) {
        guard let live else { return }
        guard let copy = try? Sys.blocking("fcntl(F_DUPFD_CLOEXEC)", { fcntl(fd, F_DUPFD_CLOEXEC, 0) }) else { return }
        live.pendingStores.append(.init(name: name, fds: [copy], thenRemove: thenRemove))
        sendLiveStores()
    }

    private func sendLiveStores() {
        guard let live, let channel = systemd.channel else { return }
        while let next = live.pendingStores.first {
            let outcome = channel.send("FDSTORE=1\nFDNAME=\(next.name)\nFDPOLL=0", fds: next.fds)
            if outcome == .wouldBlock { return }
            if outcome == .failed {
                logger.error("systemd refused to store \(next.name): a crash would drop the clients", ["REASON": "handover_failed"])
            } else if let old = next.thenRemove {
                systemd.notify("FDSTOREREMOVE=1\nFDNAME=\(old)")
            }
            next.fds.forEach(Sys.close)
            live.pendingStores.removeFirst()
        }
    }

    // MARK: - A restart

    /// The live box's name when it holds every connection in `ids` and PID 1
    /// has it (stores it has not taken yet are sent now, waiting at most
    /// `HandOverControl.timeoutMs`): the hand-over then needs no box of its own.
    func liveBoxForHandOver(_ ids: [Int]) -> String? {
        guard let live, live.box != nil, !live.incomplete, live.toBox.isEmpty,
              ids.allSatisfy({ live.slot($0).serial != 0 }) else { return nil }
        let deadline = monotonicMilliseconds() + handOver.timeoutMs
        while !live.pendingStores.isEmpty {
            sendLiveStores()
            if live.pendingStores.isEmpty { break }
            if monotonicMilliseconds() >= deadline { return nil }
            usleep(1_000)
        }
        return "\(HandOverName.liveBoxPrefix)\(live.boxGeneration)"
    }

    /// After a hand-over, the live boxes and logs left hold copies of what
    /// was handed over and connections closed before: closed, unused.
    func closeCopies(_ stored: [(fd: Int32, name: String)]) {
        for s in stored {
            if s.name.hasPrefix(HandOverName.liveBoxPrefix) || s.name == HandOverName.box {
                HandOverBox.drain(s.fd).entries.forEach { Sys.close($0.fd) }
            } else {
                Sys.close(s.fd)
            }
        }
    }

}
