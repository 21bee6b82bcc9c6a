import RoomcastCore

// APIResponse.swift: what the API answers (docs/api.md): JSON bodies, and
// every error as `{"error": CODE, "message": TEXT}` with its HTTP status.

/// A refused API request: status, stable snake_case code, and a sentence.
struct APIError: Error {
    var status: Int
    var code: String
    var message: String
    var headers: [(String, String)] = []

    init(_ status: Int, _ code: String, _ message: String, headers: [(String, String)] = []) {
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
    }

    var body: String { "{\"error\": \(jsonStringLiteral(code)), \"message\": \(jsonStringLiteral(message))}" }
}

/// One answer.
struct APIResponse: Equatable {
    var status: Int
    var body: [UInt8]
    var contentType = "application/json"
    var headers: [String] = []

    static func json(_ text: String, status: Int = 200) -> APIResponse {
        APIResponse(status: status, body: Array((text + "\n").utf8))
    }

    init(status: Int, body: [UInt8], contentType: String = "application/json", headers: [String] = []) {
        self.status = status
        self.body = body
        self.contentType = contentType
        self.headers = headers
    }

    init(_ error: APIError) {
        self.init(status: error.status, body: Array((error.body + "\n").utf8), headers: error.headers.map { "\($0.0): \($0.1)" })
    }

    /// Status line, headers and body (RFC 9112 §4, §6); `close` adds `Connection: close`.
    func serialized(close: Bool) -> [UInt8] {
        var head = "HTTP/1.1 \(status) \(HTTPError.phrase(status))\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.count)\r\n"
        for h in headers { head += h + "\r\n" }
        if close { head += "Connection: close\r\n" }
        return Array((head + "\r\n").utf8) + body
    }
}

extension Server {
    func apiErrorResponse(_ error: APIError, close: Bool) -> [UInt8] {
        APIResponse(error).serialized(close: close)
    }
}

/// The replies of publishes by `Idempotency-Key`, kept 5 minutes
/// (docs/api.md): a repeat is not relayed again and gets the first reply.
struct IdempotencyCache {
    /// How long a key is remembered, in ms.
    static let keepMs: UInt64 = 5 * 60_000
    /// Keys remembered at most; the oldest go first when full.
    static let capacity = 100_000
    private var replies: [String: (response: APIResponse, atMs: UInt64)] = [:]
    private var order: [(key: String, atMs: UInt64)] = []
    private var head = 0

    mutating func reply(for key: String, now: UInt64) -> APIResponse? {
        expire(now: now)
        return replies[key]?.response
    }

    mutating func remember(_ key: String, _ response: APIResponse, now: UInt64) {
        expire(now: now)
        if replies.count >= Self.capacity, head < order.count {
            replies[order[head].key] = nil
            head += 1
        }
        replies[key] = (response, now)
        order.append((key, now))
    }

    private mutating func expire(now: UInt64) {
        while head < order.count, order[head].atMs + Self.keepMs <= now {
            if let kept = replies[order[head].key], kept.atMs == order[head].atMs { replies[order[head].key] = nil }
            head += 1
        }
        if head > 1024 && head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
    }
}

/// Percent-decoding of one path segment or query value (RFC 3986 §2.1;
/// any other byte as it is); nil when a `%` is not followed by two hex digits.
func percentDecoded(_ s: Substring) -> [UInt8]? { percentDecoded(s.utf8, strict: false) }

/// The query's `name=value` pairs, values percent-decoded (nil: malformed).
func queryItems(_ query: String) -> [String: [UInt8]]? {
    var items: [String: [UInt8]] = [:]
    for pair in query.split(separator: "&") {
        let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
        guard let value = percentDecoded(parts.count > 1 ? parts[1] : "") else { return nil }
        items[String(parts[0])] = value
    }
    return items
}
