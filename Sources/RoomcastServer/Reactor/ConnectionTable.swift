import RoomcastCore
import RoomcastIO

/// All connections in dense slots: ids are slot indices, reused after a
/// close (the selector's registration generation tells a reused slot's
/// events apart). Owns the slots, the per-IP counts, the close list and the
/// one checked state transition; the output side of each slot lives in
/// `fanout.outboxes` under the same index.
///
/// It makes no system call: closing a descriptor is the reaper's job
/// (`Server.reap`), at the end of the loop iteration.
final class ConnectionTable {
    /// The cold state of each connection (its state is in `fanout.outboxes`).
    var slots: [Connection?] = []
    /// The relay's frame sink, with an outbox (output queue and state) per slot.
    let fanout: Fanout
    private var freeSlots: [Int] = []
    private(set) var count = 0
    /// Open connections per peer IP address (only while `max_clients_per_ip` is set).
    private(set) var perIP: [Substring: Int] = [:]
    var countPerIP = false {
        didSet { if !countPerIP { perIP = [:] } else if !oldValue { for c in slots { if let c { perIP[c.ip, default: 0] += 1 } } } }
    }
    /// Connections moved to `.closing`, reaped at the end of the iteration.
    var closeList: [Int] = []

    init(fanout: Fanout) {
        self.fanout = fanout
        fanout.table = self
    }

    /// Takes a free slot for a new, open connection.
    /// - Returns: its id (the slot index).
    func add(fd: Int32, dialect: Dialect, address: String) -> Int {
        let id: Int
        if let free = freeSlots.popLast() {
            id = free
        } else {
            id = slots.count
            slots.append(nil)
            fanout.outboxes.append(Outbox())
        }
        slots[id] = Connection(fd: fd, dialect: dialect, address: address)
        fanout.outboxes[id] = Outbox(fd: fd, state: .open, json: dialect == .json, isWebSocket: dialect == .webSocket)
        count += 1
        if countPerIP { perIP[slots[id]!.ip, default: 0] += 1 }
        return id
    }

    /// Frees the slot of a reaped connection.
    func remove(_ id: Int) {
        guard let c = slots[id] else { return }
        if countPerIP, let n = perIP[c.ip] { perIP[c.ip] = n > 1 ? n - 1 : nil }
        slots[id] = nil
        fanout.outboxes[id].queue.release()
        fanout.outboxes[id] = Outbox()
        fanout.forgetShedding(id)
        freeSlots.append(id)
        count -= 1
    }

    /// The state of connection `id`; nil for a free slot.
    @inline(__always)
    func state(_ id: Int) -> ConnectionState? {
        id < slots.count ? fanout.outboxes[id].state : nil
    }

    /// Whether `id` is in use and `.open`.
    @inline(__always)
    func isOpen(_ id: Int) -> Bool { state(id) == .open }

    /// The one place a connection's state changes (memcached's
    /// `conn_set_state`). A move to `.closing` needs its `reason` and puts
    /// the connection on the close list; a second close keeps the first
    /// reason. Any other move that `ConnectionState.canMove` forbids is a bug.
    func transition(_ id: Int, to next: ConnectionState, reason: CloseReason? = nil) {
        guard let current = state(id) else { return }
        if current == .closing && next == .closing { return }
        precondition(current.canMove(to: next), "connection \(id): \(current) -> \(next)")
        fanout.outboxes[id].state = next
        if next == .closing {
            slots[id]!.closeReason = reason ?? CloseReason(text: "closed")
            closeList.append(id)
        }
    }

    /// Shorthand for `transition(id, to: .closing, ...)`.
    func close(_ id: Int, _ text: String, warning: String? = nil) {
        transition(id, to: .closing, reason: CloseReason(text: text, warning: warning))
    }

    /// The peer address of `id` ("" for a free slot or an unknown id).
    func address(of id: Int) -> String {
        slots.indices.contains(id) ? slots[id]?.address ?? "" : ""
    }

    /// The verified sub of connection `id` (signed joins, docs/protocol/tokens.md
    /// §13); "" for none, or for an id that is no connection (an API publish).
    func sub(of id: Int) -> String {
        slots.indices.contains(id) ? slots[id]?.auth?.claims.sub ?? "" : ""
    }

    /// The ids of every connection in use.
    var ids: [Int] { slots.indices.filter { slots[$0] != nil } }
}
