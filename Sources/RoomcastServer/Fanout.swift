import RoomcastCore
import RoomcastIO

/// What a broadcast touches of one connection, kept apart from `Connection`
/// in a flat array so that a broadcast is one pass under one exclusive
/// access, copying no connection struct.
struct Outbox {
    /// The connection's socket (for direct writes of large frames).
    var fd: Int32 = -1
    /// Its place in the selector, for write interest.
    var registration: Registration?
    /// Bytes owed to the peer.
    var queue = OutputQueue()
    /// The connection's state (written only by `ConnectionTable.transition`);
    /// nil for a free slot. Frames are queued only for `.open` and `.draining`.
    var state: ConnectionState?
    /// Gets the JSON form of frames (docs/protocol.md §7).
    var json = false
    /// In the flush list for this iteration.
    var queued = false
    /// Got a frame since the last sweep of idle output buffers.
    var recent = false
    /// In the list of connections holding a drained output buffer.
    var retained = false
    /// When the pending output first went above `output_soft_bytes` (nil: not above).
    var softSinceMs: UInt64?

    /// Bytes queued and not yet written.
    var pending: Int { queue.count }
    /// Relayed frames are queued for it: in use and not closing.
    @inline(__always) var takesFrames: Bool { state == .open || state == .draining }
}

/// The relay's `FrameSink`: a broadcast appends the frame (encoded once;
/// translated once for JSON recipients) to each recipient's output queue
/// and puts the connection on the flush list for the single write at the
/// end of the loop iteration (`Server.flush`). A recipient that would pass
/// the hard output limit is closed, never written to again, and the
/// broadcast goes on for everyone else (docs/protocol.md §6).
///
/// It owns the outboxes and the fan-out bookkeeping. It never changes a
/// connection's state itself: it asks its table (`ConnectionTable.close`).
final class Fanout: FrameSink {
    /// Output state per slot, same indices as `ConnectionTable.slots`.
    var outboxes: [Outbox] = []
    /// Connections with output queued in this iteration.
    var flushList: [Int] = []
    /// A frame not delivered because of its size, for the server to log.
    struct Skip: Equatable {
        enum Kind: Equatable {
            /// Over `output_hard_bytes` on its own (a JSON translation can be
            /// several times its frame): skipped for that recipient, which
            /// is not slow. `address` is the recipient's.
            case overOutputLimit
            /// Its JSON form is over `jsonMaxFrameBytes`: sent to no JSON
            /// client (JSON clients never get more than the daemon accepts
            /// from them). One per frame; `address` is the sender's.
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
    /// The table the outboxes belong to: addresses and closes.
    weak var table: ConnectionTable?

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

    func broadcast(_ frame: UnsafeRawBufferPointer, from sender: Int, to members: [Int], except: Int) -> Int {
        let hard = outputHardBytes
        var translation: [UInt8]?? = nil  // the JSON form, made at most once
        var overHard: [Int] = []
        var failed: [(id: Int, errno: Int32)] = []
        var newlyQueued: [Int] = []
        // Rare paths record into locals: touching the class's properties in
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
            for m in members where m != except && boxes[m].takesFrames {
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
            table?.close(m, "slow consumer: \(outboxes[m].pending) bytes pending, the next frame would exceed "
                         + "output_hard_bytes (\(formatSize(outputHardBytes)))", warning: "output_hard_limit")
        }
        for (m, e) in failed { table?.close(m, SystemError("send", errno: e).description) }
        deliveries &+= UInt64(count)
        return count
    }

    /// What one flush did.
    enum Written {
        /// Everything owed was written.
        case all
        /// The kernel refused the rest: `pending` bytes are still owed.
        case partial(pending: Int)
        /// send(2) failed with this errno.
        case failed(Int32)
    }

    /// Writes what `id` is owed with as few send(2) calls as the kernel
    /// allows (one, when it takes everything), under one exclusive access.
    /// A drained queue keeps a small buffer for the next iteration (no
    /// malloc per broadcast in steady state), and is noted for the sweep.
    func write(_ id: Int, keepCapacity: Int) -> Written {
        let written: Written = outboxes.withUnsafeMutableBufferPointer { boxes in
            boxes[id].queued = false
            let fd = boxes[id].fd
            while boxes[id].pending > 0 {
                let r = boxes[id].queue.withReadableBytes { Sys.send(fd, $0.baseAddress!, $0.count) }
                switch r {
                case .done(let n): boxes[id].queue.consume(n, keepCapacity: keepCapacity)
                case .failed(let e): return .failed(e)
                case .wouldBlock, .endOfFile: return .partial(pending: boxes[id].pending)
                }
            }
            return .all
        }
        if case .all = written { retainDrainedBuffer(id) }
        return written
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

    private func address(of id: Int) -> String { table?.address(of: id) ?? "" }

    /// The JSON form of an LTB frame for JSON clients (nil: none).
    private func translate(_ frame: UnsafeRawBufferPointer, from sender: Int) -> [UInt8]? {
        JSONDialect.translate(frame, settings: relaySettings, senderAddress: address(of: sender))
    }
}
