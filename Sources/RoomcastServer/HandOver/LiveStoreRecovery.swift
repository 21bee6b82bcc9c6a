import Glibc
import RoomcastCore
import RoomcastIO

// LiveStoreRecovery.swift: after a crash, the next process takes the live
// box and replays the live log (LiveStore.swift keeps them up to date).
extension Server {
    // MARK: - After a crash

    /// Nothing was handed over (a SIGKILL, a watchdog abort, a trap): the
    /// newest live log says which connections were alive and where; they
    /// come out of the live boxes (once each, by serial) and go back to
    /// their rooms. The descriptors of closed connections are closed. A
    /// damaged box (keys and descriptors that do not pair up) is served with
    /// fresh state, as the graceful path does: its closed connections were
    /// shut down, read EOF and go; copies in older boxes are told apart by
    /// inode.
    /// - Returns: the summary for STATUS=.
    func restoreAfterCrash(_ stored: [(fd: Int32, name: String)], started: UInt64, after: String = "a crash") -> String {
        var alive: [UInt64: LiveLog.Connection]?
        var carried: HandOverState.Cluster?
        var moderated: [ModerationRecord] = []
        var problem: String?
        var newest: UInt32 = 0
        for s in stored where s.name.hasPrefix(HandOverName.liveStatePrefix) {
            defer { Sys.close(s.fd) }
            do throws(SystemError) {
                let bytes = try StateFile.read(s.fd, limit: handOver.maxStateBytes)
                let generation = bytes.withUnsafeBytes { LiveLog.generation($0) } ?? 0
                guard generation >= newest else { continue }
                do throws(HandOverState.DecodeError) {
                    let replayed = try bytes.withUnsafeBytes { raw in Result { () throws(HandOverState.DecodeError) in try LiveLog.replayAll(raw) } }.get()
                    (alive, carried, moderated) = (replayed.connections, replayed.cluster, replayed.moderation)
                    newest = generation
                } catch {
                    problem = "\(error.reason): \(error.description)"
                }
            } catch {
                problem = "handover_state_unreadable: \(error.description)"
            }
        }
        if alive == nil && problem == nil { problem = "handover_state_missing: no live log" }
        var restored = 0, dropped = 0
        var seen = Set<UInt64>()
        var seenSockets = Set<SocketIdentity>()
        var fresh = 0
        if let carried {
            cluster?.adopt(carried)  // the same daemon to the others, its streams after the numbers they may have seen
        } else {
            cluster?.restoredWithNewOrigin()  // a new origin: the others are told these members are still here
        }
        let now = clock()
        // Bans, mutes and slow mode go on, before any client is served (with
        // a cluster, Redis's copy is loaded over them at connect).
        for r in moderated { try? moderation.apply(r, nowMs: now, wallMs: wallClock()) }
        for b in stored where b.name.hasPrefix(HandOverName.liveBoxPrefix) {
            let (entries, trouble) = HandOverBox.drain(b.fd)
            if let trouble { problem = "handover_box_damaged: \(trouble)" }
            for e in entries {
                if let key = e.key, seen.contains(key) {
                    Sys.close(e.fd)  // a copy in an older box
                    continue
                }
                if let key = e.key { seen.insert(key) }
                if let socket = SocketIdentity(e.fd), !seenSockets.insert(socket).inserted {
                    Sys.close(e.fd)  // the same socket, from another box
                    continue
                }
                if e.key == nil {
                    // A damaged box: no key to find its state by.
                    if restoreConnection(fd: e.fd, nil, now: now) != nil { restored += 1; fresh += 1 }
                    continue
                }
                guard let alive else {
                    // No log to tell live from closed: all served with fresh
                    // state; a closed one was shut down, reads EOF and goes.
                    if restoreConnection(fd: e.fd, nil, now: now) != nil { restored += 1 }
                    continue
                }
                guard let key = e.key, let c = alive[key] else {
                    Sys.close(e.fd)  // closed before the crash
                    dropped += 1
                    continue
                }
                var r = HandOverState.Record(key: UInt64(key))
                r.dialect = c.dialect
                r.peerAddress = c.peerAddress
                r.room = c.room
                r.identity = c.identity
                // A JSON client's texts are sent under its nickname: the JSON
                // dialect's and a WebSocket client's on roomcast.json.v1 alike.
                let speaksJSON = c.dialect == .json || c.webSocket?.subprotocol == .json
                if speaksJSON, let identity = c.identity { r.nickname = (try? UserInfo(protobuf: identity))?.name }
                r.input = c.input
                r.output = c.torn  // the rest of a frame the client got part of, before anything else
                r.tornBytes = UInt64(c.torn.count)
                r.authClaims = c.authClaims
                if var ws = c.webSocket {
                    // Its decoder goes on from the message so far; a partial text
                    // frame in `input` is checked again from its start.
                    ws.decoder.checkedOfPartialFrame = 0
                    r.webSocket = ws
                    // Silence counts from the restore, as a new client's (`open`
                    // tracks an upgrade; `restoreWebSocket` untracks it once upgraded).
                    if ws.upgraded && config.heartbeat.timeoutMs > 0 { r.heartbeatRemainingMs = UInt32(clamping: config.heartbeat.timeoutMs) }
                }
                if restoreConnection(fd: e.fd, r, now: now) != nil { restored += 1 }
            }
        }
        if let problem {
            let served = alive == nil ? "; serving every connection in the live box with fresh state"
                : fresh > 0 ? "; serving its \(plural(fresh, "connection")) with fresh state" : ""
            logger.warning("after \(after): \(problem)" + served, ["REASON": String(problem.prefix { $0 != ":" })])
        }
        let ms = clock() - started
        let line = "restored \(plural(restored, "connection")) in \(plural(relay.roomCount, "room")) in \(ms) ms after \(after)"
        logger.info(line + " (\(plural(dropped, "descriptor")) of closed connections dropped)",
                    ["CLIENTS": String(restored), "ROOMS": String(relay.roomCount), "RESTORE_MS": String(ms)])
        return line
    }
}

/// A socket's identity across descriptors (fstat(2) device and inode): the
/// same connection reached through copies in two boxes.
struct SocketIdentity: Hashable {
    let device: UInt64
    let inode: UInt64

    init?(_ fd: Int32) {
        var st = stat()
        guard fstat(fd, &st) == 0 else { return nil }
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
    }
}
