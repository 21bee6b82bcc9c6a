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
    /// Not an answer yet: the publish waits for its Idempotency-Key's claim
    /// in Redis (`deferred`, APIIdempotency.swift).
    var deferredToken: UInt64? = nil

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
