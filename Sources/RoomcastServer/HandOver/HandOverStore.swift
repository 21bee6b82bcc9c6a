import Glibc
import RoomcastCore
import RoomcastIO

// HandOverStore.swift: the hand-over's side of systemd's fd store
// (sd_notify(3), sd_pid_notify_with_fds(3)): boxes packed with the client
// descriptors, FDSTORE=1 with FDPOLL=0 retried while PID 1's queue is full,
// BARRIER=1 before exit, and the standalone unit's listeners kept there
// across restarts.

extension Server {
    /// Puts every descriptor in boxes: one, unless a box fills up (each
    /// holds thousands), then another.
    /// - Returns: the boxes' read ends (their write ends are closed).
    /// Keys are connection ids, u32 as earlier releases read them.
    func pack(_ entries: [(key: UInt64, fd: Int32)]) throws(SystemError) -> [Int32] {
        var readEnds: [Int32] = []
        var rest = entries[...]
        while !rest.isEmpty {
            let box: HandOverBox
            do { box = try HandOverBox.make() } catch {
                readEnds.forEach(Sys.close)
                throw error
            }
            let (n, error) = box.put(rest, wideKeys: false)
            box.seal()
            readEnds.append(box.readEnd)
            if error != nil || n == 0 {
                readEnds.forEach(Sys.close)
                throw error ?? SystemError("hand-over box", errno: EAGAIN)
            }
            rest = rest.dropFirst(n)
        }
        return readEnds
    }

    /// FDSTORE=1 of `fds` as `name` with FDPOLL=0 (PID 1 would drop a box
    /// whose write end closed: measured with systemd 252).
    /// - Returns: nil when sent, else what went wrong.
    func storeBeforeExit(_ fds: [Int32], name: String) -> String? {
        sendWaiting("FDSTORE=1\nFDNAME=\(name)\nFDPOLL=0", fds: fds)
    }

    /// One notification carrying `fds`, retried every ms while PID 1's queue
    /// is full, for at most `HandOverControl.timeoutMs`: a bounded wait, only
    /// at exit and at start (before READY=1).
    /// - Returns: nil when sent, else what went wrong.
    func sendWaiting(_ state: String, fds: [Int32]) -> String? {
        guard let channel = systemd.channel else { return "no notify socket" }
        let deadline = monotonicMilliseconds() + handOver.timeoutMs
        while true {
            switch channel.send(state, fds: fds) {
            case .sent: return nil
            case .failed: return SystemError("sendmsg to the notify socket", errno: errno).description
            case .wouldBlock:
                if monotonicMilliseconds() >= deadline { return "PID 1 did not read its notify socket for \(formatDuration(ms: handOver.timeoutMs))" }
                usleep(1_000)
            }
        }
    }

    /// BARRIER=1 (sd_notify_barrier(3)): waits until PID 1 has handled every
    /// notification sent before, so that the stores are done when this
    /// process exits. At most `timeoutMs`.
    func barrier(timeoutMs: UInt64) -> Bool {
        var p: [Int32] = [-1, -1]
        guard pipe(&p) == 0 else { return false }
        defer { Sys.close(p[0]) }
        let problem = sendWaiting("BARRIER=1", fds: [p[1]])
        Sys.close(p[1])
        guard problem == nil else { return false }
        // PID 1 closes its copy of the write end once it got here: POLLHUP.
        // (Sys.call retries an EINTR with the whole timeout: a bound, still.)
        var pfd = pollfd(fd: p[0], events: 0, revents: 0)
        guard case .done(let n)? = try? Sys.call("poll", { poll(&pfd, 1, Int32(clamping: timeoutMs)) }), n > 0 else { return false }
        return pfd.revents & Int16(POLLHUP) != 0
    }

    // MARK: - Listeners of the standalone unit

    /// A listener the previous process stored (standalone unit) if one is
    /// bound to `address`: adopted, so the port never closed.
    func adoptStoredListener(_ address: ListenAddress, _ dialect: Dialect, tls: Bool = false) -> Int32? {
        adoptStored(HandOverName.listener(dialect, tls: tls)) { Socket.localAddress($0) == address.description }
    }

    /// The stored `[api]` listener bound to `address` (a TCP address, or a
    /// Unix socket's path), taken out of `storedListeners`; nil if none.
    func adoptStoredAPIListener(_ address: APIListenAddress) -> Int32? {
        adoptStored(HandOverName.apiListener) { fd in
            switch address {
            case .tcp(let a): Socket.localAddress(fd) == a.description
            case .unix(let path): Socket.unixPath(fd) == path
            }
        }
    }

    private func adoptStored(_ name: String, _ matches: (Int32) -> Bool) -> Int32? {
        guard let i = handOver.storedListeners.firstIndex(where: { $0.name == name && matches($0.fd) }) else { return nil }
        return handOver.storedListeners.remove(at: i).fd
    }

    /// With an fd store and listeners of its own (standalone unit): keeps
    /// them in the store, so that clients connecting during a restart or a
    /// crash wait in the backlog instead of being refused. Stored listeners
    /// the config no longer names are closed and removed.
    func keepListenersInStore() {
        let storedNames = Set(handOver.storedListeners.map(\.name))
        handOver.storedListeners.forEach { Sys.close($0.fd) }
        handOver.storedListeners = []
        handOver.listenersInStore = 0
        guard canHandOver else { return }
        // The client listeners only when the daemon bound them (standalone
        // unit): socket units hold theirs. The API's, whenever it bound them.
        var kinds: [(name: String, fds: [Int32])] = []
        if !clientListenersFromSystemd {
            for (dialect, tls) in [(Dialect.ltb, false), (.json, false), (.webSocket, false), (.ltb, true), (.json, true), (.webSocket, true)] {
                kinds.append((HandOverName.listener(dialect, tls: tls), listeners.all.filter { $0.dialect == dialect && $0.tls == tls }.map(\.fd)))
            }
        }
        kinds.append((HandOverName.apiListener, api.listeners.filter { !$0.fromSystemd }.map(\.fd)))
        for (name, fds) in kinds {
            // Kinds only when in use now or before (TLS, the API): every
            // notification waits in PID 1's queue (a datagram socket's, of 10 by default).
            if (name.hasSuffix("-tls") || name == HandOverName.apiListener) && fds.isEmpty && !storedNames.contains(name) { continue }
            systemd.notify("FDSTOREREMOVE=1\nFDNAME=\(name)")
            if !fds.isEmpty, fds.count > systemd.fdStoreMax - handOver.listenersInStore {
                logger.warning("no room in systemd's fd store (FDSTORE=\(systemd.fdStoreMax)) for the \(name) listener: the port closes during restarts",
                               ["REASON": "fdstore_budget"])
            } else if !fds.isEmpty, let problem = storeBeforeExit(fds, name: name) {
                logger.warning("could not keep the \(name) listener in systemd's fd store (\(problem)): the port closes during restarts",
                               ["REASON": "handover_failed"])
            } else if !fds.isEmpty {
                handOver.listenersInStore += fds.count
                if name == HandOverName.apiListener {
                    for i in api.listeners.indices where !api.listeners[i].fromSystemd { api.listeners[i].inStore = true }
                }
            }
        }
    }
}
