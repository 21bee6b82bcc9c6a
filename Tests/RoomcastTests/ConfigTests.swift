import Testing
#if canImport(Glibc)
import Glibc
#endif
@testable import RoomcastCore

/// config/roomcastd.conf in the source tree (the source tree, not the build
/// dir, so #filePath is right here).
/// The repository's root folder.
private let repositoryRoot: String = {
    var parts = "\(#filePath)".split(separator: "/", omittingEmptySubsequences: false)
    parts.removeLast(3)  // ConfigTests.swift, RoomcastTests, Tests
    return parts.joined(separator: "/")
}()

private let shippedConfPath = repositoryRoot + "/config/roomcastd.conf"

private func parseError(_ text: String) -> ConfigError? {
    do {
        _ = try Config.parse(text, file: "t.conf")
        return nil
    } catch {
        return error
    }
}

/// Writes bytes to a fresh temporary file and returns its path.
private func tempFile(_ bytes: [UInt8]) -> String {
    var template = Array("/tmp/roomcast-config-test-XXXXXX".utf8CString)
    let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
    precondition(fd >= 0)
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    close(fd)
    return String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

@Suite struct UnitsTests {
    @Test(arguments: [
        ("0", 0), ("100ms", 100), ("30s", 30_000), ("5min", 300_000), ("1h", 3_600_000),
        ("1min 30s", 90_000), ("1min30s", 90_000), ("1h 1min 1s 1ms", 3_661_001),
        ("30", 30_000), ("  7s\t", 7_000), ("5 min", 300_000), ("0ms", 0), ("0s", 0),
        ("9223372036854775807ms", 9_223_372_036_854_775_807),
    ] as [(String, UInt64)])
    func durations(text: String, ms: UInt64) {
        #expect(parseDuration(text) == ms)
    }

    @Test(arguments: [
        "", " ", "30x", "1.5s", "-1s", "+1s", "s", "ms", "1min 30", "30 1min", "1m", "1sec", "1S",
        "1 h h", "99999999999999999999", "99999999999999999999s", "9223372036854775808ms",
        "2562047788015216h", "5124095576030431h 1h", "1h\n", "１s",
    ])
    func badDurations(text: String) {
        #expect(parseDuration(text) == nil)
    }

    @Test(arguments: [
        ("0", 0), ("1", 1), ("1000", 1000), ("1K", 1024), ("64K", 65_536), ("4M", 4 << 20),
        ("1G", 1 << 30), (" 2K ", 2048), ("8589934591G", 8_589_934_591 << 30),
        ("9223372036854775807", Int.max),
    ] as [(String, Int)])
    func sizes(text: String, bytes: Int) {
        #expect(parseSize(text) == bytes)
    }

    @Test(arguments: [
        "", "K", "1k", "1KB", "1 K", "1T", "-1", "+1", "1.5M", "0x10", "99999999999999999999K",
        "99999999999999999999", "9223372036854775808", "8589934592G", "9007199254740992K", "1KK",
    ])
    func badSizes(text: String) {
        #expect(parseSize(text) == nil)
    }

    @Test func formatting() {
        #expect(formatDuration(ms: 0) == "0")
        #expect(formatDuration(ms: 100) == "100ms")
        #expect(formatDuration(ms: 1500) == "1500ms")
        #expect(formatDuration(ms: 30_000) == "30s")
        #expect(formatDuration(ms: 300_000) == "5min")
        #expect(formatDuration(ms: 7_200_000) == "2h")
        #expect(formatSize(0) == "0")
        #expect(formatSize(1000) == "1000")
        #expect(formatSize(65_536) == "64K")
        #expect(formatSize(4 << 20) == "4M")
        #expect(formatSize(1 << 30) == "1G")
        #expect(formatSize(1536) == "1536")
        for ms: UInt64 in [0, 1, 999, 1000, 61_000, 3_600_000, 86_400_000, UInt64(Int64.max)] {
            #expect(parseDuration(formatDuration(ms: ms)) == ms)
        }
        for b in [0, 1, 1023, 1024, 65_542, 4 << 20, 3 << 30, Int.max] {
            #expect(parseSize(formatSize(b)) == b)
        }
    }
}

@Suite struct ListenAddressTests {
    @Test(arguments: [
        ("0.0.0.0:9898", "0.0.0.0", 9898, false), ("127.0.0.1:0", "127.0.0.1", 0, false),
        ("[::1]:9898", "::1", 9898, true), ("[::]:65535", "::", 65535, true),
        ("[0:0:0:0:0:0:0:1]:1", "::1", 1, true), ("[::FFFF:1.2.3.4]:80", "::ffff:1.2.3.4", 80, true),
    ] as [(String, String, UInt16, Bool)])
    func good(text: String, host: String, port: UInt16, v6: Bool) {
        let a = ListenAddress.parse(text)
        #expect(a == ListenAddress(host: host, port: port, isIPv6: v6))
        #expect(a.map { ListenAddress.parse($0.description) == $0 } == true)
    }

    @Test(arguments: [
        "", "9898", ":9898", "0.0.0.0", "0.0.0.0:", "0.0.0.0:65536", "0.0.0.0:-1", "0.0.0.0:+80",
        "0.0.0.0:99999999999999999999", "localhost:9898", "1.2.3:80", "1.2.3.4.5:80", "256.1.1.1:80",
        "::1:9898", "[::1]", "[::1]9898", "[::1]:", "[1.2.3.4]:80", "[::1%lo]:80", "[::1]:80x",
        " 1.2.3.4:80", "1.2.3.4 :80", "[]:80", "[::1:80",
    ])
    func bad(text: String) {
        #expect(ListenAddress.parse(text) == nil)
    }

    @Test("overlaps: what bind(2) would refuse with EADDRINUSE", arguments: [
        ("0.0.0.0:9000", "127.0.0.1:9000", true), ("127.0.0.1:9000", "0.0.0.0:9000", true),
        ("127.0.0.1:9000", "127.0.0.1:9000", true), ("[::]:9000", "[::1]:9000", true),
        ("127.0.0.1:9000", "127.0.0.2:9000", false), ("0.0.0.0:9000", "[::]:9000", false),
        ("0.0.0.0:9000", "0.0.0.0:9001", false), ("0.0.0.0:0", "127.0.0.1:0", false),
    ])
    func overlaps(a: String, b: String, expected: Bool) throws {
        let x = try #require(ListenAddress.parse(a)), y = try #require(ListenAddress.parse(b))
        #expect(x.overlaps(y) == expected)
    }

    @Test func descriptions() {
        #expect(ListenAddress(host: "1.2.3.4", port: 9898, isIPv6: false).description == "1.2.3.4:9898")
        #expect(ListenAddress(host: "::1", port: 9898, isIPv6: true).description == "[::1]:9898")
    }
}

@Suite struct ConfigTests {
    @Test func emptyTextGivesDefaults() throws {
        #expect(try Config.parse("", file: "t") == Config.defaults)
        #expect(try Config.parse("\n# only comments\n; here\n\n[server]\n[log]\n", file: "t") == Config.defaults)
        #expect(Config.defaults.server.listen.map(\.description) == ["0.0.0.0:9898"])
    }

    @Test func shippedFileEqualsDefaults() throws {
        #expect(try Config.load(path: shippedConfPath) == Config.defaults)
    }

    /// Uncommenting every `#key = value` line must still give the defaults:
    /// the documented values are the real ones. `[json] listen` and
    /// `[cluster] redis` have no default (they are off): their lines are
    /// examples, left commented.
    @Test func shippedFileUncommentedEqualsDefaults() throws {
        let bytes = try #require(readAll(shippedConfPath))
        let text = String(decoding: bytes, as: UTF8.self)
        var section = ""
        let uncommented = text.split(separator: "\n", omittingEmptySubsequences: false).map { line in
            if line.hasPrefix("[") { section = String(line) }
            if section == "[json]" && line.hasPrefix("#listen") { return line }
            if section == "[websocket]" && line.hasPrefix("#listen") { return line }
            if section == "[cluster]" && line.hasPrefix("#redis") { return line }
            if section == "[api]" && line.hasPrefix("#listen") { return line }
            if line.hasPrefix("#listen_tls") { return line }
            return line.hasPrefix("#") && line.contains(" = ") && !line.hasPrefix("# ") ? line.dropFirst() : line
        }.joined(separator: "\n")
        #expect(uncommented != text)
        #expect(try Config.parse(uncommented, file: "uncommented") == Config.defaults)
    }

    /// Every known key appears as `#key = ` in its section, with a comment
    /// line above it, sections in the documented order; and nothing else.
    @Test func shippedFileDocumentsEveryKey() throws {
        let bytes = try #require(readAll(shippedConfPath))
        let lines = String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init)
        var found: [String: [String]] = [:]
        var order: [String] = []
        var section = ""
        for (i, line) in lines.enumerated() {
            if line.hasPrefix("[") {
                section = String(line.dropFirst().dropLast())
                order.append(section)
            } else if line.hasPrefix("#"), !line.hasPrefix("# "), let eq = line.firstIndex(of: "=") {
                let key = line.dropFirst()[..<eq].trimmingSpaces
                found[section, default: []].append(key)
                #expect(lines[i - 1].hasPrefix("# "), "no comment above \(key)")
            }
        }
        #expect(order == Config.sectionOrder)
        #expect(order == ["server", "protocol", "heartbeat", "limits", "json", "websocket", "log", "cluster", "auth", "api", "tls", "rooms"])
        #expect(found == Config.knownKeys)
        #expect(Config.knownKeys.values.map(\.count).reduce(0, +) == 73)
    }

    /// The operator's documentation names every key: the table of
    /// docs/configuration.md and roomcastd.conf(5) cannot fall behind the parser.
    @Test(arguments: ["docs/configuration.md", "man/roomcastd.conf.5.scd"])
    func documentationNamesEveryKey(file: String) throws {
        let bytes = try #require(readAll(repositoryRoot + "/" + file))
        let text = String(decoding: bytes, as: UTF8.self)
        for section in Config.sectionOrder {
            #expect(text.contains("[\(section)]"), "\(file) has no [\(section)]")
            for key in Config.knownKeys[section]! {
                #expect(text.contains(file.hasSuffix(".md") ? "`\(key)`" : "*\(key) =*"), "\(file) does not document \(section).\(key)")
            }
        }
    }

    /// `[api] listen` takes TCP and Unix addresses, comma-separated and
    /// repeated; a Unix socket alone needs no key file.
    @Test func apiSection() throws {
        let c = try Config.parse("""
            [api]
            listen = unix:/run/roomcastd/api.sock
            allow_uids = 1000, 0 ,1000
            allow_gids = 27
            public_metrics = yes
            max_connections = 3
            """, file: "t.conf")
        #expect(c.api.listen == [.unix(path: "/run/roomcastd/api.sock")])
        #expect(c.api.allowUIDs == [1000, 0])
        #expect(c.api.allowGIDs == [27])
        #expect(c.api.publicMetrics && c.api.maxConnections == 3 && c.api.keyFile.isEmpty)
        let both = try Config.parse("[api]\nkey_file = /etc/roomcastd/api.keys\nlisten = 127.0.0.1:9899, [::1]:9899\nlisten = unix:/a.sock",
                                    file: "t.conf")
        #expect(both.api.listen.map(\.description) == ["127.0.0.1:9899", "[::1]:9899", "unix:/a.sock"])
        #expect(Config.defaults.api.listen.isEmpty)
    }

    @Test func everyKeyParsed() throws {
        let text = """
            [server]
            listen = 127.0.0.1:0
            max_clients = 5
            default_room = hall # not a comment
            max_clients_per_ip = 7
            [protocol]
            byte_order = big
            max_frame_bytes = 1M
            join_type = 3
            leave_type = 4
            heartbeat_type = 1
            echo = off
            validate = False
            max_violations = 10
            max_room_bytes = 1K
            notice_type = 77
            [heartbeat]
            timeout = 1min 30s
            tick = 250ms
            [limits]
            output_soft_bytes = 1M
            output_soft_seconds = 2
            output_hard_bytes = 2M
            frames_per_second = 50
            frames_burst = 100
            bytes_per_second = 1M
            bytes_burst = 2M
            shed = none
            [log]
            level = debug
            target = journal
            stats_interval = 0
            [json]
            listen = 127.0.0.1:9899
            listen = [::1]:9899
            max_frame_bytes = 4K
            heartbeat_timeout = 45s
            tcp_keepalive = 2min
            [websocket]
            listen = 127.0.0.1:9897
            allowed_origins = https://Example.com, http://127.0.0.1:8080
            max_message_bytes = 1M
            ping_interval = 10s
            echo = yes
            page = yes
            page_dir = /srv/roomcast/web
            [cluster]
            redis = [::1]:6380
            name = eu-west.1
            timeout = 500ms
            max_output_bytes = 1M
            [auth]
            key_file = /etc/roomcast/keys
            required = yes
            anonymous = read
            viewer_may = text, gift ,42
            [api]
            listen = 127.0.0.1:9896, unix:/run/api.sock
            key_file = /etc/roomcast/api.keys
            max_connections = 9
            allow_uids = 1000
            allow_gids = 100, 101
            public_metrics = yes
            """
        let c = try Config.parse(text, file: "t")
        let expected = Config(
            server: .init(listen: [ListenAddress(host: "127.0.0.1", port: 0, isIPv6: false)],
                          maxClients: 5, defaultRoom: "hall # not a comment", maxClientsPerIP: 7),
            protocol: .init(byteOrder: .big, maxFrameBytes: 1 << 20, joinType: 3, leaveType: 4,
                            heartbeatType: 1, echo: false, validate: false, maxViolations: 10, maxRoomBytes: 1024, noticeType: 77),
            heartbeat: .init(timeoutMs: 90_000, tickMs: 250),
            limits: .init(outputSoftBytes: 1 << 20, outputSoftMs: 2_000, outputHardBytes: 2 << 20,
                          framesPerSecond: 50, framesBurst: 100, bytesPerSecond: 1 << 20, bytesBurst: 2 << 20, shed: .none),
            log: .init(level: .debug, target: .journal, statsIntervalMs: 0),
            json: .init(listen: [ListenAddress(host: "127.0.0.1", port: 9899, isIPv6: false),
                                 ListenAddress(host: "::1", port: 9899, isIPv6: true)],
                        maxFrameBytes: 4096, heartbeatTimeoutMs: 45_000, tcpKeepaliveMs: 120_000),
            webSocket: .init(listen: [ListenAddress(host: "127.0.0.1", port: 9897, isIPv6: false)],
                             allowedOrigins: ["https://example.com", "http://127.0.0.1:8080"],
                             maxMessageBytes: 1 << 20, pingIntervalMs: 10_000, echo: true, page: true,
                             pageDir: "/srv/roomcast/web"),
            cluster: .init(redis: .tcp(host: "::1", port: 6380, isIPv6: true), name: "eu-west.1", timeoutMs: 500,
                           maxOutputBytes: 1 << 20),
            auth: .init(keyFile: "/etc/roomcast/keys", required: true, anonymous: .read, viewerMay: [2, 3, 42]),
            api: .init(listen: [.tcp(ListenAddress(host: "127.0.0.1", port: 9896, isIPv6: false)), .unix(path: "/run/api.sock")],
                       keyFile: "/etc/roomcast/api.keys", maxConnections: 9, allowUIDs: [1000], allowGIDs: [100, 101], publicMetrics: true))
        #expect(c == expected)
    }

    @Test(arguments: [("yes", true), ("no", false), ("true", true), ("false", false), ("on", true),
                      ("off", false), ("1", true), ("0", false), ("YES", true), ("Off", false)])
    func booleans(text: String, value: Bool) throws {
        #expect(try Config.parse("[protocol]\necho = \(text)", file: "t").protocol.echo == value)
    }

    @Test func repeatedListenReplacesDefault() throws {
        let c = try Config.parse("""
            [server]
            listen = [::1]:9898
            listen = 10.0.0.1:1234
            [log]
            level = error
            [server]
            listen = [::]:0
            listen = [::]:0
            """, file: "t")
        #expect(c.server.listen.map(\.description) == ["[::1]:9898", "10.0.0.1:1234", "[::]:0", "[::]:0"])
        #expect(c.log.level == .error)
    }

    @Test func crlfAndBOM() throws {
        let text = "\u{FEFF}[heartbeat]\r\ntimeout = 5s\r\n\r\n# c\r\n[log]\r\nlevel = warning\r\n"
        let c = try Config.parse(text, file: "t")
        #expect(c.heartbeat.timeoutMs == 5_000)
        #expect(c.log.level == .warning)
        // Line numbers still count CRLF lines.
        let e = parseError("\u{FEFF}[log]\r\nlevel = info\r\nlevel = info\r\n")
        #expect(e?.line == 3)
        // From a file too.
        let path = tempFile([0xEF, 0xBB, 0xBF] + Array("[log]\r\nlevel = debug\r\n".utf8))
        defer { unlink(path) }
        #expect(try Config.load(path: path).log.level == .debug)
    }

    /// Debian's libinih splits lines over 200 characters; the rest would
    /// become a bogus line. Here a 10,000-character line is one line.
    @Test func longLinesAreOneLine() throws {
        let filler = String(repeating: "x", count: 10_000)
        // A long comment containing '=' stays a comment.
        let c = try Config.parse("[log]\n# \(filler) = 1\nlevel = debug\n", file: "t")
        #expect(c.log.level == .debug)
        // A long value is one value; the error is on its line and short.
        let e = try #require(parseError("[server]\n\ndefault_room = \(filler)\n"))
        #expect(e.line == 3)
        #expect(e.reason.contains("10000 bytes long, at most 255"))
        #expect(e.description.utf8.count < 200)
        // 255 bytes of UTF-8 is the limit, counted in bytes.
        let room = String(repeating: "é", count: 127) + "x"  // 255 bytes
        #expect(try Config.parse("[server]\ndefault_room = \(room)", file: "t").server.defaultRoom == room)
        #expect(parseError("[server]\ndefault_room = \(room)x") != nil)
    }

    @Test(arguments: [
        // syntax
        ("[server]\nmax_clients 5", 2, "expected 'key = value'"),
        ("max_clients = 5", 1, "outside any section"),
        ("\n\n[server\n", 3, "malformed section header"),
        ("[server] # c\n", 1, "malformed section header"),
        ("[]\n", 1, "malformed section header"),
        ("[server]\n = 5\n", 2, "missing key name"),
        // unknown names
        ("[srever]\n", 1, "unknown section '[srever]' (did you mean '[server]'?)"),
        ("[Server]\n", 1, "did you mean '[server]'?"),
        ("[server]\n\nmax_client = 5", 3, "unknown key 'max_client' in [server] (did you mean 'max_clients'?)"),
        ("[server]\nMax_Clients = 5", 2, "did you mean 'max_clients'?"),
        ("[server]\ntimeout = 5s", 2, "it belongs in [heartbeat]"),
        ("[log]\nbogus = 1", 2, "unknown key 'bogus' in [log]"),
        // duplicates
        ("[server]\nmax_clients = 5\n\n[log]\n[server]\nmax_clients = 6", 6, "already set at line 2"),
        ("[server]\nlisten = 1.2.3.4:80\nlisten = 1.2.3.4:80", 3, "already listed at line 2"),
        ("[server]\nlisten = 0.0.0.0:80\nlisten = 127.0.0.1:80", 3, "server.listen: 127.0.0.1:80 overlaps 0.0.0.0:80 at line 2"),
        // bad values
        ("[server]\nlisten = localhost:80", 2, "server.listen: 'localhost:80' is not a listen address"),
        ("[server]\nlisten = ::1:80", 2, "[IPv6]:PORT"),
        ("[server]\nlisten =", 2, "is not a listen address"),
        ("[server]\nmax_clients = ten", 2, "server.max_clients: 'ten' is not a non-negative integer"),
        ("[server]\nmax_clients = 0", 2, "out of range (1 .. 1048576)"),
        ("[server]\nmax_clients = -1", 2, "is not a non-negative integer"),
        ("[server]\nmax_clients = 99999999999999999999", 2, "out of range (1 .. 1048576)"),
        ("[server]\ndefault_room =", 2, "server.default_room: must not be empty"),
        ("[protocol]\nbyte_order = network", 2, "'network' is not one of little, big"),
        ("[limits]\nshed = gifts", 2, "limits.shed: 'gifts' is not one of text, none"),
        ("[limits]\nshed_after = 25h", 2, "limits.shed_after: '25h' is out of range (0 .. 24h)"),
        ("[limits]\nshed_after = soon", 2, "limits.shed_after: 'soon' is not a duration"),
        ("[limits]\noutput_soft_seconds = 2s\nshed_after = 3s", 3,
         "limits.shed_after (3s) must not exceed limits.output_soft_seconds (2s)"),
        ("[protocol]\nmax_frame_bytes = 0", 2, "out of range (1 .. 1G)"),
        ("[protocol]\nmax_frame_bytes = 2G", 2, "out of range"),
        ("[protocol]\nmax_frame_bytes = 64KB", 2, "is not a size"),
        ("[protocol]\nmax_frame_bytes = 99999999999999999999K", 2, "is too large"),
        ("[protocol]\njoin_type = 65536", 2, "out of range (0 .. 65535)"),
        ("[protocol]\nleave_type = 0x1", 2, "not a non-negative integer"),
        ("[protocol]\necho = maybe", 2, "protocol.echo: 'maybe' is not a boolean (yes/no, true/false, on/off, 1/0)"),
        ("[protocol]\nvalidate = 2", 2, "is not a boolean"),
        ("[protocol]\nmax_violations = 99999999999999999999", 2, "out of range (1 ..)"),
        ("[protocol]\nmax_violations = 0", 2, "protocol.max_violations: '0' is out of range (1 ..)"),
        ("[protocol]\nmax_room_bytes = 0", 2, "protocol.max_room_bytes: '0' is out of range (1 .. 64K)"),
        ("[protocol]\n\nmax_room_bytes = 65537", 3, "protocol.max_room_bytes: '65537' is out of range (1 .. 64K)"),
        ("[protocol]\nmax_room_bytes = 1M", 2, "out of range (1 .. 64K)"),
        ("[protocol]\nmax_room_bytes = many", 2, "protocol.max_room_bytes: 'many' is not a size"),
        ("[protocol]\nmax_room_bytes = -5", 2, "is not a size"),
        ("[heartbeat]\ntimeout = 30x", 2, "heartbeat.timeout: '30x' is not a duration (e.g. 100ms, 30s, 5min"),
        ("[heartbeat]\ntimeout = 25h", 2, "out of range (0 .. 24h)"),
        ("[heartbeat]\ntimeout = 99999999999999999999h", 2, "heartbeat.timeout: '99999999999999999999h' is too large"),
        ("[heartbeat]\ntimeout = 9999999999999h", 2, "is too large"),
        ("[heartbeat]\ntick = 0", 2, "out of range (1ms .. 10s)"),
        ("[heartbeat]\ntick = 11s", 2, "out of range (1ms .. 10s)"),
        ("[limits]\noutput_soft_bytes = lots", 2, "limits.output_soft_bytes: 'lots' is not a size"),
        ("[limits]\noutput_soft_seconds = 10 s s", 2, "is not a duration"),
        ("[log]\nlevel = INFO", 2, "log.level: 'INFO' is not one of debug, info, notice, warning, error"),
        ("[log]\ntarget = syslog", 2, "not one of auto, journal, stderr"),
        ("[log]\nstats_interval = -1", 2, "is not a duration"),
        ("[log]\nstats_interval = 1ms", 2, "log.stats_interval: '1ms' is too short: 0 (off) or at least 1s"),
        ("[server]\nmax_clients = 5\u{0}\n", 2, "server.max_clients: '5\\u0000' is not a non-negative integer"),
        ("[server]\nmax_clients = \u{1B}[31m", 2, "server.max_clients: '\\u001b[31m' is not"),
        ("[server]\nmax_clients = 1\u{7F}\u{9B}2", 2, "server.max_clients: '1\\u007f\\u009b2' is not"),
        // cross-key rules: reported at the later line
        ("[protocol]\njoin_type = 8", 2, "protocol.join_type: 8 is the same as protocol.heartbeat_type"),
        ("[protocol]\nleave_type = 5\n\njoin_type = 5", 4, "protocol.join_type: 5 is the same as protocol.leave_type"),
        ("[protocol]\njoin_type = 5\nleave_type = 5", 3, "protocol.leave_type: 5 is the same as protocol.join_type"),
        ("[heartbeat]\ntimeout = 100ms", 2, "heartbeat.tick (100ms) must be less than heartbeat.timeout (100ms)"),
        ("[heartbeat]\ntick = 5s\ntimeout = 2s", 3, "must be less than"),
        ("[limits]\noutput_hard_bytes = 128K", 2, "output_soft_bytes (256K) must not exceed limits.output_hard_bytes (128K)"),
        ("[limits]\noutput_soft_bytes = 1K\noutput_hard_bytes = 65541\n", 3, "at least protocol.max_frame_bytes + 6 (65542)"),
        ("[limits]\noutput_soft_bytes = 1K\noutput_hard_bytes = 64K\n[protocol]\nmax_frame_bytes = 65531", 5, "at least"),
        ("[json]\nlisten = localhost:9899", 2, "json.listen: 'localhost:9899' is not a listen address"),
        ("[server]\nlisten = 127.0.0.1:9898\n[json]\nlisten = 127.0.0.1:9898", 4, "127.0.0.1:9898 is already listed at line 2"),
        ("[websocket]\nlisten = 127.0.0.1:9899\n[json]\nlisten = 0.0.0.0:9899", 4, "overlaps 127.0.0.1:9899 at line 2"),
        ("[websocket]\nallowed_origins = example.com", 2, "websocket.allowed_origins: 'example.com' is not an origin"),
        ("[websocket]\nallowed_origins = https://a.example/path", 2, "is not an origin"),
        ("[websocket]\nallowed_origins = https://a.example,", 2, "'' is not an origin"),
        ("[websocket]\nmax_message_bytes = 100", 2, "websocket.max_message_bytes: '100' is out of range"),
        ("[websocket]\nping_interval = 500ms", 2, "websocket.ping_interval: '500ms' is out of range"),
        ("[websocket]\necho = maybe", 2, "is not a boolean"),
        ("[websocket]\npage_dir = web", 2, "websocket.page_dir: 'web' is not an absolute path"),
        ("[json]\nmax_frame_bytes = 0", 2, "json.max_frame_bytes: '0' is out of range"),
        ("[json]\nheartbeat_timeout = 50ms", 2, "heartbeat.tick (100ms) must be less than json.heartbeat_timeout (50ms)"),
        ("[json]\ntcp_keepalive = 1500ms", 2, "json.tcp_keepalive must be whole seconds"),
        ("[json]\ntcp_keepalive = 3h", 2, "out of range"),
        ("[json]\nmax_frame_bytes = 5M", 2, "at least json.max_frame_bytes + 4"),
        ("[limits]\nbytes_per_second = 1K", 2, "it must hold one frame of max_frame_bytes (65542 with its header)"),
        ("[limits]\nbytes_per_second = 1M\nbytes_burst = 64K", 3, "limits.bytes_burst (or bytes_per_second when the burst is 0) is 64K"),
        ("[limits]\nframes_per_second = -1", 2, "is not a non-negative integer"),
        ("[server]\ndefault_room = lobby-of-11\n[protocol]\nmax_room_bytes = 10", 4,
         "server.default_room is 11 bytes, over protocol.max_room_bytes (10): a join naming the default room would be refused"),
        ("[protocol]\nmax_room_bytes = 4\n", 2, "server.default_room is 5 bytes"),
        ("[server]\nmax_clients_per_ip = 2000000", 2, "out of range"),
        ("[api]\nlisten = localhost:9899", 2, "api.listen: 'localhost:9899' is not a listen address (expected IPv4:PORT, [IPv6]:PORT or unix:/PATH"),
        ("[api]\nlisten = unix:relative.sock", 2, "is not a listen address"),
        ("[api]\nkey_file = /k\nlisten = 127.0.0.1:9899, unix:/run/a.sock, 127.0.0.1:9899", 3, "127.0.0.1:9899 is listed twice"),
        ("[server]\nlisten = 0.0.0.0:9899\n[api]\nkey_file = /k\nlisten = 127.0.0.1:9899", 5, "overlaps 0.0.0.0:9899 at line 2"),
        ("[api]\nlisten = 127.0.0.1:9899", 2, "api.listen on TCP needs api.key_file"),
        ("[api]\nkey_file = keys", 2, "api.key_file: 'keys' is not an absolute path"),
        ("[api]\nmax_connections = 0", 2, "api.max_connections: '0' is out of range"),
        ("[api]\nallow_uids = 1000, www-data", 2, "api.allow_uids: 'www-data' is not a numeric id"),
        ("[api]\nallow_gids = 4294967295", 2, "is not a numeric id"),
        ("[api]\npublic_metrics = sometimes", 2, "is not a boolean"),
        // the first error wins
        ("[log]\nlevel = loud\nlevel = quiet", 2, "'loud'"),
    ] as [(String, Int, String)])
    func errorsNameTheirLine(text: String, line: Int, reason: String) throws {
        let e = try #require(parseError(text), "accepted: \(text)")
        #expect(e.line == line, "\(e)")
        #expect(e.reason.contains(reason), "\(e)")
        #expect(e.file == "t.conf")
        #expect(e.description.hasPrefix("t.conf:\(line): "))
    }

    @Test("max_room_bytes: 255 by default, 1 ... 64K in the size syntax, counted in bytes of UTF-8 against default_room")
    func maxRoomBytes() throws {
        #expect(Config.defaults.protocol.maxRoomBytes == 255)
        #expect(try Config.parse("[protocol]\nmax_room_bytes = 64K", file: "t").protocol.maxRoomBytes == 65_536)
        #expect(try Config.parse("[protocol]\nmax_room_bytes = 1\n[server]\ndefault_room = x", file: "t").protocol.maxRoomBytes == 1)
        // "café" in NFC is 5 bytes: it fits in 5, not in 4.
        #expect(try Config.parse("[protocol]\nmax_room_bytes = 5\n[server]\ndefault_room = caf\u{E9}", file: "t").server.defaultRoom == "caf\u{E9}")
        #expect(parseError("[protocol]\nmax_room_bytes = 4\n[server]\ndefault_room = caf\u{E9}")?.line == 4)
    }

    @Test func edgeValuesAccepted() throws {
        let c = try Config.parse("""
            [protocol]
            max_frame_bytes = 1G
            join_type = 65535
            leave_type = 0
            heartbeat_type = 1
            [limits]
            output_hard_bytes = 1048582K
            output_soft_bytes = 0
            output_soft_seconds = 0
            [heartbeat]
            timeout = 0
            tick = 10s
            """, file: "t")
        #expect(c.protocol.maxFrameBytes == 1 << 30)
        #expect(c.limits.outputHardBytes == (1 << 30) + 6 * 1024)
        #expect(parseError("[protocol]\nmax_frame_bytes = 1G\n[limits]\noutput_hard_bytes = 1G")?.line == 4)
        #expect(c.heartbeat.timeoutMs == 0)
        #expect(c.heartbeat.tickMs == 10_000)
    }

    @Test func loadErrors() throws {
        do {
            _ = try Config.load(path: "/nonexistent/roomcastd.conf")
            Issue.record("loaded a missing file")
        } catch {
            #expect(error.line == nil)
            #expect(error.description == "/nonexistent/roomcastd.conf: cannot open: No such file or directory")
        }
        do {
            _ = try Config.load(path: "/tmp")
            Issue.record("loaded a directory")
        } catch {
            #expect(error.line == nil)
            #expect(error.reason == "not a regular file")
        }
        // A FIFO with no writer must not block (the event loop reloads inline).
        let base = tempFile([])
        let fifo = base + ".fifo"
        #expect(mkfifo(fifo, 0o600) == 0)
        defer { unlink(fifo); unlink(base) }
        do {
            _ = try Config.load(path: fifo)
            Issue.record("loaded a FIFO")
        } catch {
            #expect(error.reason == "not a regular file")
        }
        let path = tempFile(Array("[server]\ndefault_room = ok\n[log]\nlevel = ".utf8) + [0xFF, 0x0A])
        defer { unlink(path) }
        do {
            _ = try Config.load(path: path)
            Issue.record("loaded invalid UTF-8")
        } catch {
            #expect(error.line == 4)
            #expect(error.reason == "invalid UTF-8")
        }
    }

    @Test func logLevels() {
        #expect(LogLevel.debug < .info && LogLevel.info < .notice && LogLevel.notice < .warning)
        #expect(LogLevel.warning < .error)
        #expect(LogLevel.allCases.map(\.syslogPriority) == [7, 6, 5, 4, 3])
        #expect(LogTarget(rawValue: "journal") == .journal)
    }

    @Test func iniDocumentKeepsOrderAndValues() throws {
        let doc = try INIDocument.parse("[a]\n  k  =  v = w  \n;c\n[b]\nx=\n[a]\n", file: "t")
        #expect(doc.items == [
            .section(name: "a", line: 1),
            .entry(INIEntry(section: "a", key: "k", value: "v = w", line: 2)),
            .section(name: "b", line: 4),
            .entry(INIEntry(section: "b", key: "x", value: "", line: 5)),
            .section(name: "a", line: 6),
        ])
    }
}

private func readAll(_ path: String) -> [UInt8]? {
    guard let f = fopen(path, "rb") else { return nil }
    defer { fclose(f) }
    var out: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = fread(&buf, 1, buf.count, f)
        if n == 0 { break }
        out += buf[..<n]
    }
    return out
}

extension Substring {
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
    }
}

/// `[cluster]`: the Redis address is numeric or a Unix socket,
/// never a host name, and every refusal names the file and line.
@Suite struct ClusterConfigTests {
    @Test(arguments: [
        ("127.0.0.1:6379", RedisAddress.tcp(host: "127.0.0.1", port: 6379, isIPv6: false)),
        ("[::1]:6379", .tcp(host: "::1", port: 6379, isIPv6: true)),
        ("[0:0::1]:1", .tcp(host: "::1", port: 1, isIPv6: true)),
        ("unix:/run/redis/redis-server.sock", .unix(path: "/run/redis/redis-server.sock")),
    ])
    func addresses(text: String, address: RedisAddress) throws {
        let c = try Config.parse("[cluster]\nredis = \(text)\n", file: "t")
        #expect(c.cluster.redis == address)
        #expect(RedisAddress.parse(address.description) == address)
    }

    @Test(arguments: ["redis.internal:6379", "localhost:6379", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536",
                      "::1:6379", "unix:", "unix:relative.sock", "unix:/" + String(repeating: "x", count: 107), ""])
    func refusedAddresses(text: String) throws {
        let text = "[cluster]\n# the broker\nredis = \(text)\n"
        #expect(throws: ConfigError.self) { try Config.parse(text, file: "c.conf") }
        do {
            _ = try Config.parse(text, file: "c.conf")
        } catch {
            #expect(error.line == 3)
            #expect(error.description.hasPrefix("c.conf:3: cluster.redis: "))
            #expect(error.reason.contains("host names are not resolved"))
        }
    }

    @Test func offByDefault() throws {
        let c = try Config.parse("", file: "t")
        #expect(c.cluster.redis == nil)
        #expect(c.cluster.name == "main")
        #expect(c.cluster.timeoutMs == 2_000)
        #expect(c.cluster.restartGraceMs == 1_000)
        #expect(c.cluster.maxOutputBytes == 4 << 20)
        #expect(try Config.parse("[cluster]\nrestart_grace = 300ms\n", file: "t").cluster.restartGraceMs == 300)
    }

    @Test(arguments: [("name = a:b", 2, "not a cluster name"), ("name = ", 2, "not a cluster name"),
                      ("name = " + String(repeating: "n", count: 65), 2, "not a cluster name"),
                      ("timeout = 50ms", 2, "out of range"), ("timeout = 2min", 2, "out of range"),
                      ("restart_grace = 50ms", 2, "out of range"), ("restart_grace = 2min", 2, "out of range"),
                      ("max_output_bytes = 1K", 2, "out of range"), ("sharded = yes", 2, "unknown key")])
    func refusedValues(line: String, at: Int, reason: String) throws {
        do {
            _ = try Config.parse("[cluster]\n\(line)\n", file: "t")
            Issue.record("'\(line)' was accepted")
        } catch {
            #expect(error.line == at)
            #expect(error.reason.contains(reason), "\(error)")
        }
    }
}

@Suite struct WebSocketConfigTests {
    @Test("pings come at half of heartbeat.timeout when that is shorter than ping_interval")
    func effectivePingInterval() throws {
        let ws = Config.defaults.webSocket
        #expect(ws.effectivePingIntervalMs(heartbeatTimeoutMs: 30_000) == 25_000)  // the defaults: every 25 s
        #expect(ws.effectivePingIntervalMs(heartbeatTimeoutMs: 25_000) == 12_500)
        #expect(ws.effectivePingIntervalMs(heartbeatTimeoutMs: 60_000) == 25_000)
        #expect(ws.effectivePingIntervalMs(heartbeatTimeoutMs: 2_000) == 1_000)
        #expect(ws.effectivePingIntervalMs(heartbeatTimeoutMs: 0) == 25_000)
    }
}
