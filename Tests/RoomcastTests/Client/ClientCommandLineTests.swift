// The roomcast executable, end to end against the real daemon.
import Foundation
import Testing
import RoomcastClient

private func jsonObjects(_ text: String) throws -> [[String: Any]] {
    try text.split(separator: "\n").map { line in
        guard let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
            throw TestFailure("not a JSON object: \(line)")
        }
        return object
    }
}

@Suite struct ClientCommandLineTests {
    @Test func sendAndListenJSONEndToEnd() throws {
        let daemon = try TestDaemon()
        let listen = try RoomcastCommand(["listen", "--server", daemon.address, "--room", "stage", "--json", "--count", "8"])
        try #require(listen.waitForStderr("listening in stage as listener"), "\(listen.stderr)")

        let text = try roomcast(["send", "--server", daemon.address, "--name", "alice", "--room", "stage",
                                 "--level", "4", "--icon", "https://example.com/a.png", "text", "-5 degrees, \"quoted\" ✓"])
        #expect(text.status == 0, "\(text.stderr)")
        #expect(text.stdout.isEmpty && text.stderr.isEmpty)
        let gift = try roomcast(["send", "--server", daemon.address, "--name", "bob", "--room", "stage",
                                 "gift", "yacht", "https://example.com/yacht.png", "99"])
        #expect(gift.status == 0, "\(gift.stderr)")

        // An opaque frame from a library client: listen shows its body as base64.
        let loop = try EventLoop()
        let carol = RecordingClient(loop: loop, configuration: testConfiguration(daemon))
        carol.client.connect()
        try carol.client.join(UserInfo(level: 0, name: "carol", iconURL: "", room: "stage"))
        try #require(try loop.run(timeoutMs: 5_000) { !carol.events.isEmpty })
        try carol.client.sendFrame(type: 42, body: [0xDE, 0xAD, 0xBE, 0xEF])
        try loop.run(timeoutMs: 5_000) { carol.events.count >= 2 }

        let result = try listen.finish()
        carol.client.close()
        #expect(result.status == 0, "\(result.stderr)")
        let events = try jsonObjects(result.stdout)
        #expect(events.map { $0["type"] as? String } == ["join", "text", "leave", "join", "gift", "leave", "join", "opaque"])
        #expect(events.allSatisfy { $0["room"] as? String == "stage" })
        let alice = try #require(events[1]["user"] as? [String: Any])
        #expect(alice["name"] as? String == "alice" && alice["level"] as? Int == 4)
        #expect(alice["iconURL"] as? String == "https://example.com/a.png" && alice["room"] as? String == "stage")
        #expect(events[1]["text"] as? String == "-5 degrees, \"quoted\" ✓")
        #expect(events[4]["giftname"] as? String == "yacht" && events[4]["giftcount"] as? Int == 99)
        #expect(events[4]["giftURL"] as? String == "https://example.com/yacht.png")
        #expect(events[7]["frame_type"] as? Int == 42 && events[7]["body_base64"] as? String == "3q2+7w==")
    }

    @Test func listenPrintsReadableLines() throws {
        let daemon = try TestDaemon()
        let listen = try RoomcastCommand(["listen", "--server", daemon.address, "--count", "3"])
        try #require(listen.waitForStderr("listening in the default room"), "\(listen.stderr)")
        #expect(try roomcast(["send", "--server", daemon.address, "--name", "alice", "--room", "lobby", "text", "hi"]).status == 0)
        let lines = try listen.finish().stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 3)
        let stamp = try Regex(#"^\d\d:\d\d:\d\d "#)
        #expect(lines.allSatisfy { $0.firstMatch(of: stamp) != nil }, "\(lines)")
        #expect(lines.map { String($0.dropFirst(9)) } == ["alice joined lobby", "alice: hi", "alice left lobby"])
    }

    @Test func chatOverPipesSendsTypedLinesAndCommands() throws {
        let daemon = try TestDaemon()
        let chat = try RoomcastCommand(["chat", "--server", daemon.address, "--name", "carol", "--room", "stage"])
        try #require(chat.waitForStderr("joined stage as carol"), "\(chat.stderr)")
        chat.type("hello there\n/gift rose https://example.com/rose.png 3\n//slash\n/join backstage\n")
        #expect(chat.waitForStdout("carol sent 3 x rose"))
        #expect(chat.waitForStdout("carol: /slash"))
        #expect(chat.waitForStdout("carol joined backstage"))
        chat.type("/bogus\n/quit\n")
        let result = try chat.finish()
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("carol: hello there"))
        #expect(result.stderr.contains("unknown command /bogus"))
    }

    @Test(arguments: [
        (["send", "--name", "a", "--bogus", "text", "x"], "unrecognized option '--bogus'"),
        (["send", "--name"], "option '--name' requires an argument"),
        (["send", "text", "x"], "option '--name' is required"),
        (["send", "--name", "a", "--json", "text", "x"], "unrecognized option '--json'"),
        (["send", "--name", "a", "text"], "'send text' takes one MESSAGE"),
        (["send", "--name", "a", "gift", "g", "u", "many"], "gift COUNT 'many'"),
        (["send", "--name", "a", "--timeout", "soon", "text", "x"], "option '--timeout': 'soon'"),
        (["listen", "-x"], "invalid option '-x'"),
        (["listen", "--count", "0"], "option '--count': '0'"),
        (["listen", "--json=yes"], "option '--json' doesn't allow an argument"),
        (["listen", "--server", "localhost"], "option '--server': 'localhost' is not HOST:PORT"),
        (["chat", "--name", "a", "--byte-order", "middle"], "option '--byte-order': 'middle'"),
        (["chat", "--name", "a", "--heartbeat", "often"], "option '--heartbeat': 'often'"),
        (["chat", "--name", "a", "--max-frame-bytes", "64KB"], "option '--max-frame-bytes': '64KB' is not a size"),
        (["listen", "--max-frame-bytes", "0"], "option '--max-frame-bytes': '0' is out of range (1 .. 1G)"),
        (["send", "--name", "a", "--max-frame-bytes", "2G", "text", "x"], "option '--max-frame-bytes': '2G' is out of range"),
        (["listen", "--max-frame-bytes"], "option '--max-frame-bytes' requires an argument"),
        (["chat", "--name", "a", "extra"], "unexpected argument 'extra'"),
        (["--server", "127.0.0.1:1", "chat"], "option '--server' must follow a subcommand"),
        (["shout"], "unknown subcommand 'shout'"),
        ([], "missing subcommand"),
    ])
    func badUsageExits64NamingTheProblem(arguments: [String], message: String) throws {
        let result = try roomcast(arguments)
        #expect(result.status == 64)
        #expect(result.stderr.hasPrefix("roomcast: " + message), "\(result.stderr)")
        #expect(result.stderr.contains("Try 'roomcast"))
        #expect(result.stdout.isEmpty)
    }

    @Test func helpAndVersion() throws {
        let help = try roomcast(["--help"])
        #expect(help.status == 0 && help.stdout.contains("roomcast listen") && help.stderr.isEmpty)
        for command in ["chat", "send", "listen"] {
            let result = try roomcast([command, "--help"])
            #expect(result.status == 0 && result.stdout.hasPrefix("Usage: roomcast \(command)") && result.stdout.contains("--server"))
            #expect(result.stdout.contains("--max-frame-bytes SIZE") && result.stdout.contains("(default 64K)"), "\(command) --help")
        }
        let version = try roomcast(["send", "--version"])
        #expect(version.status == 0 && version.stdout == "roomcast 0.1.0\n")
    }

    @Test("--max-frame-bytes SIZE (the daemon's size syntax) lets send and listen carry frames over 64 KiB")
    func maxFrameBytesAboveTheDefault() throws {
        let daemon = try TestDaemon(config: "[protocol]\nmax_frame_bytes = 256K\n")
        let message = String(repeating: "m", count: 100_000)  // one argv string stays under 128 KiB
        // With the default 64K the client refuses to send it, naming the option.
        let refused = try roomcast(["send", "--server", daemon.address, "--name", "a", "text", message])
        #expect(refused.status == 1)
        #expect(refused.stderr.hasPrefix("roomcast: rejected: message of 100"), "\(refused.stderr.prefix(300))")
        #expect(refused.stderr.contains("over the 65536-byte frame limit (--max-frame-bytes raises it"), "\(refused.stderr.prefix(300))")

        let listen = try RoomcastCommand(["listen", "--server", daemon.address, "--room", "big", "--json", "--count", "3",
                                          "--max-frame-bytes", "256K"])
        try #require(listen.waitForStderr("listening in big as listener"), "\(listen.stderr)")
        // A default listener in the same room is cut off by the frame it cannot take.
        let small = try RoomcastCommand(["listen", "--server", daemon.address, "--room", "big", "--name", "small"])
        try #require(small.waitForStderr("listening in big as small"), "\(small.stderr)")
        let sent = try roomcast(["send", "--server", daemon.address, "--name", "a", "--room", "big",
                                 "--max-frame-bytes", "256K", "text", message])
        #expect(sent.status == 0, "\(sent.stderr.prefix(300))")
        let result = try listen.finish()
        #expect(result.status == 0, "\(result.stderr)")
        let events = try jsonObjects(result.stdout)
        #expect(events.map { $0["type"] as? String } == ["join", "join", "text"], "small's join, a's join, a's text")
        #expect((events.last?["text"] as? String)?.utf8.count == 100_000)
        #expect(small.waitForStderr("the daemon sent a frame of"), "\(small.stderr)")
        #expect(small.stderr.contains("(limit 65536;"), "\(small.stderr)")
        kill(small.process.processIdentifier, SIGINT)
        _ = try small.finish()
    }

    @Test func unreachableDaemonFailsWithOneLine() throws {
        let address = "127.0.0.1:\(unusedPort())"
        for arguments in [["send", "--server", address, "--name", "a", "text", "x"], ["listen", "--server", address]] {
            let result = try roomcast(arguments)
            #expect(result.status == 1, "\(arguments)")
            #expect(result.stderr.hasSuffix("roomcast: cannot connect to \(address): Connection refused\n"), "\(result.stderr)")
            #expect(result.stdout.isEmpty)
        }
    }

    @Test func sendTimesOutWhenTheDaemonDoesNotEcho() throws {
        let daemon = try TestDaemon(config: "[protocol]\necho = no\n")
        let result = try roomcast(["send", "--server", daemon.address, "--name", "a", "--timeout", "300ms", "text", "x"])
        #expect(result.status == 1)
        #expect(result.stderr == "roomcast: timeout: the daemon did not relay the message back within 300 ms (is echo = no?)\n")
    }

    @Test("send interrupted while waiting for its echo exits 128 + the signal", arguments: [SIGINT, SIGTERM])
    func sendInterrupted(signal: Int32) throws {
        let daemon = try TestDaemon(config: "[protocol]\necho = no\n")
        let command = try RoomcastCommand(["send", "--server", daemon.address, "--name", "a", "--timeout", "30s", "text", "x"])
        // Signal it only once it reads signals from its signalfd (blocked in
        // SigBlk); it is then connecting or waiting for an echo that never comes.
        let pid = command.process.processIdentifier
        #expect(waitFor(10) {
            let status = ProcStats.text("/proc/\(pid)/status") ?? ""
            let blocked = status.split(separator: "\n").first { $0.hasPrefix("SigBlk:") }
                .flatMap { UInt64($0.split(separator: "\t").last ?? "", radix: 16) } ?? 0
            return blocked & (1 << (SIGINT - 1)) != 0 && blocked & (1 << (SIGTERM - 1)) != 0
        })
        kill(pid, signal)
        let result = try command.finish(seconds: 5)
        #expect(result.status == 128 + signal)
        #expect(result.stderr == "roomcast: interrupted\n")
    }

    @Test("listen reports its room once per (re)join: 'listening in', then 'rejoined' after a daemon restart")
    func listenRejoinsAfterRestart() throws {
        var daemon: TestDaemon? = try TestDaemon()
        let port = daemon!.port
        let listen = try RoomcastCommand(["listen", "--server", daemon!.address, "--room", "r1"])
        #expect(listen.waitForStderr("listening in r1 as listener"))
        daemon = nil  // stopped: the client reconnects with backoff (0.5 s, then 1 s, ...)
        let restarted = try TestDaemon(port: port)
        #expect(listen.waitForStderr("rejoined r1 as listener", seconds: 15), "\(listen.stderr)")
        kill(listen.process.processIdentifier, SIGINT)
        let result = try listen.finish()
        #expect(result.stderr.components(separatedBy: "listening in r1").count == 2, "once: \(result.stderr)")
        #expect(result.stderr.components(separatedBy: "rejoined r1").count == 2, "once: \(result.stderr)")
        _ = restarted
    }

    @Test func sendRejectedWhenTheDaemonClosesTheConnection() throws {
        // A daemon that accepts frames of at most 16 bytes closes a client sending more.
        let daemon = try TestDaemon(config: "[protocol]\nmax_frame_bytes = 16\n")
        let result = try roomcast(["send", "--server", daemon.address, "--name", "a-long-enough-name", "text", "x"])
        #expect(result.status == 1)
        #expect(result.stderr.hasPrefix("roomcast: rejected: the daemon closed the connection before relaying the message (its log says why: a byte order"), "\(result.stderr)")
    }

    @Test func byteOrderMustMatchTheDaemon() throws {
        let daemon = try TestDaemon(config: "[protocol]\nbyte_order = big\n")
        let big = try roomcast(["send", "--server", daemon.address, "--byte-order", "big", "--name", "a", "text", "x"])
        #expect(big.status == 0, "\(big.stderr)")
        // Little-endian headers read as big-endian claim a body of gigabytes: the daemon closes.
        let little = try roomcast(["send", "--server", daemon.address, "--name", "a", "text", "x"])
        #expect(little.status == 1)
        #expect(little.stderr.hasPrefix("roomcast: rejected:"), "\(little.stderr)")
    }

    @Test func pythonProtobufClientAndRoomcastChatBothWays() throws {
        let daemon = try TestDaemon()
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Reference/chat_peer.py")
        let peer = try RoomcastCommand(
            ["python3", script.path, "--server", daemon.address,
             "--roomcast", productsDirectory.appendingPathComponent("roomcast").path],
            executable: URL(fileURLWithPath: "/usr/bin/env"))
        let result = try peer.finish(seconds: 30)
        #expect(result.status == 0, "python3 chat_peer.py (needs PyPI protobuf): \(result.stderr)")
        #expect(result.stdout.contains("\"ok\": true"), "\(result.stdout)")
        print("interop: \(result.stdout)")
    }
}
