@preconcurrency import Glibc

// Command line of roomcast-bench (GNU style: `--opt VALUE` or `--opt=VALUE`).
// A `--mode` picks the defaults of one workload of BENCHMARKS.md; any option given
// explicitly overrides them, whatever its position.

enum Target: String { case roomcast, redis }

enum Mode: String, CaseIterable {
    /// Whatever the options say (default: 100 members, 1 publisher, closed loop).
    case custom
    /// 1 publisher, 1,000 members, 64-byte text bodies, closed loop (window 64).
    case fanout
    /// 10 publishers, 100 members, 64-byte text bodies, closed loop (window 64).
    case pub10
    /// 1 publisher at 200 frames/s, 5,000 members: the latency distribution.
    case latency
    /// 16 KiB text bodies to 100 members, closed loop (window 64).
    case large
    /// N idle connections heartbeating: daemon RSS per connection and idle CPU.
    case idle
    /// 10,000 connects as fast as possible while a probe room measures latency.
    case storm
    /// 1 API connection publishing (`POST /v1/rooms/bench/publish`, closed
    /// loop) into 1,000 members, 64-byte text bodies; needs `--api-port`.
    case publish
}

enum BodyKind: String { case opaque, text }

struct Options {
    var mode = Mode.custom
    var target = Target.roomcast
    var host = "127.0.0.1"
    var port: UInt16 = 9898
    /// `--port P1,P2,...`: several daemons of one cluster (one cluster). The
    /// publishers connect to the first; members are spread over all, round robin.
    var ports: [UInt16] = []
    /// `--websocket-port P`: members connect to the daemon's WebSocket listener
    /// there (subprotocol roomcast.ltb.v1: one LTB frame per binary message,
    /// docs/protocol/websocket.md §15) instead of `--port`; publishers stay on LTB.
    var webSocketPort: UInt16?
    var members = 100
    /// `--tls`: every connection does a TLS handshake first (roomcastd's
    /// `listen_tls`; the certificate is not verified: a benchmark on loopback).
    var tls = false
    var publishers = 1
    var size = 64
    /// Open loop: frames per second, all publishers together. nil: closed loop.
    var rate: Double?
    /// Closed loop: frames each publisher may have outstanding (sent, not yet
    /// received by every member).
    var window = 32
    var duration = 10.0
    /// Seconds of load before measuring starts (excluded from the figures).
    var warmup = 1.0
    /// Seconds allowed, after sending stops, for the last frames to arrive.
    var drain = 3.0
    /// Stop after this many frames per publisher (closed or open loop) instead of `duration`.
    var frames: Int?
    var room = "bench"
    var body = BodyKind.opaque
    /// LTB type of the data frames (opaque bodies); text frames use type 2.
    var frameType: UInt16 = 100
    /// Whether the daemon echoes frames to their sender (bench config: no).
    var echo = false
    var json = false
    /// Idle or storm connections.
    var connections = 0
    /// Members per room of the idle and storm connections (0: they do not join or subscribe).
    var roomSize = 100
    /// Seconds between two heartbeats of one connection (0: none).
    var heartbeat = 10.0
    var serverPid: Int32?
    /// `--cpu-pids P1,P2,...`: more processes whose CPU is measured over the
    /// window (the other daemons of a cluster, redis-server), reported as `cpu_pidN_pct`.
    var cpuPids: [Int32] = []
    /// Idle mode: connection counts at which the daemon's RSS is sampled.
    var rssSteps: [Int] = []
    /// Connects in progress at once (set-up; storm: 0 = all at once).
    var connectInflight = 512
    var stormInflight = 0
    /// Longest set-up (connect + join) before giving up, seconds.
    var setupTimeout = 240.0
    var label: String?
    /// Name of the server under test in the output (default: the target).
    var server: String?
    var maxFrameBytes = 1 << 20
    /// SO_RCVBUF of every connection in bytes (0: the kernel's autotuning).
    var receiveBuffer = 0
    /// Bytes asked of one read(2) (at most the scratch buffer).
    var readSize = 256 * 1024
    /// `--api-port P`: the publishers are keep-alive HTTP/1.1 connections to
    /// the daemon's API there (docs/api.md), each with one
    /// `POST /v1/rooms/{room}/publish` outstanding at a time (closed loop).
    var apiPort: UInt16?
    /// `--api-key-file PATH`: its first key is the bearer key (api.key_file's format).
    var apiKeyFile: String?
    /// `--idempotency`: every publish carries an `Idempotency-Key` of its own.
    var idempotency = false

    var api: Bool { apiPort != nil }

    var closedLoop: Bool { rate == nil }

    static let usage = """
        Usage: roomcast-bench [OPTIONS]

        Single-threaded epoll load generator for roomcastd (LTB frames) or Redis
        PUBLISH/SUBSCRIBE (RESP), loopback only. Members join one room (or
        SUBSCRIBE one channel); publishers send frames whose body carries the
        publisher, a sequence number and the CLOCK_MONOTONIC send time.

        Workload:
          --mode M              custom (default), fanout, pub10, latency, large, idle, storm, publish:
                                sets the defaults below for that workload of BENCHMARKS.md
          --members N           receiving members of the room (default 100)
          --tls                 connect with TLS (to a listen_tls port; the certificate is not checked)
          --publishers P        publishers, also in the room (default 1)
          --size B              body bytes of a data frame (default 64; >= 20 opaque, >= 64 text)
          --body opaque|text    opaque type-100 bodies, or proto2 ChatMessage (type 2, validated
                                by roomcastd; the default of the load modes)
          --frame-type T        LTB type of opaque frames (default 100)
          --window W            closed loop: frames outstanding per publisher (default 32);
                                a frame is done when every member got it
          --rate R              open loop: R frames/s over all publishers (replaces --window)
          --frames N            stop after N frames per publisher instead of --duration
          --duration S          seconds of measured load (default 10)
          --warmup S            seconds of load before measuring (default 1)
          --drain S             seconds to wait for the last frames (default 3)
          --room NAME           room / channel (default bench)
          --heartbeat S         heartbeat (LTB type 8 / Redis PING) period per connection, 0 = off (default 10)
          --idle                idle mode (same as --mode idle)
          --connections N       idle or storm connections
          --room-size N         members per room of idle/storm connections (default 100; 0 = no join)
          --rss-steps A,B,...   idle: sample the server's RSS at these connection counts
          --connect-inflight N  connects in progress at once during set-up (default 512)
          --storm-inflight N    storm: connects in progress at once (default 0 = all)
          --setup-timeout S     give up if set-up takes longer (default 240)
          --echo yes|no         whether the daemon echoes to the sender (default no, as the bench config)
          --rcvbuf B            SO_RCVBUF of every connection, bytes (default 0: kernel autotuning)
          --read-size B         bytes asked of one read(2) (default 262144)

        Backend API (publish mode):
          --api-port P          the publishers are HTTP/1.1 keep-alive connections to roomcastd's
                                API on P, each with one POST /v1/rooms/ROOM/publish outstanding
                                (closed loop, --publishers of them); text bodies only
          --api-key-file PATH   the bearer key: the first key of PATH (api.key_file's format)
          --idempotency         every publish carries an Idempotency-Key of its own (its cost)

        Target:
          --target roomcast|redis   (default roomcast)
          --host H              127.x.x.x only (default 127.0.0.1)
          --port P[,P2...]      (default 9898); several: daemons of one cluster, publishers on
                                the first, members spread over all of them
          --websocket-port P    members are WebSocket clients of roomcastd's listener on P
                                (roomcast.ltb.v1: each binary message one LTB frame); publishers
                                stay on --port
          --server-pid PID      read the server's RSS (/proc/PID/status) and CPU (/proc/PID/stat)
          --cpu-pids P1,P2...   also measure these processes' CPU over the window (cpu_pidN_pct)

        Output:
          --json                one JSON object instead of the table
          --label TEXT          carried into the output
          --server NAME         name of the server under test in the output (default: the target)
          -h, --help
        """

    struct UsageError: Error { var message: String }

    static func parse(_ args: [String]) throws(UsageError) -> Options {
        var o = Options()
        // Pass 1: the mode's defaults.
        var explicitMode: Mode?
        var i = 0
        while i < args.count {
            let (name, inline) = split(args[i])
            if name == "--idle" { explicitMode = explicitMode ?? .idle }
            if name == "--mode" {
                let v = inline ?? (i + 1 < args.count ? args[i + 1] : "")
                guard let m = Mode(rawValue: v) else { throw UsageError(message: "unknown mode '\(v)'") }
                explicitMode = m
            }
            i += 1
        }
        if let m = explicitMode { o.applyDefaults(of: m) }
        // Pass 2: everything, overriding the defaults.
        i = 0
        while i < args.count {
            let (name, inline) = split(args[i])
            func value() throws(UsageError) -> String {
                if let inline { return inline }
                i += 1
                guard i < args.count else { throw UsageError(message: "option '\(name)' requires an argument") }
                return args[i]
            }
            func int(_ min: Int = 0, _ max: Int = Int.max) throws(UsageError) -> Int {
                let v = try value()
                guard let n = Int(v), n >= min, n <= max else { throw UsageError(message: "\(name): '\(v)' is not an integer in \(min)...\(max)") }
                return n
            }
            func double() throws(UsageError) -> Double {
                let v = try value()
                guard let d = Double(v), d >= 0, d.isFinite else { throw UsageError(message: "\(name): '\(v)' is not a non-negative number") }
                return d
            }
            switch name {
            case "-h", "--help": print(usage); exit(0)
            case "--mode": _ = try value()
            case "--idle": break
            case "--target":
                let v = try value()
                guard let t = Target(rawValue: v) else { throw UsageError(message: "unknown target '\(v)'") }
                o.target = t
            case "--host": o.host = try value()
            case "--port":
                let v = try value()
                let list = v.split(separator: ",").compactMap { UInt16($0) }.filter { $0 > 0 }
                guard !list.isEmpty, list.count == v.split(separator: ",", omittingEmptySubsequences: false).count else {
                    throw UsageError(message: "--port: '\(v)' is not a port or a comma-separated list of ports")
                }
                o.port = list[0]
                o.ports = list
            case "--websocket-port": o.webSocketPort = UInt16(try int(1, 65535))
            case "--members": o.members = try int(0, 19_000)
            case "--publishers": o.publishers = try int(1, 1_000)
            case "--size": o.size = try int(20, 1 << 20)
            case "--body":
                let v = try value()
                guard let b = BodyKind(rawValue: v) else { throw UsageError(message: "unknown body '\(v)'") }
                o.body = b
            case "--frame-type": o.frameType = UInt16(try int(0, 65535))
            case "--window": o.window = try int(1, 1 << 16); o.rate = nil
            case "--rate":
                let r = try double()
                guard r > 0 else { throw UsageError(message: "--rate must be positive") }
                o.rate = r
            case "--frames": o.frames = try int(1)
            case "--duration": o.duration = try double()
            case "--warmup": o.warmup = try double()
            case "--drain": o.drain = try double()
            case "--room": o.room = try value()
            case "--heartbeat": o.heartbeat = try double()
            case "--connections": o.connections = try int(0, 19_500)
            case "--room-size": o.roomSize = try int(0, 19_500)
            case "--rss-steps":
                let parts = try value().split(separator: ",")
                o.rssSteps = try parts.map { (p: Substring) throws(UsageError) -> Int in
                    guard let n = Int(p), n > 0 else { throw UsageError(message: "--rss-steps: '\(p)' is not a positive integer") }
                    return n
                }
            case "--connect-inflight": o.connectInflight = try int(1, 20_000)
            case "--storm-inflight": o.stormInflight = try int(0, 20_000)
            case "--setup-timeout": o.setupTimeout = try double()
            case "--echo":
                let v = try value()
                guard v == "yes" || v == "no" else { throw UsageError(message: "--echo takes yes or no") }
                o.echo = v == "yes"
            case "--rcvbuf": o.receiveBuffer = try int(0, 1 << 30)
            case "--read-size": o.readSize = try int(64, 1 << 24)
            case "--server-pid": o.serverPid = Int32(try int(1, Int(Int32.max)))
            case "--cpu-pids":
                let v = try value()
                o.cpuPids = v.split(separator: ",").compactMap { Int32($0) }
                guard !o.cpuPids.isEmpty, o.cpuPids.count == v.split(separator: ",").count else {
                    throw UsageError(message: "--cpu-pids: '\(v)' is not a comma-separated list of process ids")
                }
            case "--tls": o.tls = true
            case "--api-port": o.apiPort = UInt16(try int(1, 65535))
            case "--api-key-file": o.apiKeyFile = try value()
            case "--idempotency": o.idempotency = true
            case "--json": o.json = true
            case "--label": o.label = try value()
            case "--server": o.server = try value()
            default: throw UsageError(message: "unknown option '\(args[i])'")
            }
            i += 1
        }
        guard o.host.hasPrefix("127.") else { throw UsageError(message: "--host must be a loopback address (127.x.x.x)") }
        if o.body == .text && o.size < 64 { throw UsageError(message: "--body text needs --size >= 64") }
        if o.body == .text && o.target == .roomcast && o.frameType != 100 {
            throw UsageError(message: "--frame-type applies to opaque bodies only (text frames are type 2)")
        }
        if o.api || o.mode == .publish {
            guard o.api else { throw UsageError(message: "--mode publish needs --api-port (the daemon's [api] listen port)") }
            guard o.apiKeyFile != nil else { throw UsageError(message: "--api-port needs --api-key-file (a key of the daemon's api.key_file)") }
            guard o.target == .roomcast else { throw UsageError(message: "--api-port publishes into roomcastd, not --target redis") }
            guard o.body == .text else { throw UsageError(message: "--api-port publishes text bodies (--body text)") }
            guard o.rate == nil else { throw UsageError(message: "--api-port is a closed loop (one request outstanding per connection): no --rate") }
            guard !o.tls else { throw UsageError(message: "--api-port speaks plain HTTP: no --tls") }
        } else if o.idempotency {
            throw UsageError(message: "--idempotency applies to --api-port publishes")
        }
        let total = o.members + o.publishers + o.connections
        if total > 19_500 { throw UsageError(message: "\(total) connections: at most 19,500 (the process holds at most 20,000 descriptors)") }
        return o
    }

    private static func split(_ arg: String) -> (String, String?) {
        if arg.hasPrefix("--"), let eq = arg.firstIndex(of: "=") {
            return (String(arg[..<eq]), String(arg[arg.index(after: eq)...]))
        }
        return (arg, nil)
    }

    mutating func applyDefaults(of mode: Mode) {
        self.mode = mode
        switch mode {
        case .custom:
            break
        // The load workloads are those of the independent C generator that
        // BENCHMARKS.md compares with: closed loop with a window of 64,
        // validated text bodies (ChatMessage, type 2), 64 bytes unless noted.
        // A smaller window flatters a relay that writes large frames straight
        // to the socket: 16 frames of 16 KiB fit in the kernel's socket
        // buffers, 64 do not (BENCHMARKS.md, "Loopback").
        case .fanout:
            members = 1_000; publishers = 1; size = 64; window = 64; rate = nil; duration = 10; body = .text
        case .pub10:
            members = 100; publishers = 10; size = 64; window = 64; rate = nil; duration = 10; body = .text
        case .latency:
            members = 5_000; publishers = 1; size = 64; rate = 200; duration = 10; body = .text
        case .large:
            members = 100; publishers = 1; size = 16 * 1024; window = 64; rate = nil; duration = 10; body = .text
        case .idle:
            members = 0; publishers = 0; connections = 19_000; roomSize = 100; duration = 30; heartbeat = 10
            rssSteps = [1_000, 2_000, 5_000, 10_000, 19_000]
        case .storm:
            // The probe room: one publisher at 200 frames/s to 10 members.
            members = 10; publishers = 1; size = 64; rate = 200; room = "probe"; body = .text
            connections = 10_000; roomSize = 100; duration = 60
        case .publish:
            // As fanout, with the publisher an API connection: the ratio of
            // the two is the API's cost (bench/publish.sh).
            members = 1_000; publishers = 1; size = 64; rate = nil; duration = 10; body = .text
        }
    }
}
