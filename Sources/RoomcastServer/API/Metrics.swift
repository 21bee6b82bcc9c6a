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
        family("frames_received_total", "counter", "Complete frames read from clients and published through the API.", [("", status.framesIn)])
        family("frames_delivered_total", "counter", "Frames queued for a recipient.", [("", table.fanout.deliveries)])
        family("evictions_total", "counter", "Connections closed for a heartbeat timeout.", [("", status.evictions)])
        family("auth_refusals_total", "counter", "Frames refused by [auth].", [("", auth.refusals)])
        family("api_connections", "gauge", "Open API connections.", [("", UInt64(api.count))])
        family("api_requests_total", "counter", "API requests answered, by HTTP status.",
               api.requests.keys.sorted().map { ("{code=\"\($0)\"}", api.requests[$0]!) })
        family("uptime_seconds", "gauge", "Seconds since the daemon started.", [("", (now &- status.startedMs) / 1000)])
        return out
    }
}
