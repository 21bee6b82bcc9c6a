// The hand-over state: what one roomcastd process leaves the next
// across a restart. Round trips, every field, the version-1 fixture a later
// binary must keep reading, and damaged, truncated and unknown states.
import Foundation
import Testing
@testable import RoomcastCore

@Suite("Hand-over state encoding")
struct HandOverStateTests {
    /// A state that sets every field of every kind, with bytes that would
    /// trip a text-based format (NUL, 0xFF, newlines). Frozen: it is what the
    /// version-1 fixture holds; a later version's new fields belong in a
    /// state of their own.
    static var full: HandOverState {
        var a = HandOverState.Record(key: 7)
        a.dialect = .ltb
        a.peerAddress = "203.0.113.7:51234"
        a.room = "rüm \n 1"
        a.identity = [0x08, 0x01, 0x12, 0x05] + Array("alice".utf8) + [0x00, 0xFF]
        a.input = [0x10, 0x00, 0x00, 0x00, 0x02, 0x00, 0xAA]
        a.output = Array(repeating: 0xFF, count: 300) + [0, 1, 2]
        a.heartbeatRemainingMs = 12_345
        a.violations = 2
        a.frameMilliTokens = 4_500
        a.byteMilliTokens = -1
        var b = HandOverState.Record(key: UInt64.max)
        b.dialect = .json
        b.peerAddress = "[::1]:9"
        b.nickname = "guest232"
        b.input = [0x05, 0x00, 0x00]
        b.partialFrameRemainingMs = 0
        b.heartbeatRemainingMs = UInt32.max
        b.draining = true
        b.output = [1]
        let c = HandOverState.Record(key: 0)  // every field at its default
        return HandOverState(stoppedReadingMs: 1_234_567_890_123, writer: "0.9.0", connections: [a, b, c])
    }

    static let fixtureURL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/handover-state-v1.bin")

    @Test func roundTripKeepsEveryField() throws {
        let state = Self.full
        let bytes = state.encode()
        #expect(Array(bytes.prefix(4)) == Array("RCHO".utf8))
        #expect(bytes[4] == 1 && bytes[5] == 0, "version 1, little-endian")
        let back = try HandOverState.decode(bytes)
        #expect(back == state)
        // Field by field, so that a failure names the field.
        for (x, y) in zip(back.connections, state.connections) {
            #expect(x.key == y.key)
            #expect(x.dialect == y.dialect)
            #expect(x.peerAddress == y.peerAddress)
            #expect(x.room == y.room)
            #expect(x.identity == y.identity)
            #expect(x.nickname == y.nickname)
            #expect(x.input == y.input)
            #expect(x.output == y.output)
            #expect(x.heartbeatRemainingMs == y.heartbeatRemainingMs)
            #expect(x.partialFrameRemainingMs == y.partialFrameRemainingMs)
            #expect(x.violations == y.violations)
            #expect(x.frameMilliTokens == y.frameMilliTokens)
            #expect(x.byteMilliTokens == y.byteMilliTokens)
            #expect(x.draining == y.draining)
        }
        #expect(back.stoppedReadingMs == 1_234_567_890_123 && back.writer == "0.9.0")
    }

    @Test func emptyAndEmptyButJoined() throws {
        #expect(try HandOverState.decode(HandOverState().encode()) == HandOverState())
        // An empty identity (a join with an empty body, validate = no) is not "not joined".
        var r = HandOverState.Record(key: 1)
        r.identity = []
        r.room = ""
        let s = HandOverState(connections: [r])
        let back = try HandOverState.decode(s.encode())
        #expect(back.connections[0].identity == [] && back.connections[0].room == "")
    }

    @Test func roomNamesAreBytes() throws {
        var r = HandOverState.Record(key: 1)
        r.room = RoomName(bytes: [0xFF, 0x00, 0x80, 0x61])  // not UTF-8: room names are byte strings
        #expect(try HandOverState.decode(HandOverState(connections: [r]).encode()).connections[0].room == r.room)
    }

    @Test func largeFieldsRoundTrip() throws {
        var r = HandOverState.Record(key: 1)
        r.output = (0..<1_000_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        r.input = Array(repeating: 0x42, count: 70_000)
        let s = HandOverState(connections: [r])
        #expect(try HandOverState.decode(s.encode()) == s)
    }

    @Test func thousandConnectionsRoundTrip() throws {
        var s = HandOverState(stoppedReadingMs: 5, writer: "x")
        for i in 0..<1_000 {
            var r = HandOverState.Record(key: UInt64(i))
            r.room = RoomName("room-\(i % 10)")
            r.identity = Array("user-\(i)".utf8)
            r.heartbeatRemainingMs = UInt32(i)
            s.connections.append(r)
        }
        #expect(try HandOverState.decode(s.encode()) == s)
    }

    /// The file a version-1 binary wrote (committed; regenerate it only with
    /// a version-1 encoder). Every later binary must read it.
    @Test func readsTheVersion1Fixture() throws {
        let bytes = try [UInt8](Data(contentsOf: Self.fixtureURL))
        #expect(bytes[4] == 1, "the fixture is version 1")
        let state = try HandOverState.decode(bytes)
        #expect(state == Self.full)
        #expect(state.boxName == "box" && state.socketOptions == "", "fields added after the fixture get their defaults")
    }

    @Test func fieldsAddedAfterVersion1RoundTrip() throws {
        var s = Self.full
        s.boxName = "livebox-12"
        s.socketOptions = "30000/0"
        let back = try HandOverState.decode(s.encode())
        #expect(back.boxName == "livebox-12" && back.socketOptions == "30000/0")
        #expect(back.moderation.isEmpty, "no moderation records: none decoded")
        s.moderation = [.entry(ModerationKey(.ban, room: "a room", sub: Array("sub:1".utf8)), untilMs: 9_000, setMs: 8_000, reason: "spam"),
                        .settings("a room", slowModeSeconds: 30, setMs: 7_000)]
        #expect(try HandOverState.decode(s.encode()).moderation == s.moderation)
        var without = s
        without.moderation = []
        #expect(s.encode().count - without.encode().count <= HandOverState.moderationBytesBound(s.moderation), "the size bound holds")
    }

    @Test("the torn-frame count and the time over output_soft_bytes round-trip; absent (an older writer), they default")
    func tornBytesAndSoftClockRoundTrip() throws {
        var r = HandOverState.Record(key: 9)
        r.output = [1, 2, 3, 4, 5]
        r.tornBytes = 3
        r.softLimitElapsedMs = 7_250
        let back = try HandOverState.decode(HandOverState(connections: [r]).encode())
        #expect(back.connections.first?.tornBytes == 3 && back.connections.first?.softLimitElapsedMs == 7_250)
        let plain = try HandOverState.decode(HandOverState(connections: [HandOverState.Record(key: 9)]).encode())
        #expect(plain.connections.first?.tornBytes == 0 && plain.connections.first?.softLimitElapsedMs == nil)
        r.tornBytes = 6  // more than is owed: a damaged state, never a read past the queue
        #expect(throws: HandOverState.DecodeError.self) { try HandOverState.decode(HandOverState(connections: [r]).encode()) }
    }

    @Test("the size bound a writer keeps the state under is never below what encode writes")
    func sizeBoundHolds() throws {
        var r = HandOverState.Record(key: .max)
        r.peerAddress = "[2001:db8::1]:65535"
        r.room = "a room"
        r.identity = [UInt8](repeating: 1, count: 40)
        r.nickname = "nick"
        r.input = [UInt8](repeating: 2, count: 100)
        r.output = [UInt8](repeating: 3, count: 1000)
        (r.heartbeatRemainingMs, r.partialFrameRemainingMs, r.violations) = (1, 2, 3)
        (r.frameMilliTokens, r.byteMilliTokens, r.draining, r.tornBytes, r.softLimitElapsedMs) = (4, 5, true, 6, 7)
        var s = HandOverState(stoppedReadingMs: 1, writer: "roomcastd 9.9.9", connections: [r, r])
        s.boxName = "livebox-123"
        s.socketOptions = "nodelay"
        let one = HandOverState.recordBytesBound(address: r.peerAddress.utf8.count, room: 6, identity: 40, nickname: 4, input: 100, output: 1000)
        let bound = HandOverState.globalsBytesBound(writer: 15 + 11 + 7) + 2 * one
        #expect(s.encode().count <= bound, "\(s.encode().count) bytes encoded, bound \(bound)")
    }

    /// A newer writer may add fields and records; this reader skips them.
    @Test func unknownTagsAreSkipped() throws {
        var bytes = Self.full.encode()
        // Append a record of an unknown top-level tag, and fix length and CRC.
        bytes += [0x63, 0x00, 0x03, 0x00, 0x00, 0x00, 1, 2, 3]
        Self.reseal(&bytes)
        #expect(try HandOverState.decode(bytes) == Self.full)
        // An unknown field inside a connection record.
        var r = HandOverState.Record(key: 3)
        r.room = "lobby"
        var one = HandOverState(connections: [r]).encode()
        // The connection record is last: grow it by one unknown field.
        let field: [UInt8] = [0xE8, 0x03, 0x01, 0x00, 0x00, 0x00, 0x2A]
        let recordStart = Self.lastRecordStart(one)
        let oldLength = Int(one[recordStart + 2]) | Int(one[recordStart + 3]) << 8
        one[recordStart + 2] = UInt8((oldLength + field.count) & 0xFF)
        one[recordStart + 3] = UInt8((oldLength + field.count) >> 8)
        one += field
        Self.reseal(&one)
        #expect(try HandOverState.decode(one).connections == [r])
    }

    @Test func unknownVersionIsRefused() {
        var bytes = Self.full.encode()
        bytes[4] = 2
        #expect(throws: HandOverState.DecodeError.unknownVersion(2)) { try HandOverState.decode(bytes) }
        #expect(HandOverState.DecodeError.unknownVersion(2).reason == "handover_state_version")
    }

    @Test func damagedStatesAreRefused() {
        let good = Self.full.encode()
        func damaged(_ bytes: [UInt8]) -> Bool {
            do {
                _ = try HandOverState.decode(bytes)
                return false
            } catch {
                if case .damaged = error { return error.reason == "handover_state_damaged" }
                return false
            }
        }
        #expect(damaged([]))
        #expect(damaged(Array(good.prefix(10))), "cut inside the header")
        #expect(damaged(Array(good.dropLast())), "one byte short")
        #expect(damaged(Array(good.prefix(good.count / 2))), "cut in half")
        #expect(damaged(good + [0]), "one byte too many")
        var flipped = good
        flipped[good.count - 40] ^= 0x01
        #expect(damaged(flipped), "one bit flipped in the payload")
        var magic = good
        magic[0] = UInt8(ascii: "X")
        #expect(damaged(magic), "not our magic")
        var zero = good
        zero[4] = 0
        #expect(damaged(zero), "version 0")
        // A record whose length runs past the end, with a valid checksum.
        var overrun = HandOverState().encode()
        overrun += [0x02, 0x00, 0xFF, 0xFF, 0x00, 0x00, 1]
        Self.reseal(&overrun)
        #expect(damaged(overrun), "a record longer than the payload")
        // A connection without its key, with a valid checksum.
        var keyless = HandOverState().encode()
        keyless += [0x02, 0x00, 0x07, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00]
        Self.reseal(&keyless)
        #expect(damaged(keyless), "a record without a key")
        // The connection count in the globals disagrees with the records.
        var missing = HandOverState(connections: [HandOverState.Record(key: 1), HandOverState.Record(key: 2)]).encode()
        missing.removeSubrange(Self.lastRecordStart(missing)...)
        Self.reseal(&missing)
        #expect(damaged(missing), "a record cut out")
        // Random garbage with the right magic and version.
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            var junk = Array(good.prefix(24)) + (0..<Int.random(in: 0..<300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            Self.reseal(&junk)
            _ = try? HandOverState.decode(junk)  // must not trap
        }
    }

    @Test func crc32KnownValue() {
        #expect(CRC32.checksum(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(CRC32.checksum([]) == 0)
    }

    // MARK: - Helpers

    /// Rewrites the payload length and CRC of an encoded state after an edit.
    static func reseal(_ bytes: inout [UInt8]) {
        let payload = Array(bytes[24...])
        let length = UInt64(payload.count)
        for i in 0..<8 { bytes[8 + i] = UInt8(truncatingIfNeeded: length >> (8 * UInt64(i))) }
        let crc = CRC32.checksum(payload)
        for i in 0..<4 { bytes[16 + i] = UInt8(truncatingIfNeeded: crc >> (8 * UInt32(i))) }
    }

    /// The offset of the last top-level record of an encoded state.
    static func lastRecordStart(_ bytes: [UInt8]) -> Int {
        var offset = 24
        var last = offset
        while offset < bytes.count {
            last = offset
            let length = Int(bytes[offset + 2]) | Int(bytes[offset + 3]) << 8 | Int(bytes[offset + 4]) << 16 | Int(bytes[offset + 5]) << 24
            offset += 6 + length
        }
        return last
    }

    /// Writes the version-1 fixture; run once by hand with
    /// `ROOMCAST_WRITE_FIXTURE=1 swift test --filter HandOverStateTests`.
    @Test func writeFixtureWhenAsked() throws {
        guard ProcessInfo.processInfo.environment["ROOMCAST_WRITE_FIXTURE"] == "1" else { return }
        try FileManager.default.createDirectory(at: Self.fixtureURL.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(Self.full.encode()).write(to: Self.fixtureURL)
    }
}

@Suite struct HandOverStateClusterTests {
    @Test("the cluster record round-trips; a state without one has none")
    func clusterRoundTrip() throws {
        var s = HandOverState(stoppedReadingMs: 7, writer: "t")
        #expect(try HandOverState.decode(s.encode()).cluster == nil)
        s.cluster = .init(origin: 0xDEAD_BEEF, lastStream: 9,
                          streams: [.init(room: "r1", id: 3, seq: 120), .init(room: RoomName(bytes: [0xFF, 0x00]), id: 9, seq: 1)])
        #expect(try HandOverState.decode(s.encode()) == s)
    }

    @Test("the return deadline a hand-over announced round-trips in the cluster record (absent: nil), within clusterBytesBound")
    func returnDeadlineRoundTrips() throws {
        var s = HandOverState(stoppedReadingMs: 7, writer: "t")
        s.cluster = .init(origin: 1, lastStream: 3, streams: [.init(room: "r1", id: 3, seq: 9)])
        #expect(try HandOverState.decode(s.encode()).cluster?.returnByMs == nil)
        s.cluster!.returnByMs = 123_456_789
        #expect(try HandOverState.decode(s.encode()) == s)
        #expect(HandOverState.clusterBytesBound(s.cluster!) >= s.encode().count - HandOverState(stoppedReadingMs: 7, writer: "t").encode().count)
    }

    @Test("the tracker's positions round-trip in the cluster record, and a tracker restored from them counts what it missed")
    func positionsRoundTrip() throws {
        var tracker = ClusterSequenceTracker()
        _ = tracker.check(room: "r1", origin: 7, stream: 2, seq: 40)
        _ = tracker.check(room: "r2", origin: 7, stream: 5, seq: 1)
        _ = tracker.check(room: "r1", origin: 9, stream: 1, seq: 3)
        var s = HandOverState(stoppedReadingMs: 7, writer: "t")
        s.cluster = .init(origin: 1, lastStream: 1, streams: [], positions: tracker.carried)
        let decoded = try #require(try HandOverState.decode(s.encode()).cluster)
        #expect(Set(decoded.positions) == Set(tracker.carried) && decoded.positions.count == 3)
        #expect(HandOverState.clusterBytesBound(s.cluster!) >= s.encode().count - HandOverState(stoppedReadingMs: 7, writer: "t").encode().count)
        var restored = ClusterSequenceTracker()
        restored.restore(decoded.positions)
        #expect(restored.check(room: "r1", origin: 7, stream: 2, seq: 43) == .deliver(missed: 2))
        #expect(restored.check(room: "r1", origin: 9, stream: 1, seq: 3) == .late)
        #expect(restored.check(room: "r2", origin: 7, stream: 6, seq: 2) == .deliver(missed: 1))
        var fresh = ClusterSequenceTracker()
        #expect(fresh.check(room: "r1", origin: 7, stream: 2, seq: 43) == .deliver(missed: 0), "without them the gap is invisible")
    }

    @Test("the tracker reports each changed room once per take, forgotten ones with no positions")
    func trackerChanges() {
        var t = ClusterSequenceTracker()
        t.tracksChanges = true
        _ = t.check(room: "r1", origin: 7, stream: 1, seq: 1)
        _ = t.check(room: "r1", origin: 7, stream: 1, seq: 2)
        _ = t.check(room: "r2", origin: 8, stream: 1, seq: 1)
        let first = t.takeChanged()
        #expect(first.count == 2 && first["r1"] == [.init(room: "r1", origin: 7, stream: 1, seq: 2)])
        #expect(t.takeChanged().isEmpty)
        t.forget(origin: 8)
        t.forget(room: "r1")
        let second = t.takeChanged()
        #expect(second.count == 2 && second["r1"] == [] && second["r2"] == [], "\(second)")
    }
}
