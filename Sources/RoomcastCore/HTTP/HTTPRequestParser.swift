// A bounded HTTP/1.1 request-head parser (RFC 9112 §2-§5), shared by the
// WebSocket upgrade (RFC 6455 §4.1) and the API (HTTPRequestReader.swift
// adds bodies, keep-alive and pipelining): the request line and the header
// fields, nothing else. Resumable after any
// partial read, in the manner of nginx's ngx_http_parse.c: it remembers how
// far it has scanned, so bytes are looked at once until the head is complete.

/// A refused request: the HTTP status to answer with and why.
public struct HTTPError: Error, Equatable, Sendable, CustomStringConvertible {
    /// 400, 401, 403, 404, 405, 408, 411, 413, 426, 431 or 501.
    public var status: Int
    /// For the log and the plain-text body of the answer.
    public var reason: String
    /// Extra header lines of the answer (`Allow: GET`, `Sec-WebSocket-Version: 13`).
    public var headers: [(String, String)]

    public init(_ status: Int, _ reason: String, headers: [(String, String)] = []) {
        self.status = status
        self.reason = reason
        self.headers = headers
    }

    public static func == (a: HTTPError, b: HTTPError) -> Bool {
        a.status == b.status && a.reason == b.reason && a.headers.elementsEqual(b.headers, by: { $0 == $1 })
    }

    /// The reason phrase of `status` (RFC 9110 §15).
    public static func phrase(_ status: Int) -> String {
        switch status {
        case 101: "Switching Protocols"
        case 100: "Continue"
        case 200: "OK"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 409: "Conflict"
        case 411: "Length Required"
        case 413: "Content Too Large"
        case 415: "Unsupported Media Type"
        case 422: "Unprocessable Content"
        case 500: "Internal Server Error"
        case 501: "Not Implemented"
        case 426: "Upgrade Required"
        case 431: "Request Header Fields Too Large"
        case 503: "Service Unavailable"
        default: "Error"
        }
    }

    /// The whole answer: status line, headers, `Connection: close` and a
    /// one-line plain-text body giving the reason. The connection is closed
    /// after it.
    public var response: [UInt8] {
        let body = reason + "\n"
        var head = "HTTP/1.1 \(status) \(Self.phrase(status))\r\n"
        head += "Content-Type: text/plain; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        return Array((head + "\r\n" + body).utf8)
    }

    public var description: String { "\(status) \(Self.phrase(status)): \(reason)" }
}

/// One parsed request head.
public struct HTTPRequest: Equatable, Sendable {
    /// The method, case-sensitive (RFC 9110 §9.1): `GET`.
    public var method: String
    /// The request target as sent: `/path?query`.
    public var target: String
    /// The path part of the target: `/path`.
    public var path: String
    /// The query after `?` (empty when there is none).
    public var query: String
    /// Header fields in order, names lowercased (names are case-insensitive,
    /// RFC 9110 §5.1), values with surrounding whitespace removed.
    public var fields: [Field]

    public struct Field: Equatable, Sendable {
        public var name: String
        public var value: String
    }

    /// The values of every field named `name` (lowercase), in order.
    public func values(_ name: String) -> [String] {
        fields.filter { $0.name == name }.map(\.value)
    }

    /// The value of the only field named `name`; nil when it is absent.
    /// A field sent twice gives its values joined by commas (RFC 9110 §5.3).
    public func value(_ name: String) -> String? {
        let v = values(name)
        return v.isEmpty ? nil : v.joined(separator: ", ")
    }

    /// The comma-separated elements of every field named `name` (RFC 9110
    /// §5.6.1), trimmed, empty ones dropped, case kept.
    public func list(_ name: String) -> [String] {
        values(name).flatMap { $0.split(separator: ",").map { trim(Substring($0)) } }.filter { !$0.isEmpty }
    }

    /// Whether a list field such as `Connection` holds `token`, compared
    /// case-insensitively (tokens are, RFC 9110 §7.6.1).
    public func hasToken(_ name: String, _ token: String) -> Bool {
        let t = asciiLowercased(token)
        return list(name).contains { asciiLowercased($0) == t }
    }
}

/// The parser of one request head. A plain value: its state is where the
/// scan stopped in the caller's buffer, which holds every byte received so
/// far (at most ``maxHeadBytes`` of them are ever looked at).
public struct HTTPRequestParser: Equatable, Sendable {
    /// Request line and header fields together, in bytes, CRLFs included.
    public static let maxHeadBytes = 8 * 1024

    /// Bytes of the buffer already scanned without finding the end of the head.
    public private(set) var scanned = 0

    public init() {}

    /// The result of one call.
    public enum Step: Equatable, Sendable {
        /// The head is not complete yet.
        case needMore
        /// The whole head, `headBytes` long (a body or frames may follow).
        case request(HTTPRequest, headBytes: Int)
        /// Refused; answer with `error.response` and close.
        case error(HTTPError)
    }

    /// Looks at the bytes received so far (the same buffer, grown, on every
    /// call: only the new bytes are scanned for the end of the head).
    public mutating func parse(_ bytes: UnsafeRawBufferPointer) -> Step {
        let limit = min(bytes.count, Self.maxHeadBytes)
        // The head ends at an empty line: LF followed by LF or CR LF
        // (RFC 9112 §2.2 lets a recipient accept a bare LF).
        var i = max(scanned, 1)
        var end: Int?
        while i < limit {
            if bytes[i] == 0x0A {
                if bytes[i - 1] == 0x0A { end = i + 1; break }
                if bytes[i - 1] == 0x0D && i >= 2 && bytes[i - 2] == 0x0A { end = i + 1; break }
            }
            i += 1
        }
        guard let end else {
            scanned = max(1, limit)
            if bytes.count >= Self.maxHeadBytes {
                return .error(HTTPError(431, "request line and headers exceed \(Self.maxHeadBytes) bytes"))
            }
            return .needMore
        }
        scanned = end
        switch Self.parseHead(UnsafeRawBufferPointer(rebasing: bytes[0..<end])) {
        case .success(let request): return .request(request, headBytes: end)
        case .failure(let error): return .error(error)
        }
    }

    /// Parses a complete head (ending with its empty line).
    static func parseHead(_ head: UnsafeRawBufferPointer) -> Result<HTTPRequest, HTTPError> {
        var lines: [UnsafeRawBufferPointer] = []
        var start = 0
        for i in 0..<head.count where head[i] == 0x0A {
            var stop = i
            if stop > start && head[stop - 1] == 0x0D { stop -= 1 }
            lines.append(UnsafeRawBufferPointer(rebasing: head[start..<stop]))
            start = i + 1
        }
        // RFC 9112 §2.2: empty lines before the request line are ignored.
        while let first = lines.first, first.isEmpty, lines.count > 1 { lines.removeFirst() }
        guard let requestLine = lines.first, !requestLine.isEmpty else {
            return .failure(HTTPError(400, "empty request"))
        }
        for b in head where b == 0 || (b < 0x20 && b != 0x09 && b != 0x0D && b != 0x0A) || b == 0x7F {
            return .failure(HTTPError(400, "control character 0x\(String(b, radix: 16)) in the request head"))
        }
        // RFC 9112 §2.2: a CR not followed by LF makes the element invalid
        // (a proxy may read it as a line end where we would not).
        for i in 0..<head.count where head[i] == 0x0D && (i + 1 == head.count || head[i + 1] != 0x0A) {
            return .failure(HTTPError(400, "bare CR in the request head (RFC 9112 §2.2)"))
        }
        let parts = requestLine.split(separator: 0x20, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty else {
            return .failure(HTTPError(400, "malformed request line (expected METHOD SP TARGET SP HTTP/1.1)"))
        }
        let method = String(decoding: parts[0], as: UTF8.self)
        guard method.utf8.allSatisfy(isTokenByte) else { return .failure(HTTPError(400, "malformed method")) }
        let version = String(decoding: parts[2], as: UTF8.self)
        guard version.hasPrefix("HTTP/1."), version.utf8.count == 8,
              let minor = version.utf8.last, minor >= 0x30 && minor <= 0x39 else {
            return .failure(HTTPError(400, "malformed HTTP version '\(clip(version))'"))
        }
        guard minor >= 0x31 else { return .failure(HTTPError(400, "HTTP/1.1 or later is required (RFC 6455 §4.1 for WebSocket; the API speaks HTTP/1.1)")) }
        let target = String(decoding: parts[1], as: UTF8.self)
        guard target.hasPrefix("/") else {
            return .failure(HTTPError(400, "request target must be a path beginning with '/'"))
        }
        let path: String, query: String
        if let q = target.firstIndex(of: "?") {
            path = String(target[..<q]); query = String(target[target.index(after: q)...])
        } else {
            path = target; query = ""
        }
        var fields: [HTTPRequest.Field] = []
        for line in lines.dropFirst() where !line.isEmpty {
            if line[0] == 0x20 || line[0] == 0x09 {
                return .failure(HTTPError(400, "obsolete line folding in a header field (RFC 9112 §5.2)"))
            }
            guard let colon = line.firstIndex(of: 0x3A), colon > 0 else {
                return .failure(HTTPError(400, "header line without a field name and ':'"))
            }
            let name = line[0..<colon]
            guard name.allSatisfy(isTokenByte) else {
                return .failure(HTTPError(400, "malformed header field name (no whitespace before ':', RFC 9112 §5.1)"))
            }
            let value = String(decoding: line[(colon + 1)...], as: UTF8.self)
            fields.append(.init(name: asciiLowercased(String(decoding: name, as: UTF8.self)), value: trim(Substring(value))))
        }
        // RFC 9112 §3.2: a server MUST answer 400 to an HTTP/1.1 request
        // without Host, with more than one, or with an invalid one.
        let hosts = fields.filter { $0.name == "host" }
        guard hosts.count == 1 else {
            return .failure(HTTPError(400, hosts.isEmpty ? "no Host header (RFC 9112 §3.2)" : "more than one Host header (RFC 9112 §3.2)"))
        }
        guard isValidHost(hosts[0].value) else {
            return .failure(HTTPError(400, "invalid Host '\(clip(hosts[0].value))' (RFC 9112 §3.2)"))
        }
        return .success(HTTPRequest(method: method, target: target, path: path, query: query, fields: fields))
    }

    /// Whether `value` is a valid Host field value (RFC 9110 §7.2: `uri-host
    /// [ ":" port ]`, RFC 3986 §3.2.2-§3.2.3): an IP literal in brackets
    /// (IPv6 or IPvFuture characters) or a reg-name (unreserved,
    /// percent-encoded and sub-delims bytes; IPv4 addresses are reg-names
    /// syntactically), then optionally `:` and decimal digits. Empty is
    /// valid (RFC 9110 §7.2: the authority of the target may be empty);
    /// userinfo (`@`), a path, whitespace inside and a comma-separated list are not.
    static func isValidHost(_ value: String) -> Bool {
        let b = Array(value.utf8)
        var i = 0
        if b.first == UInt8(ascii: "[") {
            guard let close = b.firstIndex(of: UInt8(ascii: "]")), close > 1 else { return false }
            // IPv6address or IPvFuture: hex digits, ':' and '.', or 'v' and unreserved / sub-delims.
            guard b[1..<close].allSatisfy({ isUnreserved($0) || isSubDelim($0) || $0 == UInt8(ascii: ":") }) else { return false }
            i = close + 1
        } else {
            while i < b.count && b[i] != UInt8(ascii: ":") {
                if b[i] == UInt8(ascii: "%") {
                    guard i + 2 < b.count, isHexDigit(b[i + 1]), isHexDigit(b[i + 2]) else { return false }
                    i += 3
                    continue
                }
                // A comma is a sub-delim of RFC 3986 but the list separator
                // of HTTP fields (RFC 9110 §5.3): two hosts in one line.
                guard isUnreserved(b[i]) || (isSubDelim(b[i]) && b[i] != UInt8(ascii: ",")) else { return false }
                i += 1
            }
        }
        guard i < b.count else { return true }
        guard b[i] == UInt8(ascii: ":") else { return false }
        return b[(i + 1)...].allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
    }
}

/// RFC 3986 §2.3 unreserved: ALPHA / DIGIT / "-" / "." / "_" / "~".
@inline(__always)
private func isUnreserved(_ b: UInt8) -> Bool {
    switch b {
    case 0x30...0x39, 0x41...0x5A, 0x61...0x7A, UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"): true
    default: false
    }
}

/// RFC 3986 §2.2 sub-delims: `!$&'()*+,;=`.
@inline(__always)
private func isSubDelim(_ b: UInt8) -> Bool {
    "!$&'()*+,;=".utf8.contains(b)
}

@inline(__always)
private func isHexDigit(_ b: UInt8) -> Bool {
    (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66)
}

/// RFC 9110 §5.6.2 tchar.
@inline(__always)
func isTokenByte(_ b: UInt8) -> Bool {
    switch b {
    case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: true
    case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
         UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
         UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"): true
    default: false
    }
}

/// ASCII letters lowercased, everything else kept (header names and tokens
/// are ASCII; no locale involved).
func asciiLowercased(_ s: String) -> String {
    String(decoding: s.utf8.map { $0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0 }, as: UTF8.self)
}

/// Without leading and trailing spaces and tabs (OWS, RFC 9110 §5.6.3).
func trim(_ s: Substring) -> String {
    var t = s.drop { $0 == " " || $0 == "\t" }
    while t.last == " " || t.last == "\t" { t = t.dropLast() }
    return String(t)
}

/// At most 60 characters of a client's text, for an error message.
func clip(_ s: String) -> String {
    s.count <= 60 ? s : String(s.prefix(57)) + "..."
}
