import Glibc
import RoomcastCore
import RoomcastIO

/// Where a connection is in its life (memcached's `conn_states`): changed
/// only through `ConnectionTable.markClosing` and `Server`'s EOF handling.
enum ConnectionState: Equatable {
    /// Reading frames and receiving relayed ones.
    case open
    /// No more reading (the peer sent EOF, or the daemon is stopping): what
    /// is already owed is flushed until `drainDeadlineMs`, then it closes.
    case draining
    /// Marked for close with a reason; reaped at the end of the loop iteration.
    case closing
}

/// The protocol a listener speaks.
enum Dialect: Equatable {
    /// Length-type-body frames with proto2 bodies (PROTOCOL.md §1-§3).
    case ltb
    /// Seed 002's length + JSON frames (PROTOCOL.md §7).
    case json
}

/// One client connection: its socket, buffers and limits bookkeeping. It
/// knows nothing of rooms (the relay owns those by connection id).
struct Connection {
    let fd: Int32
    let generation: UInt32
    let dialect: Dialect
    /// A JSON client's nickname once it sent `nickname` (PROTOCOL.md §7).
    var nickname: String?
    /// The peer, `1.2.3.4:P` or `[::1]:P`; the `CLIENT_ADDR` journal field.
    let address: String
    /// The peer's IP address alone (`1.2.3.4`, `[::1]`), for `max_clients_per_ip`.
    var ip: Substring { Self.ip(of: address) }

    /// The IP part of a `1.2.3.4:P` or `[::1]:P` peer address.
    static func ip(of address: String) -> Substring {
        address[..<(address.lastIndex(of: ":") ?? address.endIndex)]
    }
    /// Rate limits (`[limits] frames_per_second`, `bytes_per_second`); nil: off.
    var frameBucket: TokenBucket?
    var byteBucket: TokenBucket?
    var state: ConnectionState = .open
    /// A partial frame carried over between reads (grows with bytes
    /// received, never with the length a header claims).
    var input: [UInt8] = []
    /// EPOLLOUT is registered (only while the kernel refused bytes).
    var writeArmed = false
    /// When the pending output first went above `output_soft_bytes`.
    var softSinceMs: UInt64?
    /// Why it is being closed (for the log).
    var closeReason = ""
    /// The close is the peer's fault and worth a (rate-limited) warning at
    /// reap time, e.g. a slow consumer cut off at the hard output limit.
    var closeWarns = false
    /// The relay has already been told it is gone (leave announced).
    var departed = false
    /// Deadline for flushing owed output while draining, in ms.
    var drainDeadlineMs: UInt64 = 0

    init(fd: Int32, generation: UInt32, dialect: Dialect, address: String) {
        self.fd = fd
        self.generation = generation
        self.dialect = dialect
        self.address = address
    }
}

/// What a broadcast touches of one connection, kept apart from `Connection`
/// in a flat array so that a broadcast is one pass under one exclusive
/// access, copying no connection struct (issue 5's fast path).
struct Outbox {
    /// The connection's socket (for direct writes of large frames).
    var fd: Int32 = -1
    /// Bytes owed to the peer.
    var queue = ByteQueue()
    /// Takes relayed frames: the slot is in use and not marked for close.
    var accepting = false
    /// Seed 002's dialect: gets the JSON form of frames.
    var json = false
    /// In the table's flush list for this iteration.
    var queued = false
    /// Got a frame since the last sweep of idle output buffers.
    var recent = false
    /// In the table's list of connections holding a drained output buffer.
    var retained = false

    /// Bytes queued and not yet written.
    var pending: Int { queue.count }
}

/// All connections in dense slots (ids are slot indices, reused after close
/// with a new generation). It is the relay's `FrameSink`: a broadcast appends
/// the frame (encoded once; translated once for JSON recipients) to each
/// recipient's output buffer and queues the connection for the single flush
/// at the end of the loop iteration. A recipient over the hard output limit
/// is marked for close, never written to again, and the broadcast goes on
/// for everyone else (PROTOCOL.md §6).
final class ConnectionTable: FrameSink {
    var slots: [Connection?] = []
    /// Output state per slot, same indices as `slots`.
    var outboxes: [Outbox] = []
    private var freeSlots: [Int] = []
    private var generations: [UInt32] = []
    private(set) var count = 0
    /// Open connections per peer IP address (only while `max_clients_per_ip` is set).
    private(set) var perIP: [Substring: Int] = [:]
    var countPerIP = false {
        didSet { if !countPerIP { perIP = [:] } else if !oldValue { for c in slots { if let c { perIP[c.ip, default: 0] += 1 } } } }
    }

    /// Connections with output queued in this iteration.
    var flushList: [Int] = []
    /// Connections marked for close, reaped at the end of the iteration.
    var closeList: [Int] = []
    /// A frame not delivered because of its size, for the server to log.
    struct Skip: Equatable {
        enum Kind: Equatable {
            /// Over `output_hard_bytes` on its own (a JSON translation can be
            /// several times its frame): skipped for that recipient, which
            /// is not slow. `address` is the recipient's.
            case overOutputLimit
            /// Its JSON form is over `jsonMaxFrameBytes`: sent to no JSON
            /// client (seed 002's clients never get more than the daemon
            /// accepts from them). One per frame; `address` is the sender's.
            case overJSONLimit
        }
        var kind: Kind
        /// Taken when the skip happens: the slot may be reused before it is logged.
        var address: String
        /// The size that did not fit, in bytes.
        var bytes: Int
    }
    var skips: [Skip] = []
    /// Connections that kept a drained output buffer (see `sweepIdleBuffers`).
    private var retainedList: [Int] = []

    /// Frames at least this large are written straight to an idle socket
    /// (nothing queued for it) from the sender's buffer: the kernel's copy
    /// is the only one, instead of one into the output queue first. Smaller
    /// frames are queued and go out together, one write per connection per
    /// loop iteration. In bytes.
    static let directWriteBytes = 4096

    /// `limits.output_hard_bytes`.
    var outputHardBytes: Int
    /// Frames handed to connections (the "out" figure of STATUS).
    var deliveries: UInt64 = 0
    /// The relay's rules, to translate frames for JSON clients.
    var relaySettings: RelaySettings
    /// `json.max_frame_bytes`: the largest JSON body sent to a JSON client, in bytes.
    var jsonMaxFrameBytes = Int.max

    init(outputHardBytes: Int, relaySettings: RelaySettings) {
        self.outputHardBytes = outputHardBytes
        self.relaySettings = relaySettings
    }

    /// Takes a free slot for a new connection and returns its id.
    func add(fd: Int32, dialect: Dialect, address: String) -> Int {
        let id: Int
        if let free = freeSlots.popLast() {
            id = free
        } else {
            id = slots.count
            slots.append(nil)
            outboxes.append(Outbox())
            generations.append(0)
        }
        generations[id] &+= 1
        slots[id] = Connection(fd: fd, generation: generations[id], dialect: dialect, address: address)
        outboxes[id] = Outbox(fd: fd, accepting: true, json: dialect == .json)
        count += 1
        if countPerIP { perIP[slots[id]!.ip, default: 0] += 1 }
        return id
    }

    /// Frees the slot of a reaped connection.
    func remove(_ id: Int) {
        guard let c = slots[id] else { return }
        if countPerIP, let n = perIP[c.ip] { perIP[c.ip] = n > 1 ? n - 1 : nil }
        slots[id] = nil
        outboxes[id].queue.release()
        outboxes[id] = Outbox()
        freeSlots.append(id)
        count -= 1
    }

    /// Marks `id` for close at the end of the iteration; the first reason
    /// wins. `warn`: log the close as a warning rather than at debug.
    func markClosing(_ id: Int, reason: String, warn: Bool = false) {
        guard slots[id] != nil, slots[id]!.state != .closing else { return }
        slots[id]!.state = .closing
        outboxes[id].accepting = false
        slots[id]!.closeReason = reason
        slots[id]!.closeWarns = warn
        closeList.append(id)
    }

    func broadcast(_ frame: UnsafeRawBufferPointer, from sender: Int, to members: [Int], except: Int) -> Int {
        let hard = outputHardBytes
        var translation: [UInt8]?? = nil  // the JSON form, made at most once
        var overHard: [Int] = []
        var failed: [(id: Int, errno: Int32)] = []
        var newlyQueued: [Int] = []
        // Rare paths record into locals: touching the table's properties in
        // the closure costs dynamic exclusivity checks on every delivery.
        var tooLarge: [(id: Int, bytes: Int)] = []
        var jsonTooLarge: Int?
        let jsonLimit = jsonMaxFrameBytes
        var count = 0
        outboxes.withUnsafeMutableBufferPointer { boxes in
            func put(_ bytes: UnsafeRawBufferPointer, _ m: Int) {
                guard bytes.count <= hard else {
                    tooLarge.append((m, bytes.count))
                    return
                }
                var rest = bytes
                if bytes.count >= Self.directWriteBytes && boxes[m].queue.isEmpty {
                    switch Sys.send(boxes[m].fd, bytes.baseAddress!, bytes.count) {
                    case .done(let n):
                        rest = UnsafeRawBufferPointer(rebasing: bytes[n...])
                    case .failed(let e):
                        failed.append((m, e))
                        return
                    case .wouldBlock, .endOfFile:
                        break
                    }
                }
                count += 1
                boxes[m].recent = true
                guard !rest.isEmpty else { return }
                if boxes[m].pending + rest.count > hard {
                    overHard.append(m)
                    return
                }
                boxes[m].queue.append(rest)
                if !boxes[m].queued {
                    boxes[m].queued = true
                    newlyQueued.append(m)
                }
            }
            for m in members where m != except && boxes[m].accepting {
                if boxes[m].json {
                    if translation == nil {
                        var json = self.translate(frame, from: sender)
                        if let j = json, j.count - JSONFrameCodec.headerSize > jsonLimit {
                            jsonTooLarge = j.count - JSONFrameCodec.headerSize
                            json = nil
                        }
                        translation = .some(json)
                    }
                    guard let json = translation! else { continue }
                    json.withUnsafeBytes { put($0, m) }
                } else {
                    put(frame, m)
                }
            }
        }
        flushList.append(contentsOf: newlyQueued)
        for (m, bytes) in tooLarge { skips.append(Skip(kind: .overOutputLimit, address: address(of: m), bytes: bytes)) }
        if let bytes = jsonTooLarge { skips.append(Skip(kind: .overJSONLimit, address: address(of: sender), bytes: bytes)) }
        for m in overHard {
            markClosing(m, reason: "slow consumer: \(outboxes[m].pending) bytes pending, the next frame would exceed "
                        + "output_hard_bytes (\(formatSize(outputHardBytes)))", warn: true)
        }
        for (m, e) in failed { markClosing(m, reason: SystemError("send", errno: e).description) }
        deliveries &+= UInt64(count)
        return count
    }

    /// Notes that `id` drained its output and kept the buffer for the next
    /// iteration (no malloc per broadcast while it is busy).
    func retainDrainedBuffer(_ id: Int) {
        guard outboxes[id].queue.capacity > 0, !outboxes[id].retained else { return }
        outboxes[id].retained = true
        retainedList.append(id)
    }

    /// Frees the kept buffers of connections that got nothing since the last
    /// sweep, so idle connections cost no output memory. Work is proportional
    /// to the connections holding a buffer, not to all connections.
    /// - Returns: the bytes freed.
    func sweepIdleBuffers() -> Int {
        var freed = 0
        retainedList.removeAll { id in
            guard outboxes[id].retained else { return true }  // the slot was reused
            if outboxes[id].recent {
                outboxes[id].recent = false
                return false
            }
            if outboxes[id].queue.isEmpty {
                freed += outboxes[id].queue.capacity
                outboxes[id].queue.release()
            }
            outboxes[id].retained = false
            return true
        }
        return freed
    }

    private func address(of id: Int) -> String {
        slots.indices.contains(id) ? slots[id]?.address ?? "" : ""
    }

    /// The JSON form of an LTB frame for seed-002 clients (nil: none).
    private func translate(_ frame: UnsafeRawBufferPointer, from sender: Int) -> [UInt8]? {
        JSONDialect.translate(frame, settings: relaySettings, senderAddress: address(of: sender))
    }
}
