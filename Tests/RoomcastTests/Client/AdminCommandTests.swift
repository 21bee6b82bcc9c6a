// `roomcast admin`: each verb's request (method, path, body) built from
// its command line, usage errors, and the real binary against the real
// daemon for the endpoints the daemon serves (publish, kick, rooms, room).
import Foundation
import Glibc
import Testing
import RoomcastClient

@Suite struct AdminCommandTests {
    static func request(_ args: [String]) throws -> AdminRequest { try AdminCommand.parse(args).request }

    @Test func eachVerbBuildsItsRequest() throws {
        #expect(try Self.request(["publish", "live 42", "--text", "Stream starts", "--name", "system"])
                == AdminRequest(method: "POST", path: "/v1/rooms/live%2042/publish",
                                body: #"{"type": "text", "user": {"name": "system", "level": 0, "icon": ""}, "text": "Stream starts"}"#))
        #expect(try Self.request(["publish", "r", "--gift", "rose", "--name", "shop", "--level", "2", "--count", "3", "--idempotency-key", "order-1"])
                == AdminRequest(method: "POST", path: "/v1/rooms/r/publish",
                                body: #"{"type": "gift", "user": {"name": "shop", "level": 2, "icon": ""}, "giftname": "rose", "giftURL": "", "giftcount": 3}"#,
                                headers: [("Idempotency-Key", "order-1")]))
        #expect(try Self.request(["publish", "r", "--type=42", "--body-base64", "AAEC/w=="])
                == AdminRequest(method: "POST", path: "/v1/rooms/r/publish", body: #"{"type": 42, "body_base64": "AAEC/w=="}"#))
        #expect(try Self.request(["kick", "r", "--sub", "user-1"]) == AdminRequest(method: "POST", path: "/v1/rooms/r/kick", body: #"{"sub": "user-1"}"#))
        #expect(try Self.request(["kick", "r", "--name", "tr\"oll"]) == AdminRequest(method: "POST", path: "/v1/rooms/r/kick", body: #"{"name": "tr\"oll"}"#))
        #expect(try Self.request(["ban", "é/x", "user 1", "--seconds", "600", "--reason", "spam"])
                == AdminRequest(method: "PUT", path: "/v1/rooms/%C3%A9%2Fx/bans/user%201", body: #"{"seconds": 600, "reason": "spam"}"#))
        #expect(try Self.request(["unban", "r", "user-1"]) == AdminRequest(method: "DELETE", path: "/v1/rooms/r/bans/user-1", body: nil))
        #expect(try Self.request(["mute", "r", "user-1", "--seconds", "60"])
                == AdminRequest(method: "PUT", path: "/v1/rooms/r/mutes/user-1", body: #"{"seconds": 60}"#))
        #expect(try Self.request(["slow", "r", "10"]) == AdminRequest(method: "PUT", path: "/v1/rooms/r/settings", body: #"{"slow_mode_seconds": 10}"#))
        #expect(try Self.request(["slow", "r", "0"]).body == #"{"slow_mode_seconds": 0}"#)
        #expect(try Self.request(["rooms"]) == AdminRequest(method: "GET", path: "/v1/rooms", body: nil))
        #expect(try Self.request(["rooms", "--limit", "50", "--cursor", "a b"]).path == "/v1/rooms?limit=50&cursor=a%20b")
        #expect(try Self.request(["room", "live", "--limit", "10"]).path == "/v1/rooms/live?limit=10")
    }

    @Test func usageErrors() {
        let bad: [[String]] = [
            [], ["nope"], ["publish", "r"], ["publish", "r", "--text", "t"], ["publish", "r", "--text", "t", "--gift", "g", "--name", "n"],
            ["publish", "r", "--type", "42"], ["kick", "r"], ["kick", "r", "--sub", "a", "--name", "b"], ["ban", "r", "s"],
            ["ban", "r", "s", "--seconds", "0"], ["ban", "r", "s", "--seconds", "1209601"], ["mute", "r", "--seconds", "5"],
            ["slow", "r", "2"], ["slow", "r", "121"], ["rooms", "extra"], ["rooms", "--limit", "0"], ["room"],
            ["rooms", "--text", "x"], ["rooms", "--api", "127.0.0.1:9899"], ["rooms", "--api", "http://localhost:9899"],
            ["rooms", "--key"], ["rooms", "--timeout", "0"], ["unban", "r", ""],
        ]
        for args in bad {
            #expect(throws: AdminUsageError.self, "\(args)") { try AdminCommand.parse(args) }
        }
    }

    @Test func endpoints() throws {
        #expect(try AdminCommand.parse(["rooms"]).api == "http://127.0.0.1:9899")
        #expect(try AdminCommand.parse(["rooms"], environment: ["ROOMCAST_API": "unix:/run/x.sock"]).api == "unix:/run/x.sock")
        #expect(AdminEndpoint.parse("http://[::1]:9899/") == .tcp(host: "::1", port: 9899))
        #expect(AdminEndpoint.parse("unix:/run/roomcastd/api.sock") == .unix(path: "/run/roomcastd/api.sock"))
        #expect(AdminEndpoint.parse("http://127.0.0.1:0") == nil)
        let bytes = AdminRequest(method: "DELETE", path: "/v1/rooms/r/bans/s", body: nil).serialized(host: "127.0.0.1:9899", key: "k")
        #expect(String(decoding: bytes, as: UTF8.self).hasSuffix("Authorization: Bearer k\r\nContent-Length: 0\r\n\r\n"))
    }

    /// The binary against the daemon: exit codes and JSON on stdout.
    @Test func againstTheDaemon() throws {
        let (d, dir) = try APIIntegrationTests.daemon()
        let keyFile = try dir.write("admin.key", "# the backend's key\n\(APIIntegrationTests.key)\n")
        let api = "http://127.0.0.1:\(try #require(d.apiPort))"
        let roomcast = productsDirectory.appendingPathComponent("roomcast").path
        let viewer = try d.connect()
        try viewer.send(Wire.join(Wire.user("viewer", room: "live 42")))
        _ = viewer.receiveFrame()
        func admin(_ args: [String], env: [String: String] = [:]) throws -> (status: Int32, out: String, err: String) {
            try runProcess(roomcast, ["admin"] + args, environment: env.merging(["PATH": "/usr/bin:/bin"]) { $1 })
        }
        let published = try admin(["publish", "live 42", "--text", "hello from the backend", "--name", "system", "--api", api, "--key-file", keyFile])
        #expect(published.status == 0 && published.out == "{\"delivered\": 1}\n", "\(published)")
        let frame = try #require(viewer.receiveFrame())
        #expect(frame.type == Wire.text && (try? ChatMessage(protobuf: frame.body))?.text == "hello from the backend")
        let rooms = try admin(["rooms", "--api", api], env: ["ROOMCAST_API_KEY": APIIntegrationTests.key])
        #expect(rooms.status == 0 && rooms.out.contains(#"{"room": "live 42", "viewers": 1}"#), "\(rooms)")
        let room = try admin(["room", "live 42"], env: ["ROOMCAST_API_KEY": APIIntegrationTests.key, "ROOMCAST_API": api])
        #expect(room.status == 0 && room.out.contains(#""name": "viewer""#), "\(room)")
        let kicked = try admin(["kick", "live 42", "--name", "viewer", "--api", api, "--key-file", keyFile])
        #expect(kicked.status == 0 && kicked.out == "{\"kicked\": 1}\n", "\(kicked)")
        #expect(viewer.isClosed(within: .seconds(5)))
        let wrongKey = try admin(["rooms", "--api", api], env: ["ROOMCAST_API_KEY": "k-not-the-key-0000000"])
        #expect(wrongKey.status == 77 && wrongKey.out.contains(#""error": "unauthorized""#), "\(wrongKey)")
        let notFound = try admin(["publish", "", "--text", "x", "--name", "n", "--api", api, "--key-file", keyFile])
        #expect(notFound.status != 0)
        let noKey = try admin(["rooms", "--api", api])
        #expect(noKey.status == 64 && noKey.err.contains("ROOMCAST_API_KEY"), "\(noKey)")
        let port = try freeLoopbackPort()
        let unreachable = try admin(["rooms", "--api", "http://127.0.0.1:\(port)"], env: ["ROOMCAST_API_KEY": APIIntegrationTests.key])
        #expect(unreachable.status == 69, "\(unreachable)")
        #expect(!d.stderr.current.contains(APIIntegrationTests.key), "a key reached the log")
    }
}
