/// A connection's output queue: raw bytes appended at the tail, written from
/// the head. An append is a capacity check and one memcpy (the per-recipient
/// cost of a broadcast), with no uniqueness or copy-on-write checks.
///
/// It owns manually managed memory: it lives in exactly one place (the
/// daemon's per-connection `Outbox`), is only used in place, and is freed
/// with `release()` when its connection goes. Never copy one. (It cannot be
/// `~Copyable`: the outboxes live in an `Array`, whose elements must be
/// copyable.)
///
/// `@inlinable` throughout: the daemon appends to it once per delivered frame,
/// from another module, and a call per append would cost more than the copy.
public struct OutputQueue {
    @usableFromInline var base: UnsafeMutableRawPointer?
    @usableFromInline var allocated = 0
    @usableFromInline var head = 0
    @usableFromInline var tail = 0

    public init() {}

    /// Bytes of storage allocated.
    @inlinable public var capacity: Int { allocated }
    /// Bytes queued and not yet consumed.
    @inlinable public var count: Int { tail - head }
    /// Whether nothing is queued.
    @inlinable public var isEmpty: Bool { tail == head }

    /// Appends `bytes`, growing (doubling) the storage when needed.
    @inlinable @inline(__always)
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        let n = bytes.count
        guard n > 0 else { return }
        if allocated - tail < n { makeRoom(n) }
        (base! + tail).copyMemory(from: bytes.baseAddress!, byteCount: n)
        tail += n
    }

    @usableFromInline
    mutating func makeRoom(_ n: Int) {
        let live = tail - head
        if head > 0 && allocated - live >= n && head >= live {
            // Enough room once the written prefix is dropped: slide down.
            if live > 0 { base!.copyMemory(from: base! + head, byteCount: live) }
        } else {
            let newCapacity = max(live + n, allocated * 2, 256)
            let new = UnsafeMutableRawPointer.allocate(byteCount: newCapacity, alignment: 16)
            if live > 0 { new.copyMemory(from: base! + head, byteCount: live) }
            base?.deallocate()
            base = new
            allocated = newCapacity
        }
        head = 0
        tail = live
    }

    /// Calls `body` with the queued bytes (valid only during the call).
    @inlinable @inline(__always)
    public func withReadableBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        guard let base else { return body(UnsafeRawBufferPointer(start: nil, count: 0)) }
        return body(UnsafeRawBufferPointer(start: base + head, count: tail - head))
    }

    /// Drops `n` written bytes from the head (0 <= n <= count). When the
    /// queue empties, storage larger than `keepCapacity` bytes is given back.
    @inlinable
    public mutating func consume(_ n: Int, keepCapacity: Int) {
        precondition(n >= 0 && n <= tail - head)
        head += n
        if head == tail {
            head = 0
            tail = 0
            if allocated > keepCapacity { release() }
        }
    }

    /// Keeps only the first `n` queued bytes (0 <= n <= count) and drops the
    /// rest; the storage is kept.
    @inlinable
    public mutating func truncate(to n: Int) {
        precondition(n >= 0 && n <= tail - head)
        tail = head + n
    }

    /// Frees the storage (the queue is empty afterwards).
    @inlinable
    public mutating func release() {
        base?.deallocate()
        base = nil
        allocated = 0
        head = 0
        tail = 0
    }
}
