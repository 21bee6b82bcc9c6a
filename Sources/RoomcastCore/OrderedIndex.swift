// OrderedIndex.swift: a set of keys kept in order as they come and go, for
// the API's listings (docs/api.md: rooms, bans, mutes, members, each paged
// by a cursor, the last key of the previous page). A page costs
// O(log n + limit) instead of a sort of everything per page (issue 28
// item 3: `GET /v1/rooms?limit=1` with 2 M rooms held the loop 5.9 s).
//
// The shape is a sorted list of sorted blocks (as Python's sortedcontainers):
// blocks of at most `blockSize` keys, in order, and the last key of each
// block in a directory searched by bisection.

/// Keys in ascending order, with insert, remove and "the keys after this
/// one" pages.
///
/// Costs, n keys, B = ``blockSize``: `insert` and `remove` O(log n + B +
/// n/B) in the worst case (a bisection of the directory and of one block,
/// a shift within the block, and a shift of the directory only when a
/// block splits or empties); `page` O(log n + limit); `contains` O(log n);
/// memory about n keys plus two words per block.
public struct OrderedIndex<Key: Comparable> {
    /// Keys per block at most (a block splits in two above it).
    public static var blockSize: Int { 512 }

    private var blocks: [[Key]] = []
    /// `maxes[i]` is the last key of `blocks[i]`.
    private var maxes: [Key] = []
    public private(set) var count = 0

    public init() {}

    /// The first block whose last key is >= `key` (blocks.count: none).
    private func block(atLeast key: Key) -> Int {
        var lo = 0, hi = maxes.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if maxes[mid] < key { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    /// The first position in `b` whose key is >= `key` (or > when `strictly`).
    private static func position(in b: [Key], of key: Key, strictly: Bool) -> Int {
        var lo = 0, hi = b.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if b[mid] < key || (strictly && b[mid] == key) { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    /// Whether `key` is held. O(log n).
    public func contains(_ key: Key) -> Bool {
        let i = block(atLeast: key)
        guard i < blocks.count else { return false }
        let p = Self.position(in: blocks[i], of: key, strictly: false)
        return p < blocks[i].count && blocks[i][p] == key
    }

    /// Adds `key`. - Returns: false when it was held already (nothing changes).
    @discardableResult
    public mutating func insert(_ key: Key) -> Bool {
        guard !blocks.isEmpty else {
            blocks = [[key]]
            maxes = [key]
            count = 1
            return true
        }
        var i = block(atLeast: key)
        if i == blocks.count { i -= 1 }  // past every key: the last block grows
        let p = Self.position(in: blocks[i], of: key, strictly: false)
        if p < blocks[i].count && blocks[i][p] == key { return false }
        blocks[i].insert(key, at: p)
        if p == blocks[i].count - 1 { maxes[i] = key }
        count += 1
        if blocks[i].count > Self.blockSize {
            let upper = Array(blocks[i][(Self.blockSize / 2)...])
            blocks[i].removeSubrange((Self.blockSize / 2)...)
            blocks.insert(upper, at: i + 1)
            maxes[i] = blocks[i].last!
            maxes.insert(upper.last!, at: i + 1)
        }
        return true
    }

    /// Takes `key` out. - Returns: false when it was not held.
    @discardableResult
    public mutating func remove(_ key: Key) -> Bool {
        let i = block(atLeast: key)
        guard i < blocks.count else { return false }
        let p = Self.position(in: blocks[i], of: key, strictly: false)
        guard p < blocks[i].count && blocks[i][p] == key else { return false }
        blocks[i].remove(at: p)
        count -= 1
        if blocks[i].isEmpty {
            blocks.remove(at: i)
            maxes.remove(at: i)
        } else if p == blocks[i].count {
            maxes[i] = blocks[i].last!
        }
        return true
    }

    /// At most `limit` keys greater than `after` (or equal too, when
    /// `inclusive`; every key from the first when nil), ascending, that
    /// `include` accepts, and whether more accepted ones follow (then the
    /// last key returned is the next page's cursor). `stop` ends the scan
    /// at the first key it accepts (a key past a prefix).
    /// O(log n + limit + keys refused by `include`).
    public func page(after: Key?, inclusive: Bool = false, limit: Int, stop: (Key) -> Bool = { _ in false },
                     include: (Key) -> Bool = { _ in true }) -> (keys: [Key], more: Bool) {
        var out: [Key] = []
        out.reserveCapacity(min(limit, 1024))
        var i = 0, p = 0
        if let after {
            i = block(atLeast: after)
            if i < blocks.count { p = Self.position(in: blocks[i], of: after, strictly: !inclusive) }
        }
        while i < blocks.count {
            let b = blocks[i]
            while p < b.count {
                let k = b[p]
                if stop(k) { return (out, false) }
                if include(k) {
                    if out.count == limit { return (out, true) }
                    out.append(k)
                }
                p += 1
            }
            i += 1
            p = 0
        }
        return (out, false)
    }

    /// Every key, ascending (tests). O(n).
    public var all: [Key] { blocks.flatMap { $0 } }
}

/// A key ordered by its bytes, compared as the API's cursors are
/// (`lexicographicallyPrecedes`, docs/api.md): room names and subs.
public struct ByteKey: Comparable, Hashable, Sendable {
    public var bytes: [UInt8]
    public init(_ bytes: [UInt8]) { self.bytes = bytes }
    public static func < (a: ByteKey, b: ByteKey) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }
}
