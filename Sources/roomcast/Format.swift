import Glibc
import RoomcastClient
import RoomcastCore

/// Writes all of `text` to `fd`, retrying EINTR and short writes.
/// - Returns: false if the descriptor is gone (EPIPE and other errors).
@discardableResult
func writeAll(_ fd: Int32, _ text: String) -> Bool {
    var bytes = Array(text.utf8)
    return bytes.withUnsafeMutableBytes { buffer in
        var offset = 0
        while offset < buffer.count {
            let n = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
            if n > 0 { offset += n } else if n < 0 && errno == EINTR { continue } else { return false }
        }
        return true
    }
}

/// `HH:MM:SS` in local time.
func clockTime() -> String {
    var now = time(nil)
    var parts = tm()
    localtime_r(&now, &parts)
    func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
    return "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))"
}

/// A remote string made safe for a terminal: control characters (ESC, CR,
/// newlines, C1) become U+FFFD, so no peer can move the cursor or recolour
/// the screen, and each event stays one line.
func sanitized(_ text: String) -> String {
    var out = String.UnicodeScalarView()
    for scalar in text.unicodeScalars {
        switch scalar.value {
        case 0x09: out.append(" ")
        case 0x00...0x1F, 0x7F...0x9F: out.append("\u{FFFD}")
        default: out.append(scalar)
        }
    }
    return String(out)
}

/// `1.5 s`, `30 s`, `250 ms`.
func seconds(_ ms: UInt64) -> String {
    if ms < 1_000 { return "\(ms) ms" }
    if ms >= 10_000 { return "\((ms + 500) / 1_000) s" }
    let tenths = (ms + 50) / 100
    return "\(tenths / 10).\(tenths % 10) s"
}

/// One readable line for an event, without the time stamp:
/// `alice joined lobby`, `alice: hi`, `bob sent 99 x yacht`.
/// `room` names the listener's room for joins and leaves that carry none.
func describe(_ event: ClientEvent, room: String?) -> String {
    func roomSuffix(_ user: UserInfo) -> String { (user.room ?? room).map { " " + sanitized($0) } ?? "" }
    switch event {
    case .join(let user): return "\(sanitized(user.name)) joined\(roomSuffix(user))"
    case .leave(let user): return "\(sanitized(user.name)) left\(roomSuffix(user))"
    case .text(let message): return "\(sanitized(message.user.name)): \(sanitized(message.text))"
    case .gift(let gift): return "\(sanitized(gift.user.name)) sent \(gift.giftcount) x \(sanitized(gift.giftname))"
    case .notice(let n): return n.isRefusal ? "server notice: " + describe(n) : (informative(n) ?? "server notice: " + describe(n))
    case .opaque(let type, let body): return "frame type \(type), \(body.count) bytes"
    case .malformed(let type, let body, let error): return "malformed frame type \(type), \(body.count) bytes: \(error)"
    }
}

/// A notice as one phrase: `token_invalid: signature does not verify (retry in 2 s)`.
func describe(_ n: Notice) -> String {
    sanitized(n.code) + (n.text.map { ": " + sanitized($0) } ?? "")
        + (n.retryAfterMs.map { " (retry in \(seconds(UInt64(max(0, $0)))))" } ?? "")
}

/// A notice that refuses nothing, as its user should read it
/// (docs/protocol/notices.md): `5 recent lines`, `3 watching`, `7 messages
/// skipped`; nil for a code without a phrase here (shown as a notice).
func informative(_ n: Notice) -> String? {
    func counted(_ one: String, _ many: String) -> String? {
        n.count.map { "\($0) " + ($0 == 1 ? one : many) }
    }
    switch n.code {
    case "history": return counted("recent line", "recent lines")
    case "viewers": return n.count.map { "\($0) watching" }
    case "skipped": return counted("message skipped", "messages skipped")
    case "history_lost": return "recent lines lost: showing the room from here"
    case "position": return n.position.map { "at line \($0.seq) of the room" }
    default: return nil
    }
}

/// A JSON string literal (RoomcastCore's escaping).
func jsonString(_ text: String) -> String { jsonStringLiteral(text) }

private func json(_ user: UserInfo) -> String {
    "{\"name\":\(jsonString(user.name)),\"level\":\(user.level),\"iconURL\":\(jsonString(user.iconURL))"
        + (user.room.map { ",\"room\":\(jsonString($0))" } ?? "") + "}"
}

/// One JSON object (one line) for an event. `room` is the listener's room
/// (`--room`), null for the daemon's default room. Field names follow the
/// proto2 schema (docs/protocol/ltb.md §3); opaque bodies are base64.
func jsonLine(_ event: ClientEvent, room: String?) -> String {
    let head = "\"room\":" + (room.map(jsonString) ?? "null")
    switch event {
    case .join(let user): return "{\"type\":\"join\",\(head),\"user\":\(json(user))}"
    case .leave(let user): return "{\"type\":\"leave\",\(head),\"user\":\(json(user))}"
    case .text(let m): return "{\"type\":\"text\",\(head),\"user\":\(json(m.user)),\"text\":\(jsonString(m.text))}"
    case .gift(let g):
        return "{\"type\":\"gift\",\(head),\"user\":\(json(g.user)),\"giftname\":\(jsonString(g.giftname)),"
            + "\"giftURL\":\(jsonString(g.giftURL)),\"giftcount\":\(g.giftcount)}"
    case .notice(let n):
        return "{\"type\":\"notice\",\(head),\"code\":\(jsonString(n.code))" + (n.text.map { ",\"text\":\(jsonString($0))" } ?? "")
            + (n.retryAfterMs.map { ",\"retry_after_ms\":\($0)" } ?? "") + (n.count.map { ",\"count\":\($0)" } ?? "") + "}"
    case .opaque(let type, let body):
        return "{\"type\":\"opaque\",\(head),\"frame_type\":\(type),\"body_base64\":\"\(base64(body))\"}"
    case .malformed(let type, let body, let error):
        return "{\"type\":\"malformed\",\(head),\"frame_type\":\(type),\"error\":\(jsonString(error.description)),"
            + "\"body_base64\":\"\(base64(body))\"}"
    }
}

/// RFC 4648 base64 with padding.
func base64(_ bytes: [UInt8]) -> String {
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    var out: [UInt8] = []
    out.reserveCapacity((bytes.count + 2) / 3 * 4)
    var i = 0
    while i < bytes.count {
        let b0 = UInt32(bytes[i])
        let b1 = i + 1 < bytes.count ? UInt32(bytes[i + 1]) : 0
        let b2 = i + 2 < bytes.count ? UInt32(bytes[i + 2]) : 0
        let v = b0 << 16 | b1 << 8 | b2
        out.append(alphabet[Int(v >> 18 & 63)])
        out.append(alphabet[Int(v >> 12 & 63)])
        out.append(i + 1 < bytes.count ? alphabet[Int(v >> 6 & 63)] : UInt8(ascii: "="))
        out.append(i + 2 < bytes.count ? alphabet[Int(v & 63)] : UInt8(ascii: "="))
        i += 3
    }
    return String(decoding: out, as: UTF8.self)
}

/// A status line for stderr, or nil for statuses not worth a line.
func describe(_ status: ClientStatus) -> String? {
    switch status {
    case .connecting(let server, let attempt): attempt == 1 ? "connecting to \(server)" : "connecting to \(server) (attempt \(attempt))"
    case .connected(let address): "connected to \(address)"
    case .joined(let user): "joined \(user.room.map(sanitized) ?? "the default room") as \(sanitized(user.name))"
    case .rejoined(let user): "rejoined \(user.room.map(sanitized) ?? "the default room") as \(sanitized(user.name))"
    case .disconnected(let error): "disconnected: \(error)"
    case .reconnecting(let delay, _): "reconnecting in \(seconds(delay))"
    case .closed: nil
    }
}
