// The cluster envelope's two versions (docs/protocol/across-daemons.md §12): version 2
// carries the sender's verified sub, version 1 is what every daemon reads.
// `ReleasedDecoder` is the decoder of the release before version 2, kept
// here byte for byte in what it accepts, so both directions of a rolling
// upgrade are checked against what an old daemon really does.
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

/// The envelope decoder of the last release with version 1 only (its
/// checks, in its order): what an old daemon accepts.
enum ReleasedDecoder {
    enum Failure: Error, Equatable { case tooShort, unknownVersion(UInt8), unknownKind(UInt8), badFrame }
    struct View { var kind: UInt8; var origin: UInt64; var room: [UInt8]; var address: [UInt8]; var frame: [UInt8] }

    static func decode(_ b: [UInt8]) -> Result<View, Failure> {
        guard b.count >= 29 else { return .failure(.tooShort) }
        guard b[0] == 1 else { return .failure(.unknownVersion(b[0])) }
        guard b[1] <= 5 else { return .failure(.unknownKind(b[1])) }
        let roomLength = Int(b[2]) | Int(b[3]) << 8, addressLength = Int(b[4])
        let frameStart = 29 + roomLength + addressLength
        guard b.count >= frameStart else { return .failure(.tooShort) }
        let frame = Array(b[frameStart...])
        if b[1] == 1 || b[1] == 2 {
            guard frame.count >= 6 else { return .failure(.badFrame) }
            // The header: a 4-byte length, then a 2-byte type, in the kind's byte order.
            let length = b[1] == 1 ? Int(frame[0]) | Int(frame[1]) << 8 | Int(frame[2]) << 16 | Int(frame[3]) << 24
                                   : Int(frame[3]) | Int(frame[2]) << 8 | Int(frame[1]) << 16 | Int(frame[0]) << 24
            guard 6 + length == frame.count else { return .failure(.badFrame) }
        }
        var origin: UInt64 = 0
        for i in 0..<8 { origin |= UInt64(b[5 + i]) << (8 * UInt64(i)) }
        return .success(View(kind: b[1], origin: origin, room: Array(b[29..<(29 + roomLength)]),
                              address: Array(b[(29 + roomLength)..<(29 + roomLength + addressLength)]), frame: frame))
    }
}

@Suite struct ClusterEnvelopeVersionTests {
    static let frame = FrameCodec.encode(type: 2, body: [1, 2, 3, 0, 0xff], byteOrder: .little)

    static func envelope(sub: String?, kind: ClusterEnvelope.Kind = .littleEndianFrame, frame: [UInt8] = frame) -> [UInt8] {
        var out: [UInt8] = []
        frame.withUnsafeBytes {
            ClusterEnvelope.encode(kind: kind, origin: 0x0102030405060708, stream: 7, seq: 9, room: "lobby", address: "127.0.0.1:5",
                                   sub: sub, frame: $0, into: &out)
        }
        return out
    }

    @Test("version 1 is byte for byte what the release before sent, and it still reads it")
    func versionOneUnchanged() throws {
        let v1 = Self.envelope(sub: nil)
        let expected: [UInt8] = [1, 1, 5, 0, 11, 8, 7, 6, 5, 4, 3, 2, 1, 7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]
            + Array("lobby".utf8) + Array("127.0.0.1:5".utf8) + Self.frame
        #expect(v1 == expected)
        let old = try ReleasedDecoder.decode(v1).get()
        #expect(old.room == Array("lobby".utf8) && old.frame == Self.frame)
        try v1.withUnsafeBytes { p in
            let v = try ClusterEnvelope.decode(p).get()
            #expect(v.version == 1 && v.sub.isEmpty && Array(v.frame) == Self.frame && Array(v.address) == Array("127.0.0.1:5".utf8))
        }
    }

    @Test("version 2 carries the sub (bytes, NFC and NFD apart, empty for none); the old decoder refuses it")
    func versionTwoCarriesSub() throws {
        for sub in ["u-1", "caf\u{E9}", "cafe\u{301}", "", String(repeating: "s", count: 1024)] {
            let v2 = Self.envelope(sub: sub)
            #expect(v2[0] == 2 && v2.count == ClusterEnvelope.fixedSizeWithSub + 5 + 11 + sub.utf8.count + Self.frame.count)
            #expect(Array(v2[29..<31]) == [UInt8(sub.utf8.count & 0xff), UInt8(sub.utf8.count >> 8)])
            try v2.withUnsafeBytes { p in
                let v = try ClusterEnvelope.decode(p).get()
                #expect(v.version == 2 && v.kind == .littleEndianFrame && v.origin == 0x0102030405060708 && v.stream == 7 && v.seq == 9)
                #expect(Array(v.room) == Array("lobby".utf8) && Array(v.address) == Array("127.0.0.1:5".utf8))
                #expect(Array(v.sub) == Array(sub.utf8))
                #expect(Array(v.frame) == Self.frame)
            }
            // What makes the advertisement necessary: an old daemon drops it.
            if case .failure(let why) = ReleasedDecoder.decode(v2) { #expect(why == .unknownVersion(2)) } else { Issue.record("the old decoder took version 2") }
        }
        // Cut short anywhere: refused, never read past the end.
        let v2 = Self.envelope(sub: "u-1")
        for n in 0..<v2.count {
            let cut = Array(v2.prefix(n))
            let failed = cut.withUnsafeBytes { if case .failure = ClusterEnvelope.decode($0) { true } else { false } }
            #expect(failed, "\(n) bytes")
        }
        var huge = v2; huge[29] = 0xff; huge[30] = 0xff
        #expect(huge.withUnsafeBytes { if case .failure(.tooShort) = ClusterEnvelope.decode($0) { true } else { false } })
    }

    @Test("a heartbeat advertises the versions read; the old decoder takes it and ignores the bytes; an empty one means version 1 only")
    func heartbeatAdvertisement() throws {
        var hb: [UInt8] = []
        ClusterEnvelope.readableVersions.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .heartbeat, origin: 42, stream: 0, seq: 3, room: RoomName(bytes: []), address: "", frame: $0, into: &hb)
        }
        #expect(hb[0] == 1, "heartbeats stay in version 1: every daemon must hear them")
        let old = try ReleasedDecoder.decode(hb).get()
        #expect(old.kind == 0 && old.origin == 42, "the release before accepts the heartbeat (its frame bytes are ignored for kind 0)")
        try hb.withUnsafeBytes { p in
            let v = try ClusterEnvelope.decode(p).get()
            #expect(v.kind == .heartbeat && Array(v.frame) == [1, 2])
            #expect(ClusterEnvelope.reads(2, advert: v.frame) && ClusterEnvelope.reads(1, advert: v.frame))
        }
        // What the release before sends: no bytes after the header.
        var oldHB: [UInt8] = []
        ClusterEnvelope.encode(kind: .heartbeat, origin: 43, stream: 0, seq: 3, room: RoomName(bytes: []), address: "",
                               frame: UnsafeRawBufferPointer(start: nil, count: 0), into: &oldHB)
        #expect(oldHB.count == ClusterEnvelope.fixedSize)
        try oldHB.withUnsafeBytes { p in
            let v = try ClusterEnvelope.decode(p).get()
            #expect(!ClusterEnvelope.reads(2, advert: v.frame) && ClusterEnvelope.reads(1, advert: v.frame))
        }
    }

    @Test("the cluster reads version 2 only while every daemon known advertises it: one that is new, old, downgraded or gone changes that")
    func everyReaderDecides() {
        var r = RemoteDaemons()
        #expect(r.legacyReaders == 0)
        r.heard(1, readsSub: true, nowMs: 10)
        #expect(r.legacyReaders == 0)
        // Known from a join before any heartbeat (a daemon just started, or of a release before): version 1 only.
        let tracked1 = r.joined(2, address: "a:1", room: "r", identity: [1], nowMs: 11)
        #expect(tracked1)
        #expect(r.legacyReaders == 1)
        r.heard(2, readsSub: true, nowMs: 12)
        #expect(r.legacyReaders == 0)
        r.heard(2, readsSub: false, nowMs: 13)  // downgraded under the same origin
        #expect(r.legacyReaders == 1)
        r.setCounts(3, ["r": 1], nowMs: 14)
        r.handingOver(4, graceMs: 100, nowMs: 14)
        #expect(r.legacyReaders == 3)
        _ = r.remove(2); _ = r.remove(3); _ = r.remove(4)
        #expect(r.legacyReaders == 0)
        _ = r.remove(1)
        #expect(r.legacyReaders == 0 && r.daemons.isEmpty)
        // Counts arriving after a daemon's bye leave an entry with nothing: it is forgotten once they expire.
        r.setCounts(5, ["r": 2], nowMs: 100)
        #expect(r.legacyReaders == 1)
        r.expireCounts(nowMs: 100 + RemoteDaemons.countsMaxAgeMs + 1)
        #expect(r.legacyReaders == 0 && r.daemons.isEmpty)
        // One with members (a release before the daemons channel, which never heartbeats there) is kept, and keeps version 1.
        let tracked2 = r.joined(6, address: "x:1", room: "r", identity: [1], nowMs: 200)
        #expect(tracked2)
        r.expireCounts(nowMs: 200 + RemoteDaemons.countsMaxAgeMs + 1)
        #expect(r.legacyReaders == 1)
    }

    @Test("a remote member keeps the sub its join came with; the room's list orders them by daemon and address")
    func membersKeepSub() {
        var r = RemoteDaemons()
        let tracked3 = r.joined(9, address: "b:2", room: "r", identity: [1], sub: "u-9", nowMs: 1)
        #expect(tracked3)
        let tracked4 = r.joined(3, address: "a:1", room: "r", identity: [2], sub: nil, nowMs: 1)
        #expect(tracked4)
        let tracked5 = r.joined(3, address: "c:1", room: "other", identity: [3], sub: "u-3", nowMs: 1)
        #expect(tracked5)
        let list = r.members(in: "r")
        #expect(list.map(\.origin) == [3, 9] && list.map(\.member.sub) == [nil, "u-9"] && list.map(\.address) == ["a:1", "b:2"])
    }
}
