import Glibc
import RoomcastCore
import RoomcastIO

// LiveStore.swift owns the crash path of a restart that keeps the clients
// (docs/operations/restarts.md, "Restarts, upgrades and crashes"): a
// SIGKILL, a watchdog abort or a trap gives no chance to hand anything
// over, so what a crash must not lose is in systemd's fd store all along:
//
// - a live box (`livebox-<generation>`): every client descriptor, appended
//   once per loop iteration through a non-blocking write end, keyed by a
//   64-bit serial; rebuilt when it fills up, when closed connections
//   outnumber live ones, or when the closed ones may pin more than
//   `deadBytesBeforeRebuild` of send queues;
// - a live log (`livestate-<generation>`, `LiveLog`): a shared mapping of a
//   memfd to which opens, rooms and identities, partial input frames (the
//   new bytes of each read, logged before the read is processed), torn
//   output frames and closes are appended as they happen (a memcpy each);
//   compacted into a new generation when full, never larger than the
//   reader accepts (`Server.maxStateBytes`).
//
// After a crash the next process drains the box and replays the log:
// every connection the log says is alive goes back to its room; the
// descriptors of closed ones are closed. A graceful restart (HandOver.swift)
// does not need them: the next process closes their copies.
//
// Every close must shutdown(2) first while copies sit in the box
// (`Server.release`), and drops the socket's unread input, which the copy
// would otherwise keep in kernel memory until the next rebuild. Stores go
// through the non-blocking notify channel; what PID 1 did not take yet is
// retried every iteration, and a newer generation replaces every one still
// waiting (one pending store per kind and generation: a generation's boxes
// go in one notification, a box added to it later in one of its own).
// The stores themselves, and what a restart does with them, are in
// LiveStoreFdStore.swift.

/// The live box and log of one process, and the stores PID 1 has not taken yet.
final class LiveStore {
    /// A record's worth of bookkeeping per connection id.
    struct Slot {
        var serial: UInt64 = 0
        /// The log holds a partial input frame / a torn output frame for it.
        var loggedInput = false
        var loggedTorn = false
    }

    var slots: [Slot] = []
    var nextSerial: UInt64 = 1
    /// Opened since the last iteration: put into the box at its end.
    var toBox: [(key: UInt64, fd: Int32)] = []

    /// The box new connections go into; `fullBoxes` are the boxes of the
    /// same generation that filled up before it (a box holds about 46,800
    /// descriptors at the default net.core.wmem_max: `HandOverBox.measureCapacity`).
    /// All of a generation's boxes are stored under one name.
    var box: HandOverBox?
    var fullBoxes: [HandOverBox] = []
    /// The SO_SNDBUF a new box asks for, in bytes (tests make small boxes).
    var boxSendBuffer: Int32 = 4 << 20
    var boxGeneration: UInt32 = 0
    /// Entries in the current generation's boxes, and how many of them are closed since.
    var boxed = 0
    var dead = 0
    /// What the closed entries' send queues held when they closed, in bytes:
    /// an upper bound of the kernel memory their copies in the box pin.
    var deadBytes = 0
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
    /// names to remove from the store once it has (older generations of
    /// the same kind, among them those of stores it superseded).
    struct PendingStore {
        var name: String
        var fds: [Int32]
        var thenRemove: [String]
    }
    var pendingStores: [PendingStore] = []
    /// The descriptors PID 1 holds for the live box and log, by name, once
    /// it has read what was sent: what counts against `$FDSTORE` with the
    /// listeners and, at exit, the hand-over (`Server.fdStoreRoom`).
    var inStore: [String: Int] = [:]

    /// A box rebuild that could not be done (no room in the store, a
    /// socketpair or sendmsg failing, ETOOMANYREFS): not tried again before
    /// `rebuildRetryMs`; the wait doubles from 100 ms to 10 s, and the
    /// trouble is logged once until a rebuild succeeds.
    var rebuildRetryMs: UInt64 = 0
    var rebuildBackoffMs: UInt64 = 0
    var rebuildTrouble: String?
    /// Stores dropped because a newer generation came before PID 1 took them.
    var supersededStores = 0

    /// Smallest log, in bytes; a new generation gets 2x its snapshot (and
    /// the record that did not fit), at most `maximumLogBytes`.
    static let minimumLogBytes = 1 << 20
    /// Largest log, in bytes: what the next process reads (`Server.maxStateBytes`).
    var maximumLogBytes = Server.maxStateBytes
    /// Closed entries a box may hold before it is rebuilt (when they also
    /// outnumber the live ones).
    static let deadBeforeRebuild = 64
    /// Send-queue bytes closed entries may pin before the box is rebuilt,
    /// whatever their number (a var for tests).
    var deadBytesBeforeRebuild = 16 << 20
    /// Unread input dropped per close, at most, in bytes (a receive queue
    /// holds less: `net.ipv4.tcp_rmem`'s maximum is 6 MiB by default).
    static let discardLimit = 8 << 20

    deinit {
        if let map { Sys.unmap(map, size: capacity) }
        if logFD >= 0 { Sys.close(logFD) }
        for box in fullBoxes + (box.map { [$0] } ?? []) {
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

    /// A new log generation holding `snapshot`, with room for `reserve`
    /// more bytes at least, mapped; the old one is unmapped and closed (PID 1
    /// keeps its copy until the new one is stored).
    func newLog(_ snapshot: [UInt8], reserve: Int = 0) throws(SystemError) -> Int32 {
        logGeneration += 1
        let size = min(maximumLogBytes, max(Self.minimumLogBytes, 2 * (LiveLog.headerSize + snapshot.count + reserve)))
        let capacity = max(size & ~4095, 4096)
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

extension Dialect {
    /// The dialect as the hand-over state and the live log name it.
    var handedOver: HandOverState.Dialect {
        switch self { case .json: .json; case .webSocket: .webSocket; case .ltb: .ltb }
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
        store.maximumLogBytes = handOver.maxStateBytes
        live = store
        relay.tracksChanges = true
        table.fanout.tracksTornFrames = true
        cluster?.startLiveLog()
        // TLS connections stay out, as `liveOpened` keeps new ones out.
        for id in table.ids where table.slots[id]!.tls == nil { assignSerial(id) }
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
        // TLS connections cannot be carried (the session's keys die with
        // the process, inside OpenSSL): they close with it.
        guard let live, table.slots[id]!.tls == nil else { return }
        assignSerial(id)
        let c = table.slots[id]!
        let serial = live.slots[id].serial
        live.toBox.append((serial, c.fd))
        logLive(LiveLog.open(serial, dialect: c.dialect.handedOver, address: c.address))
        // The default room (docs/protocol/rooms.md §4); a WebSocket connection is upgrading (`open` says so), in none yet.
        if c.dialect != .webSocket { logLive(LiveLog.room(serial, room: relay.roomName(of: id), identity: nil)) }
    }

    /// `WebSocketServer.upgrade` answered with 101: the session, its room,
    /// and the 101 answer as owed output until a flush writes it
    /// (`liveTorn`), so that a crash before then does not leave the client
    /// waiting for it, nor one after send it twice.
    func liveUpgraded(_ id: Int) {
        guard let live, id < live.slots.count, live.slots[id].serial != 0, let session = table.slots[id]!.webSocket else { return }
        let serial = live.slots[id].serial
        logLive(LiveLog.webSocket(serial, upgraded: true, subprotocol: session.subprotocol, echo: session.echo))
        if !session.echo { logLive(LiveLog.room(serial, room: relay.roomName(of: id), identity: nil)) }
        logLive(LiveLog.torn(serial, table.fanout.outboxes[id].queue.withReadableBytes { Array($0) }))
        live.slots[id].loggedTorn = true
    }

    /// A WebSocket read's whole frames were decoded, not yet acted on (a
    /// crash while acting on them must not replay or cut them): the
    /// fragmented message in progress as it grew (`messageBefore` bytes of
    /// it were logged before; `restarted`: a message ended since, so the
    /// log's is replaced), then the unconsumed input as `liveInput` logs it.
    func liveWebSocketInput(_ id: Int, _ bytes: UnsafeRawBufferPointer, newBytes: Int, consumed: Int, messageBefore: Int, restarted: Bool) {
        guard let live, id < live.slots.count, live.slots[id].serial != 0, let session = table.slots[id]!.webSocket else { return }
        let serial = live.slots[id].serial
        let d = session.decoder.carried
        if restarted {
            logLive(LiveLog.webSocketMessage(serial, opcode: d.messageOpcode, utf8: d.utf8, d.message))
        } else if d.message.count > messageBefore, let opcode = d.messageOpcode {
            logLive(LiveLog.webSocketFragment(serial, opcode: opcode, utf8: d.utf8, d.message[messageBefore...]))
        }
        liveInput(id, bytes, newBytes: newBytes, wholeFrames: consumed)
    }

    /// `Server.release`, before the descriptor is closed: shutdown(2), since
    /// the box still holds a copy, and the unread input dropped (the copy
    /// would keep it in kernel memory); then the close in the log.
    func liveClosing(_ id: Int, fd: Int32) {
        guard let live else { return }
        Sys.shutdownBoth(fd)
        let serial = live.slot(id).serial
        guard serial != 0 else { return }
        live.slots[id] = LiveStore.Slot()
        if let i = live.toBox.firstIndex(where: { $0.key == serial }) {
            live.toBox.remove(at: i)  // opened and closed in one iteration: never boxed
        } else {
            _ = scratch.withUnsafeMutableBytes { Sys.discardInput(fd, buffer: $0, limit: LiveStore.discardLimit) }
            live.dead += 1
            live.deadBytes += Sys.unsentBytes(fd)
        }
        logLive(LiveLog.close(serial))
    }

    /// Before a read is processed (a crash while processing it must not cut
    /// a frame in two): `bytes` is the connection's input with the read's
    /// `newBytes` at its end, `wholeFrames` the length of the whole frames
    /// at its start. A frame still growing gets the new bytes appended; one
    /// completed leaves only what follows the whole frames (often nothing).
    func liveInput(_ id: Int, _ bytes: UnsafeRawBufferPointer, newBytes: Int, wholeFrames: Int) {
        guard let live, id < live.slots.count, live.slots[id].serial != 0 else { return }
        let serial = live.slots[id].serial
        let rest = bytes[wholeFrames...]
        if rest.isEmpty && !live.slots[id].loggedInput { return }
        let record = wholeFrames == 0 ? LiveLog.inputAppend(serial, bytes[(bytes.count - newBytes)...]) : LiveLog.input(serial, rest)
        if !live.append(record) {
            // Full: a compacted generation, whose snapshot cannot hold this
            // input (it is out of the table while it is processed). A frame
            // too large for a quarter of the largest log is not kept at the
            // expense of everyone else's records.
            let fits = 17 + rest.count <= live.maximumLogBytes / 4
            rebuildLiveLog(reserve: fits ? 17 + rest.count : 0)
            if !fits || !live.append(LiveLog.input(serial, rest)) {
                logger.error("the live log has no room for \(table.address(of: id))'s partial frame (\(rest.count) bytes): a crash would close it",
                             ["REASON": "handover_failed"])
                _ = live.append(LiveLog.close(serial))
            }
        }
        live.slots[id].loggedInput = !rest.isEmpty
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

    func logLive(_ record: [UInt8]) {
        guard let live, !live.append(record) else { return }
        rebuildLiveLog()  // full: a compacted generation (it already holds this change)
    }

    /// A compacted log generation: a snapshot of every open connection, with
    /// room for `reserve` bytes more. A connection that would take the
    /// snapshot past half of `LiveStore.maximumLogBytes` is left out (a
    /// crash closes it, where its partial frames would be cut).
    func rebuildLiveLog(reserve: Int = 0) {
        guard let live else { return }
        // The cluster link first: its origin and numbering (docs/cluster.md).
        var snapshot: [UInt8] = cluster?.liveSnapshot() ?? []
        // Bans, mutes and slow modes (a few bytes each, at most
        // ModerationBook.maxEntries): what a crash must keep of them.
        for r in moderation.records { snapshot += LiveLog.moderation(r) }
        let budget = live.maximumLogBytes / 2 - LiveLog.headerSize - reserve
        var left: [String] = []
        for id in table.ids {
            let serial = live.slot(id).serial
            guard serial != 0, let c = table.slots[id] else { continue }
            var records = LiveLog.open(serial, dialect: c.dialect.handedOver, address: c.address)
            records += LiveLog.room(serial, room: relay.roomName(of: id), identity: relay.identity(of: id))
            if let session = c.webSocket {
                records += LiveLog.webSocket(serial, upgraded: session.isOpen, subprotocol: session.subprotocol, echo: session.echo)
                let d = session.decoder.carried
                if d.messageOpcode != nil { records += LiveLog.webSocketMessage(serial, opcode: d.messageOpcode, utf8: d.utf8, d.message) }
            }
            if let claims = c.auth?.claims { records += LiveLog.auth(serial, claims) }
            if !c.input.isEmpty { records += LiveLog.input(serial, c.input) }
            let torn = table.fanout.outboxes[id].torn
            if torn > 0 { records += LiveLog.torn(serial, table.fanout.outboxes[id].queue.withReadableBytes { Array($0.prefix(torn)) }) }
            guard snapshot.count + records.count <= budget else {
                left.append(c.address)
                continue
            }
            snapshot += records
            live.slots[id].loggedInput = !c.input.isEmpty
            live.slots[id].loggedTorn = torn > 0
        }
        if !left.isEmpty {
            logger.error("the live log (at most \(formatSize(live.maximumLogBytes))) cannot hold \(plural(left.count, "connection")) "
                         + "(\(left.prefix(3).joined(separator: ", "))…): a crash would close them", ["REASON": "handover_failed"])
        }
        guard fdStoreRoom() >= 1 else {
            // No room for a second generation: the old one stays stored (its
            // records stop here) rather than none.
            if live.rebuildTrouble == nil {
                logger.error("cannot store a new live log: systemd's fd store is full (FDSTORE=\(systemd.fdStoreMax)); a crash restores the older one",
                             ["REASON": "handover_failed"])
                live.rebuildTrouble = "fd store full"
            }
            return
        }
        do {
            let fd = try live.newLog(snapshot, reserve: reserve)
            queueLiveStore(name: "livestate-\(live.logGeneration)", fds: [fd],
                           thenRemove: live.logGeneration > handOver.previousLiveGeneration + 1 ? "livestate-\(live.logGeneration - 1)" : nil)
        } catch {
            logger.error("cannot make a live log: \(error.description): a crash now would lose rooms", ["REASON": "handover_failed"])
        }
    }
}
