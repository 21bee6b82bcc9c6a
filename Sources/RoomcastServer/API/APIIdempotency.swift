import RoomcastCore

// APIIdempotency.swift: a keyed publish with a cluster (docs/api.md
// "Idempotency-Key"): its key is claimed in Redis before it is relayed
// (ClusterIdempotency.swift), and its API connection is parked meanwhile:
// nothing more is answered on it until the claim's reply comes (the loop
// goes on; the wait is bounded by `cluster.timeout`, after which the
// publisher is dropped and the claim fails over to the local cache).

/// A publish by Idempotency-Key waiting for its claim in Redis.
struct PendingPublish {
    var key: String
    var fingerprint: [UInt8]
    var room: RoomName
    var type: UInt16
    var frame: [UInt8]
    /// The API connection parked for its answer; nil until `answerAPI`
    /// parks it, or once it closed.
    var connection: Int?
}

extension IdempotencyCache {
    /// The draft's answer (§2.7) to a key whose first request is still being processed.
    static let inProgressError = APIError(409, "idempotency_key_in_progress",
                                          "a request with this Idempotency-Key is still being processed (here or on another daemon of the cluster); retry later")
}

extension APIResponse {
    /// Not an answer: the request waits for its Idempotency-Key's claim
    /// (`APIServer.claims[token]`); `answerAPI` parks its connection.
    static func deferred(_ token: UInt64) -> APIResponse {
        var r = APIResponse(status: 0, body: [])
        r.deferredToken = token
        return r
    }
}

extension Server {
    /// Relays a publish and remembers its key (`key` and `fingerprint`
    /// both or neither). - Throws: 422 `bad_publish` when the relay refuses the frame.
    func relayPublish(_ frame: [UInt8], type: UInt16, room: RoomName, key: String?, fingerprint: [UInt8]?,
                      now: UInt64) throws(APIError) -> UInt64 {
        let result = frame.withUnsafeBytes { relay.publish($0, type: type, toRoom: room, sink: table.fanout) }
        switch result {
        case .success(let n):
            status.framesIn &+= 1
            relay.countReceived(type)
            if let key, let fingerprint { api.idempotency.remember(key, fingerprint: fingerprint, delivered: UInt64(n), now: now) }
            return UInt64(n)
        case .failure(let e):
            throw APIError(422, "bad_publish", "the frame would be refused: \(e)")
        }
    }

    /// With a cluster: sends the claim of `key` and returns the deferred
    /// answer; nil when the claim cannot be sent (the caller serves the
    /// request from the local cache, counted and logged as a fallback).
    func claimPublish(_ p: PendingPublish, cluster: ClusterLink, now: UInt64) -> APIResponse? {
        let token = api.nextClaim
        guard cluster.claimIdempotency(p.key, fingerprint: p.fingerprint, token: token) else {
            noteIdempotencyFallback(cluster, "the publisher is not connected, or its output is over max_output_bytes", now: now)
            return nil
        }
        api.nextClaim &+= 1
        api.claims[token] = p
        return .deferred(token)
    }

    /// The claim `token` was answered (or failed): the publish is relayed
    /// or not, and its parked connection gets the answer.
    func claimAnswered(_ token: UInt64, _ outcome: IdempotencyClaimOutcome) {
        guard let p = api.claims.removeValue(forKey: token), let cluster else { return }
        let now = clock()
        let response: APIResponse
        do throws(APIError) {
            switch outcome {
            case .claimed:
                do throws(APIError) {
                    let n = try relayPublish(p.frame, type: p.type, room: p.room, key: p.key, fingerprint: p.fingerprint, now: now)
                    cluster.finishClaim(p.key, fingerprint: p.fingerprint, delivered: n)
                    response = IdempotencyCache.reply(delivered: n)
                } catch {
                    cluster.releaseClaim(p.key)
                    throw error
                }
            case .taken(let v):
                guard v.fingerprint == p.fingerprint else { throw IdempotencyCache.mismatchError }
                guard let n = v.delivered else { throw IdempotencyCache.inProgressError }
                api.idempotency.remember(p.key, fingerprint: p.fingerprint, delivered: n, now: now)
                response = IdempotencyCache.reply(delivered: n)
            case .notOurs:
                throw IdempotencyCache.mismatchError  // taken by something this daemon cannot read: never relayed twice
            case .failed(let why):
                noteIdempotencyFallback(cluster, why, now: now)
                // The local cache decides, as without a cluster (another
                // request of this key may have been answered here meanwhile).
                if let first = try api.idempotency.answer(p.key, fingerprint: p.fingerprint, now: now) {
                    response = first
                } else {
                    response = IdempotencyCache.reply(delivered: try relayPublish(p.frame, type: p.type, room: p.room, key: p.key,
                                                                                   fingerprint: p.fingerprint, now: now))
                }
            }
        } catch {
            response = APIResponse(error)
        }
        if let id = p.connection { resumeAPI(id, token: token, response, now: now) }
    }

    /// A keyed publish served by the local cache alone: counted, logged rate-limited.
    func noteIdempotencyFallback(_ cluster: ClusterLink, _ why: String, now: UInt64) {
        cluster.countIdempotencyFallback()
        logger.peerWarning(reason: "cluster_idempotency_fallback", nowMs: now,
                           "cluster: an Idempotency-Key could not be claimed in Redis (\(why)); this daemon's cache alone decides "
                           + "(a retry on another daemon may be relayed again)",
                           ["REASON": "cluster_idempotency_fallback", "REDIS": cluster.address.description])
    }

    /// Gives parked connection `id` its answer and lets it go on.
    func resumeAPI(_ id: Int, token: UInt64, _ response: APIResponse, now: UInt64) {
        guard api.connections.indices.contains(id), let c = api.connections[id], c.parkedToken == token else { return }
        api.connections[id]!.parkedToken = nil
        api.requests[response.status, default: 0] &+= 1
        api.connections[id]!.output.append(contentsOf: response.serialized(close: !c.parkedKeepAlive))
        api.connections[id]!.idleDeadlineMs = now + APIServer.idleTimeoutMs
        if !c.parkedKeepAlive {
            api.connections[id]!.closeAfterWrite = true
            api.connections[id]!.input = []
            api.connections[id]!.unanswered = false
        } else if !api.connections[id]!.input.isEmpty {
            api.connections[id]!.unanswered = true
            api.connections[id]!.requestDeadlineMs = now + APIServer.requestTimeoutMs
        } else if c.peerClosed {
            api.connections[id]!.unanswered = true  // answerAPI sees the end and closes it once written
        }
        flushAPI(id)  // pipelined requests behind it: queued for the next turn (api.again)
    }
}
