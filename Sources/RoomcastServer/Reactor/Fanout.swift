import RoomcastCore
import RoomcastIO

/// The forms a relayed frame takes on the wire, one region of the pass's
/// batch each (`Fanout.batches`): every recipient of a form finds a pass's
/// frames of its room adjacent in its form's region, whatever forms the
/// room's other members take.
enum BatchForm: Int, CaseIterable {
    /// The LTB frame as read (LTB listeners, docs/protocol/ltb.md §2).
    case ltb
    /// Its JSON-dialect frame (docs/protocol/json.md §7).
    case json
    /// A WebSocket binary message of the LTB frame (`roomcast.ltb.v1`, docs/protocol/websocket.md §15).
    case webSocketBinary
    /// A WebSocket text message of the JSON body (`roomcast.json.v1`, docs/protocol/websocket.md §15).
    case webSocketText
}

/// What a broadcast touches of one connection, kept apart from `Connection`
/// in a flat array so that a broadcast is one pass under one exclusive
/// access, copying no connection struct.
struct Outbox {
    /// The connection's socket (for the end-of-pass send).
    var fd: Int32 = -1
    /// Its place in the selector (write interest, deregistration at reap);
    /// nil only between accept and registration.
    var registration: Registration?
    /// Bytes owed to the peer from earlier passes (what the kernel refused),
    /// and frames of this pass that could not stay in the batch. Written
    /// before the batch range. This, after a send was tried, is what the
    /// hard output limit counts (see `Fanout`).
    var queue = OutputQueue()
    /// EPOLLOUT is armed for it (written only by `Server.setWriteInterest`):
    /// the flush that writes its backlog disarms it, a partial flush of a
    /// connection without it arms it. Not `!queue.isEmpty`: a range copied
    /// into the queue during the pass is not a backlog the kernel refused.
    var writeArmed = false
    /// This pass's frames for it: bytes `batchStart..<batchEnd` of the
    /// region of `Fanout.batches` for `batchForm` (none when equal). Reset
    /// by every flush.
    var batchStart = 0
    var batchEnd = 0
    /// The region its range lies in: the form it takes frames in, set with
    /// each new range (a connection's form does not change while it holds one).
    var batchForm = BatchForm.ltb
    /// The connection's state (written only by `ConnectionTable.transition`);
    /// nil for a free slot. Frames are queued only for `.open` and `.draining`.
    var state: ConnectionState?
    /// Gets the JSON form of frames (docs/protocol/json.md §7).
    var json = false
    /// A WebSocket connection: its stream holds HTTP answers, then, once
    /// upgraded, WebSocket frames.
    var isWebSocket = false
    /// An upgraded WebSocket connection: after its first `torn` bytes (the
    /// 101 answer, when queued) its stream is WebSocket frames, whose torn
    /// frame is always kept (a slow consumer gets the rest of its frame
    /// before the close frame 1013, docs/protocol/websocket.md §15).
    var webSocketFramed = false
    /// An upgraded WebSocket connection's subprotocol: it gets each frame as
    /// a text frame of its JSON form (`.json`) or a binary frame of the LTB
    /// frame (`.ltb`), docs/protocol/websocket.md §15; nil: not (yet) taking frames in
    /// a WebSocket form.
    var webSocketForm: WebSocketSubprotocol?
    /// The connection's OpenSSL session (`SSL *`) when it speaks TLS: its
    /// output goes through SSL_write(3) (TLSIO.write); nil: send(2).
    var tls: OpaquePointer?
    /// In the flush list for this iteration.
    var queued = false
    /// Got a frame since the last sweep of idle output buffers.
    var recent = false
    /// In the list of connections holding a drained output buffer.
    var retained = false
    /// When the pending output first went above `output_soft_bytes` (nil: not above).
    var softSinceMs: UInt64?
    /// Bytes at the head of `queue` (then of its batch range) that finish a
    /// frame the kernel took only part of (kept for WebSocket connections,
    /// and for all while `Fanout.tracksTornFrames`: the crash path must
    /// resend them first, LiveStore.swift).
    var torn = 0

    /// Bytes owed and not yet written: its own queue and its range of the batch.
    var pending: Int { queue.count + batchEnd - batchStart }
    /// Relayed frames are queued for it: in use and not closing.
    @inline(__always) var takesFrames: Bool { state == .open || state == .draining }
}

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
/// The hard output limit (docs/protocol/rooms.md §6) counts what a recipient
/// holds of its own after the kernel took what it could: its queue, once
/// this pass's send was tried. Its range of the batch does not count
/// before that send: the batch is stored once for everyone, and a reader
/// that keeps up takes it from there. So a burst read in one pass (a range
/// larger than the limit) cuts nobody who reads; a reader that does not is
/// closed when its own backlog would pass the limit, never written to
/// again, and the broadcast goes on for everyone else. The check is made at
/// the end-of-pass flush (`write`), and in a broadcast only when a range
/// that stops being adjacent would have to be copied past the limit: it is
/// then sent first (`settle`), so a recipient's own memory stays within the
/// limit plus one frame. It owns the outboxes and the batch; it never
/// changes a connection's state itself: it asks its table
/// (`ConnectionTable.close`).
final class Fanout: FrameSink {
    /// Output state per slot, same indices as `ConnectionTable.slots`.
    var outboxes: [Outbox] = []
    /// Every frame relayed in this loop pass, each once per form, one
    /// region per `BatchForm` (indexed by its raw value; see the type's doc).
    private(set) var batches = [OutputQueue](repeating: OutputQueue(), count: BatchForm.allCases.count)
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
    private var retainedList: [Int] = []
    /// The table the outboxes belong to: addresses and closes.
    weak var table: ConnectionTable?

    /// `limits.output_hard_bytes`.
    var outputHardBytes: Int
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
    private var kindCodes: (join: UInt16, leave: UInt16, heartbeat: UInt16, notice: UInt16, little: Bool)
    private static func kindCodes(_ s: RelaySettings) -> (join: UInt16, leave: UInt16, heartbeat: UInt16, notice: UInt16, little: Bool) {
        (s.joinType, s.leaveType, s.heartbeatType, s.noticeType, s.byteOrder == .little)
    }
    /// `json.max_frame_bytes`: the largest JSON body sent to a JSON client, in bytes.
    var jsonMaxFrameBytes = Int.max
    /// The client address of a frame from another daemon (sender -1), set
    /// around its broadcast: the `addr` JSON clients see (`Server.deliverFromCluster`).
    var remoteSenderAddress = ""
    /// Keep `Outbox.torn` (the crash path is on, LiveStore.swift).
    var tracksTornFrames = false
    /// `limits.shed = text` (docs/protocol/rooms.md §6, "Shedding"): text frames
    /// sent by others are not given to a connection whose backlog is above
    /// `output_soft_bytes` (its `softSinceMs` is set, by `write` after its
    /// last send). Read once per broadcast.
    var shedsText = true
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
    private(set) var shedding: [Int: Int] = [:]
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

    func broadcast(_ frame: UnsafeRawBufferPointer, from sender: Int, to members: [Int], except: Int) -> Int {
        let hard = outputHardBytes
        let ltb = store(frame, .ltb)
        var json: Range<Int>?? = nil  // the JSON form in the batch, made at most once
        var translation: [UInt8]?? = nil  // the JSON frame, translated at most once
        var wsText: Range<Int>?? = nil  // a text frame of the JSON body, stored at most once
        var wsBinary: Range<Int>? = nil  // a binary frame of the LTB frame, stored at most once
        let tracksTorn = tracksTornFrames
        var overHard: [(id: Int, pending: Int)] = []
        var failed: [(id: Int, errno: Int32)] = []
        var newlyQueued: [Int] = []
        // Rare paths record into locals: touching the class's properties in
        // the closure costs dynamic exclusivity checks on every delivery.
        var tooLarge: [(id: Int, bytes: Int)] = []
        var jsonTooLarge: Int?
        let jsonLimit = jsonMaxFrameBytes
        var count = 0
        // Shedding (docs/protocol/rooms.md §6): the type is read once per broadcast;
        // only a text broadcast pays a comparison per recipient.
        let sheds = shedsText && someoneSlow && frame.count >= FrameCodec.headerSize && frameType(frame) == FrameKind.textType
        var shed: [Int] = []
        outboxes.withUnsafeMutableBufferPointer { boxes in
            func put(_ range: Range<Int>, _ form: BatchForm, _ m: Int) {
                let n = range.count
                guard n <= hard else {
                    tooLarge.append((m, n))
                    return
                }
                if boxes[m].batchEnd == range.lowerBound && boxes[m].batchEnd > boxes[m].batchStart {
                    assert(boxes[m].batchForm == form, "a connection's form changed while it held a range")
                    boxes[m].batchEnd = range.upperBound  // the next frame of its run: no work at all
                } else {
                    if boxes[m].batchEnd > boxes[m].batchStart {
                        if boxes[m].pending > hard {
                            // A copy past the limit: the kernel takes what it can first.
                            switch self.settle(&boxes[m], hard: hard, tracksTorn: tracksTorn) {
                            case .kept: break
                            case .overLimit(let pending): overHard.append((m, pending)); return
                            case .failed(let e): failed.append((m, e)); return
                            }
                        } else {
                            self.keep(&boxes[m])
                        }
                    }
                    boxes[m].batchStart = range.lowerBound
                    boxes[m].batchEnd = range.upperBound
                    boxes[m].batchForm = form
                }
                count += 1
                boxes[m].recent = true
                if !boxes[m].queued {
                    boxes[m].queued = true
                    newlyQueued.append(m)
                }
            }
            // No nested function for the JSON translation: one that captures
            // these locals made every delivery pay for dynamic exclusivity
            // checks (callgrind: 77 -> 108 instructions per delivery).
            // Shedding: a text broadcast while someone is slow first finds the
            // slow consumers (their soft clock runs) other than its sender and
            // leaves them out: others' texts wait until they catch up. Every
            // other broadcast walks `members` with nothing added per delivery
            // (a check inside this walk cost opaque fan-out 2 instructions
            // per delivery in `make bench-profile`: 88 -> 90).
            var targets = members
            if sheds {
                for m in members where m != except && m != sender && boxes[m].softSinceMs != nil && boxes[m].takesFrames { shed.append(m) }
                if !shed.isEmpty { targets = members.filter { $0 == sender || boxes[$0].softSinceMs == nil } }
            }
            for m in targets where m != except && boxes[m].takesFrames {
                if boxes[m].json {
                    if json == nil {
                        if translation == nil { translation = .some(self.jsonFrame(frame, from: sender, limit: jsonLimit, tooLarge: &jsonTooLarge)) }
                        json = .some(translation!.map { $0.withUnsafeBytes { self.store($0, .json) } })
                    }
                    guard let range = json! else { continue }
                    put(range, .json, m)
                } else if boxes[m].isWebSocket {
                    // Upgrading, or /echo: no room frames. Server frames are
                    // unmasked (RFC 6455 §5.1): the same bytes for every recipient.
                    guard let form = boxes[m].webSocketForm else { continue }
                    if form == .ltb {
                        if wsBinary == nil { wsBinary = self.storeWebSocketFrame(.binary, frame, .webSocketBinary) }
                        put(wsBinary!, .webSocketBinary, m)
                    } else {
                        if wsText == nil {
                            if translation == nil { translation = .some(self.jsonFrame(frame, from: sender, limit: jsonLimit, tooLarge: &jsonTooLarge)) }
                            wsText = .some(translation!.map { j in
                                j.withUnsafeBytes {
                                    self.storeWebSocketFrame(.text, UnsafeRawBufferPointer(rebasing: $0[JSONFrameCodec.headerSize...]), .webSocketText)
                                }
                            })
                        }
                        guard let range = wsText! else { continue }
                        put(range, .webSocketText, m)
                    }
                } else {
                    put(ltb, .ltb, m)
                }
            }
        }
        flushList.append(contentsOf: newlyQueued)
        for (m, bytes) in tooLarge { skips.append(Skip(kind: .overOutputLimit, address: address(of: m), bytes: bytes)) }
        if let bytes = jsonTooLarge { skips.append(Skip(kind: .overJSONLimit, address: address(of: sender), bytes: bytes)) }
        for (m, pending) in overHard { closeOverLimit(m, pending: pending) }
        for (m, e) in failed { table?.close(m, SystemError("send", errno: e).description) }
        if !shed.isEmpty { noteShed(shed) }
        deliveries &+= UInt64(count)
        if count > 0, frame.count >= FrameCodec.headerSize {
            let k = kindCodes
            deliveredByKind.add(FrameKind.of(frameType(frame), join: k.join, leave: k.leave, heartbeat: k.heartbeat, notice: k.notice), UInt64(count))
        }
        return count
    }

    /// The type of an LTB frame (at least a header long) in the relay's byte order.
    @inline(__always)
    private func frameType(_ frame: UnsafeRawBufferPointer) -> UInt16 {
        kindCodes.little ? UInt16(frame[4]) | UInt16(frame[5]) << 8 : UInt16(frame[4]) << 8 | UInt16(frame[5])
    }

    /// Counts a text withheld from each of `ids`, opening an episode for
    /// those not in one (`sheddingStarted`). Once per broadcast that sheds.
    @inline(never)
    private func noteShed(_ ids: [Int]) {
        framesShed &+= UInt64(ids.count)
        for id in ids {
            if let n = shedding[id] {
                shedding[id] = n + 1
            } else {
                shedding[id] = 1
                sheddingStarted.append(SheddingEpisode(id: id, address: address(of: id), count: 1))
            }
        }
    }

    /// Ends the shedding episode of `id` if it has one and its backlog is
    /// no longer above `output_soft_bytes` (`softSinceMs` cleared): it goes
    /// to `sheddingEnded`, for its `skipped` notice. Called where the soft
    /// clock stops (`write`, `Server.checkSoftLimits`).
    func endSheddingIfCaughtUp(_ id: Int) {
        guard !shedding.isEmpty, outboxes[id].softSinceMs == nil, let n = shedding.removeValue(forKey: id) else { return }
        sheddingEnded.append(SheddingEpisode(id: id, address: address(of: id), count: n))
    }

    /// Forgets the shedding episode of a connection that goes away (its slot is freed).
    func forgetShedding(_ id: Int) {
        if !shedding.isEmpty { shedding[id] = nil }
    }

    /// Appends `bytes` to the batch's region of `form`.
    /// - Returns: where they are in that region.
    private func store(_ bytes: UnsafeRawBufferPointer, _ form: BatchForm) -> Range<Int> {
        Self.append(bytes, to: &batches[form.rawValue])
    }

    /// Appends to `region` under one access of `batches` (each access of an
    /// Array stored in a class is checked for exclusivity at run time).
    private static func append(_ bytes: UnsafeRawBufferPointer, to region: inout OutputQueue) -> Range<Int> {
        let start = region.count
        region.append(bytes)
        return start..<start + bytes.count
    }

    /// The JSON frame of `frame` (the JSON dialect's translation), or nil when
    /// it has none or its body is over `limit` bytes (then `tooLarge` is set
    /// to its size, for the skip the caller logs).
    private func jsonFrame(_ frame: UnsafeRawBufferPointer, from sender: Int, limit: Int, tooLarge: inout Int?) -> [UInt8]? {
        guard let j = translate(frame, from: sender) else { return nil }
        guard j.count - JSONFrameCodec.headerSize <= limit else {
            tooLarge = j.count - JSONFrameCodec.headerSize
            return nil
        }
        return j
    }

    /// Appends one final, unmasked WebSocket frame of `payload` to the
    /// batch's region of `form` (RFC 6455 §5.2).
    /// - Returns: where it is in that region.
    private func storeWebSocketFrame(_ opcode: WebSocketOpcode, _ payload: UnsafeRawBufferPointer, _ form: BatchForm) -> Range<Int> {
        var header: [UInt8] = []
        WebSocketFrameEncoder.appendHeader(opcode, payloadLength: payload.count, to: &header)
        let start = header.withUnsafeBytes { Self.append($0, to: &batches[form.rawValue]) }.lowerBound
        return start..<Self.append(payload, to: &batches[form.rawValue]).upperBound
    }

    /// Queues `bytes` for `m` alone (an HTTP answer, a WebSocket control
    /// frame), after what it is already owed: into its own queue (after its
    /// range, moved there first), never into a region of the batch, where it
    /// would come between the frames of that form's other recipients. Never
    /// dropped for the output limits: control frames must get through (the
    /// slow-consumer rules still close a reader that does not read).
    func unicast(_ bytes: [UInt8], to m: Int) {
        guard outboxes[m].takesFrames else { return }
        if outboxes[m].batchEnd > outboxes[m].batchStart { keep(&outboxes[m]) }
        bytes.withUnsafeBytes { outboxes[m].queue.append($0) }
        outboxes[m].recent = true
        if !outboxes[m].queued {
            outboxes[m].queued = true
            flushList.append(m)
        }
    }

    /// Moves the batch range of `box` into its own queue (a copy), for when
    /// its frames stop being adjacent or the kernel refused them.
    @inline(never)
    private func keep(_ box: inout Outbox) {
        let range = box.batchStart..<box.batchEnd
        let region = box.batchForm.rawValue
        batches[region].withReadableBytes { box.queue.append(UnsafeRawBufferPointer(rebasing: $0[range])) }
        box.batchStart = 0
        box.batchEnd = 0
    }

    /// Forgets the batch range of `box` (a recipient being closed: what it
    /// was owed is lost, docs/protocol/rooms.md §6).
    private func dropRange(_ box: inout Outbox) {
        box.batchStart = 0
        box.batchEnd = 0
    }

    /// What `settle` did.
    private enum Settled {
        /// What the kernel refused is in the queue, within the limit.
        case kept
        /// Its own backlog, after the kernel took what it could, is over the
        /// limit: `pending` bytes; its range was dropped.
        case overLimit(pending: Int)
        /// send(2) failed; its range was dropped.
        case failed(Int32)
    }

    /// Drops what a recipient over `output_hard_bytes` is owed: all of it,
    /// except for a WebSocket connection the rest of its torn frame, which
    /// stays in its queue (the close frame 1013 may follow only a whole
    /// frame, RFC 6455 §5.4) and which then takes no more relayed frames.
    private func dropOverLimit(_ box: inout Outbox) {
        if box.webSocketFramed { keepTornOnly(&box) } else { dropRange(&box) }
    }

    /// Keeps of what `id` is owed only the rest of the frame the kernel took
    /// part of (nothing when none), for a slow WebSocket consumer about to
    /// get its close frame (docs/protocol/websocket.md §15); it takes no more relayed
    /// frames from now on.
    func keepTornOnly(_ id: Int) { keepTornOnly(&outboxes[id]) }

    private func keepTornOnly(_ box: inout Outbox) {
        let queued = box.queue.count
        let torn = min(box.torn, box.pending)
        if torn <= queued {
            box.queue.truncate(to: torn)
        } else {
            // The kernel took the whole backlog and part of a frame of the batch range.
            let range = box.batchStart..<box.batchStart + torn - queued
            let region = box.batchForm.rawValue
            batches[region].withReadableBytes { box.queue.append(UnsafeRawBufferPointer(rebasing: $0[range])) }
        }
        box.torn = torn
        dropRange(&box)
        box.webSocketForm = nil
        box.softSinceMs = nil
    }

    /// A range that stopped being adjacent would take the queue past the
    /// hard limit if it were copied: the kernel takes what it can of queue
    /// and range first (this pass's write attempt, made early), and only
    /// the rest is copied. Rare: only a recipient whose pass holds more than
    /// the limit and whose frames are not adjacent (JSON, several rooms).
    @inline(never)
    private func settle(_ box: inout Outbox, hard: Int, tracksTorn: Bool) -> Settled {
        let before = box.pending
        defer { bytesOut &+= UInt64(before - box.pending) }  // rare: the class property is fine here
        switch send(&box, keepCapacity: .max, tracksTorn: tracksTorn) {
        case .all:
            return .kept
        case .failed(let e):
            dropRange(&box)
            return .failed(e)
        case .blocked:
            let pending = box.pending
            if pending > hard {
                dropOverLimit(&box)
                return .overLimit(pending: pending)
            }
            if box.batchEnd > box.batchStart { keep(&box) }
            return .kept
        }
    }

    /// How a send of what a recipient is owed ended.
    private enum Sent { case all, blocked, failed(Int32) }

    /// Sends what `box` is owed (its queue, then its batch range) with as
    /// few send(2) calls as the kernel allows (one, when it takes
    /// everything). Consumes what was written; copies nothing.
    @inline(__always)
    private func send(_ box: inout Outbox, keepCapacity: Int, tracksTorn: Bool) -> Sent {
        let fd = box.fd
        let tls = box.tls
        while box.pending > 0 {
            let queued = box.queue.count
            let range = box.batchStart..<box.batchEnd
            let region = box.batchForm.rawValue
            let r = box.queue.withReadableBytes { q in
                batches[region].withReadableBytes { b in
                    let second = UnsafeRawBufferPointer(rebasing: b[range])
                    // TLS: one SSL_write of the backlog, else of the pass's whole range
                    // (one encryption per recipient per pass, records up to 16 KiB).
                    guard let tls else { return Sys.send(fd, q, second) }
                    return TLSIO.write(tls, q.isEmpty ? second : q)
                }
            }
            switch r {
            case .done(let n):
                if tracksTorn && !box.isWebSocket || box.webSocketFramed { box.torn = n >= queued + range.count ? 0 : torn(after: n, of: box, range) }
                box.queue.consume(min(n, queued), keepCapacity: keepCapacity)
                box.batchStart += max(0, n - queued)
                if box.batchStart == box.batchEnd { (box.batchStart, box.batchEnd) = (0, 0) }
            case .failed(let e):
                return .failed(e)
            case .wouldBlock, .endOfFile:
                return .blocked
            }
        }
        return .all
    }

    /// Closes `id`, whose own backlog passed `output_hard_bytes`, with the
    /// warning the operator sees (docs/protocol/rooms.md §6).
    private func closeOverLimit(_ id: Int, pending: Int) {
        if outboxes[id].webSocketFramed {
            slowWebSockets.append((id, pending))  // its close frame is queued by the server
            return
        }
        table?.close(id, overLimitText(pending: pending), warning: "output_hard_limit")
    }

    /// Why a connection with `pending` bytes of its own backlog is closed
    /// for `output_hard_bytes` (docs/protocol/rooms.md §6).
    func overLimitText(pending: Int) -> String {
        "slow consumer: \(pending) bytes pending after the kernel took what it could, over "
            + "output_hard_bytes (\(formatSize(outputHardBytes)))"
    }

    /// The end of a loop pass: every recipient was flushed (or closed), so
    /// no range points into the batch any more; it is emptied.
    func endPass() {
        assert(outboxes.allSatisfy { $0.batchStart == $0.batchEnd }, "a batch range outlived its pass")
        for i in batches.indices where batches[i].capacity > 0 {
            batches[i].consume(batches[i].count, keepCapacity: Self.retainedBatchBytes)
        }
    }

    /// What one flush did.
    enum Written: Equatable {
        /// Nothing to do: nothing owed, or the connection is closing or gone.
        case nothing
        /// Everything owed was written. `hadBacklog`: its queue held bytes
        /// refused in an earlier pass, so EPOLLOUT was armed for it (it is
        /// armed exactly while the queue holds a backlog).
        case all(hadBacklog: Bool, draining: Bool)
        /// The kernel refused the rest: `pending` bytes are now in its queue.
        /// `becameSlow`: the pending output just went above `softBytes`.
        case partial(pending: Int, hadBacklog: Bool, becameSlow: Bool)
        /// The kernel refused the rest, and the `pending` bytes that are the
        /// connection's own backlog now are over `output_hard_bytes`: it is
        /// being closed (`ConnectionTable.close`); nothing was copied.
        case overLimit(pending: Int)
        /// send(2) failed with this errno.
        case failed(Int32)
    }

    /// Writes what `id` is owed (its queue, then its batch range) with as
    /// few send(2) calls as the kernel allows (one, when it takes
    /// everything), under one exclusive access. What the kernel refuses of
    /// the batch range is copied into the queue. A drained queue keeps up to
    /// `keepCapacity` bytes of buffer for the next pass, and is noted for
    /// the sweep. The slow-consumer clock (`softSinceMs`) starts when the
    /// pending output goes above `softBytes` and stops when it is below.
    /// When what the kernel refused is more than `output_hard_bytes`, the
    /// connection is closed instead (`.overLimit`) and nothing is copied:
    /// docs/protocol/rooms.md §6 counts its own backlog after this send, never
    /// the pass's range before it.
    func write(_ id: Int, keepCapacity: Int, softBytes: Int = .max, nowMs: UInt64 = 0) -> Written {
        var retain = false
        let tracksTorn = tracksTornFrames
        let hard = outputHardBytes
        var sent = 0  // bytes the kernel took, added to `bytesOut` once, after the closure
        var wasSlow = false  // above the soft limit before this send: a shedding episode may end
        let written: Written = outboxes.withUnsafeMutableBufferPointer { boxes in
            boxes[id].queued = false
            guard let state = boxes[id].state, state != .closing, boxes[id].pending > 0 else { return .nothing }
            wasSlow = boxes[id].softSinceMs != nil
            let hadBacklog = boxes[id].writeArmed
            let before = boxes[id].pending
            let result = self.send(&boxes[id], keepCapacity: keepCapacity, tracksTorn: tracksTorn)
            sent = before - boxes[id].pending
            switch result {
            case .failed(let e):
                self.dropRange(&boxes[id])
                return .failed(e)
            case .blocked:
                // The hard limit counts what is left of its own, not what the pass held.
                let pending = boxes[id].pending
                if pending > hard {
                    self.dropOverLimit(&boxes[id])
                    return .overLimit(pending: pending)
                }
                if boxes[id].batchEnd > boxes[id].batchStart { self.keep(&boxes[id]) }
                var becameSlow = false
                if pending <= softBytes {
                    boxes[id].softSinceMs = nil
                } else if boxes[id].softSinceMs == nil {
                    boxes[id].softSinceMs = nowMs
                    becameSlow = true
                }
                return .partial(pending: pending, hadBacklog: hadBacklog, becameSlow: becameSlow)
            case .all:
                boxes[id].softSinceMs = nil
                retain = boxes[id].queue.capacity > 0 && !boxes[id].retained
                return .all(hadBacklog: hadBacklog, draining: state == .draining)
            }
        }
        bytesOut &+= UInt64(sent)
        if retain { retainDrainedBuffer(id) }
        switch written {
        case .overLimit(let pending): closeOverLimit(id, pending: pending)
        case .all, .partial: if wasSlow { endSheddingIfCaughtUp(id) }  // a flush that keeps up touches no dictionary
        case .nothing, .failed: break
        }
        return written
    }

    /// Where the frame that byte `n` of a write falls in ends, relative to
    /// `n`: the bytes of a partly written frame still to send. The write was
    /// the queue (whose first `box.torn` bytes end a frame, and which ends
    /// at a frame boundary), then `range` of the batch (whole frames).
    /// Walks the headers of what was written: only after a partial write.
    @inline(never)
    private func torn(after n: Int, of box: Outbox, _ range: Range<Int>) -> Int {
        if box.webSocketFramed {
            // The server's WebSocket frames (unmasked, RFC 6455 §5.2): 2
            // bytes, then a 16-bit or 64-bit big-endian length when the
            // 7-bit one is 126 or 127.
            return walkFrames(after: n, of: box, range) { at in
                guard at.count >= 2 else { return nil }
                let short = Int(at[1] & 0x7f)
                guard at.count >= (short == 127 ? 10 : short == 126 ? 4 : 2) else { return nil }
                switch short {
                case 126: return 4 + (Int(at[2]) << 8 | Int(at[3]))
                case 127: return 10 + Int(UInt64(bigEndian: at.loadUnaligned(fromByteOffset: 2, as: UInt64.self)))
                default: return 2 + short
                }
            }
        }
        let header = box.json ? JSONFrameCodec.headerSize : FrameCodec.headerSize
        let order = box.json ? ByteOrder.little : relaySettings.byteOrder
        return walkFrames(after: n, of: box, range) { at in
            let raw = at.loadUnaligned(as: UInt32.self)
            return header + Int(order == .little ? UInt32(littleEndian: raw) : UInt32(bigEndian: raw))
        }
    }

    /// Walks the frames of `box`'s queue, then of `range` of its batch, from
    /// `box.torn` until past `n` written bytes; `frameBytes` gives the size
    /// of the frame starting at a position (nil: bytes that are not a whole
    /// header, never expected: the walk ends, nothing is torn).
    /// - Returns: the bytes of the frame at `n` still owed.
    private func walkFrames(after n: Int, of box: Outbox, _ range: Range<Int>,
                            _ frameBytes: (UnsafeRawBufferPointer) -> Int?) -> Int {
        let region = box.batchForm.rawValue
        return box.queue.withReadableBytes { q in
            batches[region].withReadableBytes { b in
                var p = box.torn
                while p < n {
                    let at = p < q.count ? UnsafeRawBufferPointer(rebasing: q[p...])
                                         : UnsafeRawBufferPointer(rebasing: b[(range.lowerBound + p - q.count)...])
                    guard let size = frameBytes(at) else { return 0 }
                    p += size
                }
                return p - n
            }
        }
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

    private func address(of id: Int) -> String { id < 0 ? remoteSenderAddress : table?.address(of: id) ?? "" }

    /// The JSON form of an LTB frame for JSON clients (nil: none).
    private func translate(_ frame: UnsafeRawBufferPointer, from sender: Int) -> [UInt8]? {
        JSONDialect.translate(frame, settings: relaySettings, senderAddress: address(of: sender))
    }
}
