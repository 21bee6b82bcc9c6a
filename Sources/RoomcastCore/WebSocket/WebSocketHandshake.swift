// The server side of the RFC 6455 §4.2 opening handshake, decided on a
// parsed request: which path, which origin, which subprotocol, or which
// HTTP error. No cryptography here: the caller computes
// `Sec-WebSocket-Accept` (SHA-1 and base64) from ``acceptInput(key:)``.

/// The two subprotocols of the WebSocket listener (docs/protocol/websocket.md §15).
public enum WebSocketSubprotocol: String, CaseIterable, Equatable, Sendable {
    /// Each text message is one JSON object of the JSON dialect (docs/protocol/json.md §7).
    /// The default when the client offers none.
    case json = "roomcast.json.v1"
    /// Each binary message is exactly one LTB frame (docs/protocol/ltb.md §1).
    case ltb = "roomcast.ltb.v1"
}

/// What the listener serves, and to whom.
public struct WebSocketPolicy: Equatable, Sendable {
    /// Paths that accept an upgrade (`/`, and `/echo` with `[websocket] echo`).
    public var webSocketPaths: Set<String>
    /// Paths that serve the page to a plain GET (`/` with `[websocket] page`).
    public var pagePaths: Set<String>
    /// `[websocket] allowed_origins`, each `scheme://host[:port]` lowercased;
    /// empty: any origin.
    public var allowedOrigins: [String]

    public init(webSocketPaths: Set<String>, pagePaths: Set<String> = [], allowedOrigins: [String] = []) {
        self.webSocketPaths = webSocketPaths
        self.pagePaths = pagePaths
        self.allowedOrigins = allowedOrigins.map(asciiLowercased)
    }
}

/// What a valid request asks for.
public enum WebSocketHandshake: Equatable, Sendable {
    /// An upgrade to `path`: answer with ``response(accept:subprotocol:)``.
    /// `subprotocol` is what the client offered and we chose, nil when it
    /// offered none (then `roomcast.json.v1` is spoken and not named).
    case upgrade(path: String, key: String, subprotocol: WebSocketSubprotocol?)
    /// A plain GET of a page path.
    case page(path: String)

    /// The GUID of RFC 6455 §1.3 appended to the key before hashing.
    public static let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// The string whose SHA-1, base64-encoded, is `Sec-WebSocket-Accept`
    /// (RFC 6455 §4.2.2 item 5.4).
    public static func acceptInput(key: String) -> String { key + guid }

    /// The spoken subprotocol of an upgrade (the default when none was named).
    public var spoken: WebSocketSubprotocol? {
        if case .upgrade(_, _, let p) = self { return p ?? .json }
        return nil
    }

    /// Decides a request (RFC 6455 §4.2.1, §4.2.2).
    /// - Throws: ``HTTPError``: 405 for a method other than GET, 404 for a
    ///   path not served, 403 for an Origin not in `allowed_origins` (no
    ///   Origin header: not a browser, allowed), 426 for a plain GET of a
    ///   WebSocket path or a `Sec-WebSocket-Version` other than 13, 400 for a
    ///   malformed upgrade (no Host, no `Connection: upgrade`, a key that is
    ///   not 16 bytes in base64, only unknown subprotocols offered).
    public static func evaluate(_ r: HTTPRequest, policy: WebSocketPolicy) throws(HTTPError) -> WebSocketHandshake {
        guard r.method == "GET" else {
            throw HTTPError(405, "only GET is served here", headers: [("Allow", "GET")])
        }
        let isWebSocketPath = policy.webSocketPaths.contains(r.path)
        let isPage = policy.pagePaths.contains(r.path)
        guard isWebSocketPath || isPage else { throw HTTPError(404, "nothing is served at this path") }
        let wantsUpgrade = r.hasToken("upgrade", "websocket")
        if !wantsUpgrade {
            if isPage { return .page(path: r.path) }
            throw HTTPError(426, "this path speaks WebSocket only (RFC 6455)",
                            headers: [("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13")])
        }
        guard isWebSocketPath else { throw HTTPError(404, "no WebSocket endpoint at this path") }
        guard r.values("host").count == 1 else { throw HTTPError(400, "exactly one Host header is required (RFC 9112 §3.2)") }
        guard r.hasToken("connection", "upgrade") else {
            throw HTTPError(400, "an upgrade needs 'Connection: Upgrade' (RFC 6455 §4.2.1)")
        }
        let origins = r.values("origin")
        if origins.count > 1 { throw HTTPError(400, "more than one Origin header") }
        if let origin = origins.first, !policy.allowedOrigins.isEmpty,
           !policy.allowedOrigins.contains(asciiLowercased(origin)) {
            throw HTTPError(403, "origin '\(clip(origin))' is not in allowed_origins")
        }
        guard r.value("sec-websocket-version") == "13" else {
            throw HTTPError(426, "only WebSocket version 13 is spoken (RFC 6455 §4.4)", headers: [("Sec-WebSocket-Version", "13")])
        }
        let keys = r.values("sec-websocket-key")
        guard keys.count == 1, isNonceKey(keys[0]) else {
            throw HTTPError(400, "Sec-WebSocket-Key must be 16 bytes in base64 (RFC 6455 §4.1)")
        }
        let offered = r.list("sec-websocket-protocol")
        var chosen: WebSocketSubprotocol?
        if !offered.isEmpty {
            chosen = offered.lazy.compactMap(WebSocketSubprotocol.init(rawValue:)).first
            if chosen == nil {
                throw HTTPError(400, "none of the offered subprotocols is spoken here (roomcast.json.v1, roomcast.ltb.v1)")
            }
        }
        // Sec-WebSocket-Extensions (permessage-deflate) is declined by not
        // naming it in the answer (RFC 7692 §5: the client then sends plain frames).
        return .upgrade(path: r.path, key: keys[0], subprotocol: chosen)
    }

    /// A base64 string of 16 bytes: 22 characters of the alphabet and `==`.
    static func isNonceKey(_ key: String) -> Bool {
        let b = Array(key.utf8)
        guard b.count == 24, b[22] == UInt8(ascii: "="), b[23] == UInt8(ascii: "=") else { return false }
        let alphabet: (UInt8) -> Bool = { c in
            (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || (c >= 0x30 && c <= 0x39) || c == 0x2B || c == 0x2F
        }
        // The last character carries only 4 bits of the 16th byte: A, Q, g or w.
        return b[0..<22].allSatisfy(alphabet) && "AQgw".utf8.contains(b[21])
    }

    /// The 101 answer (RFC 6455 §4.2.2): `accept` is the base64 SHA-1 of
    /// ``acceptInput(key:)``; the subprotocol is named only when the
    /// client offered it.
    public static func response(accept: String, subprotocol: WebSocketSubprotocol?) -> [UInt8] {
        var head = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        head += "Sec-WebSocket-Accept: \(accept)\r\n"
        if let p = subprotocol { head += "Sec-WebSocket-Protocol: \(p.rawValue)\r\n" }
        return Array((head + "\r\n").utf8)
    }
}
