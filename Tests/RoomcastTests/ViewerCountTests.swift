// Viewer counts without sockets: `[rooms]` keys, the sweep that folds
// counts into `viewers` notices, the counts each daemon publishes to the
// cluster and their sum over daemons, and `announce_joins = no`.
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

/// An observer that records what the relay would publish to the cluster.
private final class ClusterFeedObserver: RelayObserver {
    var published: [[UInt8]] = []
    func roomOpened(_ room: RoomName) {}
    func roomClosed(_ room: RoomName) {}
    func relayed(_ frame: UnsafeRawBufferPointer, room: RoomName, from sender: Int) { published.append(Array(frame)) }
}

@Suite struct ViewerCountTests {
    @Test func roomsKeys() throws {
        #expect(Config.defaults.rooms.countsMs == 5_000)
        #expect(Config.defaults.rooms.announceJoins)
        let c = try Config.parse("[rooms]\ncounts = 2\nannounce_joins = no\n", file: "t.conf")
        #expect(c.rooms.countsMs == 2_000 && !c.rooms.announceJoins)
        #expect(try Config.parse("[rooms]\ncounts = 0\n", file: "t.conf").rooms.countsMs == 0)
        #expect(try Config.parse("[rooms]\ncounts = 1min\n", file: "t.conf").rooms.countsMs == 60_000)
        for bad in ["1500ms", "2h", "-1", "soon"] {
            #expect(throws: ConfigError.self, "counts = \(bad)") { try Config.parse("[rooms]\ncounts = \(bad)\n", file: "t.conf") }
        }
        #expect(throws: ConfigError.self) { try Config.parse("[rooms]\nannounce_joins = maybe\n", file: "t.conf") }
        #expect(RelaySettings(c).announceJoins == false)
    }

    @Test func sweepTellsChangedRoomsOncePerInterval() {
        var s = ViewerCountSweep()
        #expect(s.nextMs == .max)
        s.schedule(intervalMs: 5_000, nowMs: 1_000)
        #expect(s.nextMs == 6_000)
        // First sweep: every room is told its count.
        let first = s.sweep([("a", 3), ("b", 1)], nowMs: 6_000)
        #expect(Dictionary(uniqueKeysWithValues: first.map { ($0.room, $0.viewers) }) == ["a": 3, "b": 1])
        #expect(s.nextMs == 11_000)
        // Many joins and leaves in between fold into one notice of the new count; unchanged rooms hear nothing.
        #expect(s.sweep([("a", 3), ("b", 1)], nowMs: 11_000).isEmpty)
        let third = s.sweep([("a", 250), ("b", 1)], nowMs: 16_000)
        #expect(third.count == 1 && third[0].room == "a" && third[0].viewers == 250)
        // A room that closed is forgotten: open again, it is told anew.
        #expect(s.sweep([("a", 250)], nowMs: 21_000).isEmpty)
        #expect(s.sweep([("a", 250), ("b", 1)], nowMs: 26_000).map(\.room) == ["b"])
        // Reloading the same interval keeps the schedule; 0 turns it off and forgets.
        s.schedule(intervalMs: 5_000, nowMs: 27_000)
        #expect(s.nextMs == 31_000)
        s.schedule(intervalMs: 0, nowMs: 28_000)
        #expect(s.nextMs == .max && s.told.isEmpty)
    }

    @Test func clusterCountsRoundTrip() throws {
        var out: [UInt8] = [0xFF]
        ClusterCounts.encode([(RoomName("lobby"), 3), (RoomName(bytes: [0xC3, 0xA9, 0x00]), 70_000), (RoomName("empty"), 0)], into: &out)
        #expect(out.count == (2 + 5 + 4) + (2 + 3 + 4), "emptied first; rooms without members are left out")
        let decoded = try out.withUnsafeBytes { ClusterCounts.decode($0, maxRoomBytes: 255) }.get()
        #expect(decoded == [RoomName("lobby"): 3, RoomName(bytes: [0xC3, 0xA9, 0x00]): 70_000])
        #expect([UInt8]().withUnsafeBytes { ClusterCounts.decode($0, maxRoomBytes: 255) } == .success([:]))
        for cut in 1..<out.count where cut != 11 {
            #expect(out[..<cut].withUnsafeBytes { ClusterCounts.decode($0, maxRoomBytes: 255) } == .failure(.cutShort), "cut at \(cut)")
        }
        // In an envelope on the daemons channel: no frame header to check.
        var envelope: [UInt8] = []
        out.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .counts, origin: 7, stream: 0, seq: 0, room: RoomName(bytes: []), address: "", frame: $0, into: &envelope)
        }
        let view = try envelope.withUnsafeBytes { p throws -> (ClusterEnvelope.Kind, [UInt8]) in
            let v = try ClusterEnvelope.decode(p).get()
            return (v.kind, Array(v.frame))
        }
        #expect(view.0 == .counts && view.1 == out)
    }

    @Test func remoteCountsAreSummedReplacedAndDropOut() {
        var r = RemoteDaemons()
        r.setCounts(1, ["live": 10, "lobby": 2], nowMs: 1_000)
        r.setCounts(2, ["live": 5], nowMs: 1_000)
        #expect(r.viewers == ["live": 15, "lobby": 2])
        r.setCounts(1, ["live": 8], nowMs: 2_000)  // a new snapshot replaces the old one
        #expect(r.viewers == ["live": 13])
        _ = r.remove(2)  // said bye, or was silent for cluster.timeout
        #expect(r.viewers == ["live": 8])
        r.expireCounts(nowMs: 2_000 + RemoteDaemons.countsMaxAgeMs)
        #expect(r.viewers == ["live": 8], "not older than the limit yet")
        r.expireCounts(nowMs: 2_001 + RemoteDaemons.countsMaxAgeMs)
        #expect(r.viewers.isEmpty, "counts not refreshed for 10 s drop out")
    }

    @Test func announceJoinsOffKeepsJoinsAndLeavesFromTheRoom() {
        var settings = RelaySettings()
        settings.announceJoins = false
        var relay = Relay(settings: settings)
        let observer = ClusterFeedObserver()
        relay.observer = observer
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        let join = RelayTests.frame(0, RelayTests.user("a", room: "live").serialized())
        _ = RelayTests.send(&relay, 0, RelayTests.frame(0, RelayTests.user("b", room: "live").serialized()), sink)
        sink.reset()
        _ = RelayTests.send(&relay, 1, join, sink)
        #expect(sink.recipients() == [1], "the join comes back to its sender only")
        #expect(relay.memberCount(of: "live") == 2)
        sink.reset()
        let t = RelayTests.text("a", "hi")
        _ = RelayTests.send(&relay, 1, t, sink)
        #expect(sink.recipients() == [0, 1], "texts reach the room as always")
        sink.reset()
        relay.disconnect(0, sink: sink)
        #expect(sink.deliveries.isEmpty, "a synthesized leave reaches nobody")
        relay.connect(2)
        _ = RelayTests.send(&relay, 2, RelayTests.frame(0, RelayTests.user("c", room: "live").serialized()), sink)
        sink.reset()
        _ = RelayTests.send(&relay, 1, RelayTests.frame(1, RelayTests.user("a").serialized()), sink)
        #expect(sink.deliveries.isEmpty, "a sent leave reaches nobody")
        #expect(observer.published == [t], "joins and leaves do not go to the cluster")
    }
}

/// What /metrics counts by: frame kinds from the control codes, and
/// disconnect reasons from the close texts the server writes.
@Suite struct MetricKindTests {
    @Test func frameKinds() {
        let k = { (t: UInt16) in FrameKind.of(t, join: 10, leave: 11, heartbeat: 12, notice: 13) }
        #expect([k(10), k(11), k(12), k(2), k(3), k(13), k(0), k(42)] == [.join, .leave, .heartbeat, .text, .gift, .notice, .opaque, .opaque])
        var counts = FrameKindCounts()
        counts.add(.text)
        counts.add(.text, 4)
        #expect(counts[.text] == 5 && counts[.gift] == 0)
    }

    @Test func disconnectReasons() {
        let c = { (t: String) in DisconnectReason.classify(t, warning: nil) }
        #expect(c("closed by peer") == .peerClosed)
        #expect(c("read: Connection reset by peer (ECONNRESET)") == .error)
        #expect(c("send: Broken pipe (EPIPE)") == .error)
        #expect(c("frame length 2147483647 exceeds max_frame_bytes 65536") == .frameTooLarge)
        #expect(c("3 bad frames (protocol.max_violations = 3)") == .violations)
        #expect(c("slow consumer: output above output_soft_bytes (256K) for 10s") == .slowConsumer)
        #expect(DisconnectReason.classify("anything", warning: "output_hard_limit") == .slowConsumer)
        #expect(c("drain timeout with 10 bytes unsent") == .drainTimeout)
        #expect(c("daemon stopping") == .stopping)
        #expect(c("restart: a TLS session cannot move to the next process") == .stopping)
        #expect(c("something new") == .other)
        #expect(c(String(repeating: "x", count: 4096) + "reset") == .error && c("rese") == .other && c("") == .other)
        #expect(DisconnectReason.has("abc", "") && DisconnectReason.has("abc", "abc") && !DisconnectReason.has("ab", "abc")
                && DisconnectReason.has("héllo wörld", "wö") && !DisconnectReason.has("aab", "abb"))
        #expect(Set(DisconnectReason.allCases.map(\.label)).count == DisconnectReason.allCases.count)
    }
}
