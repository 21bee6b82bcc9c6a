import RoomcastCore
import RoomcastIO

/// The relay's `FrameSink`, built around one shared batch per loop pass
/// (as the fastest relays do: uWebSockets' pub/sub, a minimal C relay):
///
/// - A broadcast stores the frame ONCE, at the end of the batch's LTB
///   region (and each other form once, at the end of that form's region,
///   when a recipient takes it: JSON, WebSocket binary, WebSocket text), and
///   gives each recipient a byte range of its form's region: frames that
///   follow each other in a region extend the range, so a room's members
///   hold one range for all of the pass's frames of their room, whatever
///   forms the other members take, and nothing is copied per recipient.
/// - At the end of the pass (`Server.flush`) each recipient gets one
///   send(2) of its range (a gather write after its backlog, if it has
///   one). Only what the kernel refuses is copied, into that recipient's
///   own `queue`; then the batch is emptied for the next pass.
/// - A recipient whose next frame is not adjacent to its range (another
///   room's frames came between in its form's region) has its range copied
///   into its queue first, so order is kept. Bytes for one connection
///   alone (`unicast`) go to its queue, so they never come between the
///   frames of a region.
///
/// The hard output limit (docs/protocol/rooms.md §6) counts, after a send
/// was tried, what a recipient owed from before this pass and the kernel
/// still did not take (`carried`, `unsentFromBefore`); this pass's frames
/// never count, neither its range of the batch (stored once for everyone)
/// nor the copy of what the kernel refused of it. Passes follow each other
/// within microseconds while a burst arrives, before a reader that keeps
/// up is even scheduled: counting the pass's frames cut such readers (100
/// x 8 KiB with output_hard_bytes = 512K cut a reader or the sender's echo
/// in 1 of 2 runs, LeaveDuringBurstTests). A reader that does not read is
/// closed at the first send that leaves more than the limit of its older
/// backlog, never written to again, and the broadcast goes on for everyone
/// else. The check is made at the end-of-pass flush (`write`), and in a
/// broadcast only when a range that stops being adjacent would have to be
/// copied past the limit: it is then sent first (`settle`), so a
/// recipient's own memory stays within the limit plus one pass's frames.
/// It owns the outboxes and the batch; it never
/// changes a connection's state itself: it asks its table
/// (`ConnectionTable.close`).
final class Fanout: FrameSink {
    /// Output state per slot, same indices as `ConnectionTable.slots`.
    var outboxes: [Outbox] = []
    /// Every frame relayed in this loop pass, each once per form, one
    /// region per `BatchForm` (indexed by its raw value; see the type's doc).
    var batches = [OutputQueue](repeating: OutputQueue(), count: BatchForm.allCases.count)
    /// The region of `form`.
    func batch(_ form: BatchForm) -> OutputQueue { batches[form.rawValue] }
    /// Capacity kept by each region from one pass to the next, in bytes (a
    /// larger one, after a burst of large frames, is given back).
    static let retainedBatchBytes = 4 << 20
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
    var retainedList: [Int] = []
    /// The table the outboxes belong to: addresses and closes.
    weak var table: ConnectionTable?

    /// `limits.output_hard_bytes`.
    var outputHardBytes: Int
    /// For each connection whose queue this loop pass added to or sent from
    /// while it held a backlog: the bytes of that queue it owed from before
    /// this pass and the kernel has not taken yet, which is what the hard
    /// limit counts (`unsentFromBefore`). Emptied by `endPass`; touched only
    /// by partial sends and copies into a queue, never per delivery.
    var carried: [Int: Int] = [:]
    /// Frames handed to connections (the "out" figure of STATUS).
    var deliveries: UInt64 = 0
    /// The same, by kind (GET /metrics): one add per broadcast, not per recipient.
    var deliveredByKind = FrameKindCounts()
    /// Bytes the kernel (or OpenSSL) took for clients. (Kept in each Outbox
    /// instead, the wider Outbox cost the broadcast 13 instructions per
    /// delivery in `make bench-profile`; this costs about 6.)
    var bytesOut: UInt64 = 0
    /// The relay's rules, to translate frames for JSON clients.
    var relaySettings: RelaySettings { didSet { kindCodes = Self.kindCodes(relaySettings) } }
    /// The control codes and byte order of `relaySettings`, for `deliveredByKind`
    /// without copying the settings (and their strings) on every broadcast.
    var kindCodes: (join: UInt16, leave: UInt16, heartbeat: UInt16, notice: UInt16, little: Bool)
    static func kindCodes(_ s: RelaySettings) -> (join: UInt16, leave: UInt16, heartbeat: UInt16, notice: UInt16, little: Bool) {
        (s.joinType, s.leaveType, s.heartbeatType, s.noticeType, s.byteOrder == .little)
    }
    /// `json.max_frame_bytes`: the largest JSON body sent to a JSON client, in bytes.
    var jsonMaxFrameBytes = Int.max
    /// The client address of the frame from another daemon (sender -1)
    /// being broadcast, the `addr` JSON clients see: set by
    /// `broadcast(_:fromRemote:to:)` for the length of its call, "" otherwise.
    var remoteSenderAddress = ""
    /// Keep `Outbox.torn` (the crash path is on, LiveStore.swift).
    var tracksTornFrames = false
    /// `limits.shed = text` (docs/protocol/rooms.md §6, "Shedding"): text frames
    /// sent by others are not given to a connection whose backlog is above
    /// `output_soft_bytes` (its `softSinceMs` is set, by `write` after its
    /// last send). Read once per broadcast.
    var shedsText = true
    /// `limits.shed_after`, in ms: a connection's texts are shed only once
    /// its soft clock (`softSinceMs`) has run this long (0: at once).
    var shedAfterMs: UInt64 = 0
    /// The loop's clock, in ms (the server's), read only by a text
    /// broadcast while someone is slow: whether a soft clock ran `shedAfterMs`.
    var clock: () -> UInt64 = { 0 }
    /// Set around a `replay` (recent lines on join, missed lines on resume):
    /// a replay is never shed (docs/protocol.md §6), it counts toward the
    /// hard limit as any output.
    var replaying = false
    /// Whether some connection may be above `output_soft_bytes`: the server
    /// sets it when one joins `OutputWatch.overSoft` and clears it when that
    /// list empties (every connection whose soft clock runs is in it). A text
    /// broadcast looks for slow consumers only then: no cost per delivery
    /// while everyone keeps up (`make bench-history`: 71.5 -> 67 instructions).
    var someoneSlow = false
    /// Text frames withheld from each connection in its shedding episode,
    /// by id: only connections in one (a dictionary touched per broadcast
    /// that sheds, and per flush only while an episode is open, never per
    /// delivery). An episode opens with its first text withheld and ends
    /// when the connection's backlog is back at or under `output_soft_bytes`.
    var shedding: [Int: Int] = [:]
    /// A shedding episode that started or ended, for the server to log and,
    /// at its end, to tell the client with the notice `skipped`.
    struct SheddingEpisode: Equatable {
        var id: Int
        /// Taken when it happens: the slot may be reused before it is logged.
        var address: String
        /// Texts withheld in the episode so far: 1 at its start.
        var count: Int
    }
    /// Episodes opened since the server last took them (`Server.reportShedding`).
    var sheddingStarted: [SheddingEpisode] = []
    /// Episodes ended since the server last took them: their `skipped` notices are still to be queued.
    var sheddingEnded: [SheddingEpisode] = []
    /// Episodes are waiting to be logged (and told, for those that ended).
    var hasSheddingReports: Bool { !sheddingStarted.isEmpty || !sheddingEnded.isEmpty }
    /// Text frames withheld from slow consumers (`roomcast_frames_shed_total`).
    var framesShed: UInt64 = 0
    /// Upgraded WebSocket connections whose own backlog passed
    /// `output_hard_bytes` in this pass, with that backlog in bytes: their
    /// queue holds only the rest of their torn frame now, and the server
    /// queues the close frame 1013 and drains them (docs/protocol/websocket.md §15)
    /// before the next flush of the pass (`Server.reapAndFlush`).
    var slowWebSockets: [(id: Int, pending: Int)] = []

    init(outputHardBytes: Int, relaySettings: RelaySettings) {
        self.outputHardBytes = outputHardBytes
        self.relaySettings = relaySettings
        self.kindCodes = Self.kindCodes(relaySettings)
    }

    /// The queues and the batch are manually managed memory: a fan-out that
    /// goes away (a `Server` made by a test, say) frees them.
    deinit {
        for i in batches.indices { batches[i].release() }
        for i in outboxes.indices { outboxes[i].queue.release() }
    }

    /// A frame another daemon relayed (`FrameSink`): broadcast as one of
    /// no sender here, JSON members shown `address` as its `addr`.
    func broadcast(_ frame: UnsafeRawBufferPointer, fromRemote address: String, to members: [Int]) -> Int {
        remoteSenderAddress = address
        defer { remoteSenderAddress = "" }
        return broadcast(frame, from: -1, to: members, except: -1)
    }

    /// The broadcast (FrameSink): the steps of FanoutSteps.swift by name.
    /// Each recipient not shed and taking frames gets its form of the
    /// frame (translation) put into its range of the batch (region, where
    /// the hard limit is judged); what the walk found is acted on after it.
    func broadcast(_ frame: UnsafeRawBufferPointer, from sender: Int, to members: [Int], except: Int) -> Int {
        var pass = BroadcastPass(frame: frame, sender: sender, hard: outputHardBytes, tracksTorn: tracksTornFrames,
                                 jsonLimit: jsonMaxFrameBytes, ltb: store(frame, .ltb))
        // The type is read once per broadcast; only a text broadcast while
        // someone is slow pays for shedding.
        let sheds = shedsText && someoneSlow && !replaying && frame.count >= FrameCodec.headerSize && frameType(frame) == FrameKind.textType
        var shed: [Int] = []
        outboxes.withUnsafeMutableBufferPointer { boxes in
            for m in shedding(members, sender: sender, except: except, sheds: sheds, boxes, shed: &shed) where m != except && boxes[m].takesFrames {
                if !boxes[m].json && !boxes[m].isWebSocket {
                    put(pass.ltb, .ltb, to: m, boxes, &pass)  // the common case: the LTB form, no translation
                } else if let (range, form) = translatedForm(for: m, boxes, &pass) {
                    put(range, form, to: m, boxes, &pass)
                }
            }
        }
        finish(pass, shed: shed)
        return pass.count
    }

    /// A replay to `member` alone (its room's recent lines on join, its
    /// missed lines on resume, and their notices): never shed, counted
    /// toward the hard limit as any output (docs/protocol.md §6).
    func replay(_ frame: UnsafeRawBufferPointer, to member: Int) -> Int {
        replaying = true
        defer { replaying = false }
        return broadcast(frame, from: -1, to: [member], except: -1)
    }
}
