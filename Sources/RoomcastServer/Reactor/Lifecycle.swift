import CShim
import Glibc
import RoomcastCore
import RoomcastIO

// Lifecycle.swift owns the daemon's own life after start: the signals it
// takes through the signalfd, reload (SIGHUP) and the graceful stop
// (SIGTERM, SIGINT). A reload changes settings, never connections; a stop
// closes the listeners and drains every connection.

/// How far the daemon is in stopping: a graceful stop (SIGTERM without an
/// fd store, SIGINT: `Server.beginStop`) or a hand-over
/// (`Server.beginHandOver`), which stops accepting and reading the same way.
struct StopState {
    /// A stop or a hand-over began: no accepting, no reading.
    private(set) var stopping = false
    /// When the graceful stop gives up flushing, in ms (0 during a hand-over,
    /// whose own flush deadline applies: `Server.handOverFlushDeadline`).
    private(set) var deadlineMs: UInt64 = 0

    /// The graceful stop's deadline, ms; nil when none is under way or a
    /// hand-over is (its flush has a deadline of its own), so that a
    /// hand-over's flush waits in epoll_wait instead of spinning.
    var gracefulDeadlineMs: UInt64? { stopping && deadlineMs > 0 ? deadlineMs : nil }

    /// A graceful stop begins at `nowMs`, flushing for at most `drainMs`.
    /// - Returns: false when a stop or a hand-over is already under way.
    mutating func begin(nowMs: UInt64, drainMs: UInt64) -> Bool {
        guard !stopping else { return false }
        stopping = true
        deadlineMs = nowMs + drainMs
        return true
    }

    /// A hand-over begins: reading and accepting stop.
    mutating func handOverBegan() { stopping = true }

    /// The hand-over failed: a graceful stop may begin (`begin`).
    mutating func handOverFailed() { stopping = false }

    /// The graceful stop is over: every client is closed, or the deadline passed.
    func finished(nowMs: UInt64, clients: Int) -> Bool { stopping && (clients == 0 || nowMs >= deadlineMs) }
}

extension Server {
    func readSignals() {
        while true {
            let sig = signalFD >= 0 ? cshim_read_signal(signalFD) : 0
            if sig <= 0 { return }
            switch sig {
            case SIGHUP: reload()
            case SIGTERM where canHandOver && !stopping: beginHandOver()
            case SIGTERM, SIGINT: beginStop(signal: sig)
            case SIGUSR2:
                // Blocked since the first instruction (CEarlySignals) so that
                // its default action cannot kill the daemon; it means nothing.
                logger.notice("SIGUSR2 ignored: roomcastd hands its connections to systemd's fd store on every SIGTERM")
            default: break
            }
        }
    }

    /// SIGHUP: re-read the config file. Timeouts, limits, echo, validation and
    /// the log level apply at once to connected clients; listen addresses,
    /// the byte order and the log target need a restart (`Config.reloadPlan`);
    /// an invalid file keeps the old config (sd_notify(3): RELOADING=1, then READY=1).
    func reload() {
        systemd.notify("RELOADING=1\nMONOTONIC_USEC=\(Sys.monotonicUsec())")
        guard let path = options.configPath else {
            logger.notice("SIGHUP: no config file to reload (started without --config)")
            systemd.notify("READY=1")
            return
        }
        let new: Config
        do {
            new = try Config.load(path: path)
        } catch {
            logger.error("reload failed, keeping the running configuration: \(error)", ["REASON": "reload_failed", "DETAIL": error.description, "CONFIG_FILE": path])
            systemd.notify("READY=1\nSTATUS=reload failed: \(error.description); " + status.statusLine(nowMs: clock(), figures))
            return
        }
        let plan = config.reloadPlan(to: new, listenOverridden: !options.listenOverride.isEmpty, socketActivated: clientListenersFromSystemd,
                                     apiSocketActivated: api.listeners.contains(where: \.fromSystemd))
        for key in plan.needRestart {
            logger.warning("\(key) changed in \(path); restart roomcastd to apply it", ["CONFIG_FILE": path])
        }
        let now = clock()
        let old = config
        config = plan.applied
        reloadKeys()
        reloadPage()
        reloadAPIKeys()
        reloadTLS()
        relay.reconfigure(RelaySettings(config))
        table.fanout.relaySettings = relay.settings
        table.fanout.outputHardBytes = config.limits.outputHardBytes
        table.fanout.jsonMaxFrameBytes = config.json.maxFrameBytes
        table.fanout.shedsText = config.limits.shed == .text
        table.fanout.shedAfterMs = config.limits.effectiveShedAfterMs
        table.countPerIP = config.server.maxClientsPerIP > 0
        heartbeats.reconfigure(config, nowMs: now)
        cluster?.reconfigure(clusterSettings)
        scheduleViewerCounts(now: now)
        if config.limits != old.limits {
            for id in table.ids { resetRateLimits(id, now: now) }
        }
        logger.level = config.log.level
        if config.log.statsIntervalMs != old.log.statsIntervalMs { status.setStatsInterval(config.log.statsIntervalMs, nowMs: now) }
        if config.server.maxClients != old.server.maxClients {
            checkDescriptorLimit()
            checkHandOverBudget()
        }
        logger.info("configuration reloaded from \(path)", ["CONFIG_FILE": path])
        systemd.notify("READY=1\nSTATUS=" + status.statusLine(nowMs: now, figures))
    }

    /// SIGTERM/SIGINT: STOPPING=1, stop accepting and reading, flush what
    /// every client is owed (up to `drainTimeoutMs`), close, exit 0.
    func beginStop(signal: Int32) {
        let now = clock()
        guard stop.begin(nowMs: now, drainMs: Self.drainTimeoutMs) else { return }
        systemd.notify("STOPPING=1\nSTATUS=Stopping: flushing \(plural(table.count, "client"))")
        logger.info("received \(signal == SIGTERM ? "SIGTERM" : "SIGINT"), stopping: flushing \(plural(table.count, "client"))")
        closeListeners()
        closeAPIAll()
        for id in table.ids where table.isOpen(id) {
            // Everybody is leaving: no synthesized leaves to a room about to close.
            relay.forget(id)
            if table.slots[id]!.webSocket?.isOpen == true {
                // RFC 6455 §7.4.1: 1001, the server is going away (docs/protocol/websocket.md §15).
                table.fanout.unicast(WebSocketFrameEncoder.close(.goingAway, reason: "server stopping"), to: id)
            }
            if table.fanout.outboxes[id].pending == 0 {
                table.close(id, "daemon stopping")
            } else {
                startDraining(id, now: now)
            }
        }
    }

    /// After the last iteration: whatever still drains is closed, silently.
    func finishStop() {
        for id in table.ids {
            relay.forget(id)
            release(id)
        }
        table.closeList.removeAll()
        cluster?.shutdown(.bye)  // the other daemons send leaves for its members
        logger.flushSuppressed(nowMs: clock(), final: true)
        logger.info("stopped")
    }
}
