@preconcurrency import CShim
@preconcurrency import Glibc
import RoomcastClient

/// The version printed by `--version` (the daemon's version: they ship together).

/// sysexits(3) code for bad usage, as roomcastd uses.
let exitUsage: Int32 = 64

enum Subcommand: String, CaseIterable {
    case chat, send, listen, token
}

/// What `send` sends.
enum Payload: Equatable {
    case text(String)
    case gift(name: String, url: String, count: Int32)
}

/// A parsed command line.
struct Invocation {
    var command: Subcommand
    var server = ServerAddress.default
    var byteOrder = ByteOrder.little
    var heartbeatMs: UInt64 = 10_000
    /// `--max-frame-bytes`: largest body sent or accepted (the daemon's `max_frame_bytes`).
    var maxFrameBytes = ClientConfiguration().maxFrameBytes
    var name: String?
    var room: String?
    var level: Int32 = 0
    var icon = ""
    var timeoutMs: UInt64 = 5_000
    var json = false
    var count: Int?
    var payload: Payload?
    var help = false
    var version = false
    /// True for `roomcast --help`/`--version` without a subcommand.
    var topLevel = false
    /// `--token` (or ROOMCAST_TOKEN): the signed join (docs/protocol/tokens.md §13).
    var token: String?
    /// `roomcast token`: the key file, kid, claims and lifetime of the token to mint.
    var keyFile: String?
    var kid: String?
    var sub: String?
    var ttlMs: UInt64 = 3_600_000
    /// `--tls`, `--ca-file`, `--insecure`: TLS to a `listen_tls` listener (docs/protocol/tls.md §16).
    var tls = false
    var caFile: String?
    var insecure = false

    /// The client configuration these options describe.
    var configuration: ClientConfiguration {
        var configuration = ClientConfiguration(server: server)
        configuration.byteOrder = byteOrder
        configuration.heartbeatIntervalMs = heartbeatMs
        configuration.maxFrameBytes = maxFrameBytes
        configuration.token = token
        if tls || caFile != nil || insecure { configuration.tls = ClientTLS(caFile: caFile, verify: !insecure) }
        return configuration
    }

    /// The user this invocation joins as.
    func user(defaultName: String) -> UserInfo {
        UserInfo(level: level, name: name ?? defaultName, iconURL: icon, room: room)
    }
}

/// A command-line mistake; `message` names the offending option or argument.
struct UsageError: Error {
    var message: String
    var command: Subcommand?
}

/// One long option; `value` is its short letter, or >= 256 for long-only ones.
private struct OptionSpec {
    let name: StaticString
    let hasArgument: Bool
    let value: Int32
    var short: Character? { value < 256 ? Character(Unicode.Scalar(UInt8(value))) : nil }
}

private let optByteOrder: Int32 = 256
private let optHeartbeat: Int32 = 257
private let optMaxFrameBytes: Int32 = 258
private let optToken: Int32 = 259
private let optKeyFile: Int32 = 260
private let optKid: Int32 = 261
private let optSub: Int32 = 262
private let optTTL: Int32 = 263
private let optTLS: Int32 = 264
private let optCAFile: Int32 = 265
private let optInsecure: Int32 = 266
/// The range of `--max-frame-bytes`: the daemon's `max_frame_bytes` (1 ... 1G).
let maxFrameBytesRange = 1...(1 << 30)

private func letter(_ c: Character) -> Int32 { Int32(c.asciiValue!) }

private let commonOptions = [
    OptionSpec(name: "server", hasArgument: true, value: letter("s")),
    OptionSpec(name: "byte-order", hasArgument: true, value: optByteOrder),
    OptionSpec(name: "heartbeat", hasArgument: true, value: optHeartbeat),
    OptionSpec(name: "max-frame-bytes", hasArgument: true, value: optMaxFrameBytes),
    OptionSpec(name: "tls", hasArgument: false, value: optTLS),
    OptionSpec(name: "ca-file", hasArgument: true, value: optCAFile),
    OptionSpec(name: "insecure", hasArgument: false, value: optInsecure),
    OptionSpec(name: "help", hasArgument: false, value: letter("h")),
    OptionSpec(name: "version", hasArgument: false, value: letter("V")),
]
private let identityOptions = [
    OptionSpec(name: "name", hasArgument: true, value: letter("n")),
    OptionSpec(name: "room", hasArgument: true, value: letter("r")),
    OptionSpec(name: "level", hasArgument: true, value: letter("l")),
    OptionSpec(name: "icon", hasArgument: true, value: letter("i")),
    OptionSpec(name: "token", hasArgument: true, value: optToken),
]

private func options(for command: Subcommand) -> [OptionSpec] {
    switch command {
    case .chat:
        return identityOptions + commonOptions
    case .send:
        return identityOptions + [OptionSpec(name: "timeout", hasArgument: true, value: letter("t"))] + commonOptions
    case .token:
        return [
            OptionSpec(name: "key-file", hasArgument: true, value: optKeyFile),
            OptionSpec(name: "kid", hasArgument: true, value: optKid),
            OptionSpec(name: "sub", hasArgument: true, value: optSub),
            OptionSpec(name: "room", hasArgument: true, value: letter("r")),
            OptionSpec(name: "name", hasArgument: true, value: letter("n")),
            OptionSpec(name: "ttl", hasArgument: true, value: optTTL),
            OptionSpec(name: "help", hasArgument: false, value: letter("h")),
            OptionSpec(name: "version", hasArgument: false, value: letter("V")),
        ]
    case .listen:
        return identityOptions + [
            OptionSpec(name: "json", hasArgument: false, value: letter("j")),
            OptionSpec(name: "count", hasArgument: true, value: letter("c")),
        ] + commonOptions
    }
}

private func cString(_ s: StaticString) -> UnsafePointer<CChar> {
    UnsafeRawPointer(s.utf8Start).assumingMemoryBound(to: CChar.self)
}

/// Parses `roomcast SUBCOMMAND [OPTIONS] [ARGUMENTS]` (arguments without the
/// program name) with getopt_long(3). Options must come before arguments
/// (`+` mode), so a message may start with `-`; `--` ends the options.
/// Not reentrant: getopt's state is process-wide.
func parseCommandLine(_ arguments: [String]) -> Result<Invocation, UsageError> {
    guard let first = arguments.first else {
        return .failure(UsageError(message: "missing subcommand (chat, send or listen)", command: nil))
    }
    guard let command = Subcommand(rawValue: first) else {
        if first == "--help" || first == "-h" || first == "help" { return .success(Invocation(command: .chat, help: true, topLevel: true)) }
        if first == "--version" || first == "-V" { return .success(Invocation(command: .chat, version: true, topLevel: true)) }
        if first.hasPrefix("-") {
            return .failure(UsageError(message: "option '\(first)' must follow a subcommand (chat, send or listen)", command: nil))
        }
        return .failure(UsageError(message: "unknown subcommand '\(first)' (expected chat, send or listen)", command: nil))
    }
    let specs = options(for: command)
    var longOptions = specs.map {
        option(name: cString($0.name), has_arg: $0.hasArgument ? required_argument : no_argument, flag: nil, val: $0.value)
    }
    longOptions.append(option())
    // "+": stop at the first argument; ":": report a missing argument as ':'.
    let shortOptions = "+:" + specs.compactMap { spec in spec.short.map { String($0) + (spec.hasArgument ? ":" : "") } }.joined()

    let argv: [UnsafeMutablePointer<CChar>?] = (["roomcast " + first] + arguments.dropFirst()).map { strdup($0) } + [nil]
    defer { for p in argv { free(p) } }
    let argc = Int32(argv.count - 1)
    optind = 0  // full re-initialisation (glibc)
    opterr = 0  // we print our own messages
    var values: [(Int32, String?)] = []
    var failure: UsageError?
    shortOptions.withCString { shorts in
        while failure == nil {
            let c = getopt_long(argc, argv, shorts, longOptions, nil)
            if c == -1 { break }
            let previous = optind >= 1 && optind - 1 < argc ? argv[Int(optind) - 1].map { String(cString: $0) } : nil
            let typed = previous.map { $0.hasPrefix("--") ? String($0.prefix { $0 != "=" }) : $0 }
            switch c {
            case letter("?"):
                if let typed, typed.hasPrefix("--") {
                    failure = UsageError(
                        message: optopt != 0 ? "option '\(typed)' doesn't allow an argument" : "unrecognized option '\(typed)'",
                        command: command)
                } else {
                    failure = UsageError(message: "invalid option '-\(Character(Unicode.Scalar(UInt8(truncatingIfNeeded: optopt))))'", command: command)
                }
            case letter(":"):
                let name = typed.flatMap { $0.hasPrefix("--") ? $0 : nil }
                    ?? "-\(Character(Unicode.Scalar(UInt8(truncatingIfNeeded: optopt))))"
                failure = UsageError(message: "option '\(name)' requires an argument", command: command)
            default:
                values.append((c, optarg.map { String(cString: $0) }))
            }
        }
    }
    if let failure { return .failure(failure) }
    let rest = argv[Int(optind)..<Int(argc)].compactMap { $0.map { String(cString: $0) } }

    var invocation = Invocation(command: command)
    func fail(_ message: String) -> Result<Invocation, UsageError> { .failure(UsageError(message: message, command: command)) }
    for (c, value) in values {
        let v = value ?? ""
        switch c {
        case letter("s"):
            guard let server = ServerAddress.parse(v) else {
                return fail("option '--server': '\(v)' is not HOST:PORT (e.g. 127.0.0.1:9898 or [::1]:9898)")
            }
            invocation.server = server
        case optByteOrder:
            guard let order = ByteOrder(rawValue: v) else { return fail("option '--byte-order': '\(v)' is not little or big") }
            invocation.byteOrder = order
        case optHeartbeat:
            guard let ms = parseDuration(v) else { return fail("option '--heartbeat': '\(v)' is not a duration like 10s or 500ms (0: none)") }
            invocation.heartbeatMs = ms
        case optMaxFrameBytes:
            // The size syntax of the daemon's config (Units.swift): 512, 64K, 4M, 1G.
            guard let bytes = parseSize(v) else {
                return fail("option '--max-frame-bytes': '\(v)' is not a size (bytes, optionally with K, M or G = 1024-based, e.g. 256K)")
            }
            guard maxFrameBytesRange.contains(bytes) else {
                return fail("option '--max-frame-bytes': '\(v)' is out of range (1 .. 1G)")
            }
            invocation.maxFrameBytes = bytes
        case letter("t"):
            guard let ms = parseDuration(v), ms > 0 else { return fail("option '--timeout': '\(v)' is not a positive duration like 5s or 500ms") }
            invocation.timeoutMs = ms
        case letter("n"):
            guard !v.isEmpty else { return fail("option '--name': the name is empty") }
            invocation.name = v
        case letter("r"):
            guard !v.isEmpty else { return fail("option '--room': the room name is empty") }
            invocation.room = v
        case letter("l"):
            guard let level = Int32(v) else { return fail("option '--level': '\(v)' is not a 32-bit integer") }
            invocation.level = level
        case letter("i"):
            invocation.icon = v
        case optToken:
            guard !v.isEmpty else { return fail("option '--token': the token is empty") }
            invocation.token = v
        case optKeyFile:
            invocation.keyFile = v
        case optKid:
            invocation.kid = v
        case optSub:
            guard !v.isEmpty else { return fail("option '--sub': the account id is empty") }
            invocation.sub = v
        case optTLS:
            invocation.tls = true
        case optCAFile:
            guard !v.isEmpty else { return fail("option '--ca-file': the file name is empty") }
            invocation.caFile = v
        case optInsecure:
            invocation.insecure = true
        case optTTL:
            guard let ms = parseDuration(v), ms >= 1000 else { return fail("option '--ttl': '\(v)' is not a duration of at least 1s, like 1h or 10min") }
            invocation.ttlMs = ms
        case letter("j"):
            invocation.json = true
        case letter("c"):
            guard let count = Int(v), count > 0 else { return fail("option '--count': '\(v)' is not a positive integer") }
            invocation.count = count
        case letter("h"):
            invocation.help = true
        case letter("V"):
            invocation.version = true
        default:
            return fail("internal error: option \(c) has no handler")
        }
    }
    if invocation.help || invocation.version { return .success(invocation) }

    if invocation.token == nil, command != .token, let env = getenv("ROOMCAST_TOKEN"), env.pointee != 0 {
        invocation.token = String(cString: env)
    }
    switch command {
    case .token:
        if let extra = rest.first { return fail("unexpected argument '\(extra)'") }
        for (value, option) in [(invocation.keyFile, "--key-file"), (invocation.kid, "--kid"), (invocation.sub, "--sub")] where value == nil {
            return fail("option '\(option)' is required")
        }
        return .success(invocation)
    case .chat, .listen:
        if let extra = rest.first { return fail("unexpected argument '\(extra)'") }
    case .send:
        switch rest.first {
        case "text":
            guard rest.count == 2 else { return fail("'send text' takes one MESSAGE argument (quote it), got \(rest.count - 1)") }
            invocation.payload = .text(rest[1])
        case "gift":
            guard rest.count == 4 else { return fail("'send gift' takes NAME URL COUNT, got \(rest.count - 1) arguments") }
            guard let count = Int32(rest[3]) else { return fail("gift COUNT '\(rest[3])' is not a 32-bit integer") }
            invocation.payload = .gift(name: rest[1], url: rest[2], count: count)
        case nil:
            return fail("missing what to send: 'text MESSAGE' or 'gift NAME URL COUNT'")
        case let other?:
            return fail("unknown message kind '\(other)' (expected text or gift)")
        }
    }
    if command != .listen && invocation.name == nil { return fail("option '--name' is required") }
    return .success(invocation)
}
