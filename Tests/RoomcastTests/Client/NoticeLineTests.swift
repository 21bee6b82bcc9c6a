// The README's commands under `make run` ([rooms] history = 50, issue 28
// item 10): `roomcast send` took every notice for a refusal (`refused:
// history` in every room), chat and listen printed `server notice: history`
// without the number. Only the refusal codes of docs/protocol.md §13's notice
// table refuse; the others read as `5 recent lines`, `3 watching`, `7
// messages skipped`.
import Foundation
import Testing
import RoomcastClient
import RoomcastCore
@testable import roomcast

/// The `[rooms]` of `make run` (config/roomcastd.conf plus history = 50), with counts every second.
private let makeRunRooms = "[rooms]\nhistory = 50\ncounts = 1\n"

@Suite struct NoticeLineTests {
    @Test("only the notice table's refusal codes refuse; history, viewers and skipped read with their numbers")
    func phrases() {
        for code in ["token_required", "token_invalid", "token_expired", "room_forbidden", "identity_mismatch",
                     "not_permitted", "kicked", "banned", "muted", "slow_mode"] {
            #expect(Notice(code: code).isRefusal, "\(code)")
        }
        for code in ["history", "history_lost", "position", "skipped", "viewers", "restarting", "some_later_code"] {
            #expect(!Notice(code: code).isRefusal, "\(code)")
        }
        #expect(describe(.notice(Notice(code: "history", count: 5)), room: "lobby") == "5 recent lines")
        #expect(describe(.notice(Notice(code: "history", count: 1)), room: "lobby") == "1 recent line")
        #expect(describe(.notice(Notice(code: "viewers", count: 3)), room: "lobby") == "3 watching")
        #expect(describe(.notice(Notice(code: "skipped", count: 7)), room: "lobby") == "7 messages skipped")
        #expect(describe(.notice(Notice(code: "slow_mode", text: "wait", retryAfterMs: 2000)), room: "lobby")
                == "server notice: slow_mode: wait (retry in 2.0 s)")
    }

    @Test("under make run's history = 50: send exits 0 and relays, in an empty room and in one with recent lines")
    func sendWithHistory() throws {
        let daemon = try TestDaemon(config: makeRunRooms)
        let listen = try RoomcastCommand(["listen", "--server", daemon.address, "--room", "lobby", "--json"])
        try #require(listen.waitForStderr("listening in lobby"), "\(listen.stderr)")
        for i in 0..<3 {
            let sent = try roomcast(["send", "--server", daemon.address, "--room", "lobby", "--name", "bot", "text", "hi \(i)"])
            #expect(sent.status == 0, "send \(i): \(sent.stderr)")
            #expect(sent.stderr.isEmpty, "send \(i): \(sent.stderr)")
            #expect(listen.waitForStdout("\"text\":\"hi \(i)\""), "send \(i) not relayed: \(listen.stdout)")
        }
        let gift = try roomcast(["send", "--server", daemon.address, "--room", "lobby", "--name", "bot",
                                 "gift", "rose", "https://example.com/rose.png", "3"])
        #expect(gift.status == 0, "\(gift.stderr)")
    }

    @Test("listen and chat show '5 recent lines' and 'N watching' under make run's history = 50")
    func listenAndChatLines() throws {
        let daemon = try TestDaemon(config: makeRunRooms)
        // A room keeps its recent lines while it has members: one stays.
        let keeper = try RoomcastCommand(["listen", "--server", daemon.address, "--room", "lobby"])
        try #require(keeper.waitForStderr("listening in lobby"), "\(keeper.stderr)")
        for i in 0..<5 {
            let sent = try roomcast(["send", "--server", daemon.address, "--room", "lobby", "--name", "bot", "text", "line \(i)"])
            try #require(sent.status == 0, "\(sent.stderr)")
        }
        let listen = try RoomcastCommand(["listen", "--server", daemon.address, "--room", "lobby"])
        #expect(listen.waitForStdout(" 5 recent lines\n"), "\(listen.stdout)")
        #expect(listen.waitForStdout("bot: line 4"), "\(listen.stdout)")
        let chat = try RoomcastCommand(["chat", "--server", daemon.address, "--name", "carol", "--room", "lobby"])
        #expect(chat.waitForStdout(" 5 recent lines"), "\(chat.stdout)")
        #expect(chat.waitForStdout(" 3 watching"), "\(chat.stdout)")
        #expect(listen.waitForStdout(" 3 watching\n"), "\(listen.stdout)")
        chat.type("/quit\n")
        let result = try chat.finish()
        #expect(result.status == 0, "\(result.stderr)")
        #expect(!result.stdout.contains("server notice"), "\(result.stdout)")
        #expect(!listen.stdout.contains("server notice"), "\(listen.stdout)")
    }
}
