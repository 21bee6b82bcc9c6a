@preconcurrency import CHiredis
@preconcurrency import Glibc
import RoomcastCore
import RoomcastIO

// RedisReplies.swift: how a RedisConnection (RedisConnection.swift) reads
// what Redis sends: bounded reads per wakeup, hiredis's parser with the
// reply budget (`maxReplyBytes`), and each reply matched to the command it
// answers or handed to the link as a message.
extension RedisConnection {
    // MARK: - Replies

    /// A reply over `maxReplyBytes`: refused (counted, `replySize`) and the connection closed.
    func brokeOversized() {
        link.refuse(.replySize, "a \(role.name) reply of more than \(formatSize(maxReplyBytes)), its elements counted "
                    + "(not what a daemon of ours writes); the connection is closed")
        broke("a reply of more than \(formatSize(maxReplyBytes)) (not a roomcast message)", .surprise)
    }

    func readReplies() {
        for _ in 0..<Self.readsPerWakeup {
            let result = input.withUnsafeMutableBytes { Sys.read(fd, $0.baseAddress!, $0.count) }
            switch result {
            case .done(let n):
                guard let reader else { return }
                let fed = input.withUnsafeBytes { redisReaderFeed(reader, $0.baseAddress!.assumingMemoryBound(to: CChar.self), n) }
                if fed != REDIS_OK { return broke(Self.readerError(reader), .surprise) }
                guard takeReplies() else { return }
                if roomcast_reader_buffered(reader) > maxReplyBytes { return brokeOversized() }
                if n < Self.readSize { return }
            case .wouldBlock:
                return
            case .endOfFile:
                let midReply = reader.map { roomcast_reader_buffered($0) > 0 || roomcast_reader_in_reply($0) != 0 } ?? false
                return broke(midReply ? "Redis closed the connection in the middle of a reply" : "Redis closed the connection",
                             midReply ? .surprise : .io)
            case .failed(let e):
                return broke(String(cString: strerror(e)), .io)
            }
        }
    }

    /// Every whole reply the parser holds, in order.
    /// - Returns: false when one broke the connection (it is closed).
    func takeReplies() -> Bool {
        while let reader {
            var object: UnsafeMutableRawPointer?
            guard redisReaderGetReply(reader, &object) == REDIS_OK else {
                if budget.pointee.exceeded != 0 { brokeOversized() } else { broke(Self.readerError(reader), .surprise) }
                return false
            }
            guard let object else { return true }
            let reply = object.assumingMemoryBound(to: redisReply.self)
            let problem = answer(reply)
            freeReplyObject(object)
            if let problem {
                broke(problem.reason, problem.loss)
                return false
            }
            if fd < 0 { return false }
        }
        return false
    }

    /// Matches one reply to what it answers.
    /// - Returns: why the connection must close, if it must.
    func answer(_ reply: UnsafeMutablePointer<redisReply>) -> (reason: String, loss: Loss)? {
        let now = link.nowMs
        if role == .subscriber, reply.isArray(3), let kind = reply.bytes(at: 0), kind.elementsEqual("message".utf8) {
            guard let channel = reply.bytes(at: 1), let payload = reply.bytes(at: 2) else {
                return ("a message whose channel or payload is not a string", .surprise)
            }
            guard link.redisMessage(self, channel: channel, payload: payload) else {
                return ("a message on a channel this daemon never subscribed to", .surprise)
            }
            if outstanding > 0 { awaitingSinceMs = now }
            return nil
        }
        guard expectedHead < expected.count else {
            return ("a reply nobody asked for (\(reply.summary))", .surprise)
        }
        var e = expected[expectedHead]
        if reply.pointee.type == REDIS_REPLY_ERROR {
            switch e.kind {
            case .publish:
                link.redisPublishRefused(self, reply.text)
            case .store, .load:
                link.redisModerationRefused(self, reply.text, load: e.kind == .load)
            case .claim, .claimStore:
                link.redisClaimRefused(reply.text, claim: e.kind == .claim)  // ClusterIdempotency.swift
            case .pong, .subscribe, .unsubscribe:
                // The whole command is refused (an ACL, a server that is
                // loading): one error, no confirmation.
                return ("Redis refused \(e.kind == .pong ? "PING" : e.kind == .subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE"): \(reply.text)", .refused)
            }
        } else {
            switch e.kind {
            case .pong:
                guard reply.pointee.type == REDIS_REPLY_STATUS, reply.text == "PONG" else {
                    return ("\(reply.summary) in answer to PING", .surprise)
                }
            case .publish:
                guard reply.pointee.type == REDIS_REPLY_INTEGER else { return ("\(reply.summary) in answer to PUBLISH", .surprise) }
            case .store:
                break
            case .claimStore:
                break
            case .claim:
                // nil: claimed; a string: whose it is (checked there); anything else is no answer to SET.
                guard reply.pointee.type == REDIS_REPLY_NIL || reply.pointee.type == REDIS_REPLY_STRING else {
                    return ("\(reply.summary) in answer to SET NX GET", .surprise)
                }
                link.redisClaimAnswered(reply.pointee.type == REDIS_REPLY_NIL ? nil
                                        : UnsafeRawBufferPointer(start: reply.pointee.str, count: reply.pointee.len))
            case .load:
                guard reply.pointee.type == REDIS_REPLY_ARRAY, reply.pointee.elements % 2 == 0 else {
                    return ("\(reply.summary) in answer to HGETALL", .surprise)
                }
                var pairs: [(field: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)] = []
                pairs.reserveCapacity(reply.pointee.elements / 2)
                for i in stride(from: 0, to: reply.pointee.elements, by: 2) {
                    guard let f = reply.bytes(at: i), let v = reply.bytes(at: i + 1) else { return ("a field or value of HGETALL that is not a string", .surprise) }
                    pairs.append((f, v))
                }
                link.redisModerationLoaded(pairs)
            case .subscribe, .unsubscribe:
                let word = e.kind == .subscribe ? "subscribe" : "unsubscribe"
                guard reply.isArray(3), let kind = reply.bytes(at: 0), kind.elementsEqual(word.utf8),
                      let channel = reply.bytes(at: 1), reply.pointee.element[2]?.pointee.type == REDIS_REPLY_INTEGER else {
                    return ("\(reply.summary) in answer to \(word.uppercased())", .surprise)
                }
                guard channel.elementsEqual(e.channels[e.confirmed]) else {
                    return ("a \(word) confirmation for another channel than the one asked for", .surprise)
                }
                e.confirmed += 1
                if e.confirmed < e.channels.count {
                    expected[expectedHead] = e
                    awaitingSinceMs = now
                    return nil
                }
            }
        }
        // The command at the front is fully answered.
        expectedHead += 1
        if expectedHead == expected.count {
            expected.removeAll(keepingCapacity: true)
            expectedHead = 0
        } else if expectedHead >= 1024 && expectedHead * 2 >= expected.count {
            expected.removeFirst(expectedHead)
            expectedHead = 0
        }
        awaitingSinceMs = outstanding == 0 ? nil : now
        if e.handshake {
            handshakeLeft -= 1
            if handshakeLeft == 0 {
                settledAtMs = now
                link.redisSettled(self)
            }
        }
        return nil
    }

    static func readerError(_ r: UnsafeMutablePointer<redisReader>) -> String {
        let text = withUnsafeBytes(of: r.pointee.errstr) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
        return text.isEmpty ? "a protocol error" : text
    }
}

/// The strings and shape of a hiredis reply, read in place.
extension UnsafeMutablePointer where Pointee == redisReply {
    /// An array of exactly `n` elements.
    func isArray(_ n: Int) -> Bool { pointee.type == REDIS_REPLY_ARRAY && pointee.elements == n }

    /// Element `i` of an array reply as bytes (valid until the reply is freed), nil if it is not a string.
    func bytes(at i: Int) -> UnsafeRawBufferPointer? {
        guard pointee.type == REDIS_REPLY_ARRAY, i < pointee.elements, let e = pointee.element[i],
              e.pointee.type == REDIS_REPLY_STRING, let s = e.pointee.str else { return nil }
        return UnsafeRawBufferPointer(start: s, count: e.pointee.len)
    }

    /// A status or error reply's text.
    var text: String {
        guard let s = pointee.str else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: s, count: pointee.len), as: UTF8.self)
    }

    /// `status "OK"`, `an array of 2`, `integer 3`: for a log line (a string's bytes are not shown).
    var summary: String {
        switch pointee.type {
        case REDIS_REPLY_STATUS: "status \"\(text.prefix(40))\""
        case REDIS_REPLY_ERROR: "error \"\(text.prefix(80))\""
        case REDIS_REPLY_INTEGER: "integer \(pointee.integer)"
        case REDIS_REPLY_NIL: "nil"
        case REDIS_REPLY_ARRAY: "an array of \(pointee.elements)"
        default: "a string of \(pointee.len) bytes"
        }
    }
}
