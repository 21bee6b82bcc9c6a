// Whole HTTP/1.1 requests with their bodies, one after another on a
// persistent connection (RFC 9112 §6, §9.3): the head from HTTPRequestParser,
// then the body framed by Content-Length only. Bounded before anything is
// buffered: a head of at most 8 KiB, a body of at most `maxBodyBytes`.

/// Reads requests from the bytes a connection has received, in order
/// (pipelining: several may be in one read; each is answered in turn).
public struct HTTPRequestReader: Equatable, Sendable {
    /// The largest body accepted, in bytes (docs/api.md: 64 KiB).
    public let maxBodyBytes: Int
    private var head = HTTPRequestParser()
    /// The head parsed and the body still arriving.
    private var waiting: Waiting?
    private var continueSent = false

    private struct Waiting: Equatable, Sendable {
        var request: HTTPRequest
        var headBytes: Int
        var bodyBytes: Int
    }

    /// - Parameter maxBodyBytes: the largest Content-Length accepted, bytes.
    public init(maxBodyBytes: Int = 64 * 1024) {
        self.maxBodyBytes = maxBodyBytes
    }

    /// The result of one call.
    public enum Step: Equatable, Sendable {
        /// Not a whole request yet. `sendContinue`: the client asked for
        /// `Expect: 100-continue` and should now be told `100 Continue`
        /// (RFC 9110 §10.1.1); true once per request.
        case needMore(sendContinue: Bool)
        /// A whole request: its body is `body` of the buffer, and the
        /// request used the first `consumed` bytes (drop them, then call
        /// again for the next one). `keepAlive`: the client did not ask to
        /// close (`Connection: close`, RFC 9112 §9.3).
        case request(HTTPRequest, body: Range<Int>, consumed: Int, keepAlive: Bool)
        /// Refused: answer with the status and close (the framing of what
        /// follows is unknown).
        case error(HTTPError)
    }

    /// Looks at the bytes received and not yet consumed (the same buffer,
    /// grown, until a request is returned; after that, the buffer without
    /// the `consumed` bytes).
    public mutating func next(_ bytes: UnsafeRawBufferPointer) -> Step {
        if waiting == nil {
            switch head.parse(bytes) {
            case .needMore: return .needMore(sendContinue: false)
            case .error(let e): return .error(e)
            case .request(let request, let headBytes):
                switch Self.bodyLength(request, max: maxBodyBytes) {
                case .failure(let e): return .error(e)
                case .success(let n): waiting = Waiting(request: request, headBytes: headBytes, bodyBytes: n)
                }
            }
        }
        let w = waiting!
        guard bytes.count >= w.headBytes + w.bodyBytes else {
            let owed = !continueSent && w.request.hasToken("expect", "100-continue")
            if owed { continueSent = true }
            return .needMore(sendContinue: owed)
        }
        self = HTTPRequestReader(maxBodyBytes: maxBodyBytes)
        return .request(w.request, body: w.headBytes..<(w.headBytes + w.bodyBytes), consumed: w.headBytes + w.bodyBytes,
                        keepAlive: !w.request.hasToken("connection", "close"))
    }

    /// Whether a head has been read and its body is awaited.
    public var readingBody: Bool { waiting != nil }

    /// The body length of `request` (RFC 9112 §6.3): Content-Length, the
    /// same value however often it is given; none means no body.
    /// A transfer coding is refused: `chunked` with 411 (send a length
    /// instead), any other with 501 (RFC 9112 §6.1), an empty
    /// `Transfer-Encoding` with 400 (the framing is in doubt: a proxy in
    /// front may have read it otherwise). A Content-Length that is not
    /// `1*DIGIT` (empty included; RFC 9110 §8.6), in any of its values or
    /// list elements, is 400: the framing is invalid and what follows must
    /// not be read as a request (RFC 9112 §6.3 item 5; the caller closes).
    static func bodyLength(_ request: HTTPRequest, max: Int) -> Result<Int, HTTPError> {
        let codings = request.list("transfer-encoding")
        if !codings.isEmpty {
            if codings.contains(where: { asciiLowercased($0) == "chunked" }) {
                return .failure(HTTPError(411, "chunked request bodies are not accepted: send Content-Length (at most \(max) bytes)"))
            }
            return .failure(HTTPError(501, "transfer coding '\(clip(codings.joined(separator: ", ")))' is not implemented"))
        }
        if !request.values("transfer-encoding").isEmpty {
            return .failure(HTTPError(400, "empty Transfer-Encoding (RFC 9112 §6.1): the body's framing is in doubt"))
        }
        // Every element of every Content-Length line, empty ones kept.
        let lengths = request.values("content-length").flatMap { $0.split(separator: ",", omittingEmptySubsequences: false).map { trim($0) } }
        guard let first = lengths.first else { return .success(0) }
        guard lengths.allSatisfy({ $0 == first }) else {
            return .failure(HTTPError(400, "Content-Length given with different values (RFC 9112 §6.3)"))
        }
        let digits = Array(first.utf8)
        guard !digits.isEmpty, digits.count <= 18, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let n = Int(first) else {
            return .failure(HTTPError(400, "Content-Length '\(clip(first))' is not a decimal length (RFC 9112 §6.3)"))
        }
        guard n <= max else { return .failure(HTTPError(413, "the body is \(n) bytes, over \(max)")) }
        return .success(n)
    }
}
