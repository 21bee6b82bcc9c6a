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
    /// Its input is not read while its own backlog is above
    /// `output_soft_bytes` (backpressure on a sender that does not read,
    /// docs/protocol/rooms.md §6): EPOLLIN is off until the backlog drains
    /// to that size (`Server.pauseInput`; the flush that drains it, `Server.flush`).
    var inputPaused = false
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
