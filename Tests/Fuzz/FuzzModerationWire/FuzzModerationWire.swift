// libFuzzer target: the moderation wire text (ModerationWire.swift,
// docs/api.md "Across the cluster") that a daemon reads from Redis, both
// the control channel's messages and the moderation hash's fields and
// values. Whatever the bytes, decoding never traps; what it accepts
// re-encodes to text that decodes to the same record (so every daemon that
// passes it on agrees on it), and stays within the bounds the API itself
// writes: slow mode 0 or 3 ... 120 s, times not before the epoch, a reason
// of at most 512 bytes, a sub of at most 1024. The daemon's arithmetic
// (retry_after_ms, the expiry wheel, slow mode's interval in ms) relies on
// them. Input: the whole as a control message, and split at its first
// newline as a hash field and value. Build and run: `make fuzz`.
import RoomcastCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzModerationWire(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: data == nil ? 0 : size))
    if let message = ControlMessage(bytes) {
        let again = ControlMessage(message.encoded)
        precondition(again == message, "a control message does not survive its own encoding")
        switch message.operation {
        case .set(let record): check(record)
        case .kick(let room, _, let value):
            precondition(!room.bytes.isEmpty && !value.isEmpty, "a kick without a room or a value")
        }
    }
    let newline = bytes.firstIndex(of: 0x0A) ?? bytes.count
    let field = bytes[..<newline], value = bytes[min(newline + 1, bytes.count)...]
    if let record = ModerationRecord(field: field, value: value) {
        check(record)
        precondition(ModerationField(field) != nil, "a record whose field alone is not one")
    }
    return 0
}

/// A decoded record: within the API's bounds, and its text decodes to itself.
private func check(_ record: ModerationRecord) {
    precondition(ModerationRecord(field: Array(record.field.utf8), value: Array(record.value.utf8)) == record,
                 "a record does not survive its own encoding")
    precondition(record.setMs >= 0 && (record.untilMs ?? 0) >= 0, "a time before the epoch")
    switch record {
    case .settings(let room, let seconds, _):
        precondition(!room.bytes.isEmpty, "settings of no room")
        precondition(seconds == 0 || (3...120).contains(seconds), "slow mode of \(seconds) s, outside 0 or 3 ... 120")
    case .entry(let key, _, _, let reason):
        precondition(!key.sub.isEmpty && key.sub.count <= 1024, "a sub of \(key.sub.count) bytes")
        precondition(reason.utf8.count <= 512 * 3, "a reason of \(reason.utf8.count) bytes")
    case .removed(let key, _, _):
        precondition(!key.sub.isEmpty && key.sub.count <= 1024, "a sub of \(key.sub.count) bytes")
    }
}
