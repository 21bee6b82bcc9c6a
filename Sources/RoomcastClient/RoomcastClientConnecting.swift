import RoomcastCore
import CShim
import COpenSSL
import Glibc
import RoomcastIO

// The client's connecting: addresses in turn, retries with backoff, the join on every connection (RoomcastClient.swift holds its state).
extension RoomcastClient {
    func startAttempt() {
        state = .connecting
        onStatus(.connecting(server: configuration.server.description, attempt: retries + 1))
        do {
            addresses = try configuration.server.resolve()
        } catch {
            connectionEnded(error)
            return
        }
        addressIndex = 0
        connectTimer = loop.schedule(afterMs: configuration.connectTimeoutMs) { [weak self] in
            guard let self, self.state == .connecting else { return }
            self.connectTimer = nil
            self.connectionEnded(.connectTimeout(address: self.configuration.server.description,
                                                 ms: self.configuration.connectTimeoutMs))
        }
        tryNextAddress(lastError: nil)
    }

    /// Tries `addresses[addressIndex...]` in turn until one connects or is pending.
    func tryNextAddress(lastError: ClientError?) {
        var lastError = lastError
        while addressIndex < addresses.count {
            let address = addresses[addressIndex]
            addressIndex += 1
            let text = format(address)
            let sock: Int32
            do {
                sock = try Sys.blocking("socket") { socket(address.family, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0) }
            } catch {
                lastError = .system(call: "socket", errno: error.errno)
                continue
            }
            Sys.setOption(sock, Int32(IPPROTO_TCP), TCP_NODELAY, 1)  // chat lines are small; no Nagle delay
            let err: Int32
            do {
                _ = try Sys.blocking("connect") { address.withSockaddr { Glibc.connect(sock, $0, $1) } }
                err = 0
            } catch {
                err = error.errno
            }
            if err == 0 || err == EINPROGRESS {
                fd = sock
                connectedAddress = text
                do {
                    watchID = try loop.watch(sock, readable: false, writable: true) { [weak self] readiness in
                        self?.handle(readiness)
                    }
                    writeArmed = true
                } catch {
                    Sys.close(sock)
                    fd = -1
                    lastError = error
                    continue
                }
                if err == 0 { connected() }
                return
            }
            Sys.close(sock)
            lastError = .connect(address: text, errno: err)
        }
        connectionEnded(lastError ?? .connect(address: configuration.server.description, errno: ECONNREFUSED))
    }

    /// TCP is up: the TLS handshake first when configured (ClientTLS.swift).
    func connected() {
        if configuration.tls != nil { startTLS() } else { didConnect() }
    }

    func didConnect() {
        if let t = connectTimer { loop.cancel(t); connectTimer = nil }
        state = .connected
        everConnected = true
        connectedAtMs = loop.nowMs
        decoder = FrameDecoder(byteOrder: configuration.byteOrder, maxFrameBytes: configuration.maxFrameBytes)
        updateInterest()
        scheduleHeartbeat()
        let gen = generation
        onStatus(.connected(address: connectedAddress))
        guard gen == generation, state == .connected else { return }
        // A join sent on an earlier connection makes this an automatic rejoin.
        if isJoined && !joinSentThisConnection { sendJoin(rejoin: joinSentEver) }
    }

    func sendJoin(rejoin: Bool) {
        guard let user else { return }
        joinSentThisConnection = true
        joinSentEver = true
        do {
            var join = user
            if join.token == nil { join.token = configuration.token }
            try enqueue(type: configuration.types.join, body: join.serialized())
        } catch {
            return  // only .notConnected is possible here, and the caller checked
        }
        onStatus(rejoin ? .rejoined(user) : .joined(user))
    }
}
