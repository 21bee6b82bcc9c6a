// The chat page's files as the WebSocket listener serves them to a plain
// GET (docs/protocol/websocket.md §15, "The page"): a fixed set of names read once
// from `[websocket] page_dir`, so a request can reach nothing but those
// names (no path is ever joined to the directory).

/// One servable file: its bytes and the `Content-Type` its extension gives.
public struct PageFile: Equatable, Sendable {
    public var body: [UInt8]
    public var contentType: String

    public init(body: [UInt8], contentType: String) {
        self.body = body
        self.contentType = contentType
    }
}

/// The files of the page directory, by request path (`/chat.js`); `/` is `index.html`.
public struct PageFiles: Equatable, Sendable {
    /// Largest file served, bytes; a larger one refuses the directory.
    public static let maxFileBytes = 1 << 20
    /// Most files served; more refuse the directory.
    public static let maxFiles = 64

    /// Request path to file; `/` and `/index.html` are the same file.
    public private(set) var files: [String: PageFile] = [:]

    public init() {}

    /// The request paths served (for ``WebSocketPolicy/pagePaths``).
    public var paths: Set<String> { Set(files.keys) }

    /// The `Content-Type` of a file name by its extension (RFC 9239 for
    /// JavaScript, RFC 2318 for CSS, the WHATWG MIME sniffing standard's
    /// table otherwise), nil for a name that is not served: no extension,
    /// an unknown one, a dot file, or a name with bytes outside
    /// `[A-Za-z0-9._-]`.
    public static func contentType(of name: String) -> String? {
        let bytes = Array(name.utf8)
        guard let first = bytes.first, first != UInt8(ascii: "."), bytes.count <= 255,
              bytes.allSatisfy({ b in
                  (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                      || b == 0x2E || b == 0x2D || b == 0x5F
              }),
              let dot = name.lastIndex(of: ".") else { return nil }
        return switch asciiLowercased(String(name[name.index(after: dot)...])) {
        case "html": "text/html; charset=utf-8"
        case "css": "text/css; charset=utf-8"
        case "js": "text/javascript; charset=utf-8"
        case "json": "application/json"
        case "txt": "text/plain; charset=utf-8"
        case "svg": "image/svg+xml"
        case "png": "image/png"
        case "ico": "image/x-icon"
        case "webp": "image/webp"
        default: nil
        }
    }

    /// Adds file `name` (a bare name, checked by ``contentType(of:)``).
    /// - Returns: false when the name is not served or the limits are reached.
    public mutating func add(name: String, body: [UInt8]) -> Bool {
        guard let type = Self.contentType(of: name), body.count <= Self.maxFileBytes, files.count < Self.maxFiles else {
            return false
        }
        let file = PageFile(body: body, contentType: type)
        files["/" + name] = file
        if name == "index.html" { files["/"] = file }
        return true
    }

    /// The `200 OK` answer for `path` (RFC 9110 §15.3.1), nil when not served.
    /// The connection is closed after it (`Connection: close`); the browser
    /// revalidates each load (`Cache-Control: no-cache`) and must not sniff
    /// another type (`X-Content-Type-Options: nosniff`).
    public func response(for path: String) -> [UInt8]? {
        guard let file = files[path] else { return nil }
        let head = "HTTP/1.1 200 OK\r\nContent-Type: \(file.contentType)\r\nContent-Length: \(file.body.count)\r\n"
            + "Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n"
            + "Content-Security-Policy: default-src 'self'; connect-src 'self' ws: wss:\r\nConnection: close\r\n\r\n"
        return Array(head.utf8) + file.body
    }
}
