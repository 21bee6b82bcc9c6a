import Testing
@testable import RoomcastCore

/// Records every delivery as (recipient, frame bytes).
final class RecordingSink: FrameSink {
    var deliveries: [(id: Int, frame: [UInt8])] = []
    func broadcast(_ frame: UnsafeRawBufferPointer, from sender: Int, to members: [Int], except: Int) -> Int {
        let recipients = members.filter { $0 != except }
        for id in recipients { deliveries.append((id, Array(frame))) }
        return recipients.count
    }
    func frames(to id: Int) -> [[UInt8]] { deliveries.filter { $0.id == id }.map(\.frame) }
    func recipients() -> [Int] { deliveries.map(\.id).sorted() }
    func reset() { deliveries.removeAll() }
}

/// The relay policy (PROTOCOL.md §2-§4) without sockets.
@Suite struct RelayTests {
    static func user(_ name: String, room: String? = nil) -> UserInfo {
        UserInfo(level: 3, name: name, iconURL: "https://x/\(name).png", room: room)
    }
    static func frame(_ type: UInt16, _ body: [UInt8]) -> [UInt8] {
        FrameCodec.encode(type: type, body: body, byteOrder: .little)
    }
    static func send(_ relay: inout Relay, _ id: Int, _ frame: [UInt8], _ sink: RecordingSink) -> RelayEvent {
        let type = UInt16(frame[4]) | UInt16(frame[5]) << 8
        return frame.withUnsafeBytes { relay.receive(from: id, type: type, frame: $0, sink: sink) }
    }
    static func text(_ name: String, _ text: String) -> [UInt8] {
        frame(2, ChatMessage(user: user(name), text: text).serialized())
    }

    @Test func newConnectionsAreInTheDefaultRoomAndHearIt() {
        var relay = Relay(settings: RelaySettings())
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        #expect(relay.room(of: 0) == "lobby")
        let t = Self.text("a", "hi")
        #expect(Self.send(&relay, 0, t, sink) == .relayed(recipients: 2))
        #expect(sink.frames(to: 1) == [t])
        #expect(sink.frames(to: 0) == [t], "echo to the sender by default")
    }

    @Test func echoOffExcludesTheSender() {
        var relay = Relay(settings: RelaySettings(echo: false))
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        _ = Self.send(&relay, 0, Self.text("a", "hi"), sink)
        #expect(sink.recipients() == [1])
    }

    @Test func heartbeatsAreNeverRelayed() {
        var relay = Relay(settings: RelaySettings())
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        #expect(Self.send(&relay, 0, Self.frame(8, Array("this is a heartBeat message ".utf8)), sink) == .heartbeat)
        #expect(sink.deliveries.isEmpty)
    }

    @Test("a control type set to text's or gift's takes its place (seed 001: heartbeat 1, login 3)")
    func controlTypesTakePrecedence() {
        var relay = Relay(settings: RelaySettings(joinType: 3, leaveType: 4, heartbeatType: 2))
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        #expect(Self.send(&relay, 0, Self.frame(2, Array("ping".utf8)), sink) == .heartbeat, "type 2 is the heartbeat: never decoded")
        #expect(sink.deliveries.isEmpty)
        let login = Self.frame(3, Self.user("a", room: "r").serialized())
        #expect(Self.send(&relay, 0, login, sink) == .joined(name: "a", room: "r", recipients: 1), "type 3 is the join")
        #expect(relay.room(of: 0) == "r")
    }

    @Test func joinMovesRoomsAndRoomsAreIsolated() {
        var relay = Relay(settings: RelaySettings())
        let sink = RecordingSink()
        for id in 0..<3 { relay.connect(id) }
        let joinA = Self.frame(0, Self.user("alice", room: "a").serialized())
        #expect(Self.send(&relay, 0, joinA, sink) == .joined(name: "alice", room: "a", recipients: 1))
        _ = Self.send(&relay, 1, Self.frame(0, Self.user("bob", room: "b").serialized()), sink)
        sink.reset()
        _ = Self.send(&relay, 0, Self.text("alice", "in a"), sink)
        #expect(sink.recipients() == [0])
        sink.reset()
        _ = Self.send(&relay, 2, Self.text("carol", "in lobby"), sink)
        #expect(sink.recipients() == [2])
        #expect(relay.roomCount == 3)
    }

    @Test func rejoinElsewhereAnnouncesLeaveToTheOldRoom() {
        var relay = Relay(settings: RelaySettings())
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        let alice = Self.user("alice").serialized()
        _ = Self.send(&relay, 0, Self.frame(0, alice), sink)
        sink.reset()
        _ = Self.send(&relay, 0, Self.frame(0, Self.user("alice", room: "vip").serialized()), sink)
        #expect(sink.frames(to: 1) == [Self.frame(1, alice)], "the lobby hears alice leave")
        #expect(relay.room(of: 0) == "vip")
    }

    @Test func leaveDetachesWithoutClosingAndRejoinWorks() {
        var relay = Relay(settings: RelaySettings())
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        let alice = Self.user("alice").serialized()
        _ = Self.send(&relay, 0, Self.frame(0, alice), sink)
        sink.reset()
        let leave = Self.frame(1, alice)
        #expect(Self.send(&relay, 0, leave, sink) == .left(room: "lobby", recipients: 1))
        #expect(sink.frames(to: 1) == [leave], "the sender is taken out first, then the room hears it")
        #expect(relay.room(of: 0) == nil)
        sink.reset()
        _ = Self.send(&relay, 1, Self.text("bob", "anyone?"), sink)
        #expect(sink.recipients() == [1], "after leave, nothing reaches the client")
        #expect(Self.send(&relay, 0, Self.text("alice", "shouting into the void"), sink) == .relayed(recipients: 0))
        // A disconnect after leave is silent: it no longer has a join identity.
        sink.reset()
        relay.disconnect(0, sink: sink)
        #expect(sink.deliveries.isEmpty)
    }

    @Test func disconnectOfAJoinedClientSynthesizesItsLeave() {
        var relay = Relay(settings: RelaySettings(byteOrder: .big, leaveType: 21))
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        relay.connect(2)
        let bob = Self.user("bob").serialized()
        _ = FrameCodec.encode(type: 0, body: bob, byteOrder: .big).withUnsafeBytes { relay.receive(from: 1, type: 0, frame: $0, sink: sink) }
        sink.reset()
        let result = relay.disconnect(1, sink: sink)
        #expect(result.room == "lobby" && result.recipients == 2)
        #expect(sink.frames(to: 0) == [FrameCodec.encode(type: 21, body: bob, byteOrder: .big)])
        // Never-joined clients leave silently.
        sink.reset()
        relay.disconnect(2, sink: sink)
        #expect(sink.deliveries.isEmpty)
        #expect(relay.memberCount(of: "lobby") == 1)
    }

    @Test func malformedBodiesAreDroppedAndCounted() {
        var relay = Relay(settings: RelaySettings(maxViolations: 2))
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        let bad = Self.frame(2, [0x0A, 0x05, 0x08])  // user field claims 5 bytes, has 1
        guard case .rejected(_, 1, false) = Self.send(&relay, 0, bad, sink) else { Issue.record("first bad frame"); return }
        guard case .rejected(_, 2, true) = Self.send(&relay, 0, Self.frame(3, []), sink) else { Issue.record("second bad frame"); return }
        guard case .rejected = Self.send(&relay, 1, Self.frame(0, [0xFF]), sink) else { Issue.record("bad join"); return }
        #expect(sink.deliveries.isEmpty)
    }

    @Test func opaqueTypesRelayUnchangedAndValidationCanBeOff() {
        var relay = Relay(settings: RelaySettings(validate: false))
        let sink = RecordingSink()
        relay.connect(0)
        let garbage = Self.frame(2, [0xFF, 0xFF])
        #expect(Self.send(&relay, 0, garbage, sink) == .relayed(recipients: 1))
        let opaque = Self.frame(99, [0xFF, 0x00])
        #expect(Self.send(&relay, 0, opaque, sink) == .relayed(recipients: 1))
        #expect(sink.frames(to: 0) == [garbage, opaque])
    }

    /// Swap-remove keeps every membership index right through churn.
    @Test func membershipChurn() {
        var relay = Relay(settings: RelaySettings())
        let sink = RecordingSink()
        var rng = SystemRandomNumberGenerator()
        var model: [Int: String] = [:]
        for step in 0..<3_000 {
            let id = Int.random(in: 0..<40, using: &rng)
            if model[id] == nil {
                relay.connect(id)
                model[id] = "lobby"
            } else if Bool.random(using: &rng) {
                let room = ["a", "b", "c", "lobby"].randomElement(using: &rng)!
                _ = Self.send(&relay, id, Self.frame(0, Self.user("u\(id)", room: room).serialized()), sink)
                model[id] = room
            } else {
                relay.disconnect(id, sink: sink)
                model[id] = nil
            }
            if step % 100 == 0 {
                for room in ["a", "b", "c", "lobby"] {
                    #expect(relay.memberCount(of: room) == model.values.filter { $0 == room }.count)
                }
                sink.reset()
                if let (id, room) = model.first {
                    _ = Self.send(&relay, id, Self.frame(99, []), sink)
                    #expect(Set(sink.recipients()) == Set(model.filter { $0.value == room }.keys))
                }
            }
        }
    }
}
