import Glibc

/// A connection's output queue: raw bytes appended at the tail, written from
/// the head. An append is a capacity check and one memcpy (the per-recipient
/// cost of a broadcast, issue 5), with no uniqueness or copy-on-write checks.
///
/// It owns manually managed memory: it lives in exactly one place
/// (`Outbox` in `ConnectionTable.outboxes`), is only used in place, and is
/// freed with `release()` when its connection goes. Never copy one.
struct ByteQueue {
    private var base: UnsafeMutableRawPointer?
    private(set) var capacity = 0
    private var head = 0
    private var tail = 0

    /// Bytes queued and not yet consumed.
    var count: Int { tail - head }
    var isEmpty: Bool { tail == head }

    /// Appends `bytes`, growing (doubling) the storage when needed.
    @inline(__always)
    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        let n = bytes.count
        guard n > 0 else { return }
        if capacity - tail < n { makeRoom(n) }
        (base! + tail).copyMemory(from: bytes.baseAddress!, byteCount: n)
        tail += n
    }

    private mutating func makeRoom(_ n: Int) {
        let live = tail - head
        if head > 0 && capacity - live >= n && head >= live {
            // Enough room once the written prefix is dropped: slide down.
            if live > 0 { base!.copyMemory(from: base! + head, byteCount: live) }
        } else {
            let newCapacity = max(live + n, capacity * 2, 256)
            let new = UnsafeMutableRawPointer.allocate(byteCount: newCapacity, alignment: 16)
            if live > 0 { new.copyMemory(from: base! + head, byteCount: live) }
            base?.deallocate()
            base = new
            capacity = newCapacity
        }
        head = 0
        tail = live
    }

    /// Calls `body` with the queued bytes (valid only during the call).
    @inline(__always)
    func withReadableBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        guard let base else { return body(UnsafeRawBufferPointer(start: nil, count: 0)) }
        return body(UnsafeRawBufferPointer(start: base + head, count: tail - head))
    }

    /// Drops `n` written bytes from the head. When the queue empties, storage
    /// larger than `keepCapacity` bytes is given back.
    mutating func consume(_ n: Int, keepCapacity: Int) {
        precondition(n >= 0 && n <= tail - head)
        head += n
        if head == tail {
            head = 0
            tail = 0
            if capacity > keepCapacity { release() }
        }
    }

    /// Frees the storage (the queue is empty afterwards).
    mutating func release() {
        base?.deallocate()
        base = nil
        capacity = 0
        head = 0
        tail = 0
    }
}
