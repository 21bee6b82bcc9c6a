import Glibc
import RoomcastCore
import RoomcastIO

// LiveStoreFdStore.swift hands the live box and log to systemd's fd store
// (LiveStore.swift makes them): a store waits in `LiveStore.pendingStores`
// until PID 1 takes it over the non-blocking notify channel, a newer
// generation supersedes the ones still waiting, and a restart that keeps
// the clients reuses the stored box or closes the copies it left.

extension Server {
    /// FDSTORE=1 of copies of `fds` under one name, in one notification
    /// (ours stay in use), sent now if PID 1 takes it, else at the end of a
    /// later iteration. Stores of the same kind still waiting under another
    /// name (older generations) are superseded: they are dropped, and the
    /// new one also removes what they would have removed and, when some of
    /// their generation reached PID 1 before them (sibling boxes), that
    /// generation itself.
    func queueLiveStore(name: String, fds: [Int32], thenRemove: String?) {
        guard let live else { return }
        var copies: [Int32] = []
        for fd in fds {
            guard let copy = try? Sys.blocking("fcntl(F_DUPFD_CLOEXEC)", { fcntl(fd, F_DUPFD_CLOEXEC, 0) }) else {
                copies.forEach(Sys.close)
                return
            }
            copies.append(copy)
        }
        var removals = thenRemove.map { [$0] } ?? []
        let kind = name.prefix { $0 != "-" }
        // A newer generation supersedes every one PID 1 has not taken yet; a
        // sibling box of the same generation (same name) does not.
        live.pendingStores.removeAll { superseded in
            guard superseded.name != name, superseded.name.prefix(while: { $0 != "-" }) == kind else { return false }
            superseded.fds.forEach(Sys.close)
            live.supersededStores += 1
            removals += superseded.thenRemove
            live.inStore[superseded.name, default: superseded.fds.count] -= superseded.fds.count
            if live.inStore[superseded.name]! <= 0 { live.inStore[superseded.name] = nil }
            removals.append(superseded.name)  // when its siblings are stored, they go too
            return true
        }
        // Only names PID 1 holds (or will, from a store still waiting): the
        // list stays short however many generations were superseded.
        var seen = Set<String>()
        removals = removals.filter { $0 != name && live.inStore[$0] != nil && seen.insert($0).inserted }
        live.pendingStores.append(.init(name: name, fds: copies, thenRemove: removals))
        live.inStore[name, default: 0] += copies.count  // counted from now: the old ones go only after it
        sendLiveStores()
    }

    func sendLiveStores() {
        guard let live, let channel = systemd.channel else { return }
        while let next = live.pendingStores.first {
            let outcome = channel.send("FDSTORE=1\nFDNAME=\(next.name)\nFDPOLL=0", fds: next.fds)
            if outcome == .wouldBlock { return }
            if outcome == .failed {
                logger.error("systemd refused to store \(next.name): a crash would drop the clients", ["REASON": "handover_failed"])
                live.inStore[next.name, default: next.fds.count] -= next.fds.count
                // Not in the store: a hand-over must not name it.
                if next.name.hasPrefix(HandOverName.liveBoxPrefix) { live.incomplete = true }
            } else {
                for old in next.thenRemove {
                    systemd.notify("FDSTOREREMOVE=1\nFDNAME=\(old)")
                    live.inStore[old] = nil
                }
            }
            next.fds.forEach(Sys.close)
            live.pendingStores.removeFirst()
        }
    }

    // MARK: - A restart

    /// The live box's name when it holds every connection in `ids` and PID 1
    /// has it (stores it has not taken yet are sent now, waiting at most
    /// `HandOverControl.timeoutMs`): the hand-over then needs no box of its own.
    func liveBoxForHandOver(_ ids: [Int]) -> String? {
        guard let live, live.box != nil, !live.incomplete, live.toBox.isEmpty,
              ids.allSatisfy({ live.slot($0).serial != 0 }) else { return nil }
        let deadline = monotonicMilliseconds() + handOver.timeoutMs
        while !live.pendingStores.isEmpty {
            sendLiveStores()
            if live.pendingStores.isEmpty { break }
            if monotonicMilliseconds() >= deadline { return nil }
            usleep(1_000)
        }
        return "\(HandOverName.liveBoxPrefix)\(live.boxGeneration)"
    }

    /// After a hand-over, the live boxes and logs left hold copies of what
    /// was handed over and connections closed before: closed, unused.
    func closeCopies(_ stored: [(fd: Int32, name: String)]) {
        for s in stored {
            if s.name.hasPrefix(HandOverName.liveBoxPrefix) || s.name == HandOverName.box {
                HandOverBox.drain(s.fd).entries.forEach { Sys.close($0.fd) }
            } else {
                Sys.close(s.fd)
            }
        }
    }
}
