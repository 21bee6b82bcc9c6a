import RoomcastCore
import RoomcastIO

// The fan-out's batch: storing a pass's frames once per form, the recipients' ranges, unicasts (Fanout.swift holds its state and the broadcast).
extension Fanout {
    /// Appends `bytes` to the batch's region of `form`.
    /// - Returns: where they are in that region.
    func store(_ bytes: UnsafeRawBufferPointer, _ form: BatchForm) -> Range<Int> {
        Self.append(bytes, to: &batches[form.rawValue])
    }

    /// Appends to `region` under one access of `batches` (each access of an
    /// Array stored in a class is checked for exclusivity at run time).
    static func append(_ bytes: UnsafeRawBufferPointer, to region: inout OutputQueue) -> Range<Int> {
        let start = region.count
        region.append(bytes)
        return start..<start + bytes.count
    }

    /// The JSON frame of `frame` (the JSON dialect's translation), or nil when
    /// it has none or its body is over `limit` bytes (then `tooLarge` is set
    /// to its size, for the skip the caller logs).
    func jsonFrame(_ frame: UnsafeRawBufferPointer, from sender: Int, limit: Int, tooLarge: inout Int?) -> [UInt8]? {
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
    func storeWebSocketFrame(_ opcode: WebSocketOpcode, _ payload: UnsafeRawBufferPointer, _ form: BatchForm) -> Range<Int> {
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
        noteQueueGrows(m, queued: outboxes[m].queue.count)
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
    func keep(_ box: inout Outbox) {
        let range = box.batchStart..<box.batchEnd
        let region = box.batchForm.rawValue
        batches[region].withReadableBytes { box.queue.append(UnsafeRawBufferPointer(rebasing: $0[range])) }
        box.batchStart = 0
        box.batchEnd = 0
    }

    /// Forgets the batch range of `box` (a recipient being closed: what it
    /// was owed is lost, docs/protocol/rooms.md §6).
    func dropRange(_ box: inout Outbox) {
        box.batchStart = 0
        box.batchEnd = 0
    }


    /// Drops what a recipient over `output_hard_bytes` is owed: all of it,
    /// except for a WebSocket connection the rest of its torn frame, which
    /// stays in its queue (the close frame 1013 may follow only a whole
    /// frame, RFC 6455 §5.4) and which then takes no more relayed frames.
    func dropOverLimit(_ box: inout Outbox) {
        if box.webSocketFramed { keepTornOnly(&box) } else { dropRange(&box) }
    }

    /// Keeps of what `id` is owed only the rest of the frame the kernel took
    /// part of (nothing when none), for a slow WebSocket consumer about to
    /// get its close frame (docs/protocol/websocket.md §15); it takes no more relayed
    /// frames from now on.
    func keepTornOnly(_ id: Int) { keepTornOnly(&outboxes[id]) }

    func keepTornOnly(_ box: inout Outbox) {
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
}
