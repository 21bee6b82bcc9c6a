// A client whose network vanishes (no FIN, no RST) while its room talks must
// be announced as gone within about its liveness time, not after the
// kernel's 15 minutes of retransmissions (TCP_USER_TIMEOUT, tcp(7)).
// Reference/dead_peer.py runs the real roomcastd in a network namespace of
// its own (unshare -n, root) and blackholes the victim's address there.
import Foundation
import Glibc
import Testing

@Suite("Dead peers are found while their room talks (real roomcastd in its own network namespace)", .serialized,
       .enabled(if: getuid() == 0, "needs root for unshare -n and ip rule"))
struct DeadPeerTests {
    static func leaveAfter(_ dialect: String) throws -> Double? {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Reference/dead_peer.py")
        let run = try RoomcastCommand(
            ["unshare", "-n", "python3", script.path, "--roomcastd", productsDirectory.appendingPathComponent("roomcastd").path,
             "--dialect", dialect, "--wait", "15"],
            executable: URL(fileURLWithPath: "/usr/bin/env"))
        let result = try run.finish(seconds: 40)
        #expect(result.status == 0, "dead_peer.py: \(result.stderr)")
        print("dead peer (\(dialect)): \(result.stdout)")
        let line = try #require(result.stdout.split(separator: "\n").last.map(String.init))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        return object["leave_after_s"] as? Double
    }

    @Test("a JSON client that vanishes mid-conversation leaves within about json.tcp_keepalive (3 s)")
    func jsonPeerVanishes() throws {
        let seconds = try Self.leaveAfter("json")
        #expect(seconds != nil && seconds! < 8, "leave after \(seconds.map { "\($0) s" } ?? "more than 15 s")")
    }

    @Test("an LTB client that vanishes mid-conversation leaves within about heartbeat.timeout (3 s)")
    func ltbPeerVanishes() throws {
        let seconds = try Self.leaveAfter("ltb")
        #expect(seconds != nil && seconds! < 8, "leave after \(seconds.map { "\($0) s" } ?? "more than 15 s")")
    }
}
