// Whatever answers at the Redis address costs the cluster link only, never
// the daemon: replies nobody asked for, replies of the wrong shape, bytes
// that are no RESP, a close mid-reply, a SUBSCRIBE refused by an ACL. The
// link closes the connection, says why, and reconnects with its backoff;
// local relay goes on; once a real Redis answers there, it works.
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Cluster over a misbehaving Redis", .serialized)
struct ClusterRobustnessTests {
    @Test("extra replies, wrong shapes, garbage, a close mid-reply: the daemon stays up, relays locally, reconnects, and works once Redis is real",
          arguments: FakeRedis.Behaviour.allCases)
    func misbehavingRedis(_ behaviour: FakeRedis.Behaviour) throws {
        let fake = try FakeRedis(behaviour)
        let port = fake.port
        let a = try Daemon(["cluster.redis": fake.address, "cluster.name": "odd"])
        let x = try a.connect(), y = try a.connect()
        // Reconnects go on: several connections, each broken by the fake's answers.
        #expect(waitUntil(.seconds(10)) { fake.connections >= 6 }, "\(fake.connections) connections; \(fake.commands)")
        #expect(a.child.process.isRunning, "roomcastd exited with \(a.child.waitForExit(timeout: .seconds(1)).map(String.init) ?? "?")")
        try x.send(Wire.text(Wire.user("x"), "local"))
        #expect(y.receiveFrame()?.wire == Wire.text(Wire.user("x"), "local"), "local relay goes on")
        #expect(a.stderr.line(with: ["cluster:", "REASON=cluster_protocol"]) != nil, "the daemon says what went wrong:\n\(a.stderr.current.suffix(2000))")

        fake.stop()
        let redis = try RedisServer(port: port)
        #expect(redis.waitForSubscribers("roomcast:odd:room:lobby", 1, timeout: .seconds(10)), "it reconnects to the real Redis")
        let b = try clusterDaemon(redis, name: "odd")
        let z = try b.connect()
        #expect(redis.waitForSubscribers("roomcast:odd:room:lobby", 2))
        try x.send(Wire.text(Wire.user("x"), "across"))
        #expect(z.receiveFrame()?.wire == Wire.text(Wire.user("x"), "across"), "and relays across daemons")
        #expect(a.child.process.isRunning)
    }
}
