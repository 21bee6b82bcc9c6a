// The resource budget of the hand-over and the crash path: a full fd store
// never costs the stored live box, a rebuild that cannot be done is retried
// with backoff and logged once, and a configuration that cannot hold is
// told at start in one line with the numbers.
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("Hand-over budget: fd store size, rebuilds, the check at start")
struct HandOverBudgetTests {
    typealias Node = HandOverTests.Node

    @Test("a full fd store: the rotation keeps the stored box (no removal before the new one fits), logs once and retries with backoff, never every turn")
    func fullStoreKeepsTheOldBox() throws {
        let clock = HandOverTests.ManualClock()
        // Room for the listener, the first box and log only (FileDescriptorStoreMax=3).
        // max_clients = 5000: 15,000 in flight at most, under the test process's RLIMIT_NOFILE.
        let a = try Node("max_clients = 5000\n", clock: clock, fdStoreMax: 3)
        a.notify.max = 3
        let startLog = a.log
        let budgetLines = startLog.split(separator: "\n").filter { $0.contains("REASON=handover_budget") }
        #expect(budgetLines.count == 1 && budgetLines[0].contains("FDSTORE=3") && budgetLines[0].contains("at least 6")
                && !budgetLines[0].contains("in flight"), "told at start, in one line, with the numbers: \(budgetLines)")
        let clients = (0..<70).map { _ in a.connect() }
        try a.tick()
        a.notify.update()
        #expect(a.notify.store["livebox-1"]?.count == 1)
        clients.forEach { close($0.peer) }
        var logged = ""
        for _ in 0..<50 {
            clock.nowMs += 1
            try a.tick()
            logged += a.log
        }
        #expect(a.server.table.count == 0)
        a.notify.update()
        #expect(a.notify.store.keys.contains { $0.hasPrefix("livebox-") }, "a live box is still stored: \(a.notify.store.keys.sorted())")
        #expect(a.notify.refused == 0, "nothing sent that PID 1 had to drop")
        let lines = logged.split(separator: "\n").filter { $0.contains("cannot rebuild the live box") }
        #expect(lines.count == 1, "logged once in 50 turns, not per turn: \(lines.count)")
        #expect(lines.first?.contains("fd store is full") == true, "\(lines)")
        // After the backoff it is tried again, still not logged again.
        clock.nowMs += 20_000
        try a.tick()
        #expect(!a.log.contains("cannot rebuild the live box"))
    }

    @Test("with room, a rotation stores the new box before it removes the old")
    func rotationWithRoom() throws {
        let clock = HandOverTests.ManualClock()
        let a = try Node("max_clients = 5000\n", clock: clock)
        a.notify.max = 16
        #expect(!a.log.contains("REASON=handover_budget"), "the budget holds: nothing said")
        let clients = (0..<70).map { _ in a.connect() }
        try a.tick()
        clients.forEach { close($0.peer) }
        for _ in 0..<5 { try a.tick() }
        a.notify.update()
        #expect(a.notify.store["livebox-2"] != nil && a.notify.store["livebox-1"] == nil, "\(a.notify.store.keys.sorted())")
    }

    @Test("more boxes as clients grow: a full box gets a sibling under the same name; a crash restores everyone from all of them")
    func moreBoxesAsClientsGrow() throws {
        let clock = HandOverTests.ManualClock()
        let a = try Node("", clock: clock)
        let live = try #require(a.server.live)
        live.boxSendBuffer = 1  // the kernel's smallest (4,608 bytes): 506 descriptors per box
        let first = (0..<300).map { _ in a.connect() }
        try a.tick()
        a.server.rebuildLiveBox()  // generation 2, in small boxes
        let more = (0..<1_200).map { _ in a.connect() }
        // Accepting and boxing are bounded per turn: turn until every client is
        // in a box (4 turns were enough in a plain build, not under AddressSanitizer).
        // PID 1 reads its notify socket as the daemon sends (its queue holds
        // 11 datagrams at net.unix.max_dgram_qlen = 10): a fake that did not
        // read left the last sibling's store waiting in A, and the crash lost
        // the 188 clients in it (pendingSiblingStoreIsRetried pins that).
        for _ in 0..<100 where a.server.table.count < 1_500 || !live.toBox.isEmpty || !live.pendingStores.isEmpty {
            try a.tick()
            a.notify.update()
        }
        #expect(live.pendingStores.isEmpty, "every box is in the store before the crash: \(live.pendingStores.map(\.name))")
        let boxes = a.notify.store["livebox-2"]?.count ?? 0
        #expect(boxes >= 3, "1,500 clients in boxes of 506: \(boxes) boxes under livebox-2: \(a.notify.store.keys.sorted())")
        #expect(a.notify.store["livebox-1"] == nil)
        #expect(!a.log.contains("REASON=handover_failed"))
        // The crash: B gets only what A stored.
        let b = try Node("", clock: clock, stored: a.notify.passed)
        #expect(b.server.table.count == 1_500, "every client back from \(boxes) boxes: \(b.server.table.count)")
        (first + more).forEach { close($0.peer) }
    }

    /// Fills the fake PID 1's notify queue, as a PID 1 busy elsewhere leaves it.
    static func fillQueue(_ notify: HandOverTests.FakeNotify) {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var a = sockaddr_un()
        a.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &a.sun_path) { $0.copyBytes(from: Array(notify.path.utf8)) }
        let message = Array("X_FILLER=1".utf8)
        while withUnsafePointer(to: &a, {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, message, message.count, 0, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }) > 0 {}
    }

    @Test("a sibling box whose store PID 1 has not taken yet is retried every turn; once taken, a crash restores its clients too")
    func pendingSiblingStoreIsRetried() throws {
        let clock = HandOverTests.ManualClock()
        let a = try Node("", clock: clock)
        let live = try #require(a.server.live)
        live.boxSendBuffer = 1  // 506 descriptors per box
        let first = (0..<300).map { _ in a.connect() }
        try a.tick()
        a.server.rebuildLiveBox()
        a.notify.update()
        #expect(a.notify.store["livebox-2"]?.count == 1 && live.pendingStores.isEmpty)
        Self.fillQueue(a.notify)  // PID 1 busy: no datagram gets in
        let more = (0..<300).map { _ in a.connect() }
        for _ in 0..<5 { try a.tick() }
        #expect(live.toBox.isEmpty && live.fullBoxes.count == 1, "a sibling box: \(live.fullBoxes.count + 1) boxes")
        #expect(live.pendingStores.map(\.name) == ["livebox-2"], "its store waits: \(live.pendingStores.map(\.name))")
        a.notify.update()  // PID 1 reads (only the filler so far) ...
        #expect(a.notify.store["livebox-2"]?.count == 1)
        try a.tick()  // ... and the next turn sends the store
        a.notify.update()
        #expect(live.pendingStores.isEmpty && a.notify.store["livebox-2"]?.count == 2)
        let b = try Node("", clock: clock, stored: a.notify.passed)
        #expect(b.server.table.count == 600, "both boxes restored: \(b.server.table.count)")
        (first + more).forEach { close($0.peer) }
    }

    @Test("a new generation that supersedes a sibling box's waiting store still removes the older generation from the store, and a crash restores from the new one alone")
    func supersededSiblingStoreRemovesItsGeneration() throws {
        let clock = HandOverTests.ManualClock()
        let a = try Node("", clock: clock)
        let live = try #require(a.server.live)
        live.boxSendBuffer = 1
        let first = (0..<300).map { _ in a.connect() }
        try a.tick()
        a.server.rebuildLiveBox()
        a.notify.update()
        Self.fillQueue(a.notify)
        let more = (0..<300).map { _ in a.connect() }
        for _ in 0..<5 { try a.tick() }
        #expect(live.pendingStores.map(\.name) == ["livebox-2"], "the sibling's store waits: \(live.pendingStores.map(\.name))")
        // 400 close: closed entries outnumber open ones, a rebuild (generation
        // 3, one box) supersedes the waiting sibling store.
        (first + more[..<100]).forEach { close($0.peer) }
        for _ in 0..<5 where live.boxGeneration < 3 { try a.tick() }
        #expect(live.boxGeneration == 3 && a.server.table.count == 200)
        #expect(live.pendingStores.map(\.name) == ["livebox-3"], "\(live.pendingStores.map(\.name))")
        for _ in 0..<5 where !live.pendingStores.isEmpty {
            a.notify.update()
            try a.tick()
        }
        a.notify.update()
        #expect(a.notify.store.keys.filter { $0.hasPrefix("livebox-") }.sorted() == ["livebox-3"],
                "generation 2 removed once 3 is stored: \(a.notify.store.keys.sorted())")
        #expect(live.inStore.keys.filter { $0.hasPrefix("livebox-") }.sorted() == ["livebox-3"], "\(live.inStore)")
        let b = try Node("", clock: clock, stored: a.notify.passed)
        #expect(b.server.table.count == 200, "\(b.server.table.count)")
        more[100...].forEach { close($0.peer) }
    }

    @Test("descriptors in flight stay under RLIMIT_NOFILE: a rebuild that would pass it is not tried (the stored box stays), logged once; new clients are boxed only while there is room")
    func inFlightStaysUnderTheLimit() throws {
        let clock = HandOverTests.ManualClock()
        let a = try Node("max_clients = 5000\n", clock: clock)
        // Room for 500 descriptors in flight beyond the margin.
        a.server.descriptorLimit = UInt64(Server.inFlightMargin + 500)
        let clients = (0..<400).map { _ in a.connect() }
        try a.tick()
        clients[..<100].forEach { close($0.peer) }
        var logged = ""
        for _ in 0..<20 {
            clock.nowMs += 1
            try a.tick()
            logged += a.log
        }
        a.notify.update()
        #expect(a.notify.store["livebox-1"] != nil && a.notify.store["livebox-2"] == nil,
                "300 open + 400 boxed would pass the limit: the old box stays: \(a.notify.store.keys.sorted())")
        let more = (0..<150).map { _ in a.connect() }
        for _ in 0..<20 {
            clock.nowMs += 1
            try a.tick()
            logged += a.log
        }
        #expect(a.server.live!.boxed == 500, "only up to the limit: \(a.server.live!.boxed) boxed")
        let lines = logged.split(separator: "\n").filter { $0.contains("REASON=handover_failed") }
        #expect(lines.count == 1 && lines[0].contains("over RLIMIT_NOFILE"), "once, with the reason: \(lines)")
        (clients[100...] + more).forEach { close($0.peer) }
    }

    @Test("the budget: descriptors in flight against RLIMIT_NOFILE, the store against FDSTORE, with the numbers")
    func budget() {
        let ok = HandOverBudget(maxClients: 6_000, descriptorLimit: 20_000, fdStoreMax: 16, listeners: 2)
        #expect(ok.problems.isEmpty)
        let tight = HandOverBudget(maxClients: 10_000, descriptorLimit: 20_000, fdStoreMax: 16, listeners: 0)
        #expect(tight.problems.count == 1)
        #expect(tight.problems[0].contains("30000 descriptors in flight") && tight.problems[0].contains("RLIMIT_NOFILE is 20000")
                && tight.problems[0].contains("about 6666 clients"), "\(tight.problems[0])")
        let small = HandOverBudget(maxClients: 100, descriptorLimit: 65_536, fdStoreMax: 4, listeners: 2)
        #expect(small.problems == [small.problems[0]] && small.problems[0].contains("FDSTORE=4") && small.problems[0].contains("at least 7"))
        // 100,000 clients in boxes of 46,800: 3 boxes per generation, 2 x 3 + 3 store entries.
        let many = HandOverBudget(maxClients: 100_000, descriptorLimit: 400_000, fdStoreMax: 8, listeners: 0, boxCapacity: 46_800)
        #expect(many.boxesPerGeneration == 3 && many.storeEntries == 9 && many.problems.count == 1, "\(many.problems)")
    }
}
