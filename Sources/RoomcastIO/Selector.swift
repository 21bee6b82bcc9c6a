import CShim
import Glibc

/// Readiness of a descriptor, translated from epoll bits. The selector knows
/// nothing of what the descriptor is. Public because the client library
/// hands it to its watch handlers (`RoomcastClient.IOReadiness`).
public struct Readiness: OptionSet, Sendable {
    /// Bit 0 readable, bit 1 writable, bit 2 hangup.
    public let rawValue: UInt8
    /// A set from its bits (see `rawValue`).
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    /// Bytes (or EOF) can be read without blocking.
    public static let readable = Readiness(rawValue: 1)
    /// Bytes can be written without blocking (or a non-blocking connect finished).
    public static let writable = Readiness(rawValue: 2)
    /// EPOLLHUP or EPOLLERR: the descriptor should be read (to learn the error
    /// or EOF) and then closed.
    public static let hangup = Readiness(rawValue: 4)
}

/// A descriptor's place in a `Selector`: a slot and the generation the slot
/// had when the descriptor was registered. It goes stale at `deregister`,
/// and every call with a stale registration is ignored.
package struct Registration: Hashable, Sendable {
    @usableFromInline let slot: UInt32
    @usableFromInline let generation: UInt32

    @usableFromInline init(slot: UInt32, generation: UInt32) {
        self.slot = slot
        self.generation = generation
    }

    /// The `epoll_event.data.u64` of this registration.
    @usableFromInline var token: UInt64 { UInt64(generation) << 32 | UInt64(slot) }
}

/// One slot of a `Selector`'s registry.
@usableFromInline struct SelectorEntry {
    @usableFromInline var fd: Int32 = -1
    @usableFromInline var generation: UInt32 = 0
    @usableFromInline var live = false
    @usableFromInline var readable = false
    @usableFromInline var writable = false
    @usableFromInline init() {}
}

/// A level-triggered epoll(7) selector with its own registry: each
/// registered descriptor carries a `Target` chosen by the caller (what the
/// descriptor is to it: a connection id, a listener, a handler), and
/// `wait` hands back the target, never the descriptor.
///
/// Stale events are dropped here (libuv, swift-nio): the kernel's token is
/// the registration's slot and generation, and a descriptor deregistered
/// (and maybe closed and reused) earlier in the same batch no longer
/// matches. The selector also remembers each registration's interest, so
/// asking for the interest it already has costs no epoll_ctl(2).
package final class Selector<Target> {
    @usableFromInline let epfd: Int32
    @usableFromInline var events: [epoll_event]
    /// Per slot: the descriptor, generation and interest. Not generic, so
    /// the output path's interest checks need no generic metadata even when
    /// the compiler does not specialize them.
    @usableFromInline var entries: [SelectorEntry] = []
    /// Per slot: the caller's target (nil: free).
    @usableFromInline var targets: [Target?] = []
    private var freeSlots: [UInt32] = []

    /// - Parameter capacity: events returned per `wait` at most.
    /// - Throws: `SystemError` from epoll_create1(2) (EMFILE, ENOMEM).
    package init(capacity: Int = 512) throws(SystemError) {
        epfd = try Sys.blocking("epoll_create1") { epoll_create1(Int32(EPOLL_CLOEXEC)) }
        events = Array(repeating: epoll_event(), count: capacity)
    }

    deinit { Sys.close(epfd) }

    @usableFromInline
    func control(_ op: Int32, _ name: StaticString, _ r: Registration, fd: Int32, readable: Bool, writable: Bool) throws(SystemError) {
        var ev = epoll_event(events: (readable ? EPOLLIN.rawValue : 0) | (writable ? EPOLLOUT.rawValue : 0),
                             data: epoll_data_t(u64: r.token))
        _ = try Sys.blocking("\(name)") { epoll_ctl(epfd, op, fd, &ev) }
    }

    /// Starts watching `fd` for `target`.
    /// - Throws: `SystemError` from epoll_ctl(2) (e.g. EPERM for a regular
    ///   file, ENOMEM, ENOSPC past `max_user_watches`); nothing is registered then.
    package func register(_ fd: Int32, _ target: Target, readable: Bool = true, writable: Bool = false) throws(SystemError) -> Registration {
        let slot: UInt32
        if let free = freeSlots.popLast() {
            slot = free
        } else {
            slot = UInt32(entries.count)
            entries.append(SelectorEntry())
            targets.append(nil)
        }
        let r = Registration(slot: slot, generation: entries[Int(slot)].generation)
        do {
            try control(EPOLL_CTL_ADD, "epoll_ctl(ADD)", r, fd: fd, readable: readable, writable: writable)
        } catch {
            freeSlots.append(slot)
            throw error
        }
        entries[Int(slot)].fd = fd
        entries[Int(slot)].live = true
        targets[Int(slot)] = target
        entries[Int(slot)].readable = readable
        entries[Int(slot)].writable = writable
        return r
    }

    /// Whether `r` is still registered.
    @inlinable
    package func isLive(_ r: Registration) -> Bool {
        Int(r.slot) < entries.count && entries[Int(r.slot)].generation == r.generation && entries[Int(r.slot)].live
    }

    /// Changes what `r` is watched for; a no-op when it is stale or already so.
    /// - Throws: `SystemError` from epoll_ctl(2).
    @inlinable
    package func setInterest(_ r: Registration, readable: Bool, writable: Bool) throws(SystemError) {
        guard isLive(r) else { return }
        let e = entries[Int(r.slot)]
        guard e.readable != readable || e.writable != writable else { return }
        try control(EPOLL_CTL_MOD, "epoll_ctl(MOD)", r, fd: e.fd, readable: readable, writable: writable)
        entries[Int(r.slot)].readable = readable
        entries[Int(r.slot)].writable = writable
    }

    /// Stops watching; events of `r` still in the current batch are dropped.
    /// Call it before closing the descriptor. A stale `r` is ignored.
    package func deregister(_ r: Registration) {
        guard isLive(r) else { return }
        var ev = epoll_event()
        // ENOENT/EPERM cannot happen for a live registration; nothing to do on error.
        _ = try? Sys.call("epoll_ctl(DEL)") { epoll_ctl(epfd, EPOLL_CTL_DEL, entries[Int(r.slot)].fd, &ev) }
        entries[Int(r.slot)] = SelectorEntry()
        entries[Int(r.slot)].generation = r.generation &+ 1
        targets[Int(r.slot)] = nil
        freeSlots.append(r.slot)
    }

    /// Drops every registration (their descriptors are not closed).
    package func deregisterAll() {
        for slot in entries.indices where entries[slot].live {
            deregister(Registration(slot: UInt32(slot), generation: entries[slot].generation))
        }
    }

    /// Waits up to `timeoutMs` (-1: forever) and calls `handler` for each
    /// ready registration that is still live when its turn comes.
    /// - Throws: `SystemError` from epoll_wait(2) (EINTR is retried).
    @inlinable
    package func wait(timeoutMs: Int32, _ handler: (Target, Readiness) -> Void) throws(SystemError) {
        let n = try Sys.blocking("epoll_wait") {
            events.withUnsafeMutableBufferPointer { epoll_wait(epfd, $0.baseAddress, Int32($0.count), timeoutMs) }
        }
        for i in 0..<Int(n) {
            let ev = events[i]
            let token = ev.data.u64
            let slot = Int(token & 0xFFFF_FFFF)
            guard slot < entries.count, entries[slot].generation == UInt32(token >> 32),
                  let target = targets[slot] else { continue }  // stale: deregistered earlier in this batch
            var r: Readiness = []
            if ev.events & EPOLLIN.rawValue != 0 { r.insert(.readable) }
            if ev.events & EPOLLOUT.rawValue != 0 { r.insert(.writable) }
            if ev.events & (EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 { r.insert(.hangup) }
            handler(target, r)
        }
    }
}
