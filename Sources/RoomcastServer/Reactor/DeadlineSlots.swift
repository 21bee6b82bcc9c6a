/// Connections that are not clients yet, each with a deadline: a PROXY header
/// still owed (ProxyHeaders.swift) or a TLS handshake not done
/// (TLSHandshakes.swift). Slots are reused; a serial per slot tells a reused
/// slot from the one a deadline was set for. Deadlines are kept in insertion
/// order, which is deadline order while the timeout does not shrink (after a
/// shorter one on a reload, a deadline waits for those before it: late by at
/// most the old timeout).
struct DeadlineSlots<Element> {
    private var storage: [Element?] = []
    private var serials: [UInt64] = []
    private var free: [Int] = []
    /// (slot, serial, deadline in ms), in insertion order.
    private var deadlines: [(slot: Int, serial: UInt64, deadline: UInt64)] = []
    private var head = 0
    private var nextSerial: UInt64 = 0
    /// Occupied slots.
    private(set) var count = 0

    /// The element in `slot`, nil when it is free (or out of range).
    subscript(slot: Int) -> Element? {
        get { storage.indices.contains(slot) ? storage[slot] : nil }
        _modify { yield &storage[slot] }
    }

    /// Every slot number ever used, occupied or free.
    var indices: Range<Int> { storage.indices }

    /// Puts `element` in a free slot with `deadline` (ms); returns the slot.
    mutating func add(_ element: Element, deadline: UInt64) -> Int {
        nextSerial &+= 1
        let slot: Int
        if let reused = free.popLast() {
            slot = reused
            storage[slot] = element
            serials[slot] = nextSerial
        } else {
            slot = storage.count
            storage.append(element)
            serials.append(nextSerial)
        }
        deadlines.append((slot, nextSerial, deadline))
        count += 1
        return slot
    }

    /// Frees `slot`; returns what it held (nil: it was free).
    mutating func remove(_ slot: Int) -> Element? {
        guard storage.indices.contains(slot), let element = storage[slot] else { return nil }
        storage[slot] = nil
        free.append(slot)
        count -= 1
        if count == 0 { deadlines.removeAll(keepingCapacity: true); head = 0 }
        return element
    }

    /// The earliest deadline still pending, in ms.
    mutating func nextDeadline() -> UInt64? {
        dropStale()
        return head < deadlines.count ? deadlines[head].deadline : nil
    }

    /// The slots whose deadline is at or before `now` (ms); each is returned once.
    mutating func expired(now: UInt64) -> [Int] {
        var out: [Int] = []
        while true {
            dropStale()
            guard head < deadlines.count, deadlines[head].deadline <= now else { break }
            out.append(deadlines[head].slot)
            head += 1
        }
        if head > 64 && head * 2 > deadlines.count { deadlines.removeFirst(head); head = 0 }
        return out
    }

    private mutating func dropStale() {
        while head < deadlines.count {
            let d = deadlines[head]
            guard storage[d.slot] == nil || serials[d.slot] != d.serial else { return }
            head += 1
        }
    }
}
