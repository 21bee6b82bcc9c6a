import Glibc
import RoomcastCore
import RoomcastIO

// APIConnectionIO.swift: an API connection's bytes on the loop (docs/api.md):
// reads bounded by what is owed, pipelined requests answered in turn, at most
// ``APIServer/requestsPerWakeup`` per loop turn, answers written as the
// kernel takes them. Input is consumed by offset and compacted once per
// turn, answers are appended in place: a request costs its own bytes, not
// the connection's buffers (issue 28 item 1: the buffers were copied per
// request, ~15 us per 34-byte request, and 100,000 pipelined requests held
// the loop 168 ms).

extension Server {
    /// Readiness of API connection `id`: read and answer, then write what is owed.
    func apiReady(_ id: Int, _ readiness: Readiness) {
        guard api.connections.indices.contains(id), api.connections[id] != nil else { return }
        let now = clock()
        let c = api.connections[id]!
        if c.reading && !c.peerClosed && !c.closeAfterWrite && (readiness.contains(.readable) || readiness.contains(.hangup)) {
            readAPI(id, now: now)
            guard api.connections[id] != nil else { return }
            // A queued connection had its batch this turn or has it next.
            if !api.connections[id]!.queued { answerAPI(id, now: now) }
        }
        guard api.connections[id] != nil else { return }
        flushAPI(id)
    }

    /// The connections the per-wakeup cap left with whole requests: the
    /// next `requestsPerWakeup` of each, at the start of a loop turn (those
    /// queued again wait for the next one; the wait does not sleep then).
    func answerAPIAgain() {
        let ids = api.again
        api.again.removeAll(keepingCapacity: true)
        let now = clock()
        for id in ids where api.connections.indices.contains(id) && api.connections[id]?.queued == true {
            api.connections[id]!.queued = false
            answerAPI(id, now: now)
            guard api.connections[id] != nil else { continue }
            flushAPI(id)
        }
    }

    /// Reads what the kernel has, at most ``APIServer/readBytesPerWakeup``
    /// and while less than ``APIServer/inputPauseBytes`` is unanswered (the
    /// rest stays in the socket: the level-triggered readiness brings it
    /// back once reading is wanted again).
    private func readAPI(_ id: Int, now: UInt64) {
        var total = 0
        while total < APIServer.readBytesPerWakeup && api.connections[id]!.input.count < APIServer.inputPauseBytes {
            let result = scratch.withUnsafeMutableBytes { Sys.read(api.connections[id]!.fd, $0.baseAddress!, $0.count) }
            switch result {
            case .done(let n):
                total += n
                if api.connections[id]!.input.isEmpty && api.connections[id]!.requestDeadlineMs == nil {
                    api.connections[id]!.requestDeadlineMs = now + APIServer.requestTimeoutMs
                }
                api.connections[id]!.input.append(contentsOf: scratch[0..<n])
                api.connections[id]!.unanswered = true
            case .wouldBlock:
                return
            case .endOfFile:
                // Answer what is whole, then close: the peer sends no more.
                api.connections[id]!.peerClosed = true
                api.connections[id]!.unanswered = true  // so that answerAPI sees the end
                return
            case .failed:
                closeAPI(id)
                return
            }
        }
    }

    /// Answers the whole requests in the input, in order (pipelining): at
    /// most ``APIServer/requestsPerWakeup`` (then the connection is queued
    /// in `api.again` for the next turn), and none while the answers owed
    /// are over ``APIServer/outputPauseBytes`` (then `flushAPI` queues it
    /// once the kernel took them). The input is consumed by offset and
    /// compacted once at the end; answers are appended in place.
    func answerAPI(_ id: Int, now: UInt64) {
        guard api.connections[id] != nil, api.connections[id]!.unanswered, api.connections[id]!.parkedToken == nil else { return }
        var input: [UInt8] = []
        swap(&input, &api.connections[id]!.input)  // taken out: the handlers may look at `api`
        var offset = 0
        var answered = 0
        var stillUnanswered = true
        answering: while api.connections[id]!.pendingOutput < APIServer.outputPauseBytes && !api.connections[id]!.closeAfterWrite {
            guard answered < APIServer.requestsPerWakeup else {
                if !api.connections[id]!.queued {
                    api.connections[id]!.queued = true
                    api.again.append(id)
                }
                break
            }
            let step = input.withUnsafeBytes { api.connections[id]!.reader.next(UnsafeRawBufferPointer(rebasing: $0[offset...])) }
            switch step {
            case .needMore(let sendContinue):
                if sendContinue { api.connections[id]!.output.append(contentsOf: "HTTP/1.1 100 Continue\r\n\r\n".utf8) }
                stillUnanswered = false
                if api.connections[id]!.peerClosed { api.connections[id]!.closeAfterWrite = true }
                break answering
            case .error(let e):
                let error = APIError(e.status, Self.httpErrorCode(e.status), e.reason)
                api.connections[id]!.output.append(contentsOf: apiErrorResponse(error, close: true))
                api.connections[id]!.closeAfterWrite = true
                offset = input.count
                stillUnanswered = false
                api.requests[e.status, default: 0] &+= 1
                let peer = api.connections[id]!.peer.description
                logger.peerWarning(reason: "api_bad_request", nowMs: now, "\(peer): API request refused: \(e)",
                                   ["CLIENT_ADDR": peer, "STATUS": String(e.status), "DETAIL": e.reason])
                break answering
            case .request(let request, let bodyRange, let consumed, let keepAlive):
                let body = Array(input[(offset + bodyRange.lowerBound)..<(offset + bodyRange.upperBound)])
                offset += consumed
                answered += 1
                let response = answer(request, body: body, peer: api.connections[id]!.peer, now: now)
                guard api.connections[id] != nil else { return }
                if let token = response.deferredToken {
                    // Its answer waits for Redis (APIIdempotency.swift): nothing more is answered meanwhile.
                    api.connections[id]!.parkedToken = token
                    api.connections[id]!.parkedKeepAlive = keepAlive
                    api.claims[token]?.connection = id
                    if !keepAlive { offset = input.count }
                    break answering
                }
                api.requests[response.status, default: 0] &+= 1
                api.connections[id]!.output.append(contentsOf: response.serialized(close: !keepAlive))
                api.connections[id]!.idleDeadlineMs = now + APIServer.idleTimeoutMs
                if !keepAlive {
                    api.connections[id]!.closeAfterWrite = true
                    offset = input.count
                    stillUnanswered = false
                }
            }
        }
        // Once per turn: drop what was answered.
        if offset == input.count { input.removeAll(keepingCapacity: input.capacity <= 2 * APIServer.readBytesPerWakeup) }
        else if offset > 0 { input.removeSubrange(0..<offset) }
        if answered > 0 {
            let parked = api.connections[id]!.parkedToken != nil  // the wait is bounded by cluster.timeout instead
            api.connections[id]!.requestDeadlineMs = input.isEmpty || parked ? nil : now + APIServer.requestTimeoutMs
        }
        api.connections[id]!.unanswered = stillUnanswered && !input.isEmpty
        swap(&input, &api.connections[id]!.input)
    }

    /// Writes what `id` is owed; closes it once written when it is to close;
    /// reads while little is owed and little is unanswered; queues it for
    /// the next turn when answering waited for the kernel to take answers.
    func flushAPI(_ id: Int) {
        guard api.connections[id] != nil else { return }
        let fd = api.connections[id]!.fd
        while api.connections[id]!.pendingOutput > 0 {
            let sent = api.connections[id]!.outputSent
            let r = api.connections[id]!.output.withUnsafeBytes { Sys.send(fd, $0.baseAddress! + sent, $0.count - sent) }
            switch r {
            case .done(let n): api.connections[id]!.outputSent += n
            case .wouldBlock: break
            case .endOfFile, .failed:
                closeAPI(id)
                return
            }
            if case .wouldBlock = r { break }
        }
        // Drop what the kernel took once it is the larger half (amortized O(1) a byte).
        let sent = api.connections[id]!.outputSent
        if sent > 0 && sent == api.connections[id]!.output.count {
            api.connections[id]!.output.removeAll(keepingCapacity: api.connections[id]!.output.capacity <= 2 * APIServer.outputPauseBytes)
            api.connections[id]!.outputSent = 0
        } else if sent > 0 && sent >= api.connections[id]!.pendingOutput {
            api.connections[id]!.output.removeSubrange(0..<sent)
            api.connections[id]!.outputSent = 0
        }
        let c = api.connections[id]!
        if c.pendingOutput == 0 && c.closeAfterWrite {
            closeAPI(id)
            return
        }
        let wantRead = c.pendingOutput < APIServer.outputPauseBytes && c.input.count < APIServer.inputPauseBytes
            && !c.closeAfterWrite && !c.peerClosed
        let wantWrite = c.pendingOutput > 0
        if wantRead != c.reading || wantWrite != c.writing {
            api.connections[id]!.reading = wantRead
            api.connections[id]!.writing = wantWrite
            if let r = c.registration { try? selector.setInterest(r, readable: wantRead, writable: wantWrite) }
        }
        // Whole requests held while the output was full: the next turn answers them.
        if c.unanswered && !c.queued && !c.closeAfterWrite && c.parkedToken == nil && c.pendingOutput < APIServer.outputPauseBytes {
            api.connections[id]!.queued = true
            api.again.append(id)
        }
    }
}
