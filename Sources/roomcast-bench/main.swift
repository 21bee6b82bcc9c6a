// roomcast-bench: the load generator of BENCHMARKS.md. One thread, epoll.
//
// Phases: connect and join the main room (publishers first, then members),
// wait until the server has relayed every join (roomcast) or confirmed every
// SUBSCRIBE (Redis); then warm up, measure, stop sending and drain. The idle
// mode instead connects in steps, samples the server's RSS at each, and
// measures the server's CPU while the connections only heartbeat. The storm
// mode opens its connections during the measurement of a probe room.
@preconcurrency import Glibc

setvbuf(stdout, nil, _IOLBF, 0)
signal(SIGPIPE, SIG_IGN)

// `roomcast-bench verify-tokens [N]`: the cost of verifying a signed join (VerifyBench.swift).
if CommandLine.arguments.dropFirst().first == "verify-tokens" {
    exit(runVerifyBench(Array(CommandLine.arguments.dropFirst(2))))
}

let o: Options
do {
    o = try Options.parse(Array(CommandLine.arguments.dropFirst()))
} catch {
    fputs("roomcast-bench: \(error.message)\nTry 'roomcast-bench --help'.\n", stderr)
    exit(64)
}

let fdLimit = raiseDescriptorLimit()
let total = o.publishers + o.members + o.connections
if total + 16 > fdLimit {
    fatal("\(total) connections need more descriptors than the limit (\(fdLimit)); raise the hard limit (ulimit -Hn)")
}

// `--api-port`: the bearer key, never printed (a secret, like any key of api.key_file).
var apiKey = ""
if let path = o.apiKeyFile {
    guard let text = readProcFile(path), let key = firstAPIKey(text) else { fatal("no API key in \(path) (--api-key-file)") }
    apiKey = key
}
let probe = o.apiPort.map { APIProbe(host: o.host, port: $0, key: apiKey) }
/// The daemon's delivered text frames (GET /metrics), or the run stops: a
/// figure it cannot check is no figure.
@MainActor func daemonDelivered() -> UInt64 {
    var error: String?
    guard let v = probe!.deliveredText(error: &error) else { fatal(error ?? "GET /metrics failed") }
    return v
}

let engine = Engine(o, capacity: total, apiKey: apiKey)
let server = o.serverPid.map { ProcessProbe(pid: $0) }
if let server, server.rssKiB() == nil { fatal("cannot read /proc/\(server.pid)/status (--server-pid)") }

/// Join frames one connection group receives when `k` connections join a
/// room one after the other (each join goes to the members already in it).
@MainActor func joinReceipts(_ k: Int) -> Int { o.echo ? k * (k + 1) / 2 : k * (k - 1) / 2 }

let mainCount = o.publishers + o.members
@MainActor func mainReady() -> Bool {
    guard engine.openCount[0] >= mainCount else { return false }
    switch o.target {
    // API publishers join nothing: only the members' joins go round.
    case .roomcast: return engine.joinsReceived[0] >= joinReceipts(o.api ? o.members : mainCount)
    case .redis: return engine.subscribed[0] >= o.members
    }
}

/// Whether the first `n` extra connections are connected and joined.
@MainActor func extrasReady(_ n: Int) -> Bool {
    guard engine.openCount[1] >= n else { return false }
    guard o.roomSize > 0 else { return true }
    switch o.target {
    case .roomcast:
        let full = n / o.roomSize, rest = n % o.roomSize
        return engine.joinsReceived[1] >= full * joinReceipts(o.roomSize) + joinReceipts(rest)
    case .redis:
        return engine.subscribed[1] >= n
    }
}

func now() -> Double { Double(monotonicNs()) / 1e9 }

@MainActor func setupFailed(_ what: String) -> Never {
    var msg = "set-up did not complete within \(Int(o.setupTimeout)) s: \(what); "
    msg += "open \(engine.openCount[0] + engine.openCount[1]), joins seen \(engine.joinsReceived), "
    msg += "subscribed \(engine.subscribed), closed by server \(engine.closedByServer)"
    if let p = engine.firstProblem { msg += "; first problem: \(p)" }
    fatal(msg)
}

for p in 0..<o.publishers { engine.add(role: .publisher, index: p) }
for _ in 0..<o.members { engine.add(role: .member) }
engine.recipients = Int32(o.members)
for i in 0..<o.connections { engine.add(role: .extra, room: o.roomSize == 0 ? 0 : i / o.roomSize) }

var r = Report()
r.add("target", "target", .string(o.target.rawValue))
r.add("server", "server", .string(o.server ?? o.target.rawValue))
r.add("mode", "mode", .string(o.mode.rawValue))
if let label = o.label { r.add("label", "label", .string(label)) }
let rssBefore = server?.rssKiB()

// Set-up of the main room.
let setupStart = now()
engine.inflightLimit = o.connectInflight
engine.startHeartbeats()
if mainCount > 0 {
    engine.launch(upTo: mainCount)
    if !engine.run(seconds: o.setupTimeout, until: { engine.allLaunchedOpen && mainReady() }) { setupFailed("main room") }
}
let setupSeconds = now() - setupStart

if o.mode == .idle || (o.publishers == 0 && o.connections > 0) {
    // MARK: Idle connections: RSS per connection, idle CPU.
    var steps = o.rssSteps.filter { $0 < o.connections }
    steps.append(o.connections)
    var samples: [Int] = []
    let start = now()
    for step in steps {
        engine.launch(upTo: mainCount + step)
        if !engine.run(seconds: o.setupTimeout, until: { engine.allLaunchedOpen && extrasReady(step) }) {
            setupFailed("\(step) idle connections")
        }
        // Let the server settle: roomcastd frees the output buffers of
        // connections that got nothing for a second (sweeps every second).
        engine.run(seconds: 2.5)
        samples.append(server?.rssKiB() ?? 0)
    }
    let connectSeconds = now() - start
    let cpu0 = server?.cpuSeconds(), self0 = selfCPUSeconds(), t0 = now()
    engine.run(seconds: o.duration)
    let cpu1 = server?.cpuSeconds(), self1 = selfCPUSeconds(), t1 = now()
    let rssAfter = server?.rssKiB()
    r.add("connections", "connections", .int(o.connections))
    r.add("room_size", "members per room", .int(o.roomSize))
    r.add("heartbeat_s", "heartbeat period", .double(o.heartbeat, digits: 1), "s")
    r.add("connect_s", "connect + join time", .double(connectSeconds, digits: 2), "s")
    r.add("connect_errors", "connect errors (retried)", .int(engine.connectErrors))
    r.add("closed_by_server", "closed by server", .int(engine.closedByServer))
    r.add("window_s", "idle window", .double(t1 - t0, digits: 1), "s")
    r.add("heartbeats_sent", "heartbeats sent", .int(Int(engine.heartbeatsSent)))
    r.add("gen_cpu_pct", "generator CPU (window)", .double(100 * (self1 - self0) / (t1 - t0), digits: 2), "% of a core")
    if let rssBefore, let rssAfter, let cpu0, let cpu1 {
        r.add("rss_steps", "RSS sampled at", .ints(steps))
        r.add("rss_kib", "server RSS at those", .ints(samples), "KiB")
        r.add("server_rss_before_kib", "server RSS before", .int(rssBefore), "KiB")
        r.add("server_rss_after_kib", "server RSS after window", .int(rssAfter), "KiB")
        let per = Double(samples.last! - rssBefore) * 1024 / Double(max(1, o.connections))
        r.add("rss_per_conn_bytes", "server RSS per connection", .double(per, digits: 0), "B")
        if steps.count >= 2 {
            let slope = Double(samples.last! - samples[0]) * 1024 / Double(max(1, steps.last! - steps[0]))
            r.add("rss_slope_bytes", "RSS slope (first..last step)", .double(slope, digits: 0), "B/conn")
        }
        r.add("server_cpu_pct", "server CPU (window)", .double(100 * (cpu1 - cpu0) / (t1 - t0), digits: 2), "% of a core")
    }
} else {
    // MARK: Load: fan-out, latency, large frames, storm.
    guard o.publishers > 0, o.members > 0 else { fatal("a load run needs --publishers and --members (or --idle)") }
    if let f = o.frames { engine.framesLimit = UInt64(f) }
    let daemonStart = probe == nil ? 0 : daemonDelivered()
    engine.startSending()
    if o.frames == nil { engine.run(seconds: o.warmup) }
    let daemon0 = probe == nil ? 0 : daemonDelivered()
    let self0 = selfCPUTimes(), cpu0 = server?.cpuTimes(), t0 = now()
    let wait0 = server?.runQueueWaitSeconds(), selfWait0 = selfRunQueueWaitSeconds()
    let others0 = o.cpuPids.map { ProcessProbe(pid: $0).cpuSeconds() ?? 0 }
    let sent0 = engine.framesSent
    engine.measuring = true
    var stormSeconds: Double?
    var stormDone = false
    if o.mode == .storm || o.connections > 0 {
        engine.inflightLimit = o.stormInflight
        engine.inStorm = true
        let s0 = now()
        engine.launch(upTo: engine.count)
        stormDone = engine.run(seconds: o.duration) { engine.allLaunchedOpen && extrasReady(o.connections) }
        stormSeconds = now() - s0
        engine.inStorm = false
        engine.run(seconds: 1)
    } else if let f = o.frames {
        let target = UInt64(f) * UInt64(o.publishers)
        engine.run(seconds: o.setupTimeout) {
            engine.framesSent >= target && (!o.closedLoop || engine.outstanding == 0)
        }
    } else {
        engine.run(seconds: o.duration)
    }
    engine.measuring = false
    let t1 = now(), self1 = selfCPUTimes(), cpu1 = server?.cpuTimes()
    let wait1 = server?.runQueueWaitSeconds(), selfWait1 = selfRunQueueWaitSeconds()
    let others1 = o.cpuPids.map { ProcessProbe(pid: $0).cpuSeconds() ?? 0 }
    let daemon1 = probe == nil ? 0 : daemonDelivered()
    let measuredFrames = engine.framesSent - sent0
    engine.sending = false
    // An API publish reaches the members only when it is answered 200:
    // wait for the answers of those under way, then for their deliveries.
    func expectedDeliveries() -> UInt64 { (o.api ? engine.apiOK : engine.framesSent) * UInt64(o.members) }
    engine.run(seconds: o.drain) { engine.outstanding == 0 || !o.api }
    engine.run(seconds: o.drain) { engine.deliveries >= expectedDeliveries() }
    let expected = expectedDeliveries()
    let daemonEnd = probe == nil ? 0 : daemonDelivered()
    let rssAfter = server?.rssKiB()
    let secs = t1 - t0
    let lat = engine.hist.summary()
    r.add("members", "members", .int(o.members))
    r.add("publishers", "publishers", .int(o.publishers))
    r.add("size", "body size", .int(o.size), "B")
    r.add("body", "body", .string(o.body == .text ? "text (ChatMessage, type 2)" : "opaque (type \(o.frameType))"))
    if let rate = o.rate {
        r.add("loop", "loop", .string("open, \(fixed(rate, 0)) frames/s"))
    } else {
        r.add("loop", "loop", .string("closed, window \(o.window)"))
    }
    r.add("setup_s", "set-up (connect + join)", .double(setupSeconds, digits: 2), "s")
    r.add("measured_s", "measured", .double(secs, digits: 2), "s")
    r.add("frames_sent", o.api ? "publish requests sent (measured)" : "frames sent (measured)", .int(Int(measuredFrames)))
    if o.api {
        let req = engine.requestHist.summary()
        r.add("api_connections", "API connections (1 request outstanding each)", .int(o.publishers))
        r.add("idempotency", "Idempotency-Key on every publish", .bool(o.idempotency))
        r.add("publishes", "publishes answered 200 (measured)", .int(Int(engine.measuredPublishes)))
        r.add("publishes_per_s", "publishes/s", .double(Double(engine.measuredPublishes) / secs, digits: 0))
        r.add("req_p50_us", "request latency p50", .double(req.p50, digits: 1), "us")
        r.add("req_p90_us", "request latency p90", .double(req.p90, digits: 1), "us")
        r.add("req_p99_us", "request latency p99", .double(req.p99, digits: 1), "us")
        r.add("req_max_us", "request latency max", .double(req.max, digits: 1), "us")
        r.add("api_errors", "publishes answered other than 200", .int(Int(engine.apiErrors)))
        r.add("delivered_mismatch", "answers whose delivered was not the members", .int(Int(engine.deliveredMismatch)))
        // The daemon's own count (GET /metrics): over the window, and over the
        // whole run, where it must equal what the members received.
        r.add("daemon_deliveries_per_s", "deliveries/s by the daemon's /metrics", .double(Double(daemon1 &- daemon0) / secs, digits: 0))
        r.add("daemon_delivered", "text deliveries by the daemon's /metrics (run)", .int(Int(daemonEnd &- daemonStart)))
        r.add("daemon_match", "daemon's count = members' count (run)", .bool(daemonEnd &- daemonStart == engine.deliveries))
    }
    r.add("deliveries", "deliveries (measured)", .int(Int(engine.measuredDeliveries)))
    r.add("deliveries_per_s", "deliveries/s", .double(Double(engine.measuredDeliveries) / secs, digits: 0))
    r.add("frames_per_s", "frames/s (per member)", .double(Double(engine.measuredDeliveries) / secs / Double(o.members), digits: 0))
    r.add("mib_per_s", "body MiB/s delivered", .double(Double(engine.measuredDeliveries) * Double(o.size) / secs / 1_048_576, digits: 1))
    r.add("lat_p50_us", "latency p50", .double(lat.p50, digits: 1), "us")
    r.add("lat_p90_us", "latency p90", .double(lat.p90, digits: 1), "us")
    r.add("lat_p99_us", "latency p99", .double(lat.p99, digits: 1), "us")
    r.add("lat_p999_us", "latency p99.9", .double(lat.p999, digits: 1), "us")
    r.add("lat_max_us", "latency max", .double(lat.max, digits: 1), "us")
    r.add("lat_mean_us", "latency mean", .double(lat.mean, digits: 1), "us")
    r.add("expected", "expected deliveries (all)", .int(Int(expected)))
    r.add("delivered", "delivered (all)", .int(Int(engine.deliveries)))
    r.add("loss", "loss (expected - delivered)", .int(Int(expected) - Int(engine.deliveries)))
    r.add("order_errors", "frames out of per-sender order", .int(Int(engine.orderErrors)))
    r.add("other_frames", "other frames at members/publishers", .int(Int(engine.otherFrames)))
    if o.rate != nil { r.add("max_send_lag_us", "generator send lag max", .double(Double(engine.maxSendLagNs) / 1000, digits: 0), "us") }
    r.add("gen_max_turn_us", "generator longest loop turn", .double(Double(engine.maxTurnNs) / 1000, digits: 0), "us")
    let gen = self1 - self0
    let genCPU = 100 * gen.total / secs
    r.add("gen_cpu_pct", "generator CPU", .double(genCPU, digits: 1), "% of a core")
    r.add("gen_bound", "generator-bound (CPU >= 90%)", .bool(genCPU >= 90))
    r.add("gen_reads_per_delivery", "generator reads per delivery", .double(Double(engine.measuredReads) / Double(max(1, engine.measuredDeliveries)), digits: 4))
    r.add("gen_bytes_per_read", "generator bytes per read", .double(Double(engine.measuredBytesIn) / Double(max(1, engine.measuredReads)), digits: 0), "B")
    r.add("gen_sys_pct", "generator CPU in the kernel", .double(100 * gen.system / secs, digits: 1), "% of a core")
    // Time runnable but not running: what other work on the machine took.
    // High for the server: its figure is the machine's share, not its speed.
    r.add("gen_wait_pct", "generator waiting for a CPU", .double(100 * (selfWait1 - selfWait0) / secs, digits: 1), "% of the window")
    if let wait0, let wait1 {
        r.add("server_wait_pct", "server waiting for a CPU", .double(100 * (wait1 - wait0) / secs, digits: 1), "% of the window")
    }
    if let cpu0, let cpu1 {
        let cpu = cpu1 - cpu0
        r.add("server_cpu_pct", "server CPU", .double(100 * cpu.total / secs, digits: 1), "% of a core")
        r.add("server_sys_pct", "server CPU in the kernel", .double(100 * cpu.system / secs, digits: 1), "% of a core")
        // Deliveries per CPU-second the server actually got: steadier than
        // deliveries/s on a machine whose cores are shared with other work.
        let per = cpu.total > 0 ? Double(engine.measuredDeliveries) / cpu.total : 0
        r.add("deliveries_per_server_cpu_s", "deliveries per server CPU-second", .double(per, digits: 0))
        // On loopback a delivery's kernel work is split between the two
        // cores: the receiving half runs on the generator's core whenever
        // the generator holds the socket (its backlog is processed there),
        // and more of it the more writes a server makes per delivery. Both
        // processes' CPU per delivery counts all of it, wherever it ran.
        let both = cpu.total + gen.total
        let perBoth = both > 0 ? Double(engine.measuredDeliveries) / both : 0
        r.add("deliveries_per_cpu_s", "deliveries per CPU-second (server + generator)", .double(perBoth, digits: 0))
    }
    for (i, pid) in o.cpuPids.enumerated() {
        r.add("cpu_pid\(i)_pct", "CPU of process \(pid)", .double(100 * (others1[i] - others0[i]) / secs, digits: 1), "% of a core")
    }
    if let rssBefore { r.add("server_rss_before_kib", "server RSS before", .int(rssBefore), "KiB") }
    if let rssAfter { r.add("server_rss_after_kib", "server RSS after", .int(rssAfter), "KiB") }
    if let stormSeconds {
        let s = engine.stormHist.summary()
        r.add("storm_connections", "storm connections", .int(o.connections))
        r.add("storm_room_size", "storm members per room", .int(o.roomSize))
        r.add("storm_complete", "storm: all accepted + joined", .bool(stormDone))
        r.add("storm_s", "storm: time to all joined", .double(stormSeconds, digits: 2), "s")
        r.add("storm_connects_per_s", "storm: joined connects/s", .double(Double(engine.openCount[1]) / stormSeconds, digits: 0))
        r.add("storm_connect_errors", "storm: connect errors (retried)", .int(engine.connectErrors))
        r.add("storm_lat_samples", "probe deliveries during storm", .int(Int(s.samples)))
        r.add("storm_lat_p50_us", "probe latency p50 during storm", .double(s.p50, digits: 1), "us")
        r.add("storm_lat_p99_us", "probe latency p99 during storm", .double(s.p99, digits: 1), "us")
        r.add("storm_lat_max_us", "probe latency max during storm", .double(s.max, digits: 1), "us")
    }
    r.add("closed_by_server", "connections closed by server", .int(engine.closedByServer))
    r.add("publisher_receipts", "data frames at publishers", .int(Int(engine.publisherReceipts)))
    if engine.serverErrors > 0 { r.add("server_errors", "server error replies", .int(Int(engine.serverErrors))) }
}
if let p = engine.firstProblem { r.add("first_problem", "first problem", .string(p)) }
r.add("gen_max_rss_kib", "generator max RSS", .int(selfMaxRSSKiB()), "KiB")

engine.closeAll()
print(o.json ? r.json() : r.table())
