import RoomcastCore
import RoomcastIO

// FanoutSteps.swift: the steps of one broadcast (Fanout.broadcast walks
// them by name): shedding picks the recipients, translation gives each JSON
// or WebSocket one its form of the frame (stored in the batch at most once per form), and
// the region step extends or starts the recipient's range of the batch,
// where the hard output limit is judged (docs/protocol/rooms.md §6).
//
// Every step works on a `BroadcastPass` the walk owns and on the outboxes'
// buffer, both passed in: a step that captured the walk's locals, or
// touched the class's properties per recipient, paid dynamic exclusivity
// checks on every delivery (callgrind: 77 -> 108 instructions per delivery).

/// One broadcast's working state: the frame's forms, each stored at most
/// once, and what the walk leaves for after it (closes, skips, the
/// connections newly owed output, the delivery count).
struct BroadcastPass {
    let frame: UnsafeRawBufferPointer
    let sender: Int
    /// `limits.output_hard_bytes`.
    let hard: Int
    let tracksTorn: Bool
    /// `json.max_frame_bytes`.
    let jsonLimit: Int
    /// The LTB form, stored once for everyone.
    let ltb: Range<Int>
    /// The JSON form in the batch (nil: not made yet; .some(nil): no JSON form).
    var json: Range<Int>?? = nil
    /// The JSON frame, translated at most once.
    var translation: [UInt8]?? = nil
    /// A WebSocket text frame of the JSON body, stored at most once.
    var wsText: Range<Int>?? = nil
    /// A WebSocket binary frame of the LTB frame, stored at most once.
    var wsBinary: Range<Int>? = nil
    var overHard: [(id: Int, pending: Int)] = []
    var failed: [(id: Int, errno: Int32)] = []
    var newlyQueued: [Int] = []
    var tooLarge: [(id: Int, bytes: Int)] = []
    var jsonTooLarge: Int?
    /// Frames handed to connections by this broadcast.
    var count = 0
}

extension Fanout {
    /// Shedding (docs/protocol/rooms.md §6): while someone is slow, a text
    /// broadcast leaves out every reader other than its sender whose soft
    /// clock ran `shed_after` (appended to `shed`); a burst that crosses
    /// the soft size for a moment sheds nothing. Any other broadcast gets
    /// `members` back with nothing done per recipient.
    @inline(__always)
    func shedding(_ members: [Int], sender: Int, except: Int, sheds: Bool, _ boxes: UnsafeMutableBufferPointer<Outbox>,
                  shed: inout [Int]) -> [Int] {
        guard sheds else { return members }
        let now = clock(), after = shedAfterMs
        func overLong(_ m: Int) -> Bool { boxes[m].softSinceMs.map { after == 0 || now >= $0 && now - $0 >= after } ?? false }
        for m in members where m != except && m != sender && overLong(m) && boxes[m].takesFrames { shed.append(m) }
        return shed.isEmpty ? members : members.filter { $0 == sender || !overLong($0) }
    }

    /// Translation: the form of the frame a JSON or WebSocket recipient `m`
    /// reads (JSON, a WebSocket binary or text frame, docs/protocol/json.md
    /// and websocket.md), stored in the batch the first time a recipient
    /// needs it; nil when `m` gets none (a JSON form over
    /// `json.max_frame_bytes`, a WebSocket still upgrading or on /echo).
    /// Plain LTB recipients take `pass.ltb` without it (the walk's common case).
    @inline(__always)
    func translatedForm(for m: Int, _ boxes: UnsafeMutableBufferPointer<Outbox>, _ pass: inout BroadcastPass) -> (Range<Int>, BatchForm)? {
        if boxes[m].json {
            if pass.json == nil {
                if pass.translation == nil { pass.translation = .some(jsonFrame(pass.frame, from: pass.sender, limit: pass.jsonLimit, tooLarge: &pass.jsonTooLarge)) }
                pass.json = .some(pass.translation!.map { $0.withUnsafeBytes { self.store($0, .json) } })
            }
            return pass.json!.map { ($0, .json) }
        }
        assert(boxes[m].isWebSocket, "translatedForm for a plain LTB recipient")
        // Server frames are unmasked (RFC 6455 §5.1): the same bytes for every recipient.
        guard let form = boxes[m].webSocketForm else { return nil }
        if form == .ltb {
            if pass.wsBinary == nil { pass.wsBinary = storeWebSocketFrame(.binary, pass.frame, .webSocketBinary) }
            return (pass.wsBinary!, .webSocketBinary)
        }
        if pass.wsText == nil {
            if pass.translation == nil { pass.translation = .some(jsonFrame(pass.frame, from: pass.sender, limit: pass.jsonLimit, tooLarge: &pass.jsonTooLarge)) }
            pass.wsText = .some(pass.translation!.map { j in
                j.withUnsafeBytes { self.storeWebSocketFrame(.text, UnsafeRawBufferPointer(rebasing: $0[JSONFrameCodec.headerSize...]), .webSocketText) }
            })
        }
        return pass.wsText!.map { ($0, .webSocketText) }
    }

    /// The region step: `m` is owed `range` of the batch in `form`. The next
    /// frame of its run extends its range (no work at all); otherwise its
    /// range so far is copied to its queue and a new one starts. The limit
    /// step comes in there: a frame over `output_hard_bytes` is skipped, and
    /// a copy past the limit is sent first (`settle`), which may close `m`.
    @inline(__always)
    func put(_ range: Range<Int>, _ form: BatchForm, to m: Int, _ boxes: UnsafeMutableBufferPointer<Outbox>, _ pass: inout BroadcastPass) {
        guard range.count <= pass.hard else {
            pass.tooLarge.append((m, range.count))
            return
        }
        if boxes[m].batchEnd == range.lowerBound && boxes[m].batchEnd > boxes[m].batchStart {
            assert(boxes[m].batchForm == form, "a connection's form changed while it held a range")
            boxes[m].batchEnd = range.upperBound
        } else {
            if boxes[m].batchEnd > boxes[m].batchStart {
                if boxes[m].pending > pass.hard {
                    switch settle(m, &boxes[m], hard: pass.hard, tracksTorn: pass.tracksTorn) {
                    case .kept: break
                    case .overLimit(let pending): pass.overHard.append((m, pending)); return
                    case .failed(let e): pass.failed.append((m, e)); return
                    }
                } else {
                    keep(&boxes[m])
                }
            }
            boxes[m].batchStart = range.lowerBound
            boxes[m].batchEnd = range.upperBound
            boxes[m].batchForm = form
        }
        pass.count += 1
        boxes[m].recent = true
        if !boxes[m].queued {
            boxes[m].queued = true
            pass.newlyQueued.append(m)
        }
    }

    /// After the walk: the connections newly owed output join the flush
    /// list, skipped frames are reported, recipients over the limit or whose
    /// send failed are closed, shed ones noted, and deliveries counted.
    func finish(_ pass: BroadcastPass, shed: [Int]) {
        flushList.append(contentsOf: pass.newlyQueued)
        for (m, bytes) in pass.tooLarge { skips.append(Skip(kind: .overOutputLimit, address: address(of: m), bytes: bytes)) }
        if let bytes = pass.jsonTooLarge { skips.append(Skip(kind: .overJSONLimit, address: address(of: pass.sender), bytes: bytes)) }
        for (m, pending) in pass.overHard { closeOverLimit(m, pending: pending) }
        for (m, e) in pass.failed { table?.close(m, SystemError("send", errno: e).description) }
        if !shed.isEmpty { noteShed(shed) }
        deliveries &+= UInt64(pass.count)
        if pass.count > 0, pass.frame.count >= FrameCodec.headerSize {
            let k = kindCodes
            deliveredByKind.add(FrameKind.of(frameType(pass.frame), join: k.join, leave: k.leave, heartbeat: k.heartbeat, notice: k.notice), UInt64(pass.count))
        }
    }
}
