import RoomcastCore

// APIWire.swift: what `--api-port` puts on the wire and reads back
// (docs/api.md): POST /v1/rooms/{room}/publish requests whose JSON text
// carries the publisher, sequence and send time where members look for
// them, and the HTTP/1.1 answers (RFC 9112) the daemon sends back.

/// One API connection's publish request, built once and stamped in place:
/// the 16 hex digits of the sequence and of the CLOCK_MONOTONIC send time in
/// the JSON `text`, and (`--idempotency`) the sequence again in the
/// `Idempotency-Key` header, beside the run's random id and the publisher, so
/// that no two requests share a key, not even those of two runs against one
/// daemon within 5 minutes (a repeated key is not relayed again, docs/api.md).
///
/// The JSON is `{"type": "text", "user": {"name": "p", "level": 1, "icon": ""},
/// "text": T}` with T the text of `Wire.bodyTemplate`: the daemon makes it the
/// same `ChatMessage` (type 2, `--size` bytes) an LTB publisher sends, so
/// members parse both alike and the two figures compare like with like.
struct APIPublishRequest {
    /// The whole request: request line, headers, body.
    let bytes: [UInt8]
    /// Offset in `bytes` of the 16 hex digits of the sequence in the text.
    let sequenceAt: Int
    /// Offset in `bytes` of the 16 hex digits of the send time in the text.
    let timeAt: Int
    /// Offset in `bytes` of the 16 hex digits of the sequence in `Idempotency-Key`; nil without it.
    let keySequenceAt: Int?

    /// - Parameters: `wire` (text bodies only), the publisher's index, the
    ///   room, the bearer key (api.key_file), whether to send `Idempotency-Key`,
    ///   and the run's id (random: the keys' part that differs between runs).
    init(wire: Wire, publisher: Int, room: String, key: String, idempotency: Bool, run: UInt64) {
        precondition(wire.body == .text, "API publishes carry text bodies")
        let body = wire.bodyTemplate(publisher: publisher)
        let message = try! ChatMessage(protobuf: body)
        let json = Array("{\"type\": \"text\", \"user\": {\"name\": \"\(message.user.name)\", \"level\": \(message.user.level), \"icon\": \"\"}, \"text\": \"".utf8)
        let textAt = json.count
        let bodyBytes = json + Array(message.text.utf8) + Array("\"}".utf8)
        var head = "POST /v1/rooms/\(percentEncodedSegment(room))/publish HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head += "Authorization: Bearer \(key)\r\nContent-Type: application/json\r\n"
        var keyAt: Int?
        if idempotency {
            let prefix = "Idempotency-Key: bench-\(hex(run, digits: 16))-\(hex(UInt64(publisher), digits: 8))-"
            keyAt = head.utf8.count + prefix.utf8.count
            head += prefix + String(repeating: "0", count: 16) + "\r\n"
        }
        head += "Content-Length: \(bodyBytes.count)\r\n\r\n"
        let headBytes = Array(head.utf8)
        bytes = headBytes + bodyBytes
        // The text starts with 8 hex digits of the publisher, then the sequence, then the time (Wire).
        sequenceAt = headBytes.count + textAt + 8
        timeAt = sequenceAt + 16
        keySequenceAt = keyAt
    }
}

/// A room name as one path segment: RFC 3986 §2.3 unreserved bytes as they
/// are, every other byte percent-encoded (§2.1), as the API decodes it.
func percentEncodedSegment(_ s: String) -> String {
    let digits = Array("0123456789ABCDEF".utf8)
    var out: [UInt8] = []
    for b in s.utf8 {
        let unreserved = (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || (b >= 0x30 && b <= 0x39)
            || b == 0x2D || b == 0x2E || b == 0x5F || b == 0x7E
        if unreserved { out.append(b) } else { out += [0x25, digits[Int(b >> 4)], digits[Int(b & 15)]] }
    }
    return String(decoding: out, as: UTF8.self)
}

/// One HTTP/1.1 answer at the start of a buffer (RFC 9112 §4, §6.3: the
/// daemon frames every body by `Content-Length`).
enum HTTPAnswer: Equatable {
    /// Not all of it yet: read more.
    case incomplete
    /// Status, where the body starts and its length, and the bytes the whole answer takes.
    case answer(status: Int, bodyAt: Int, bodyLength: Int, end: Int)
    /// Not an answer this client can read (what was wrong).
    case malformed(String)

    /// Longest head (status line and headers) accepted, bytes.
    static let maxHead = 8192

    /// Parses the answer at the start of `buf`.
    static func parse(_ buf: UnsafeRawBufferPointer) -> HTTPAnswer {
        let n = buf.count
        var end = -1
        var i = 0
        while i + 3 < n {
            if buf[i] == 13 && buf[i + 1] == 10 && buf[i + 2] == 13 && buf[i + 3] == 10 { end = i; break }
            i += 1
        }
        guard end >= 0 else { return n > maxHead ? .malformed("no end of the head in \(maxHead) bytes") : .incomplete }
        // "HTTP/1.1 200 OK": the version, a space, three digits.
        guard end >= 12, buf[0] == 0x48, buf[1] == 0x54, buf[2] == 0x54, buf[3] == 0x50, buf[4] == 0x2F, buf[8] == 0x20,
              (9..<12).allSatisfy({ buf[$0] >= 0x30 && buf[$0] <= 0x39 }) else {
            return .malformed("not an HTTP status line: \(String(decoding: buf[0..<min(end, 40)], as: UTF8.self))")
        }
        let status = (Int(buf[9]) - 48) * 100 + (Int(buf[10]) - 48) * 10 + Int(buf[11]) - 48
        var length: Int?
        var lineStart = 0
        while lineStart < end {
            var lineEnd = lineStart
            while lineEnd < end && !(buf[lineEnd] == 13 && buf[lineEnd + 1] == 10) { lineEnd += 1 }
            let line = buf[lineStart..<lineEnd]
            let name = "content-length:"
            if line.count > name.utf8.count,
               zip(line.prefix(name.utf8.count), name.utf8).allSatisfy({ ($0 | 0x20) == $1 || $0 == $1 }) {
                let value = String(decoding: line.dropFirst(name.utf8.count), as: UTF8.self).filter { $0 != " " && $0 != "\t" }
                guard let v = Int(value), v >= 0 else { return .malformed("bad Content-Length '\(value)'") }
                length = v
            }
            lineStart = lineEnd + 2
        }
        // 1xx, 204 and 304 have no body (RFC 9112 §6.3).
        let bodyless = status / 100 == 1 || status == 204 || status == 304
        guard let length = length ?? (bodyless ? 0 : nil) else { return .malformed("an answer without Content-Length") }
        let bodyAt = end + 4
        guard n - bodyAt >= length else { return .incomplete }
        return .answer(status: status, bodyAt: bodyAt, bodyLength: length, end: bodyAt + length)
    }
}

/// N of a publish's answer `{"delivered": N}` (docs/api.md); nil when the
/// body is not that.
func deliveredCount(_ body: UnsafeRawBufferPointer) -> Int? {
    let key = Array("\"delivered\":".utf8)
    guard body.count > key.count else { return nil }
    var at = -1
    for i in 0...(body.count - key.count) where body[i] == key[0] {
        if (0..<key.count).allSatisfy({ body[i + $0] == key[$0] }) { at = i + key.count; break }
    }
    guard at >= 0 else { return nil }
    while at < body.count && body[at] == 0x20 { at += 1 }
    var v = 0, digits = 0
    while at < body.count && body[at] >= 0x30 && body[at] <= 0x39 {
        v = v * 10 + Int(body[at] - 48)
        digits += 1
        at += 1
    }
    return digits > 0 && digits < 19 ? v : nil
}

/// The value of one sample of a Prometheus text exposition (0.0.4): the
/// line that starts with `series` (name and labels exactly as the daemon
/// writes them, e.g. `roomcast_frames_delivered_total{type="text"}`) and a
/// space; nil when there is none or its value is not an unsigned integer.
func prometheusSample(_ text: String, series: String) -> UInt64? {
    for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
        let value = line.dropFirst(series.utf8.count + 1).split(separator: " ").first ?? ""
        return UInt64(value)
    }
    return nil
}

/// The first line of an API key file (api.key_file's format: one key a
/// line, `#` comments) that is a key, trimmed; nil when there is none.
func firstAPIKey(_ text: String) -> String? {
    for line in text.split(whereSeparator: { $0 == "\n" || $0 == "\r" }) {
        let key = line.trimmingCharacters(in: " \t")
        if !key.isEmpty && !key.hasPrefix("#") { return key }
    }
    return nil
}

private extension Substring {
    func trimmingCharacters(in set: String) -> String {
        var s = self
        while let c = s.first, set.contains(c) { s = s.dropFirst() }
        while let c = s.last, set.contains(c) { s = s.dropLast() }
        return String(s)
    }
}
