import RoomcastCore

// `roomcast admin`: the backend API's requests (docs/api.md) built from a
// command line, without any I/O, so that each verb's method, path and body
// are tested on their own. AdminHTTP.swift sends them.

/// One request to the backend API.
public struct AdminRequest: Equatable, Sendable {
    public var method: String
    /// The path and query, `{room}` and `{sub}` percent-encoded (RFC 3986 §2.1).
    public var path: String
    /// A JSON body (nil: none).
    public var body: String?
    /// Extra headers (`Idempotency-Key`).
    public var headers: [(String, String)] = []

    public init(method: String, path: String, body: String?, headers: [(String, String)] = []) {
        self.method = method
        self.path = path
        self.body = body
        self.headers = headers
    }

    public static func == (a: AdminRequest, b: AdminRequest) -> Bool {
        a.method == b.method && a.path == b.path && a.body == b.body && a.headers.elementsEqual(b.headers, by: { $0 == $1 })
    }
}

/// A mistake on the `roomcast admin` command line.
public struct AdminUsageError: Error, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// What `roomcast admin` was asked: where the API is, how to authenticate, the request.
public struct AdminInvocation: Equatable, Sendable {
    /// `--api`: `http://HOST:PORT` or `unix:/PATH`; default `$ROOMCAST_API`, else `http://127.0.0.1:9899`.
    public var api: String
    /// `--key-file`: a file whose first non-comment line is the bearer key (else `$ROOMCAST_API_KEY`).
    public var keyFile: String?
    /// `--timeout` in ms (default 5000).
    public var timeoutMs: UInt64 = 5_000
    public var request: AdminRequest
}

/// The bytes of `text` percent-encoded but for RFC 3986 unreserved characters.
public func percentEncodedComponent(_ text: String) -> String {
    var out = ""
    for b in text.utf8 {
        switch b {
        case 0x41...0x5A, 0x61...0x7A, 0x30...0x39, 0x2D, 0x2E, 0x5F, 0x7E: out.unicodeScalars.append(Unicode.Scalar(b))
        default:
            let hex = Array("0123456789ABCDEF".utf8)
            out += "%" + String(decoding: [hex[Int(b >> 4)], hex[Int(b & 15)]], as: UTF8.self)
        }
    }
    return out
}

public enum AdminCommand {
    /// The verbs, in the order of `roomcast admin --help`.
    public static let verbs = ["publish", "kick", "ban", "unban", "mute", "rooms", "room", "slow"]

    /// Parses `roomcast admin VERB [OPTIONS] ARGS...` (the arguments after `admin`).
    /// - Parameter environment: `ROOMCAST_API` is the default `--api`.
    /// - Throws: ``AdminUsageError`` naming the option or argument at fault.
    public static func parse(_ arguments: [String], environment: [String: String] = [:]) throws(AdminUsageError) -> AdminInvocation {
        var positional: [String] = []
        var options: [String: String] = [:]
        let valued: Set<String> = ["api", "key-file", "timeout", "text", "name", "level", "icon", "gift", "gift-url", "count", "type",
                                   "body-base64", "idempotency-key", "sub", "seconds", "reason", "limit", "cursor"]
        var i = 0
        while i < arguments.count {
            let a = arguments[i]
            if a == "--" {
                positional += arguments[(i + 1)...]
                break
            }
            if a.hasPrefix("--") {
                var name = String(a.dropFirst(2)), value: String?
                if let eq = name.firstIndex(of: "=") {
                    value = String(name[name.index(after: eq)...])
                    name = String(name[..<eq])
                }
                guard valued.contains(name) else { throw AdminUsageError("unknown option --\(name)") }
                if value == nil {
                    i += 1
                    guard i < arguments.count else { throw AdminUsageError("--\(name) needs a value") }
                    value = arguments[i]
                }
                guard options[name] == nil else { throw AdminUsageError("--\(name) given twice") }
                options[name] = value
            } else {
                positional.append(a)
            }
            i += 1
        }
        guard let verb = positional.first else { throw AdminUsageError("no verb: one of \(verbs.joined(separator: ", "))") }
        let args = Array(positional.dropFirst())
        var used: Set<String> = ["api", "key-file", "timeout"]
        func option(_ name: String) -> String? {
            used.insert(name)
            return options[name]
        }
        func int(_ name: String, _ range: ClosedRange<Int>) throws(AdminUsageError) -> Int? {
            guard let text = option(name) else { return nil }
            guard let n = Int(text), range.contains(n) else { throw AdminUsageError("--\(name) must be an integer \(range.lowerBound) ... \(range.upperBound)") }
            return n
        }
        func operands(_ names: String...) throws(AdminUsageError) -> [String] {
            guard args.count == names.count else {
                throw AdminUsageError("\(verb) takes \(names.isEmpty ? "no arguments" : names.joined(separator: " ")), not \(args.count) argument\(args.count == 1 ? "" : "s")")
            }
            for (n, a) in zip(names, args) where a.isEmpty { throw AdminUsageError("\(n) must not be empty") }
            return args
        }
        func page(_ base: String) throws(AdminUsageError) -> String {
            var query: [String] = []
            if let n = try int("limit", 1...1000) { query.append("limit=\(n)") }
            if let c = option("cursor") { query.append("cursor=" + percentEncodedComponent(c)) }
            return query.isEmpty ? base : base + "?" + query.joined(separator: "&")
        }
        func room(_ r: String) -> String { "/v1/rooms/" + percentEncodedComponent(r) }
        func until() throws(AdminUsageError) -> String {
            guard let s = try int("seconds", 1...1_209_600) else { throw AdminUsageError("\(verb) needs --seconds N (1 ... 1209600)") }
            let reason = option("reason").map { ", \"reason\": " + jsonStringLiteral($0) } ?? ""
            return "{\"seconds\": \(s)\(reason)}"
        }
        let request: AdminRequest
        switch verb {
        case "publish":
            let r = try operands("ROOM")[0]
            var headers: [(String, String)] = []
            if let key = option("idempotency-key") {
                guard !key.isEmpty, key.utf8.count <= 255, !key.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F }) else {
                    throw AdminUsageError("--idempotency-key must be 1 ... 255 bytes without control characters")
                }
                headers.append(("Idempotency-Key", key))
            }
            func user() throws(AdminUsageError) -> String {
                guard let name = option("name") else { throw AdminUsageError("publish --text and --gift need --name (the user shown)") }
                let level = try int("level", Int(Int32.min)...Int(Int32.max)) ?? 0
                return "{\"name\": \(jsonStringLiteral(name)), \"level\": \(level), \"icon\": \(jsonStringLiteral(option("icon") ?? ""))}"
            }
            let kinds = ["text", "gift", "type"].filter { options[$0] != nil }
            guard kinds.count == 1 else { throw AdminUsageError("publish needs exactly one of --text TEXT, --gift NAME or --type N --body-base64 B64") }
            let body: String
            switch kinds[0] {
            case "text":
                body = "{\"type\": \"text\", \"user\": \(try user()), \"text\": \(jsonStringLiteral(option("text")!))}"
            case "gift":
                let count = try int("count", 1...Int(Int32.max)) ?? 1
                body = "{\"type\": \"gift\", \"user\": \(try user()), \"giftname\": \(jsonStringLiteral(option("gift")!)), "
                    + "\"giftURL\": \(jsonStringLiteral(option("gift-url") ?? "")), \"giftcount\": \(count)}"
            default:
                let type = try int("type", 0...65535)!
                guard let b64 = option("body-base64") else { throw AdminUsageError("publish --type needs --body-base64 B64 (RFC 4648, standard alphabet)") }
                body = "{\"type\": \(type), \"body_base64\": \(jsonStringLiteral(b64))}"
            }
            request = AdminRequest(method: "POST", path: room(r) + "/publish", body: body, headers: headers)
        case "kick":
            let r = try operands("ROOM")[0]
            let sub = option("sub"), name = option("name")
            guard (sub == nil) != (name == nil) else { throw AdminUsageError("kick needs exactly one of --sub SUB or --name NAME") }
            let body = sub.map { "{\"sub\": \(jsonStringLiteral($0))}" } ?? "{\"name\": \(jsonStringLiteral(name!))}"
            request = AdminRequest(method: "POST", path: room(r) + "/kick", body: body)
        case "ban", "mute":
            let a = try operands("ROOM", "SUB")
            request = AdminRequest(method: "PUT", path: room(a[0]) + (verb == "ban" ? "/bans/" : "/mutes/") + percentEncodedComponent(a[1]), body: try until())
        case "unban":
            let a = try operands("ROOM", "SUB")
            request = AdminRequest(method: "DELETE", path: room(a[0]) + "/bans/" + percentEncodedComponent(a[1]), body: nil)
        case "slow":
            let a = try operands("ROOM", "SECONDS")
            guard let s = Int(a[1]), s == 0 || (3...120).contains(s) else { throw AdminUsageError("SECONDS must be 0 (off) or 3 ... 120") }
            request = AdminRequest(method: "PUT", path: room(a[0]) + "/settings", body: "{\"slow_mode_seconds\": \(s)}")
        case "rooms":
            _ = try operands()
            request = AdminRequest(method: "GET", path: try page("/v1/rooms"), body: nil)
        case "room":
            let r = try operands("ROOM")[0]
            request = AdminRequest(method: "GET", path: try page(room(r)), body: nil)
        default:
            throw AdminUsageError("unknown verb '\(verb)': one of \(verbs.joined(separator: ", "))")
        }
        if let extra = options.keys.sorted().first(where: { !used.contains($0) }) {
            throw AdminUsageError("--\(extra) does not apply to \(verb)")
        }
        let timeout = options["timeout"].flatMap { UInt64($0) }
        if options["timeout"] != nil && (timeout == nil || timeout! == 0 || timeout! > 600_000) {
            throw AdminUsageError("--timeout must be milliseconds, 1 ... 600000")
        }
        let api = options["api"] ?? environment["ROOMCAST_API"] ?? "http://127.0.0.1:9899"
        guard AdminEndpoint.parse(api) != nil else {
            throw AdminUsageError("--api \(api): expected http://HOST:PORT (numeric IPv4 or [IPv6]) or unix:/PATH")
        }
        return AdminInvocation(api: api, keyFile: options["key-file"], timeoutMs: timeout ?? 5_000, request: request)
    }
}

/// Where the API listens: `http://127.0.0.1:9899`, `http://[::1]:9899` or `unix:/run/roomcastd/api.sock`.
public enum AdminEndpoint: Equatable, Sendable {
    case tcp(host: String, port: UInt16)
    case unix(path: String)

    public static func parse(_ text: String) -> AdminEndpoint? {
        if text.hasPrefix("unix:/") {
            let path = String(text.dropFirst(5))
            return path.utf8.count <= 107 ? .unix(path: path) : nil
        }
        guard text.hasPrefix("http://") else { return nil }
        var rest = Substring(text.dropFirst(7))
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        guard let address = ListenAddress.parse(String(rest)), address.port != 0 else { return nil }
        return .tcp(host: address.host, port: address.port)
    }

    /// The `Host` header: the authority, or `localhost` on a Unix socket.
    public var hostHeader: String {
        switch self {
        case .tcp(let host, let port): host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .unix: "localhost"
        }
    }
}

extension AdminRequest {
    /// The HTTP/1.1 request bytes, with `Connection: close` (one request per connection).
    public func serialized(host: String, key: String?) -> [UInt8] {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: \(host)\r\nUser-Agent: roomcast-admin\r\nAccept: application/json\r\nConnection: close\r\n"
        if let key { head += "Authorization: Bearer \(key)\r\n" }
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body {
            head += "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body
        } else {
            head += method == "GET" ? "\r\n" : "Content-Length: 0\r\n\r\n"
        }
        return Array(head.utf8)
    }
}
