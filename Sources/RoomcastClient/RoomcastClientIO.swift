import RoomcastCore
import CShim
import COpenSSL
import Glibc
import RoomcastIO

// The client's I/O: reading and decoding frames, the output queue, heartbeats (RoomcastClient.swift holds its state).
extension RoomcastClient {
    func handle(_ readiness: IOReadiness) {
        switch state {
        case .connecting:
            var socketError: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            do {
                _ = try Sys.blocking("getsockopt(SO_ERROR)") { getsockopt(fd, SOL_SOCKET, SO_ERROR, &socketError, &length) }
            } catch {
                socketError = error.errno
            }
            let error = socketError
            if handshaking {
                continueTLS()
            } else if error == 0 {
                connected()
            } else {
                let text = connectedAddress
                closeSocket()
                tryNextAddress(lastError: .connect(address: text, errno: error))
            }
        case .connected, .finishing:
            if readiness.contains(.writable) { flush() }
            if readiness.contains(.readable) || readiness.contains(.hangup) { readAvailable() }
        default:
            break
        }
    }

    func readAvailableNow() { readAvailable() }

    func readAvailable() {
        let gen = generation
        for _ in 0..<Self.readsPerWakeup {
            let result = ssl.map { tlsRead($0) } ?? scratch.withUnsafeMutableBytes { Sys.read(fd, $0.baseAddress!, $0.count) }
            switch result {
            case .done(let n):
                decoder.append(scratch[0..<n])
                deliverFrames(generation: gen)
                guard gen == generation else { return }
                if n < Self.readSize && ssl == nil { return }
            case .wouldBlock:
                return
            case .endOfFile:
                if state == .finishing { close() } else { connectionEnded(.closedByPeer) }
                return
            case .failed(let e):
                if state == .finishing { close() } else { connectionEnded(tlsError ?? .system(call: "read", errno: e)) }
                return
            }
        }
        if let ssl, SSL_has_pending(ssl) == 1 { readLater() }  // records inside OpenSSL wake no epoll
    }

    func deliverFrames(generation gen: UInt64) {
        while gen == generation {
            let frame: Frame?
            do {
                frame = try decoder.next()
            } catch {
                connectionEnded(.frameTooLarge(claimed: error.claimed, limit: error.limit))
                return
            }
            guard let frame else { return }
            if let event = decode(frame) { onEvent(event) }
        }
    }

    func decode(_ frame: Frame) -> ClientEvent? {
        let types = configuration.types
        do {
            switch frame.type {
            case types.heartbeat: return nil  // roomcastd never relays them; other servers might echo them
            case types.join: return .join(try UserInfo(protobuf: frame.body))
            case types.leave: return .leave(try UserInfo(protobuf: frame.body))
            case types.notice: return .notice(try Notice(protobuf: frame.body))
            case types.text: return .text(try ChatMessage(protobuf: frame.body))
            case types.gift: return .gift(try GiftMessage(protobuf: frame.body))
            default: return .opaque(type: frame.type, body: frame.body)
            }
        } catch {
            return .malformed(type: frame.type, body: frame.body, error: error)
        }
    }

    func checkSize(_ body: [UInt8]) throws(ClientError) {
        guard body.count <= configuration.maxFrameBytes else {
            throw .bodyTooLarge(bytes: body.count, limit: configuration.maxFrameBytes)
        }
    }

    func enqueue(type: UInt16, body: [UInt8]) throws(ClientError) {
        try checkSize(body)
        guard state == .connected, !failing else { throw .notConnected }
        FrameCodec.appendHeader(type: type, length: UInt32(body.count), byteOrder: configuration.byteOrder, to: &output)
        output.append(contentsOf: body)
        flush()
    }

    /// Optimistic write; EPOLLOUT is armed only while the kernel refuses bytes.
    /// A failure is handled on the next loop iteration, so a public method
    /// never calls the handlers itself.
    func flush() {
        while outputStart < output.count {
            let start = outputStart
            let result = output.withUnsafeBytes { bytes in
                ssl.map { tlsWrite($0, UnsafeRawBufferPointer(rebasing: bytes[start...])) } ?? Sys.send(fd, bytes.baseAddress! + start, bytes.count - start)
            }
            switch result {
            case .done(let n):
                outputStart += n
            case .wouldBlock:
                if !writeArmed { writeArmed = true; updateInterest() }
                return
            case .failed(let e):
                failLater(tlsError ?? .system(call: "send", errno: e))
                return
            case .endOfFile:
                failLater(.closedByPeer)
                return
            }
        }
        output.removeAll(keepingCapacity: output.capacity <= 1 << 20)
        outputStart = 0
        if writeArmed { writeArmed = false; updateInterest() }
        if state == .finishing { shutdownWrite() }
    }

    /// FIN after the last queued byte; a reset peer shows up as EOF or an error on read.
    func shutdownWrite() {
        if let ssl { _ = SSL_shutdown(ssl) }  // close_notify first (RFC 8446 §6.1)
        _ = try? Sys.blocking("shutdown") { Glibc.shutdown(fd, Int32(SHUT_WR)) }
    }

    func failLater(_ error: ClientError) {
        guard !failing else { return }
        failing = true
        let gen = generation
        loop.schedule(afterMs: 0) { [weak self] in
            guard let self, self.generation == gen else { return }
            self.connectionEnded(error)
        }
    }

    func updateInterest() {
        guard let watchID else { return }
        do {
            try loop.update(watchID, readable: true, writable: writeArmed)
        } catch {
            failLater(error)
        }
    }

    func scheduleHeartbeat() {
        guard configuration.heartbeatIntervalMs > 0 else { return }
        let gen = generation
        heartbeatTimer = loop.schedule(afterMs: configuration.heartbeatIntervalMs) { [weak self] in
            guard let self, self.generation == gen, self.state == .connected else { return }
            try? self.enqueue(type: self.configuration.types.heartbeat, body: self.configuration.heartbeatBody)
            self.scheduleHeartbeat()
        }
    }
}
