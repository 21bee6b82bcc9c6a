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

/// The relay policy (docs/protocol/ §2-§4) without sockets.
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

    @Test("a control type set to text's or gift's takes its place (other clients: heartbeat 1, login 3)")
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
        guard case .rejected(_, 1, false, .badFrame) = Self.send(&relay, 0, bad, sink) else { Issue.record("first bad frame"); return }
        guard case .rejected(_, 2, true, .badFrame) = Self.send(&relay, 0, Self.frame(3, []), sink) else { Issue.record("second bad frame"); return }
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

    @Test("a join naming a room over max_room_bytes is a violation (room_too_long); the sender keeps its room and identity")
    func roomTooLongIsRefused() {
        var relay = Relay(settings: RelaySettings(maxViolations: 3))
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        let alice = Self.user("alice", room: "a").serialized()
        _ = Self.send(&relay, 0, Self.frame(0, alice), sink)
        _ = Self.send(&relay, 1, Self.frame(0, Self.user("bob", room: "a").serialized()), sink)
        let roomsBefore = relay.roomCount
        sink.reset()

        let huge = String(repeating: "r", count: 60_000)
        let event = Self.send(&relay, 0, Self.frame(0, Self.user("mallory", room: huge).serialized()), sink)
        guard case .rejected(let reason, 1, false, .roomTooLong) = event else {
            Issue.record("not refused as room_too_long: \(event)")
            return
        }
        #expect(reason.hasPrefix("join: room is 60000 bytes, over protocol.max_room_bytes (255): 'rrrr"), "\(reason)")
        #expect(reason.utf8.count < 200, "the reason quotes only the start of the room: \(reason.utf8.count) bytes")
        #expect(sink.deliveries.isEmpty, "the join is not relayed anywhere")
        #expect(relay.room(of: 0) == "a" && relay.name(of: 0) == "alice", "still alice, still in a")
        #expect(relay.roomCount == roomsBefore, "no room was made for it")
        // Its room's traffic still reaches it.
        let hi = Self.text("bob", "still there?")
        #expect(Self.send(&relay, 1, hi, sink) == .relayed(recipients: 2))
        #expect(sink.frames(to: 0) == [hi])
        // Its identity is alice's join: a disconnect announces that to a.
        sink.reset()
        relay.disconnect(0, sink: sink)
        #expect(sink.frames(to: 1) == [Self.frame(1, alice)])
    }

    @Test("max_room_bytes counts UTF-8 bytes, the limit itself is allowed, and reconfigure changes it")
    func roomLimitBoundaryAndReconfigure() {
        var relay = Relay(settings: RelaySettings(maxRoomBytes: 10))
        let sink = RecordingSink()
        relay.connect(0)
        let elevenBytes = "caf\u{E9}-caf\u{E9}"  // 9 characters, 11 bytes
        #expect(elevenBytes.utf8.count == 11)
        guard case .rejected(_, _, _, .roomTooLong) = Self.send(&relay, 0, Self.frame(0, Self.user("a", room: elevenBytes).serialized()), sink) else {
            Issue.record("11 bytes (9 characters) passed a 10-byte limit")
            return
        }
        let exactly = "caf\u{E9}-cafe"  // 10 bytes
        #expect(Self.send(&relay, 0, Self.frame(0, Self.user("a", room: exactly).serialized()), sink)
                == .joined(name: "a", room: exactly, recipients: 1))
        relay.reconfigure(RelaySettings(maxRoomBytes: 11))
        #expect(Self.send(&relay, 0, Self.frame(0, Self.user("a", room: elevenBytes).serialized()), sink)
                == .joined(name: "a", room: elevenBytes, recipients: 1), "the new limit applies to the next join")
        // A join without a room (the default room) is never measured against it.
        relay.reconfigure(RelaySettings(defaultRoom: "lobby", maxRoomBytes: 1))
        #expect(Self.send(&relay, 0, Self.frame(0, Self.user("a").serialized()), sink) == .joined(name: "a", room: "lobby", recipients: 1))
    }

    /// "café" with U+00E9 (NFC: 63 61 66 c3 a9) and with "e" + U+0301 (NFD:
    /// 63 61 66 65 cc 81) are equal as Swift Strings but different bytes.
    static let nfc = "caf\u{E9}", nfd = "cafe\u{301}"

    @Test("rooms whose names look alike (NFC and NFD café) are two rooms: byte-wise, not canonical equivalence")
    func roomsAreByteStrings() {
        #expect(Self.nfc == Self.nfd, "the premise: String == is canonical equivalence")
        #expect(Array(Self.nfc.utf8) == [0x63, 0x61, 0x66, 0xC3, 0xA9])
        #expect(Array(Self.nfd.utf8) == [0x63, 0x61, 0x66, 0x65, 0xCC, 0x81])
        var relay = Relay(settings: RelaySettings())
        let sink = RecordingSink()
        relay.connect(0)
        relay.connect(1)
        let joinNFC = Self.frame(0, Self.user("alice", room: Self.nfc).serialized())
        let joinNFD = Self.frame(0, Self.user("bob", room: Self.nfd).serialized())
        #expect(Self.send(&relay, 0, joinNFC, sink) == .joined(name: "alice", room: Self.nfc, recipients: 1))
        #expect(Self.send(&relay, 1, joinNFD, sink) == .joined(name: "bob", room: Self.nfd, recipients: 1),
                "bob's join reaches only bob: alice is in another room")
        #expect(relay.roomCount == 2)
        #expect(relay.memberCount(of: RoomName(bytes: [0x63, 0x61, 0x66, 0xC3, 0xA9])) == 1)
        #expect(relay.memberCount(of: RoomName(bytes: [0x63, 0x61, 0x66, 0x65, 0xCC, 0x81])) == 1)
        #expect(relay.roomName(of: 0)?.bytes == Array(Self.nfc.utf8))
        #expect(relay.roomName(of: 1)?.bytes == Array(Self.nfd.utf8))
        sink.reset()
        _ = Self.send(&relay, 0, Self.text("alice", "nfc"), sink)
        _ = Self.send(&relay, 1, Self.text("bob", "nfd"), sink)
        #expect(sink.frames(to: 0) == [Self.text("alice", "nfc")])
        #expect(sink.frames(to: 1) == [Self.text("bob", "nfd")])
        // Moving from one spelling to the other is a real move: the old room hears the leave.
        relay.connect(2)
        _ = Self.send(&relay, 2, Self.frame(0, Self.user("carol", room: Self.nfc).serialized()), sink)
        sink.reset()
        let carolNFD = Self.user("carol", room: Self.nfd).serialized()
        _ = Self.send(&relay, 2, Self.frame(0, carolNFD), sink)
        #expect(sink.frames(to: 0) == [Self.frame(1, Self.user("carol", room: Self.nfc).serialized())], "alice hears carol leave")
        #expect(relay.memberCount(of: RoomName(Self.nfd)) == 2)
    }

    @Test("events, user infos and messages compare their strings byte for byte")
    func equalityIsByteWise() {
        #expect(RelayEvent.joined(name: "a", room: Self.nfc, recipients: 1) != .joined(name: "a", room: Self.nfd, recipients: 1))
        #expect(RelayEvent.joined(name: Self.nfc, room: "r", recipients: 1) != .joined(name: Self.nfd, room: "r", recipients: 1))
        #expect(RelayEvent.left(room: Self.nfc, recipients: 1) != .left(room: Self.nfd, recipients: 1))
        #expect(RelayEvent.left(room: nil, recipients: 1) != .left(room: "", recipients: 1))
        #expect(RelayEvent.joined(name: "a", room: Self.nfc, recipients: 1) == .joined(name: "a", room: "caf\u{E9}", recipients: 1))
        #expect(Self.user("a", room: Self.nfc) != Self.user("a", room: Self.nfd))
        #expect(Self.user(Self.nfc) != Self.user(Self.nfd))
        #expect(Self.user("a", room: Self.nfc) == Self.user("a", room: "caf\u{E9}"))
        #expect(ChatMessage(user: Self.user("a"), text: Self.nfc) != ChatMessage(user: Self.user("a"), text: Self.nfd))
        #expect(GiftMessage(user: Self.user("a"), giftname: Self.nfc, giftURL: "u", giftcount: 1)
                != GiftMessage(user: Self.user("a"), giftname: Self.nfd, giftURL: "u", giftcount: 1))
        #expect(RelaySettings(defaultRoom: Self.nfc) != RelaySettings(defaultRoom: Self.nfd))
        #expect(RoomName(Self.nfc) != RoomName(Self.nfd) && Set([RoomName(Self.nfc), RoomName(Self.nfd)]).count == 2)
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
