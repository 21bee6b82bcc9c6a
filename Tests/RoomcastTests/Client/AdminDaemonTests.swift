// The real `roomcast admin` binary against the real roomcastd with `[auth]`
// and `[api]` (docs/api.md "From the shell", roomcast(1)): what signed
// members get for each verb (the notices `banned` with `retry_after_ms`,
// `muted`, `slow_mode`, `kicked`; a publish frame byte for byte), the JSON
// on stdout, and the exit status (0, 1, 64, 69, 77).
import Foundation
import Glibc
import RoomcastCore
import Testing

/// `roomcast admin` aimed at one daemon's API, with a key file.
struct AdminCLI {
    let api: String
    let keyFile: String
    let binary = productsDirectory.appendingPathComponent("roomcast").path

    init(_ m: ModerationDaemon) throws {
        api = "http://127.0.0.1:\(try #require(m.daemon.apiPort))"
        keyFile = try m.dir.write("admin.key", "# the backend's key\n\(APIIntegrationTests.key)\n")
    }

    /// Runs `roomcast admin ARGS --api API --key-file KEY` (no key from the environment).
    func run(_ args: [String], key: Bool = true) throws -> (status: Int32, out: String, err: String) {
        try runProcess(binary, ["admin"] + args + ["--api", api] + (key ? ["--key-file", keyFile] : []), environment: ["PATH": "/usr/bin:/bin"])
    }
}

@Suite("roomcast admin against a real roomcastd ([auth], [api])", .serialized)
struct AdminDaemonTests {
    @Test("ban and unban: the member is told banned (retry_after_ms) and closed, the room hears the leave, rejoins are refused until unban")
    func banAndUnban() throws {
        let m = try ModerationDaemon()
        let admin = try AdminCLI(m)
        let fan = try joinSigned(m.daemon, "fan", room: "live 42")
        let troll = try joinSigned(m.daemon, "troll", room: "live 42")
        drain(fan)

        let ban = try admin.run(["ban", "live 42", "troll", "--seconds", "600", "--reason", "spam links"])
        #expect(ban.status == 0 && ban.err.isEmpty, "\(ban)")
        #expect(ban.out.hasPrefix(#"{"sub": "troll", "until_ms": "#) && ban.out.hasSuffix("}\n"), "\(ban.out)")
        #expect(ban.out.contains(#""reason": "spam links""#) && ban.out.contains(#""kicked": 1"#), "\(ban.out)")
        let notice = try #require(nextNotice(troll), "the banned member was told nothing")
        #expect(notice.code == "banned" && notice.text?.contains("spam links") == true, "\(notice)")
        #expect((notice.retryAfterMs ?? 0) > 590_000 && (notice.retryAfterMs ?? 0) <= 600_000, "\(notice)")
        troll.expectClosed()
        let leave = try #require(fan.receiveFrame(), "the room did not hear the leave")
        #expect(try leave.type == Wire.leave && UserInfo(protobuf: leave.body).name == "troll")

        let token = try moderationToken("troll")
        let again = try m.daemon.connect()
        try again.send(Wire.join(user("troll", room: "live 42", token: token)))
        let refused = try #require(nextNotice(again))
        #expect(refused.code == "banned" && (refused.retryAfterMs ?? 0) > 0, "\(refused)")
        fan.expectNoFrame(within: .milliseconds(300), "a banned join reached the room")

        let unban = try admin.run(["unban", "live 42", "troll"])
        #expect(unban.status == 0 && unban.out == "{\"removed\": true}\n", "\(unban)")
        try again.send(Wire.join(user("troll", room: "live 42", token: token)))
        #expect(again.receiveFrame()?.type == Wire.join, "troll joins again once unbanned")
        #expect(fan.receiveFrame()?.type == Wire.join)

        // A second unban: the API's 404, exit 1, its JSON on stdout and a line on stderr.
        let twice = try admin.run(["unban", "live 42", "troll"])
        #expect(twice.status == 1 && twice.out.contains(#""error": "not_banned""#), "\(twice)")
        #expect(twice.err.contains("DELETE /v1/rooms/live%2042/bans/troll: HTTP 404"), "\(twice.err)")
        #expect(!m.daemon.stderr.current.contains(APIIntegrationTests.key), "the API key reached the log")
    }

    @Test("mute: the member stays, its texts are refused with muted and relayed nowhere; slow: one text per interval, then slow_mode")
    func muteAndSlow() throws {
        let m = try ModerationDaemon()
        let admin = try AdminCLI(m)
        let fan = try joinSigned(m.daemon, "fan", room: "live 42")
        let loud = try joinSigned(m.daemon, "loud", room: "live 42")
        let chatty = try joinSigned(m.daemon, "chatty", room: "live 42")
        drain(fan)
        drain(loud)

        let mute = try admin.run(["mute", "live 42", "loud", "--seconds", "300"])
        #expect(mute.status == 0 && mute.out.hasPrefix(#"{"sub": "loud", "until_ms": "#) && mute.out.hasSuffix("\"reason\": \"\"}\n"), "\(mute)")
        loud.expectOpen()
        try loud.send(Wire.text(user("loud"), "shout"))
        let muted = try #require(nextNotice(loud))
        #expect(muted.code == "muted" && (muted.retryAfterMs ?? 0) > 290_000 && (muted.retryAfterMs ?? 0) <= 300_000, "\(muted)")
        fan.expectNoFrame(within: .milliseconds(300), "a muted text was relayed")
        loud.expectOpen()

        let slow = try admin.run(["slow", "live 42", "30"])
        #expect(slow.status == 0 && slow.out == "{\"room\": \"live 42\", \"slow_mode_seconds\": 30}\n", "\(slow)")
        drain(chatty)
        try chatty.send(Wire.text(user("chatty"), "first"))
        #expect(try fan.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == "first")
        try chatty.send(Wire.text(user("chatty"), "second"))
        let slowed = try #require(nextNotice(chatty))
        #expect(slowed.code == "slow_mode" && (slowed.retryAfterMs ?? 0) > 20_000 && (slowed.retryAfterMs ?? 0) <= 30_000, "\(slowed)")
        fan.expectNoFrame(within: .milliseconds(300), "a text within the interval was relayed")

        let off = try admin.run(["slow", "live 42", "0"])
        #expect(off.status == 0 && off.out == "{\"room\": \"live 42\", \"slow_mode_seconds\": 0}\n", "\(off)")
        try chatty.send(Wire.text(user("chatty"), "free again"))
        #expect(try fan.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == "free again")
        chatty.expectOpen()
    }

    @Test("kick by sub and by name: the notice kicked, then closed; the room hears each leave")
    func kick() throws {
        let m = try ModerationDaemon()
        let admin = try AdminCLI(m)
        let fan = try joinSigned(m.daemon, "fan", room: "live 42")
        let a = try joinSigned(m.daemon, "pest", room: "live 42")
        let b = try joinSigned(m.daemon, "other", room: "live 42")
        drain(fan)
        drain(a)

        let bySub = try admin.run(["kick", "live 42", "--sub", "pest"])
        #expect(bySub.status == 0 && bySub.out == "{\"kicked\": 1}\n", "\(bySub)")
        #expect(nextNotice(a)?.code == "kicked")
        a.expectClosed()
        #expect(try fan.receiveFrame().map { try UserInfo(protobuf: $0.body).name } == "pest")
        let byName = try admin.run(["kick", "live 42", "--name", "other"])
        #expect(byName.status == 0 && byName.out == "{\"kicked\": 1}\n", "\(byName)")
        #expect(nextNotice(b)?.code == "kicked")
        b.expectClosed()
        let nobody = try admin.run(["kick", "live 42", "--sub", "nobody"])
        #expect(nobody.status == 0 && nobody.out == "{\"kicked\": 0}\n", "\(nobody)")
        fan.expectOpen()
    }

    @Test("publish text, gift and an opaque type: members get the frame byte for byte; rooms and room list what is there")
    func publishAndList() throws {
        let m = try ModerationDaemon()
        let admin = try AdminCLI(m)
        let fan = try joinSigned(m.daemon, "fan", room: "live 42")
        drain(fan)

        let text = try admin.run(["publish", "live 42", "--text", "Stream starts in 5 minutes", "--name", "system"])
        #expect(text.status == 0 && text.out == "{\"delivered\": 1}\n", "\(text)")
        #expect(fan.receiveFrame()?.wire == Wire.frame(Wire.text, ChatMessage(user: UserInfo(level: 0, name: "system", iconURL: ""),
                                                                                  text: "Stream starts in 5 minutes").serialized()))
        let gift = try admin.run(["publish", "live 42", "--gift", "rose", "--name", "shop", "--level", "2", "--icon", "https://img.example/shop.png",
                                  "--gift-url", "https://img.example/rose.gif", "--count", "3", "--idempotency-key", "order-8812"])
        #expect(gift.status == 0 && gift.out == "{\"delivered\": 1}\n", "\(gift)")
        #expect(fan.receiveFrame()?.wire == Wire.frame(Wire.gift, GiftMessage(user: UserInfo(level: 2, name: "shop", iconURL: "https://img.example/shop.png"),
                                                                                  giftname: "rose", giftURL: "https://img.example/rose.gif",
                                                                                  giftcount: 3).serialized()))
        // The same request with the same idempotency key: the first answer, nothing relayed twice.
        let repeated = try admin.run(["publish", "live 42", "--gift", "rose", "--name", "shop", "--level", "2", "--icon", "https://img.example/shop.png",
                                      "--gift-url", "https://img.example/rose.gif", "--count", "3", "--idempotency-key", "order-8812"])
        #expect(repeated.status == 0 && repeated.out == "{\"delivered\": 1}\n", "\(repeated)")
        // The key with another request (here another body): 422, nothing relayed (docs/api.md).
        let reused = try admin.run(["publish", "live 42", "--gift", "rose", "--name", "shop", "--idempotency-key", "order-8812"])
        #expect(reused.status != 0 && reused.out.contains("idempotency_key_reused"), "\(reused)")
        fan.expectNoFrame(within: .milliseconds(300), "a repeated idempotency key was relayed again")
        let opaque = try admin.run(["publish", "live 42", "--type", "42", "--body-base64", "AAEC/w=="])
        #expect(opaque.status == 0 && opaque.out == "{\"delivered\": 1}\n", "\(opaque)")
        #expect(fan.receiveFrame()?.wire == Wire.frame(42, [0x00, 0x01, 0x02, 0xFF]))

        let rooms = try admin.run(["rooms", "--limit", "10"])
        #expect(rooms.status == 0 && rooms.out == "{\"rooms\": [{\"room\": \"live 42\", \"viewers\": 1}], \"next_cursor\": null}\n", "\(rooms)")
        let room = try admin.run(["room", "live 42"])
        #expect(room.status == 0 && room.out.hasPrefix(#"{"room": "live 42", "viewers": 1, "members": [{"id": "#), "\(room)")
        // The other daemons' members follow in `remote_members` (none without [cluster]).
        #expect(room.out.contains(#""name": "fan", "sub": "fan""#) && room.out.contains("\"next_cursor\": null")
                && room.out.hasSuffix("\"remote_members\": [], \"remote_next_cursor\": null}\n"), "\(room.out)")
        let empty = try admin.run(["room", "nobody here"])
        #expect(empty.status == 0 && empty.out.contains(#""viewers": 0, "members": []"#), "\(empty)")
    }

    @Test("exit status: 64 bad usage or an unreadable key file, 77 a refused key, 69 the daemon down")
    func exitStatus() throws {
        let m = try ModerationDaemon()
        let admin = try AdminCLI(m)
        for args in [["slow", "live 42", "2"], ["ban", "live 42", "troll"], ["ban", "r", "s", "--seconds", "1209601"], ["frobnicate"]] {
            let r = try admin.run(args)
            #expect(r.status == 64 && r.out.isEmpty && r.err.contains("Try 'roomcast admin --help'"), "\(args): \(r)")
        }
        let noKey = try admin.run(["rooms"], key: false)
        #expect(noKey.status == 64 && noKey.err.contains("ROOMCAST_API_KEY"), "\(noKey)")
        let missing = try runProcess(admin.binary, ["admin", "rooms", "--api", admin.api, "--key-file", m.dir.path + "/no-such-key"])
        #expect(missing.status == 64 && missing.err.contains("no-such-key"), "\(missing)")

        let wrong = try m.dir.write("wrong.key", "k-not-the-key-00000000\n")
        let refused = try runProcess(admin.binary, ["admin", "ban", "r", "s", "--seconds", "5", "--api", admin.api, "--key-file", wrong])
        #expect(refused.status == 77 && refused.out.contains(#""error": "unauthorized""#) && refused.err.contains("HTTP 401"), "\(refused)")
        #expect(try admin.run(["rooms"]).out.contains(#""rooms": []"#), "a refused ban changed nothing")
        #expect(!m.daemon.stderr.current.contains("k-not-the-key"), "a refused key reached the log")

        m.daemon.child.kill(SIGTERM)
        #expect(m.daemon.child.waitForExit() == 0)
        let down = try admin.run(["ban", "live 42", "troll", "--seconds", "60"])
        #expect(down.status == 69 && down.out.isEmpty && down.err.contains(admin.api), "\(down)")
    }
}
