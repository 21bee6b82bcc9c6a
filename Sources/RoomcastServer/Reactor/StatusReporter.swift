import RoomcastCore

/// What the daemon tells its operator on a schedule: the `STATUS=` line of
/// `systemctl status` (sd_notify(3)), the periodic stats log line
/// (`log.stats_interval`), and the watchdog pings (`WATCHDOG=1`,
/// sd_watchdog_enabled(3)).
///
/// It owns the counters and the schedule, and returns the text to send; it
/// sends nothing itself (`Server.runTimers` hands the text to systemd and
/// the logger). Times are ms on the server's clock.
struct StatusReporter {
    /// A snapshot of what the lines report.
    struct Figures {
        var clients: Int
        var rooms: Int
        /// Frames handed to connections so far (`Fanout.deliveries`).
        var deliveries: UInt64
        var stopping: Bool
        /// The cluster's state (`[cluster]`); nil when it is off.
        var cluster: ClusterFigures? = nil
        /// Frames refused by `[auth]` so far (nil: signed joins are off).
        var authRefusals: UInt64? = nil
        /// Connections closed because their token ran out.
        var tokensExpired: UInt64 = 0
        /// `TLSState.summary` (nil: no `listen_tls`).
        var tls: String? = nil
    }

    /// How often STATUS= is refreshed, in ms.
    static let statusIntervalMs: UInt64 = 2_000

    /// Complete frames read from clients (and published through the API).
    var framesIn: UInt64 = 0
    /// Bytes read from clients (every dialect, before TLS decryption: what recv(2) or SSL_read returned).
    var bytesIn: UInt64 = 0
    /// Client connections ended, by `DisconnectReason`.
    var disconnects = [UInt64](repeating: 0, count: DisconnectReason.allCases.count)
    /// When `start` ran, ms (the API's `uptime_ms`).
    private(set) var startedMs: UInt64 = 0
    /// Connections closed for a heartbeat timeout.
    var evictions: UInt64 = 0
    /// Connections refused at accept for coming from outside `proxy_from`.
    var proxyRefused: UInt64 = 0
    /// Connections closed for a missing, late or malformed PROXY header.
    var proxyHeaderFailures: UInt64 = 0

    private var nextStatusMs: UInt64 = .max
    private var lastStatus = (ms: UInt64(0), framesIn: UInt64(0), deliveries: UInt64(0))
    private var statusClients = 0
    private var statsIntervalMs: UInt64 = 0
    private var nextStatsMs: UInt64 = .max
    private var lastStats = (ms: UInt64(0), framesIn: UInt64(0), deliveries: UInt64(0), evictions: UInt64(0))
    private(set) var watchdogIntervalMs: UInt64 = 0
    private var nextWatchdogMs: UInt64 = .max

    /// Starts the schedules at `nowMs`.
    /// - Parameters:
    ///   - watchdogUsec: `WATCHDOG_USEC` (µs) when the watchdog is on. Pings
    ///     go out every third of it: sd_watchdog_enabled(3) asks for half,
    ///     and at exactly half a loop a few ms late already stretches a gap
    ///     past it; a third leaves a sixth as margin.
    ///   - statsIntervalMs: `log.stats_interval` (0: no stats line).
    mutating func start(nowMs: UInt64, watchdogUsec: UInt64?, statsIntervalMs: UInt64) {
        if let usec = watchdogUsec {
            watchdogIntervalMs = max(1, usec / 3_000)
            nextWatchdogMs = nowMs
        }
        startedMs = nowMs
        lastStatus = (nowMs, 0, 0)
        lastStats = (nowMs, 0, 0, 0)
        nextStatusMs = nowMs + Self.statusIntervalMs
        setStatsInterval(statsIntervalMs, nowMs: nowMs)
    }

    /// A new `log.stats_interval` (0: off), counted from `nowMs`.
    mutating func setStatsInterval(_ ms: UInt64, nowMs: UInt64) {
        statsIntervalMs = ms
        nextStatsMs = ms == 0 ? .max : nowMs + ms
    }

    /// The earliest time something is due, given the current client count
    /// (a changed count refreshes STATUS at most once a second sooner).
    func deadline(clients: Int) -> UInt64 {
        var next = min(nextStatusMs, nextStatsMs, nextWatchdogMs)
        if clients != statusClients { next = min(next, lastStatus.ms + 1_000) }
        return next
    }

    /// Whether a watchdog ping is due; if so, the next one is scheduled.
    mutating func watchdogDue(nowMs: UInt64) -> Bool {
        guard nowMs >= nextWatchdogMs else { return false }
        nextWatchdogMs = nowMs + watchdogIntervalMs
        return true
    }

    /// The STATUS= line if it is due (every `statusIntervalMs`, and at most
    /// once a second sooner when the number of clients changed, so
    /// `systemctl status` is never stale).
    mutating func statusDue(nowMs: UInt64, _ figures: Figures) -> String? {
        guard nowMs >= nextStatusMs || (figures.clients != statusClients && nowMs >= lastStatus.ms + 1_000) else { return nil }
        nextStatusMs = nowMs + Self.statusIntervalMs
        return statusLine(nowMs: nowMs, figures)
    }

    /// The STATUS= text now, e.g. `12 clients, 3 rooms, 40 frames/s in,
    /// 480 frames/s out, 0 evicted`; rates since the previous line.
    mutating func statusLine(nowMs: UInt64, _ f: Figures) -> String {
        let seconds = Double(max(nowMs &- lastStatus.ms, 1)) / 1000
        let inRate = Double(framesIn &- lastStatus.framesIn) / seconds
        let outRate = Double(f.deliveries &- lastStatus.deliveries) / seconds
        lastStatus = (nowMs, framesIn, f.deliveries)
        statusClients = f.clients
        if f.stopping { return "Stopping: flushing \(plural(f.clients, "client"))" }
        return "\(plural(f.clients, "client")), \(plural(f.rooms, "room")), \(Int(inRate.rounded())) frames/s in, "
            + "\(Int(outRate.rounded())) frames/s out, \(evictions) evicted" + (f.cluster.map { "; " + $0.summary } ?? "")
            + (f.authRefusals.map { "; auth: \($0) refused, \(f.tokensExpired) expired" } ?? "")
            + (f.tls.map { "; " + $0 } ?? "")
    }

    /// The stats log line and its fields if it is due.
    mutating func statsDue(nowMs: UInt64, _ f: Figures) -> (message: String, clients: Int, rooms: Int)? {
        guard nowMs >= nextStatsMs else { return nil }
        let seconds = Double(max(nowMs &- lastStats.ms, 1)) / 1000
        let fin = framesIn &- lastStats.framesIn
        let fout = f.deliveries &- lastStats.deliveries
        let message = "stats: \(f.clients) clients, \(f.rooms) rooms, \(fin) frames in (\(Int((Double(fin) / seconds).rounded()))/s), "
            + "\(fout) frames out (\(Int((Double(fout) / seconds).rounded()))/s), \(evictions &- lastStats.evictions) evicted"
            + (f.cluster.map { "; \($0.summary), \($0.late) late, \($0.stale) stale, \($0.misrouted) misrouted" } ?? "")
            + (f.authRefusals.map { "; auth: \($0) refused, \(f.tokensExpired) expired" } ?? "")
            + (proxyRefused + proxyHeaderFailures > 0
               ? "; PROXY: \(proxyRefused) refused (proxy_from), \(proxyHeaderFailures) bad headers (total)" : "")
            + (f.tls.map { "; " + $0 + " (total)" } ?? "")
        lastStats = (nowMs, framesIn, f.deliveries, evictions)
        setStatsInterval(statsIntervalMs, nowMs: nowMs)
        return (message, f.clients, f.rooms)
    }
}

/// `1 client`, `2 clients`.
func plural(_ n: Int, _ noun: String) -> String { n == 1 ? "1 \(noun)" : "\(n) \(noun)s" }
