@preconcurrency import COpenSSL
import CShim
@preconcurrency import Glibc
import RoomcastCore

// The load generator's reading: LTB, HTTP answers, WebSocket and RESP parsing, deliveries (Engine.swift holds its state).
extension Engine {
    func readConn(_ id: Int) {
        let c = conns + id
        let keep = c.pointee.carryLen
        if keep > 0 { scratch.copyMemory(from: c.pointee.carry!, byteCount: keep) }
        var n: Int
        let ask = min(o.readSize, scratchCap - keep)
        if let ssl = c.pointee.ssl {
            // Records until OpenSSL wants the socket (what it holds wakes no epoll).
            n = 0
            while n < ask {
                ERR_clear_error()
                let r = SSL_read(ssl, scratch + keep + n, Int32(ask - n))
                if r > 0 { n += Int(r); continue }
                let e = SSL_get_error(ssl, r)
                if e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE { break }
                if n == 0 { serverClosed(id, "SSL_read: error \(e)"); return }
                break
            }
            if n == 0 { return }
        } else {
            repeat { n = read(c.pointee.fd, scratch + keep, ask) } while n < 0 && errno == EINTR
        }
        if n <= 0 {
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
            serverClosed(id, n == 0 ? "end of file" : "read: \(String(cString: strerror(errno)))")
            return
        }
        bytesIn &+= UInt64(n)
        if measuring { measuredReads &+= 1; measuredBytesIn &+= UInt64(n) }
        let have = keep + n
        let now = monotonicNs()
        let used: Int
        switch (o.target, c.pointee.webSocket) {
        case (.roomcast, .none) where o.api && c.pointee.role == .publisher: used = parseAnswers(id, have, now: now)
        case (.roomcast, .none): used = parseLTB(id, have, now: now)
        case (.roomcast, _): used = parseWebSocket(id, have, now: now)
        case (.redis, _): used = parseRESP(id, have, now: now)
        }
        let rest = have - used
        if rest > 0 {
            if rest > c.pointee.carryCap {
                c.pointee.carry?.deallocate()
                let cap = max(rest, 256)
                c.pointee.carry = .allocate(byteCount: cap, alignment: 16)
                c.pointee.carryCap = cap
            }
            c.pointee.carry!.copyMemory(from: scratch + used, byteCount: rest)
        }
        c.pointee.carryLen = rest
    }

    /// Consumes whole LTB frames from the scratch buffer; returns the bytes used.
    func parseLTB(_ id: Int, _ have: Int, now: UInt64) -> Int {
        var off = 0
        while have - off >= 6 {
            let length = Int(UInt32(littleEndian: scratch.loadUnaligned(fromByteOffset: off, as: UInt32.self)))
            if have - off - 6 < length { break }
            handleLTB(id, at: off, length: length, now: now)
            off += 6 + length
        }
        return off
    }

    /// One whole LTB frame at `off` of the scratch buffer (`length`: its body's bytes).
    @inline(__always)
    func handleLTB(_ id: Int, at off: Int, length: Int, now: UInt64) {
        let type = UInt16(littleEndian: scratch.loadUnaligned(fromByteOffset: off + 4, as: UInt16.self))
        if length > o.maxFrameBytes { fatal("server sent a frame of \(length) bytes (type \(type))") }
        let role = conns[id].role
        if type == wire.dataType {
            if role == .member {
                deliverPayload(id, UnsafeRawPointer(scratch + off + 6 + wire.payloadOffset), binary: wire.body == .opaque, now: now)
            } else {
                publisherReceipts &+= 1
            }
        } else if type == Wire.joinType {
            joinsReceived[role == .extra ? 1 : 0] += 1
        } else {
            otherFrames &+= 1
        }
    }

    /// An API publisher's answers (HTTP/1.1, one per request): a 200 counts
    /// one publish, its latency, and whether `delivered` was every member;
    /// anything else is an error. Either way the next request may go.
    func parseAnswers(_ id: Int, _ have: Int, now: UInt64) -> Int {
        let p = Int(conns[id].index)
        var off = 0
        while off < have {
            let answer = HTTPAnswer.parse(UnsafeRawBufferPointer(start: scratch + off, count: have - off))
            switch answer {
            case .incomplete:
                return off
            case .malformed(let why):
                serverClosed(id, "the API's answer: \(why)")
                return have
            case .answer(let status, let bodyAt, let bodyLength, let end):
                guard awaiting[p] else {
                    serverClosed(id, "the API answered a request that was not sent")
                    return have
                }
                awaiting[p] = false
                let body = UnsafeRawBufferPointer(start: scratch + off + bodyAt, count: bodyLength)
                if status == 200 {
                    apiOK &+= 1
                    if deliveredCount(body) != Int(recipients) { deliveredMismatch &+= 1 }
                    if measuring {
                        measuredPublishes &+= 1
                        requestHist.record(now &- requestSentNs[p])
                    }
                } else {
                    apiErrors &+= 1
                    if firstError == nil {
                        firstError = "publish answered \(status): \(String(decoding: body.prefix(200), as: UTF8.self))"
                    }
                }
                off += end
            }
        }
        return off
    }

    /// A WebSocket member: first the 101 answer to its upgrade, then whole server
    /// frames (unmasked, RFC 6455 §5.2), each binary message one LTB frame
    /// (roomcast.ltb.v1); pings are answered with pongs. Returns the bytes used.
    func parseWebSocket(_ id: Int, _ have: Int, now: UInt64) -> Int {
        var off = 0
        if conns[id].webSocket == .upgrading {
            let head = UnsafeRawBufferPointer(start: scratch, count: have)
            guard let end = (0..<max(0, have - 3)).first(where: {
                head[$0] == 13 && head[$0 + 1] == 10 && head[$0 + 2] == 13 && head[$0 + 3] == 10
            }) else {
                if have > 8192 { serverClosed(id, "no end to the upgrade's answer in 8 KiB") }
                return 0
            }
            let answer = String(decoding: head[0..<end], as: UTF8.self)
            guard answer.hasPrefix("HTTP/1.1 101"), answer.lowercased().contains("sec-websocket-protocol: roomcast.ltb.v1") else {
                serverClosed(id, "upgrade refused: \(answer.prefix(80))")
                return have
            }
            conns[id].webSocket = .open
            sendHello(id)
            off = end + 4
        }
        while have - off >= 2 {
            let b0 = scratch.load(fromByteOffset: off, as: UInt8.self)
            var length = Int(scratch.load(fromByteOffset: off + 1, as: UInt8.self) & 0x7F)
            var at = off + 2
            if length == 126 {
                guard have - off >= 4 else { break }
                length = Int(UInt16(bigEndian: scratch.loadUnaligned(fromByteOffset: off + 2, as: UInt16.self)))
                at = off + 4
            } else if length == 127 {
                guard have - off >= 10 else { break }
                length = Int(UInt64(bigEndian: scratch.loadUnaligned(fromByteOffset: off + 2, as: UInt64.self)))
                at = off + 10
            }
            if length > o.maxFrameBytes + 6 { fatal("server sent a WebSocket frame of \(length) bytes") }
            guard have - at >= length else { break }
            switch b0 & 0x0F {
            case 2 where length >= 6: handleLTB(id, at: at, length: length - 6, now: now)
            case 9:
                sendMessage(id, scratch + at, length, opcode: 10)
                if !conns[id].writeArmed { flush(id) }
            case 8:
                serverClosed(id, "WebSocket close \(length >= 2 ? Int(UInt16(bigEndian: scratch.loadUnaligned(fromByteOffset: at, as: UInt16.self))) : 1005)")
                return have
            default: otherFrames &+= 1
            }
            off = at + length
        }
        return off
    }

    /// Records one data frame's payload (publisher, sequence, send time),
    /// binary or hex as the body format says; the same for LTB and RESP.
    @inline(__always)
    func deliverPayload(_ id: Int, _ p: UnsafeRawPointer, binary: Bool, now: UInt64) {
        if binary {
            deliver(id, Int(UInt32(littleEndian: p.loadUnaligned(as: UInt32.self))),
                    UInt64(littleEndian: p.loadUnaligned(fromByteOffset: 4, as: UInt64.self)),
                    UInt64(littleEndian: p.loadUnaligned(fromByteOffset: 12, as: UInt64.self)), now: now)
        } else {
            deliver(id, Int(loadHex(p, digits: 8)), loadHex(p + 8, digits: 16), loadHex(p + 24, digits: 16), now: now)
        }
    }

    /// Consumes whole RESP replies and pushes; returns the bytes used.
    func parseRESP(_ id: Int, _ have: Int, now: UInt64) -> Int {
        let role = conns[id].role
        let base = UnsafeRawPointer(scratch)
        let binary = wire.body == .opaque
        let payloadOffset = wire.payloadOffset
        var off = 0
        while off < have {
            let first = base.load(fromByteOffset: off, as: UInt8.self)
            if first == UInt8(ascii: "*") {
                // An array of bulk strings / integers: message, subscribe, pong pushes.
                guard let (count, afterHeader) = respLine(base, off + 1, have) else { break }
                var at = afterHeader
                var kindStart = -1, kindLen = 0, lastStart = -1, lastLen = 0
                var complete = true
                for e in 0..<max(0, count) {
                    guard at < have else { complete = false; break }
                    let t = base.load(fromByteOffset: at, as: UInt8.self)
                    guard let (value, afterLine) = respLine(base, at + 1, have) else { complete = false; break }
                    if t == UInt8(ascii: "$") {
                        let end = afterLine + max(0, value) + 2
                        guard end <= have else { complete = false; break }
                        if e == 0 { kindStart = afterLine; kindLen = value }
                        lastStart = afterLine; lastLen = value
                        at = end
                    } else {
                        at = afterLine   // ':' integer (subscriber count)
                    }
                }
                guard complete else { break }
                off = at
                if kindLen == 7 && base.load(fromByteOffset: kindStart, as: UInt8.self) == UInt8(ascii: "m") {
                    if role == .member, lastLen >= payloadOffset + (binary ? Wire.binaryPayloadSize : Wire.hexPayloadSize) {
                        deliverPayload(id, base + lastStart + payloadOffset, binary: binary, now: now)
                    } else {
                        publisherReceipts &+= 1
                    }
                } else if kindLen == 9 && base.load(fromByteOffset: kindStart, as: UInt8.self) == UInt8(ascii: "s") {
                    subscribed[role == .extra ? 1 : 0] += 1
                } else if kindLen == 4 && base.load(fromByteOffset: kindStart, as: UInt8.self) == UInt8(ascii: "p") {
                    pongs &+= 1
                } else {
                    otherFrames &+= 1
                }
            } else if first == UInt8(ascii: ":") || first == UInt8(ascii: "+") || first == UInt8(ascii: "-") {
                guard let nl = lineEnd(base, off, have) else { break }
                if first == UInt8(ascii: "-") {
                    serverErrors &+= 1
                    if firstError == nil {
                        firstError = "redis: " + String(decoding: UnsafeRawBufferPointer(start: base + off, count: nl - off), as: UTF8.self)
                    }
                } else if first == UInt8(ascii: "+") {
                    pongs &+= 1
                }
                off = nl + 2
            } else {
                fatal("unexpected RESP byte \(first) from the server")
            }
        }
        return off
    }

    /// Index of the "\r" of the line starting at `from`, or nil if incomplete.
    @inline(__always)
    func lineEnd(_ base: UnsafeRawPointer, _ from: Int, _ have: Int) -> Int? {
        var i = from
        while i + 1 < have {
            if base.load(fromByteOffset: i, as: UInt8.self) == 13 { return i }
            i += 1
        }
        return nil
    }

    /// A RESP decimal integer line at `from` ("-1", "42") and the offset after its CRLF.
    @inline(__always)
    func respLine(_ base: UnsafeRawPointer, _ from: Int, _ have: Int) -> (Int, Int)? {
        var i = from
        var v = 0
        var negative = false
        while i < have {
            let c = base.load(fromByteOffset: i, as: UInt8.self)
            if c == 13 {
                guard i + 1 < have else { return nil }
                return (negative ? -v : v, i + 2)
            }
            if c == UInt8(ascii: "-") { negative = true } else { v = v &* 10 &+ Int(c &- 48) }
            i += 1
        }
        return nil
    }

    @inline(__always)
    func deliver(_ member: Int, _ pub: Int, _ seq: UInt64, _ sentNs: UInt64, now: UInt64) {
        deliveries &+= 1
        // Per-sender order (docs/protocol/rooms.md §4): each member must see each
        // publisher's sequence numbers 0, 1, 2... with no gap, repeat or swap.
        if pub >= 0 && pub < o.publishers {
            let k = member * o.publishers + pub
            if nextExpected[k] != seq { orderErrors &+= 1 }
            nextExpected[k] = seq &+ 1
        } else {
            orderErrors &+= 1
        }
        if measuring {
            measuredDeliveries &+= 1
            let lat = now &- sentNs
            let v = lat > (1 << 62) ? 0 : lat   // a clock read racing the send: count as 0
            hist.record(v)
            if inStorm { stormHist.record(v) }
        }
        guard o.closedLoop, !o.api, pub >= 0, pub < o.publishers else { return }
        let base = pub * ringSize
        let slot = Int(seq % UInt64(ringSize))
        ring[base + slot] &+= 1
        if seq == oldest[pub] && ring[base + slot] == recipients {
            // Slide the window past every frame that all members now have.
            var s = seq
            while s < nextSeq[pub] {
                let k = base + Int(s % UInt64(ringSize))
                guard ring[k] == recipients else { break }
                ring[k] = 0
                s += 1
                completedFrames &+= 1
            }
            oldest[pub] = s
        }
    }
}
