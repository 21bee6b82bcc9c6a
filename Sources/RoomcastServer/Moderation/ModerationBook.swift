import RoomcastCore

// ModerationBook.swift: the bans, mutes and slow modes this daemon knows
// (docs/api.md "Moderation"), set through the API here or by another
// daemon of the cluster (ModerationWire.swift). Pure: the caller passes
// both clocks. A ban or mute is in force while the wall clock is before its
// `untilMs` (the same instant on every daemon); the timing wheel, on the
// monotonic clock, only tells when to forget an expired one.

/// Bans, mutes and room settings, bounded.
struct ModerationBook {
    /// Bans and mutes at most in one room, and in all (docs/api.md): one
    /// more is refused with 507 `moderation_full`.
    static let maxPerRoom = 10_000
    static let maxEntries = 100_000
    /// Rooms with a setting (slow mode) at most.
    static let maxRoomSettings = 100_000
    /// The longest ban or mute, in s (14 days; docs/api.md).
    static let maxSeconds = ModerationRecord.maxSeconds
    /// The longest reason, in bytes of UTF-8.
    static let maxReasonBytes = ModerationRecord.maxReasonBytes
    /// Slow mode's interval: 0 (off) or 3 ... 120 s (docs/api.md).
    static let slowModeRange = ModerationRecord.slowModeRange
    /// How long a removal is remembered, in ms: a load from Redis that was
    /// sent before the removal reached it must not bring the entry back.
    static let rememberRemovalMs: Int64 = 60_000
    /// Expiries are rounded up to this, in ms (the check itself is exact).
    static let wheelTickMs: UInt64 = 1_000

    struct Entry: Equatable {
        var key: ModerationKey
        /// Wall-clock ms since the epoch: in force before it.
        var untilMs: Int64
        /// When it was set, wall-clock ms (the later of two settings wins).
        var setMs: Int64
        var reason: String

        var record: ModerationRecord { .entry(key, untilMs: untilMs, setMs: setMs, reason: reason) }
    }

    /// Why an entry was not taken.
    enum Refusal: Error, Equatable {
        /// A cap is reached (the message names it).
        case full(String)
        /// An entry set later is already here.
        case stale
    }

    private var slots: [Entry?] = []
    private var free: [Int] = []
    private var index: [ModerationKey: Int] = [:]
    private var perRoom: [RoomName: Int] = [:]
    /// Every key of `index`, in listing order (``ListKey``): the pages of the API's listings.
    private var order = OrderedIndex<ListKey>()
    private var wheel: TimingWheel
    /// Rooms' slow mode in s (absent: off), and when it was set (wall ms).
    private(set) var slowMode: [RoomName: (seconds: Int, setMs: Int64)] = [:]
    /// Hash field → when it was removed (wall ms), for `rememberRemovalMs`.
    private var removed: [String: Int64] = [:]

    init(nowMs: UInt64) {
        wheel = TimingWheel(tickMs: Self.wheelTickMs, slotCount: 256, startMs: nowMs)
    }

    /// Bans and mutes held (expired ones not yet forgotten included).
    var count: Int { index.count }

    /// Whether a record needs Redis's attention at all (tests).
    var isEmpty: Bool { index.isEmpty && slowMode.isEmpty }

    /// The entry `key` while it is in force at `wallMs`.
    func active(_ key: ModerationKey, wallMs: Int64) -> Entry? {
        guard let slot = index[key], let e = slots[slot], e.untilMs > wallMs else { return nil }
        return e
    }

    /// The entries of `kind` in `room` in force at `wallMs`, by sub's bytes. O(entries).
    func list(_ kind: ModerationKind, room: RoomName, wallMs: Int64) -> [Entry] {
        page(kind, room: room, after: [], limit: Int.max, wallMs: wallMs).entries
    }

    /// A page of ``list(_:room:wallMs:)``: at most `limit` entries whose sub
    /// follows `after` (empty: from the first), and whether more follow
    /// (docs/api.md's cursor). O(log n + limit + expired entries not yet
    /// forgotten, at most a wheel tick's worth) over ``order``.
    func page(_ kind: ModerationKind, room: RoomName, after: [UInt8], limit: Int, wallMs: Int64) -> (entries: [Entry], more: Bool) {
        let from = ListKey(kind: kind.rawValue, room: room.bytes, sub: after)
        let got = order.page(after: from, inclusive: after.isEmpty, limit: limit,
                             stop: { $0.kind != from.kind || $0.room != from.room },
                             include: { active(ModerationKey(kind, room: room, sub: $0.sub), wallMs: wallMs) != nil })
        return (got.keys.map { slots[index[ModerationKey(kind, room: room, sub: $0.sub)]!]! }, got.more)
    }

    /// The listing order: kind, room, then sub, each by its bytes.
    struct ListKey: Comparable {
        var kind: String
        var room: [UInt8]
        var sub: [UInt8]

        init(kind: String, room: [UInt8], sub: [UInt8]) { self.kind = kind; self.room = room; self.sub = sub }
        init(_ key: ModerationKey) { self.init(kind: key.kind.rawValue, room: key.room.bytes, sub: key.sub) }

        static func < (a: ListKey, b: ListKey) -> Bool {
            if a.kind != b.kind { return a.kind < b.kind }
            if a.room != b.room { return a.room.lexicographicallyPrecedes(b.room) }
            return a.sub.lexicographicallyPrecedes(b.sub)
        }
    }

    /// Sets (or replaces) an entry. A later `setMs` wins over an earlier
    /// one, so two daemons that hear two settings in either order agree.
    /// - Throws: `Refusal.full` at a cap, `.stale` when a later one is here or was removed later.
    mutating func set(_ entry: Entry, nowMs: UInt64, wallMs: Int64) throws(Refusal) {
        if let gone = removed[entry.key.field], gone >= entry.setMs { throw .stale }
        if let slot = index[entry.key] {
            guard slots[slot]!.setMs <= entry.setMs else { throw .stale }
            slots[slot] = entry
            wheel.schedule(slot, at: deadline(entry, nowMs: nowMs, wallMs: wallMs))
            return
        }
        guard index.count < Self.maxEntries else { throw .full("\(Self.maxEntries) bans and mutes in all") }
        guard perRoom[entry.key.room, default: 0] < Self.maxPerRoom else {
            throw .full("\(Self.maxPerRoom) bans and mutes in the room")
        }
        let slot: Int
        if let reused = free.popLast() {
            slot = reused
            slots[slot] = entry
        } else {
            slot = slots.count
            slots.append(entry)
        }
        index[entry.key] = slot
        order.insert(ListKey(entry.key))
        perRoom[entry.key.room, default: 0] += 1
        wheel.schedule(slot, at: deadline(entry, nowMs: nowMs, wallMs: wallMs))
    }

    /// Removes `key` (a DELETE here or elsewhere, at `setMs`).
    /// - Returns: the entry, if one was held and in force.
    @discardableResult
    mutating func remove(_ key: ModerationKey, setMs: Int64, wallMs: Int64) -> Entry? {
        remember(key.field, setMs, wallMs: wallMs)
        guard let slot = index[key], slots[slot]!.setMs <= setMs else { return nil }
        let e = drop(slot)
        return e.untilMs > wallMs ? e : nil
    }

    /// Entries whose time is up at `nowMs` (monotonic), forgotten here; the
    /// caller removes them from Redis.
    mutating func popExpired(nowMs: UInt64, wallMs: Int64) -> [Entry] {
        wheel.advance(to: nowMs)
        var out: [Entry] = []
        while let slot = wheel.popExpired() {
            guard let e = slots[slot] else { continue }
            if e.untilMs > wallMs {  // the wall clock lags the monotonic one: not yet
                wheel.schedule(slot, at: deadline(e, nowMs: nowMs, wallMs: wallMs))
                continue
            }
            out.append(drop(slot))
        }
        return out
    }

    /// Ms until the next expiry may be due (nil: none held).
    func nextTimeout(fromMs nowMs: UInt64) -> UInt64? { wheel.nextTimeout(from: nowMs) }

    /// Every entry and setting held (what a restart carries over). O(entries).
    var records: [ModerationRecord] {
        index.values.map { slots[$0]!.record } + slowMode.map { .settings($0.key, slowModeSeconds: $0.value.seconds, setMs: $0.value.setMs) }
    }

    /// `room`'s slow mode in s (0: off).
    func slowModeSeconds(_ room: RoomName) -> Int { slowMode[room]?.seconds ?? 0 }

    /// Sets `room`'s slow mode (0: off) at `setMs`.
    /// - Throws: `.full` at `maxRoomSettings`, `.stale` when a later setting is here.
    mutating func setSlowMode(_ room: RoomName, seconds: Int, setMs: Int64, wallMs: Int64) throws(Refusal) {
        let field = ModerationRecord.settings(room, slowModeSeconds: 0, setMs: 0).field
        if let here = slowMode[room], here.setMs > setMs { throw .stale }
        if seconds == 0 {
            slowMode[room] = nil
            remember(field, setMs, wallMs: wallMs)
            return
        }
        if let gone = removed[field], gone > setMs { throw .stale }
        guard slowMode[room] != nil || slowMode.count < Self.maxRoomSettings else {
            throw .full("\(Self.maxRoomSettings) rooms with settings")
        }
        slowMode[room] = (seconds, setMs)
    }

    /// Takes one record (from Redis or the control channel).
    /// - Throws: as `set` and `setSlowMode`.
    mutating func apply(_ record: ModerationRecord, nowMs: UInt64, wallMs: Int64) throws(Refusal) {
        switch record {
        case .entry(let key, let until, let set, let reason):
            try self.set(Entry(key: key, untilMs: until, setMs: set, reason: reason), nowMs: nowMs, wallMs: wallMs)
        case .settings(let room, let seconds, let set):
            try setSlowMode(room, seconds: seconds, setMs: set, wallMs: wallMs)
        case .removed(let key, _, let set):
            remove(key, setMs: set, wallMs: wallMs)
        }
    }

    /// The cluster's whole state as Redis had it (HGETALL): each record
    /// taken by the usual rule (the later `setMs` wins, a removal included).
    /// - Returns: the records taken that are in force (a ban's members must
    ///   go), those whose time is up (for Redis to forget), and those held
    ///   here that the hash lacks or has older (for Redis to be told again:
    ///   it lost them, e.g. it restarted without persistence).
    mutating func load(_ records: [ModerationRecord], nowMs: UInt64, wallMs: Int64)
        -> (taken: [ModerationRecord], expired: [ModerationRecord], missing: [ModerationRecord]) {
        var taken: [ModerationRecord] = [], expired: [ModerationRecord] = []
        var inHash: [String: Int64] = [:]
        for r in records {
            inHash[r.field] = r.setMs
            if let until = r.untilMs, until <= wallMs {
                expired.append(r)
                continue
            }
            do throws(Refusal) {
                try apply(r, nowMs: nowMs, wallMs: wallMs)
                if case .removed = r {} else { taken.append(r) }
            } catch {}
        }
        let missing = self.records.filter { r in inHash[r.field].map { $0 < r.setMs } ?? true }
        return (taken, expired, missing)
    }

    // MARK: - Private

    private func deadline(_ e: Entry, nowMs: UInt64, wallMs: Int64) -> UInt64 {
        e.untilMs > wallMs ? nowMs &+ UInt64(e.untilMs - wallMs) : nowMs
    }

    private mutating func drop(_ slot: Int) -> Entry {
        let e = slots[slot]!
        slots[slot] = nil
        free.append(slot)
        wheel.cancel(slot)
        index[e.key] = nil
        order.remove(ListKey(e.key))
        if perRoom[e.key.room, default: 1] <= 1 { perRoom[e.key.room] = nil } else { perRoom[e.key.room]! -= 1 }
        return e
    }

    private mutating func remember(_ field: String, _ setMs: Int64, wallMs: Int64) {
        if removed.count >= 4096 { removed = removed.filter { wallMs - $0.value < Self.rememberRemovalMs } }
        if removed.count < 65_536 { removed[field] = max(removed[field] ?? .min, setMs) }
    }
}
