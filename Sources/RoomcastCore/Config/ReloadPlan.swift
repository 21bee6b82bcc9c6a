// What a reload (SIGHUP) applies and what waits for a restart.

/// What a reload (SIGHUP) applies: the new file's settings, except those
/// that only a restart can change, which keep their running values.
public struct ReloadPlan: Equatable, Sendable {
    /// The config to run with from now on.
    public var applied: Config
    /// Keys whose new value waits for a restart, in a fixed order
    /// (`server.listen`, `json.listen`, `websocket.listen`, `api.listen`, `protocol.byte_order`, `log.target`,
    /// `cluster.redis`, `cluster.name`),
    /// only those that changed (and, for the listen keys, only where the
    /// file's value is in use: not replaced by `--listen`, not under socket
    /// activation).
    public var needRestart: [String]
}

extension Config {
    /// The plan for replacing this running config by `new` (read from the
    /// file on SIGHUP). Listen addresses, the byte order, the log target and
    /// the cluster's Redis and name need a restart: sockets are bound and
    /// clients speak one byte order from the start, the log sink is chosen
    /// once, and so are the Redis connections and their channels.
    /// - Parameters:
    ///   - listenOverridden: `--listen` replaced `[server] listen` at start.
    ///   - socketActivated: the client listeners came from systemd; no client listen key is used.
    ///   - apiSocketActivated: the API's came from systemd (a socket named `api`); `[api] listen` is not used.
    public func reloadPlan(to new: Config, listenOverridden: Bool, socketActivated: Bool, apiSocketActivated: Bool = false) -> ReloadPlan {
        var applied = new
        var needRestart: [String] = []
        if !listenOverridden && !socketActivated && new.server.listen != server.listen { needRestart.append("server.listen") }
        if !socketActivated && new.json.listen != json.listen { needRestart.append("json.listen") }
        if !socketActivated && new.webSocket.listen != webSocket.listen { needRestart.append("websocket.listen") }
        if !socketActivated && new.allTLSListen != allTLSListen { needRestart.append("listen_tls") }
        applied.server.listen = server.listen
        applied.json.listen = json.listen
        applied.webSocket.listen = webSocket.listen
        if !apiSocketActivated && new.api.listen != api.listen { needRestart.append("api.listen") }
        applied.api.listen = api.listen
        applied.server.listenTLS = server.listenTLS
        applied.json.listenTLS = json.listenTLS
        applied.webSocket.listenTLS = webSocket.listenTLS
        if new.protocol.byteOrder != self.protocol.byteOrder {
            needRestart.append("protocol.byte_order")
            applied.protocol.byteOrder = self.protocol.byteOrder
        }
        if new.log.target != log.target {
            needRestart.append("log.target")
            applied.log.target = log.target
        }
        // The Redis connections and channel names are made once, at start.
        if new.cluster.redis != cluster.redis {
            needRestart.append("cluster.redis")
            applied.cluster.redis = cluster.redis
        }
        if new.cluster.name != cluster.name {
            needRestart.append("cluster.name")
            applied.cluster.name = cluster.name
        }
        return ReloadPlan(applied: applied, needRestart: needRestart)
    }
}
