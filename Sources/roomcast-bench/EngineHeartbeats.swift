@preconcurrency import COpenSSL
import CShim
@preconcurrency import Glibc
import RoomcastCore

// The load generator's heartbeats (Engine.swift holds its state).
extension Engine {
    func startHeartbeats() {
        heartbeatStartNs = monotonicNs()
        heartbeatsDone = 0
    }

    /// Each open connection sends one heartbeat per period, spread evenly.
    func heartbeats(now: UInt64) {
        guard o.heartbeat > 0, heartbeatStartNs > 0, count > 0 else { return }
        let due = UInt64(Double(now &- heartbeatStartNs) / (o.heartbeat * 1e9) * Double(count))
        var budget = 4096
        while heartbeatsDone < due && budget > 0 {
            heartbeatsDone += 1
            budget -= 1
            let id = heartbeatCursor
            heartbeatCursor = (heartbeatCursor + 1) % count
            // A WebSocket member sends nothing between its upgrade and the 101 answer.
            // An API connection speaks HTTP: its requests keep it open.
            guard conns[id].state == .open, conns[id].webSocket != .upgrading,
                  !(o.api && conns[id].role == .publisher) else { continue }
            heartbeatsSent += 1
            heartbeatBytes.withUnsafeBytes { sendMessage(id, $0.baseAddress!, $0.count) }
            if !conns[id].writeArmed { flush(id) }
        }
    }
}
