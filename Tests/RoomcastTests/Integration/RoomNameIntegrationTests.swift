// Room names against the real roomcastd: their length is bounded
// (`[protocol] max_room_bytes`), they are byte strings (names that only look
// alike are different rooms), and peer-supplied names cannot make log lines
// long.
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Room names (real roomcastd): max_room_bytes, byte-wise rooms, bounded log lines")
struct RoomNameIntegrationTests {
    /// The longest line of the daemon's log so far, in bytes.
    static func longestLine(_ d: Daemon) -> Int {
        d.stderr.current.split(separator: "\n").map(\.utf8.count).max() ?? 0
    }

    @Test("a join naming a 60,000-byte room is refused (REASON=room_too_long): the client stays in its room and hears it; log lines stay short")
    func longRoomIsRefused() throws {
        let d = try Daemon()
        let alice = Wire.user("alice", room: "a")
        let a = try d.connect(), b = try d.connect()
        try a.send(Wire.join(alice))
        let bob = Wire.user("bob", room: "a")
        try b.send(Wire.join(bob))
        #expect(a.receiveFrames(2).map(\.wire) == [Wire.join(alice), Wire.join(bob)])
        #expect(b.receiveFrame()?.wire == Wire.join(bob))

        let huge = String(repeating: "r", count: 60_000)
        try a.send(Wire.join(Wire.user("mallory", room: huge)))
        #expect(d.stderr.wait(forLineWith: ["REASON=room_too_long", a.address, "room is 60000 bytes, over protocol.max_room_bytes (255)"]),
                "stderr: \(d.stderr.current.suffix(2000))")
        a.expectNoFrame(within: .milliseconds(200), "(the refused join is relayed nowhere, not even back)")
        a.expectOpen()
        #expect(Self.longestLine(d) < 1_500, "the longest log line is \(Self.longestLine(d)) bytes")
        // Still in room a, still alice: b's text reaches it, and its own text goes to a.
        let hi = Wire.text(bob, "still there?")
        try b.send(hi)
        #expect(a.receiveFrame()?.wire == hi, "the client stays in its room and gets its traffic")
        #expect(b.receiveFrame()?.wire == hi)
        let line = try #require(d.stderr.line(with: ["REASON=room_too_long"]))
        #expect(line.hasSuffix(" ROOM=a"), "the warning names the room it stayed in: \(line.suffix(100))")
        // A 60,000-byte user name in an ordinary join is relayed, but logged cut.
        let longName = UserInfo(level: 1, name: String(repeating: "n", count: 60_000), iconURL: "", room: "a")
        try b.send(Wire.join(longName))
        let relayed = a.receiveFrame()?.wire
        #expect(relayed == Wire.join(longName), "got \(relayed?.count ?? 0) bytes, type \(relayed.map { $0[4] } ?? 255)")
        #expect(d.stderr.wait(forLineWith: ["joined a", "…(60000 bytes)", "USER_NAME="]))
        let longest = Self.longestLine(d)
        #expect(longest < 1_500, "the longest log line is \(longest) bytes")
    }

    @Test("400 clients each naming a 60,000-byte room: all refused, all still in the lobby, RSS grows < 8 MiB (was 46 MiB)")
    func manyLongRoomsCostNothing() throws {
        let d = try Daemon()
        let probe = try d.connect()
        pause(.milliseconds(100))
        let before = d.rssKiB
        var clients: [TestClient] = []
        for i in 0..<400 {
            let c = try d.connect(awaitAccept: false)
            // Each name differs in its first bytes, so none could share a room.
            let room = String(i) + String(repeating: "r", count: 60_000 - String(i).count)
            try c.send(Wire.join(Wire.user("u\(i)", room: room)) + Wire.frame(Wire.opaque, Array(String(i).utf8)))
            clients.append(c)
        }
        // Each one's opaque frame reaches the lobby, so each join was refused and left it there.
        let frames = probe.receiveFrames(400, timeout: .seconds(20))
        #expect(frames.count == 400, "the probe in the lobby got \(frames.count) of 400 frames")
        #expect(Set(frames.map { String(decoding: $0.body, as: UTF8.self) }).count == frames.count)
        let grown = d.rssKiB - before
        reportFigure("room_too_long", "rss_growth_400_clients_kib", String(grown))
        #expect(grown < 8 * 1024 * rssBoundFactor, "RSS grew \(grown) KiB for 400 clients naming 60,000-byte rooms")
        #expect(Self.longestLine(d) < 1_500)
        _ = clients
    }

    @Test("a reload applies a changed max_room_bytes to the next joins")
    func reloadChangesTheLimit() throws {
        let d = try Daemon(["protocol.max_room_bytes": "16"])
        let c = try d.connect()
        let twenty = Wire.user("a", room: String(repeating: "x", count: 20))
        try c.send(Wire.join(twenty))
        #expect(d.stderr.wait(forLineWith: ["REASON=room_too_long", "over protocol.max_room_bytes (16)"]))
        c.expectNoFrame(within: .milliseconds(200), "(refused at 16 bytes)")

        try d.rewriteConfig(Daemon.fullConfig(["protocol.max_room_bytes": "32"]))
        let from = d.notify.all.count
        d.child.kill(SIGHUP)
        #expect(d.notify.wait(for: "READY=1", from: from, timeout: .seconds(5)) != nil)
        #expect(d.stderr.wait(forLineWith: ["configuration reloaded"]))
        try c.send(Wire.join(twenty))
        #expect(c.receiveFrame()?.wire == Wire.join(twenty), "accepted at 32 bytes")
    }

    @Test("two rooms that look alike (café in NFC and in NFD) are two rooms: no frame crosses between them")
    func lookAlikeRoomsAreSeparate() throws {
        let d = try Daemon()
        let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
        #expect(nfc == nfd && Array(nfc.utf8) != Array(nfd.utf8), "the premise")
        let a = try d.connect(), b = try d.connect()
        let alice = Wire.user("alice", room: nfc), bob = Wire.user("bob", room: nfd)
        try a.send(Wire.join(alice))
        #expect(a.receiveFrame()?.wire == Wire.join(alice))
        try b.send(Wire.join(bob))
        #expect(b.receiveFrame()?.wire == Wire.join(bob))
        a.expectNoFrame(within: .milliseconds(200), "(bob's join is in the other café)")
        for (sender, receiver, user) in [(a, b, alice), (b, a, bob)] {
            let text = Wire.text(user, "only for my café")
            try sender.send(text)
            #expect(sender.receiveFrame()?.wire == text)
            receiver.expectNoFrame(within: .milliseconds(200), "(a frame crossed between look-alike rooms)")
        }
        // A third client joining the NFD spelling is with bob, not alice.
        let c = try d.connect()
        let carol = Wire.user("carol", room: nfd)
        try c.send(Wire.join(carol))
        #expect(b.receiveFrame()?.wire == Wire.join(carol))
        a.expectNoFrame(within: .milliseconds(200))
        #expect(d.notify.wait(timeout: .seconds(4)) { $0.hasPrefix("STATUS=3 clients, 2 rooms,") } != nil,
                "two rooms: \(d.notify.all.last?.lines ?? [])")
    }
}
