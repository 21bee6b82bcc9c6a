@preconcurrency import COpenSSL
import CShim
@preconcurrency import Glibc
import RoomcastCore

// The load generator's sending: the publishers' closed-loop window and rate (Engine.swift holds its state).
extension Engine {
    func startSending() {
        rateStartNs = monotonicNs()
        rateSent = 0
        sending = true
    }

    /// Frames not yet delivered to every member (closed loop).
    var outstanding: UInt64 {
        var n: UInt64 = 0
        if o.api {
            for p in 0..<o.publishers where awaiting[p] { n += 1 }
            return n
        }
        for p in 0..<o.publishers { n += nextSeq[p] - oldest[p] }
        return n
    }

    func sendDue() {
        let now = monotonicNs()
        if o.api {
            for p in 0..<o.publishers where !awaiting[p] && nextSeq[p] < framesLimit {
                let id = publisherIDs[p]
                guard conns[id].state == .open else { continue }
                writeRequest(p, id, now: now)
                flush(id)
            }
            return
        }
        if let rate = o.rate {
            let due = UInt64(Double(now &- rateStartNs) * rate / 1e9)
            if due <= rateSent { return }
            let lag = now &- (rateStartNs &+ UInt64(Double(rateSent + 1) * 1e9 / rate))
            if lag < (1 << 62) && lag > maxSendLagNs { maxSendLagNs = lag }
            while rateSent < due {
                let p = Int(rateSent % UInt64(o.publishers))
                rateSent += 1
                guard nextSeq[p] < framesLimit else { continue }
                let id = publisherIDs[p]
                guard conns[id].state == .open else { continue }
                writeFrame(p, id, now: now)
            }
            for p in 0..<o.publishers where pending(publisherIDs[p]) > 0 && !conns[publisherIDs[p]].writeArmed {
                flush(publisherIDs[p])
            }
            return
        }
        for p in 0..<o.publishers {
            let id = publisherIDs[p]
            guard conns[id].state == .open, pending(id) == 0 else { continue }
            let limit = min(oldest[p] + UInt64(ringSize), framesLimit)
            guard nextSeq[p] < limit else { continue }
            while nextSeq[p] < limit { writeFrame(p, id, now: now) }
            flush(id)
        }
    }

    @inline(__always)
    func writeFrame(_ p: Int, _ id: Int, now: UInt64) {
        let seq = nextSeq[p]
        nextSeq[p] = seq + 1
        framesSent &+= 1
        let dst = reserve(id, messageLen)
        dst.copyMemory(from: templates[p], byteCount: messageLen)
        let at = dst + payloadAt
        if wire.body == .opaque {
            at.storeBytes(of: seq.littleEndian, toByteOffset: 4, as: UInt64.self)
            at.storeBytes(of: now.littleEndian, toByteOffset: 12, as: UInt64.self)
        } else {
            storeHex(seq, digits: 16, at: at + 8)
            storeHex(now, digits: 16, at: at + 24)
        }
    }

    /// Publisher p's next request, its sequence and send time stamped in.
    func writeRequest(_ p: Int, _ id: Int, now: UInt64) {
        let seq = nextSeq[p]
        nextSeq[p] = seq + 1
        framesSent &+= 1
        awaiting[p] = true
        requestSentNs[p] = now
        let r = apiRequests[p]
        let dst = reserve(id, r.bytes.count)
        r.bytes.withUnsafeBytes { dst.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        storeHex(seq, digits: 16, at: dst + r.sequenceAt)
        storeHex(now, digits: 16, at: dst + r.timeAt)
        if let k = r.keySequenceAt { storeHex(seq, digits: 16, at: dst + k) }
    }
}
