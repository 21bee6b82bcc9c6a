// RoomcastClient against the real daemon over loopback.
import Foundation
import Testing
import RoomcastClient

private func user(_ name: String, room: String? = "stage") -> UserInfo {
    UserInfo(level: 3, name: name, iconURL: "https://example.com/\(name).png", room: room)
}

@Suite struct ClientLibraryTests {
    @Test func joinTextGiftOpaqueLeaveRoundTrip() throws {
        let daemon = try TestDaemon()
        let loop = try EventLoop()
        let alice = RecordingClient(loop: loop, configuration: testConfiguration(daemon))
        let bob = RecordingClient(loop: loop, configuration: testConfiguration(daemon))
        alice.client.connect()
        try alice.client.join(user("alice"))  // queued until connected
        try #require(try loop.run(timeoutMs: 5_000) { alice.events.contains(.join(user("alice"))) })
        #expect(alice.statuses.prefix(3) == [
            .connecting(server: daemon.address, attempt: 1), .connected(address: daemon.address), .joined(user("alice")),
        ])

        bob.client.connect()
        try loop.run(timeoutMs: 5_000) { bob.client.state == .connected }
        try bob.client.join(user("bob"))
        try #require(try loop.run(timeoutMs: 5_000) { alice.events.contains(.join(user("bob"))) })

        try alice.client.sendText("hi bob ✓")
        try bob.client.sendGift(name: "yacht", url: "https://example.com/yacht.png", count: 99)
        try alice.client.sendFrame(type: 42, body: [1, 2, 3])
        let text = ClientEvent.text(ChatMessage(user: user("alice"), text: "hi bob ✓"))
        let gift = ClientEvent.gift(GiftMessage(user: user("bob"), giftname: "yacht",
                                                giftURL: "https://example.com/yacht.png", giftcount: 99))
        let opaque = ClientEvent.opaque(type: 42, body: [1, 2, 3])
        try #require(try loop.run(timeoutMs: 5_000) {
            [text, gift, opaque].allSatisfy { bob.events.contains($0) && alice.events.contains($0) }
        })
        // Frames from one sender arrive in the order sent (docs/protocol/rooms.md §4).
        #expect(bob.events.firstIndex(of: text)! < bob.events.firstIndex(of: opaque)!)

        try alice.client.leave()
        try #require(try loop.run(timeoutMs: 5_000) { bob.events.contains(.leave(user("alice"))) })
        // After leaving, alice is in no room: bob's next text reaches bob only.
        try bob.client.sendText("anyone?")
        try #require(try loop.run(timeoutMs: 5_000) { bob.texts.contains("anyone?") })
        try loop.run(timeoutMs: 200) { false }
        #expect(!alice.texts.contains("anyone?"))
        #expect(alice.client.state == .connected)

        alice.client.finish()
        bob.client.close()
        #expect(try loop.run(timeoutMs: 5_000) { alice.client.state == .closed })
        #expect(alice.statuses.last == .closed && bob.statuses.last == .closed)
        #expect(alice.disconnects == 0 && bob.disconnects == 0)
    }

    @Test("names and rooms that only look alike (café NFC/NFD) are different users and rooms for the client too")
    func lookAlikeNamesAndRoomsDiffer() throws {
        let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
        // Events and statuses compare through UserInfo: byte for byte.
        #expect(ClientEvent.join(user(nfc)) != .join(user(nfd)))
        #expect(ClientEvent.join(user("a", room: nfc)) != .join(user("a", room: nfd)))
        #expect(ClientStatus.joined(user("a", room: nfc)) != .joined(user("a", room: nfd)))
        #expect(ClientEvent.text(ChatMessage(user: user("a"), text: nfc)) != .text(ChatMessage(user: user("a"), text: nfd)))

        let daemon = try TestDaemon()
        let loop = try EventLoop()
        let alice = RecordingClient(loop: loop, configuration: testConfiguration(daemon))
        let bob = RecordingClient(loop: loop, configuration: testConfiguration(daemon))
        alice.client.connect()
        bob.client.connect()
        try alice.client.join(user("alice", room: nfc))
        try bob.client.join(user("bob", room: nfd))
        try #require(try loop.run(timeoutMs: 5_000) {
            alice.events.contains(.join(user("alice", room: nfc))) && bob.events.contains(.join(user("bob", room: nfd)))
        })
        try alice.client.sendText("nfc only")
        try bob.client.sendText("nfd only")
        try loop.run(timeoutMs: 500) { false }
        #expect(alice.events == [.join(user("alice", room: nfc)), .text(ChatMessage(user: user("alice", room: nfc), text: "nfc only"))])
        #expect(bob.events == [.join(user("bob", room: nfd)), .text(ChatMessage(user: user("bob", room: nfd), text: "nfd only"))])
    }

    @Test func reconnectsAfterDaemonRestartAndRejoins() throws {
        let config = "[heartbeat]\ntimeout = 2s\ntick = 20ms\n"
        var daemon: TestDaemon? = try TestDaemon(config: config)
        let port = daemon!.port
        let loop = try EventLoop()
        let alice = RecordingClient(loop: loop, configuration: testConfiguration(daemon!))
        alice.client.connect()
        try alice.client.join(user("alice"))
        try #require(try loop.run(timeoutMs: 5_000) { alice.events.contains(.join(user("alice"))) })

        daemon!.stop()
        daemon = nil
        try #require(try loop.run(timeoutMs: 5_000) { alice.disconnects > 0 })
        // Keep retrying (refused) for a while: the backoff must not give up.
        try loop.run(timeoutMs: 400) { false }
        #expect(alice.client.state != .closed)

        let restarted = try TestDaemon(config: config, port: port)
        let bob = RecordingClient(loop: loop, configuration: testConfiguration(restarted))
        bob.client.connect()
        try bob.client.join(user("bob"))
        try #require(try loop.run(timeoutMs: 10_000) {
            alice.statuses.contains(.rejoined(user("alice"))) && bob.events.contains(.join(user("bob")))
        }, "alice: \(alice.statuses)")
        // Text from alice reaches bob only if alice is back in "stage", not the default room.
        try alice.client.sendText("back again")
        try #require(try loop.run(timeoutMs: 5_000) { bob.texts.contains("back again") })

        let reconnecting = alice.statuses.compactMap { if case .reconnecting(let delay, let attempt) = $0 { (delay, attempt) } else { nil } }
        #expect(reconnecting.count >= 2)
        #expect(reconnecting.allSatisfy { $0.0 >= 25 && $0.0 <= 200 }, "\(reconnecting)")
        #expect(reconnecting.map(\.1) == Array(1...reconnecting.count))
        alice.client.close()
        bob.client.close()
    }

    @Test func heartbeatsKeepAQuietClientPastTheDaemonTimeout() throws {
        let daemon = try TestDaemon(config: "[heartbeat]\ntimeout = 600ms\ntick = 20ms\n")
        let loop = try EventLoop()
        var beating = testConfiguration(daemon)
        beating.heartbeatIntervalMs = 150
        var silent = testConfiguration(daemon)
        silent.heartbeatIntervalMs = 0  // the control: no heartbeats, so evicted
        silent.reconnect = .never
        let alice = RecordingClient(loop: loop, configuration: beating)
        let mute = RecordingClient(loop: loop, configuration: silent)
        alice.client.connect()
        mute.client.connect()
        try alice.client.join(user("alice"))
        try mute.client.join(user("mute"))
        try #require(try loop.run(timeoutMs: 5_000) {
            alice.events.contains(.join(user("alice"))) && alice.events.contains(.join(user("mute")))
        })

        // 1.5 s of silence from both: 2.5 daemon timeouts.
        try loop.run(timeoutMs: 1_500) { false }
        #expect(mute.statuses.contains(.disconnected(.closedByPeer)))
        #expect(mute.client.state == .closed)
        #expect(alice.disconnects == 0 && alice.client.state == .connected)
        // The daemon announced the evicted client's leave (docs/protocol/rooms.md §4).
        #expect(alice.events.contains(.leave(user("mute"))))
        try alice.client.sendText("still here")
        #expect(try loop.run(timeoutMs: 5_000) { alice.texts.contains("still here") })
        alice.client.close()
    }

    @Test func refusedConnectionClosesWithoutRetryWhenAskedTo() throws {
        let loop = try EventLoop()
        var configuration = ClientConfiguration(server: ServerAddress(host: "127.0.0.1", port: unusedPort()))
        configuration.reconnect = .never
        let client = RecordingClient(loop: loop, configuration: configuration)
        client.client.connect()
        try #require(try loop.run(timeoutMs: 5_000) { client.client.state == .closed })
        guard case .disconnected(.connect(_, let errno)) = client.statuses.dropLast().last else {
            Issue.record("\(client.statuses)")
            return
        }
        #expect(errno == ECONNREFUSED)
        #expect(throws: ClientError.notConnected) { try client.client.sendFrame(type: 9, body: []) }
    }

    @Test func backoffDoublesToTheCapWithJitter() {
        let policy = ReconnectPolicy()
        #expect(policy.delayMs(attempt: 0, jitter: 1) == 500)
        #expect(policy.delayMs(attempt: 0, jitter: 0) == 250)
        #expect(policy.delayMs(attempt: 1, jitter: 1) == 1_000)
        #expect(policy.delayMs(attempt: 5, jitter: 1) == 16_000)
        #expect(policy.delayMs(attempt: 6, jitter: 1) == 30_000)
        #expect(policy.delayMs(attempt: 1_000, jitter: 1) == 30_000)
        #expect(policy.delayMs(attempt: 1_000, jitter: 0) == 15_000)
        #expect(policy.stableAfterMs == 60_000)
    }

    @Test func serverAddresses() {
        #expect(ServerAddress.parse("127.0.0.1:9898") == ServerAddress(host: "127.0.0.1", port: 9898))
        #expect(ServerAddress.parse("[::1]:9898") == ServerAddress(host: "::1", port: 9898))
        #expect(ServerAddress.parse("localhost:1") == ServerAddress(host: "localhost", port: 1))
        for bad in ["127.0.0.1", "::1:9898", "[::1]9898", ":9898", "host:65536", "host:-1", "host:"] {
            #expect(ServerAddress.parse(bad) == nil, "\(bad)")
        }
        #expect(ServerAddress(host: "::1", port: 7).description == "[::1]:7")
    }

    @Test func ipv6Loopback() throws {
        let daemon = try TestDaemon()
        _ = daemon
        // The daemon above listens on IPv4 only; start one on [::1] through its --listen.
        let process = Process()
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("roomcast-v6-\(UUID().uuidString).log")
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: log) }
        let port = unusedPort()
        process.executableURL = productsDirectory.appendingPathComponent("roomcastd")
        process.arguments = ["--config", daemon.configURL.path, "--listen", "[::1]:\(port)"]
        process.standardError = try FileHandle(forWritingTo: log)
        try process.run()
        defer { process.terminate(); process.waitUntilExit() }
        guard waitFor(10, { ((try? String(contentsOf: log, encoding: .utf8)) ?? "").contains("listening on [::1]") }) else {
            Issue.record("no IPv6 loopback here: \((try? String(contentsOf: log, encoding: .utf8)) ?? "")")
            return
        }
        let loop = try EventLoop()
        let client = RecordingClient(loop: loop, configuration: ClientConfiguration(server: ServerAddress.parse("[::1]:\(port)")!))
        client.client.connect()
        try client.client.join(user("six"))
        #expect(try loop.run(timeoutMs: 5_000) { client.events.contains(.join(user("six"))) })
        #expect(client.statuses.contains(.connected(address: "[::1]:\(port)")))
        client.client.close()
    }
}
