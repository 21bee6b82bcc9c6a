import RoomcastCore

// HandOverBudget.swift: what keeping the clients through restarts and
// crashes needs (docs/operations/restarts.md, "Restarts, upgrades and crashes"), compared at
// start with what the unit gives, so that an operator learns at start, in
// one line with the numbers, that a configuration cannot hold, instead of
// an error per loop turn later.

/// The resources the hand-over and the crash path need for a configuration.
struct HandOverBudget: Equatable {
    /// `server.max_clients`.
    var maxClients: Int
    /// RLIMIT_NOFILE (soft, after raising it to the hard limit): the kernel
    /// refuses to put more descriptors in flight in AF_UNIX sockets than
    /// this, per user (unix(7), ETOOMANYREFS), in descriptors.
    var descriptorLimit: UInt64
    /// `$FDSTORE`: the unit's FileDescriptorStoreMax=, in descriptors.
    var fdStoreMax: Int
    /// Listener descriptors the daemon keeps in the store (standalone unit).
    var listeners: Int
    /// Descriptors one box holds (`HandOverBox.measureCapacity`); 0: unknown (one box).
    var boxCapacity: Int = 0

    /// Boxes a live box generation needs for `maxClients`.
    var boxesPerGeneration: Int { boxCapacity > 0 ? max(1, (maxClients + boxCapacity - 1) / boxCapacity) : 1 }

    /// Descriptors in flight at the peak, for `maxClients` clients: the live
    /// box holds each open connection and up to as many closed ones (it is
    /// rebuilt when closed entries outnumber open ones), and a rebuild puts
    /// every open one into a new box before the old one goes.
    var inFlight: UInt64 { 3 * UInt64(maxClients) }

    /// Clients for which a rebuild still fits under `descriptorLimit`.
    var clientsInFlight: UInt64 { descriptorLimit / 3 }

    /// Store entries at the peak: the listeners, two generations of live
    /// boxes and two live logs (a rotation stores the new generation before
    /// it removes the old one) and, at exit, the state.
    var storeEntries: Int { listeners + 2 * boxesPerGeneration + 3 }

    /// What does not hold, one clause each (empty: it all holds).
    var problems: [String] {
        var out: [String] = []
        if inFlight > descriptorLimit {
            out.append("server.max_clients = \(maxClients) can put \(inFlight) descriptors in flight in the live box "
                       + "(open and closed entries, and a rebuild's copy), but RLIMIT_NOFILE is \(descriptorLimit): "
                       + "above about \(clientsInFlight) clients a crash may drop clients; raise LimitNOFILE= to \(inFlight) or lower max_clients")
        }
        if storeEntries > fdStoreMax {
            out.append("FDSTORE=\(fdStoreMax) (FileDescriptorStoreMax=) but the daemon keeps up to \(storeEntries) descriptors there "
                       + "(\(listeners) listeners, 2 x \(boxesPerGeneration) live boxes of \(boxCapacity > 0 ? String(boxCapacity) : "?") descriptors, 2 live logs, the state): live boxes and logs are not rotated "
                       + "while it is full; raise both to at least \(storeEntries)")
        }
        return out
    }
}

extension Server {
    var handOverBudget: HandOverBudget {
        HandOverBudget(maxClients: config.server.maxClients, descriptorLimit: descriptorLimit, fdStoreMax: systemd.fdStoreMax,
                       listeners: handOver.listenersInStore, boxCapacity: handOver.boxCapacity)
    }

    /// At start and when max_clients changes on reload: one warning line
    /// (REASON=handover_budget) when the budget does not hold.
    func checkHandOverBudget() {
        guard canHandOver else { return }
        if handOver.boxCapacity == 0 { handOver.boxCapacity = HandOverBox.measureCapacity() ?? 0 }
        let problems = handOverBudget.problems
        guard !problems.isEmpty else { return }
        logger.warning("restarts and crashes cannot keep every client: " + problems.joined(separator: "; "), ["REASON": "handover_budget"])
    }
}
