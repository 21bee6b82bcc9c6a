import RoomcastCore

// Metrics.swift: GET /metrics in the Prometheus text exposition format
// 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/),
// every family under `roomcast_`, counters ending in `_total`.

extension Server {
    /// The exposition text: `# HELP`, `# TYPE`, then the samples of each family.
    func metricsText(now: UInt64) -> String {
        var out = ""
        func family(_ name: String, _ type: String, _ help: String, _ samples: [(String, UInt64)]) {
            out += "# HELP roomcast_\(name) \(help)\n# TYPE roomcast_\(name) \(type)\n"
            for (labels, value) in samples { out += "roomcast_\(name)\(labels) \(value)\n" }
        }
        var byDialect: [String: UInt64] = ["ltb": 0, "json": 0, "websocket": 0]
        for id in table.ids where table.isOpen(id) { byDialect[table.slots[id]!.dialect.name, default: 0] += 1 }
        family("clients", "gauge", "Open client connections by dialect.",
               byDialect.keys.sorted().map { ("{dialect=\"\($0)\"}", byDialect[$0]!) })
        family("rooms", "gauge", "Rooms with at least one member here.", [("", UInt64(relay.roomCount))])
        family("frames_received_total", "counter", "Frames handed to the relay from clients (every dialect) and the API, by type.",
               FrameKind.allCases.map { ("{type=\"\($0.label)\"}", relay.receivedByKind[$0]) })
        family("frames_delivered_total", "counter", "Frames queued for a recipient, by type.",
               FrameKind.allCases.map { ("{type=\"\($0.label)\"}", table.fanout.deliveredByKind[$0]) })
        family("frames_shed_total", "counter", "Text frames not sent to slow consumers above output_soft_bytes ([limits] shed = text).",
               [("", table.fanout.framesShed)])
        family("received_bytes_total", "counter", "Bytes read from clients (before TLS decryption).", [("", status.bytesIn)])
        family("sent_bytes_total", "counter", "Bytes the kernel (or OpenSSL) took for clients.", [("", table.fanout.bytesOut)])
        family("disconnects_total", "counter", "Client connections ended, by reason.",
               DisconnectReason.allCases.map { ("{reason=\"\($0.label)\"}", status.disconnects[$0.rawValue]) })
        family("restored_connections", "gauge", "Connections this process took over when it started (a restart that kept them, or a crash recovery).",
               [("", UInt64(handOver.restoredConnections))])
        family("start_info", "gauge", "How this process started: fresh, handover (a restart that kept the connections) or crash (recovered).",
               [("{from=\"\(handOver.startedFrom)\"}", 1)])
        family("handovers_total", "counter", "Restarts that handed the connections over to the next process, since the daemon last started fresh or recovered from a crash (carried across them).",
               [("", handOver.handOvers)])
        family("auth_refusals_total", "counter", "Frames refused by [auth].", [("", auth.refusals)])
        family("auth_sessions", "gauge", "Connections holding a verified token, each with one pending expiry ([auth]).",
               [("", UInt64(auth.sessionCount))])
        family("frames_refused_total", "counter", "Frames from clients refused and relayed nowhere, by reason (the notice's code).",
               FrameRefusal.allCases.map { ("{reason=\"\($0.label)\"}", relay.refusedByReason[$0]) })
        family("api_connections", "gauge", "Open API connections.", [("", UInt64(api.count))])
        family("api_requests_total", "counter", "API requests answered, by HTTP status.",
               api.requests.keys.sorted().map { ("{code=\"\($0)\"}", api.requests[$0]!) })
        family("uptime_seconds", "gauge", "Seconds since the daemon started.", [("", (now &- status.startedMs) / 1000)])
        var pending: UInt64 = 0
        for id in table.ids { pending &+= UInt64(table.fanout.outboxes[id].pending) }
        family("output_pending_bytes", "gauge", "Bytes queued for clients and not yet taken by the kernel.", [("", pending)])
        family("refusals_total", "counter", "Connections refused or closed by policy, by reason.", [
            ("{reason=\"heartbeat_timeout\"}", status.evictions),
            ("{reason=\"proxy_from\"}", status.proxyRefused),
            ("{reason=\"proxy_header\"}", status.proxyHeaderFailures),
            ("{reason=\"token_expired\"}", auth.expired),
            ("{reason=\"api_max_connections\"}", api.refusedAtAccept),
        ])
        let c = cluster?.figures
        family("cluster_connected", "gauge", "1 while both Redis connections of [cluster] are ready (0 when off or down).", [("", c?.connected == true ? 1 : 0)])
        family("cluster_frames_total", "counter", "Cluster traffic by direction: published to Redis, received from other daemons, dropped, gaps, late duplicates, misrouted and stale messages.", [
            ("{direction=\"published\"}", c?.published ?? 0), ("{direction=\"received\"}", c?.received ?? 0),
            ("{direction=\"dropped\"}", c?.dropped ?? 0), ("{direction=\"gap\"}", c?.gaps ?? 0),
            ("{direction=\"late\"}", c?.late ?? 0), ("{direction=\"misrouted\"}", c?.misrouted ?? 0),
            ("{direction=\"stale\"}", c?.stale ?? 0),
        ])
        family("cluster_daemons", "gauge", "Other daemons of the cluster this daemon knows of (heard, or holding members here).",
               [("", UInt64(cluster?.daemonsKnown ?? 0))])
        family("cluster_subscribed_rooms", "gauge", "Room channels subscribed in Redis (rooms with members here), while connected.",
               [("", UInt64(c?.rooms ?? 0))])
        family("cluster_refused_total", "counter", "What was refused from Redis and never delivered, stored or answered, by reason (docs/cluster.md, \"What arrives from Redis\").",
               ClusterRefusal.allCases.map { ("{reason=\"\($0.label)\"}", cluster?.refused($0) ?? 0) })
        family("idempotency_cluster_fallbacks_total", "counter", "Publishes by Idempotency-Key decided by this daemon's cache alone: Redis down, refusing the claim or not answering within cluster.timeout (docs/api.md).",
               [("", cluster?.idempotencyFallbacks ?? 0)])
        out += "# HELP roomcast_loop_wait_seconds Time each loop iteration spent waiting in epoll_wait(2).\n# TYPE roomcast_loop_wait_seconds histogram\n"
        out += loop.wait.exposition("roomcast_loop_wait_seconds")
        out += "# HELP roomcast_loop_iteration_seconds Time each loop iteration spent working (events, timers, flush).\n# TYPE roomcast_loop_iteration_seconds histogram\n"
        out += loop.work.exposition("roomcast_loop_iteration_seconds")
        return out
    }
}
