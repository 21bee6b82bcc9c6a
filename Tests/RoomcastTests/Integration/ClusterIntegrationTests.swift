// Rooms that span daemons: two or three real roomcastd on one
// real redis-server, LTB and JSON clients on each. Every test has a Redis
// of its own; the suite runs its tests one at a time (each starts several
// processes and some stop Redis for seconds).
import Foundation
import Glibc
import RoomcastCore
import Testing

/// A daemon of cluster `name` on `redis`, with a JSON listener, and its link up.
/// - Parameter address: where the daemon says it connected (`[cluster]
///   redis` as given in `settings`; the server's TCP address by default).
func clusterDaemon(_ redis: RedisServer, name: String, _ settings: [String: String] = [:], address: String? = nil) throws -> Daemon {
    let d = try Daemon(["cluster.redis": redis.address, "cluster.name": name, "json.listen": "127.0.0.1:0"]
        .merging(settings) { $1 })
    let address = address ?? redis.address
    guard d.stderr.wait(for: "cluster: connected to Redis at \(address)", timeout: .seconds(10)) else {
        throw HarnessError("the daemon did not connect to Redis at \(address):\n\(d.stderr.current)")
    }
    return d
}

/// Who sent a frame, for per-sender order checks: every frame a test sends is unique.
struct SentFrames {
    private(set) var bySender: [String: [[UInt8]]] = [:]
    private var owner: [[UInt8]: String] = [:]

    mutating func add(_ sender: String, _ frame: [UInt8]) {
        precondition(owner[frame] == nil, "frames must be unique")
        bySender[sender, default: []].append(frame)
        owner[frame] = sender
    }

    var count: Int { owner.count }

    /// Records an issue unless `received` holds every frame once, and each
    /// sender's frames in the order it sent them.
    func check(_ received: [[UInt8]], _ who: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(received.count == count, "\(who) received \(received.count) frames of \(count)", sourceLocation: sourceLocation)
        var got: [String: [[UInt8]]] = [:]
        for f in received {
            guard let sender = owner[f] else {
                Issue.record("\(who) received a frame nobody sent: \(f.prefix(32))", sourceLocation: sourceLocation)
                continue
            }
            got[sender, default: []].append(f)
        }
        for (sender, frames) in bySender {
            #expect(got[sender] ?? [] == frames, "\(who): the frames from \(sender) differ (missing, duplicated or reordered)",
                    sourceLocation: sourceLocation)
        }
    }
}

@Suite("Cluster over Redis", .serialized)
struct ClusterIntegrationTests {
    @Test("a conversation across three daemons: byte-identical, per-sender ordered, echoes once, LTB and JSON alike")
    func conversationAcrossDaemons() throws {
        let redis = try RedisServer()
        let daemons = try (0..<3).map { _ in try clusterDaemon(redis, name: "conv") }
        let ltb = try daemons.map { try $0.connect() }
        let json = try [JSONTestClient(daemons[0]), JSONTestClient(daemons[2])]
        // Every daemon has members in the lobby (the default room): three subscribers.
        #expect(redis.waitForSubscribers("roomcast:conv:room:lobby", 3))

        var sent = SentFrames()
        var jsonExpected: [[String: String]] = []  // what JSON clients should see, per sender in order
        var jsonBySender: [String: [[String: String]]] = [:]
        let users = ["ann", "bob", "cat"].map { Wire.user($0, room: "lobby") }
        for (i, c) in ltb.enumerated() {
            let join = Wire.join(users[i])
            try c.send(join)
            sent.add(users[i].name, join)
            jsonBySender[users[i].name, default: []].append(["cmd": "join", "nickname": users[i].name, "addr": c.address])
        }
        let guests = ["guest1", "guest2"]
        for (i, j) in json.enumerated() {
            try j.send(["cmd": "nickname", "nickname": guests[i]])
            sent.add(guests[i], Wire.join(UserInfo(level: 0, name: guests[i], iconURL: "")))
            jsonBySender[guests[i], default: []].append(["cmd": "join", "nickname": guests[i], "addr": j.address])
        }
        // Interleaved: 40 texts from each LTB client, 20 msgs from each JSON
        // client, a gift and an opaque frame (JSON clients never see opaque ones).
        for n in 0..<40 {
            for (i, c) in ltb.enumerated() {
                let text = "\(users[i].name) #\(n) \u{1F600} \"q\" \0 end"
                let frame = Wire.text(users[i], text)
                try c.send(frame)
                sent.add(users[i].name, frame)
                jsonBySender[users[i].name]!.append(["cmd": "msg", "from": users[i].name, "content": text])
            }
            if n % 2 == 0 {
                for (i, j) in json.enumerated() {
                    let text = "\(guests[i]) says \(n)"
                    try j.send(["cmd": "msg", "content": text])
                    sent.add(guests[i], Wire.text(UserInfo(level: 0, name: guests[i], iconURL: ""), text))
                    jsonBySender[guests[i]]!.append(["cmd": "msg", "from": guests[i], "content": text])
                }
            }
        }
        let gift = Wire.frame(Wire.gift, GiftMessage(user: users[1], giftname: "rose", giftURL: "https://g/r.png", giftcount: 3).serialized())
        try ltb[1].send(gift)
        sent.add("bob", gift)
        jsonBySender["bob"]!.append(["cmd": "gift", "from": "bob", "giftname": "rose", "giftURL": "https://g/r.png", "giftcount": "3"])
        let opaque = Wire.frame(Wire.opaque, [0, 1, 2, 0xFF, 0x0D, 0x0A] + Array("cat's own type".utf8))
        try ltb[2].send(opaque)
        sent.add("cat", opaque)
        jsonExpected = jsonBySender.values.flatMap { $0 }

        for (i, c) in ltb.enumerated() {
            sent.check(c.receiveFrames(sent.count, timeout: .seconds(15)).map(\.wire), "LTB client on daemon \(i)")
            c.expectNoFrame(within: .milliseconds(200), "after the conversation (a duplicate?)")
        }
        for (i, j) in json.enumerated() {
            var got: [String: [[String: String]]] = [:]
            for _ in 0..<jsonExpected.count {
                guard let o = j.receive(timeout: .seconds(10)) else { break }
                let flat = o.mapValues { "\($0)" }
                got[flat["nickname"] ?? flat["from"] ?? "?", default: []].append(flat)
            }
            for (sender, objects) in jsonBySender {
                #expect(got[sender] ?? [] == objects, "JSON client \(i): the objects from \(sender) differ")
            }
            #expect(j.receive(timeout: .milliseconds(200)) == nil, "JSON client \(i) got more than expected")
        }
        for (i, d) in daemons.enumerated() {
            #expect(d.stderr.line(with: ["cluster_gap"]) == nil, "daemon \(i) counted a gap")
        }
    }

    @Test("[cluster] redis = unix:/PATH: two daemons on Redis's Unix socket relay to each other")
    func redisOverUnixSocket() throws {
        let directory = try TempDirectory()
        let path = directory.path + "/redis.sock"
        let redis = try RedisServer(arguments: ["--unixsocket", path, "--unixsocketperm", "700"])
        let daemons = try (0..<2).map { _ in try clusterDaemon(redis, name: "unix", ["cluster.redis": "unix:" + path], address: "unix:" + path) }
        let a = try daemons[0].connect(), b = try daemons[1].connect()
        // Both are in the default room (lobby) from their connect on.
        #expect(redis.waitForSubscribers("roomcast:unix:room:lobby", 2))
        let au = Wire.user("ann", room: "lobby"), bu = Wire.user("bob", room: "lobby")
        try b.send(Wire.join(bu))
        #expect(b.receiveFrame()?.wire == Wire.join(bu))
        #expect(a.receiveFrame()?.wire == Wire.join(bu), "through Redis's Unix socket")
        try a.send(Wire.join(au))
        #expect(a.receiveFrame()?.wire == Wire.join(au))
        #expect(b.receiveFrame()?.wire == Wire.join(au))
        try b.send(Wire.text(bu, "over unix"))
        #expect(b.receiveFrame()?.wire == Wire.text(bu, "over unix"))
        #expect(a.receiveFrame()?.wire == Wire.text(bu, "over unix"))
    }

    @Test("Redis killed and restarted mid-conversation: local relay goes on, cross-daemon relay resumes, losses counted, nothing duplicated")
    func redisRestart() throws {
        let redis = try RedisServer()
        let a = try clusterDaemon(redis, name: "kill"), b = try clusterDaemon(redis, name: "kill")
        let alice = try a.connect(), neighbour = try a.connect(), bob = try b.connect()
        let ann = Wire.user("ann", room: "lobby")
        #expect(redis.waitForSubscribers("roomcast:kill:room:lobby", 2))
        func say(_ range: Range<Int>) throws -> [[UInt8]] {
            try range.map { n in
                let f = Wire.text(ann, "message \(n)")
                try alice.send(f)
                return f
            }
        }
        let before = try say(0..<20)
        #expect(bob.receiveFrames(20).map(\.wire) == before)
        #expect(neighbour.receiveFrames(20).map(\.wire) == before)

        redis.kill()
        #expect(a.stderr.wait(forLineWith: ["WARNING", "cluster: lost Redis at \(redis.address)", "local relay goes on", "REASON=cluster_down"]))
        #expect(b.stderr.wait(forLineWith: ["WARNING", "cluster: lost Redis at \(redis.address)"]))
        let during = try say(20..<40)
        #expect(neighbour.receiveFrames(20).map(\.wire) == during, "local relay goes on while Redis is down")
        bob.expectNoFrame(within: .milliseconds(300), "while Redis is down")
        #expect(waitUntil(.seconds(5)) { a.notify.all.last { $0.value("STATUS") != nil }?.value("STATUS")?.contains("cluster disconnected") == true },
                "STATUS= says the cluster is down")

        try redis.start()
        #expect(a.stderr.wait(forLineWith: ["NOTICE", "cluster: Redis at \(redis.address) is back after", "resubscribed to 1 room",
                                            "20 frames were not published meanwhile", "REASON=cluster_up"], timeout: .seconds(10)))
        #expect(b.stderr.wait(forLineWith: ["NOTICE", "is back after"], timeout: .seconds(10)))
        #expect(redis.waitForSubscribers("roomcast:kill:room:lobby", 2))
        let after = try say(40..<60)
        #expect(bob.receiveFrames(20).map(\.wire) == after, "cross-daemon relay resumes, without the frames of the outage")
        bob.expectNoFrame(within: .milliseconds(300), "after the outage (a duplicate?)")
        #expect(neighbour.receiveFrames(20).map(\.wire) == after)
        // b counts the 20 frames it never got (sequence gap).
        #expect(b.stderr.wait(forLineWith: ["WARNING", "cluster: 20 frames from daemon", "to lobby never arrived", "REASON=cluster_gap"]))
        #expect(waitUntil(.seconds(5)) {
            a.notify.all.last { $0.value("STATUS") != nil }?.value("STATUS")?.contains("cluster connected, 1 room subscribed, 40 frames out, 0 in, 20 dropped, 0 gaps") == true
        }, "a's STATUS=: \(a.notify.all.last { $0.value("STATUS") != nil }?.value("STATUS") ?? "none")")
        #expect(waitUntil(.seconds(5)) {
            b.notify.all.last { $0.value("STATUS") != nil }?.value("STATUS")?.contains("40 in, 0 dropped, 20 gaps") == true
        }, "b's STATUS=: \(b.notify.all.last { $0.value("STATUS") != nil }?.value("STATUS") ?? "none")")
    }

    @Test("a stopped Redis (SIGSTOP: its connections stay open) is found within about 2 s, and the link comes back after SIGCONT")
    func frozenRedis() throws {
        let redis = try RedisServer()
        let a = try clusterDaemon(redis, name: "frozen"), b = try clusterDaemon(redis, name: "frozen")
        let alice = try a.connect(), neighbour = try a.connect(), bob = try b.connect()
        let ann = Wire.user("ann")
        #expect(redis.waitForSubscribers("roomcast:frozen:room:lobby", 2))
        try alice.send(Wire.text(ann, "before"))
        #expect(bob.receiveFrame()?.wire == Wire.text(ann, "before"))
        #expect(neighbour.receiveFrame()?.wire == Wire.text(ann, "before"))

        let stoppedAt = monotonicMs()
        redis.freeze()
        // Local relay never waits for it.
        try alice.send(Wire.text(ann, "while frozen"))
        let local = neighbour.receiveFrame(timeout: .milliseconds(500))
        #expect(local?.wire == Wire.text(ann, "while frozen"))
        #expect(a.stderr.wait(forLineWith: ["WARNING", "cluster: lost Redis", "(Redis stopped?)"], timeout: .seconds(5)))
        let detectedMs = monotonicMs() - stoppedAt
        #expect(detectedMs <= 3_000, "found after \(detectedMs) ms (timeout 2 s)")
        // b too (its heartbeat runs on its own clock, up to half a second apart).
        #expect(b.stderr.wait(forLineWith: ["WARNING", "cluster: lost Redis", "(Redis stopped?)"], timeout: .seconds(2)))
        redis.thaw()
        #expect(a.stderr.wait(forLineWith: ["NOTICE", "is back after"], timeout: .seconds(10)))
        #expect(b.stderr.wait(forLineWith: ["NOTICE", "is back after"], timeout: .seconds(10)), "\(b.stderr.current)")
        #expect(redis.waitForSubscribers("roomcast:frozen:room:lobby", 2))
        try alice.send(Wire.text(ann, "after"))
        // "while frozen" may or may not have reached Redis before it stopped: at most once.
        var got = bob.receiveFrames(2, timeout: .seconds(3)).map(\.wire)
        if got.first == Wire.text(ann, "while frozen") { got.removeFirst() }
        #expect(got == [Wire.text(ann, "after")])
        bob.expectNoFrame(within: .milliseconds(300))
    }

    @Test("output for a stopped Redis is bounded by max_output_bytes: frames over it are dropped and counted, local relay goes on")
    func outputToRedisIsBounded() throws {
        let redis = try RedisServer()
        // A long timeout, so that the link stays "up" while Redis is stopped and its output piles up.
        let a = try clusterDaemon(redis, name: "bound", ["cluster.max_output_bytes": "64K", "cluster.timeout": "10s",
                                                         "protocol.echo": "no"])
        let sender = try a.connect(), neighbour = try a.connect()
        #expect(redis.waitForSubscribers("roomcast:bound:room:lobby", 1))
        redis.freeze()
        defer { redis.thaw() }
        // 16 MiB of frames: more than the kernel buffers on both sides of
        // the loopback connection, so the rest waits in hiredis's output.
        let body = [UInt8](repeating: 0x5A, count: 60_000)
        var received = 0
        for n in 0..<280 {
            try sender.send(Wire.frame(Wire.opaque, [UInt8(n & 0xFF)] + body))
            received += neighbour.receiveFrames(8, timeout: .milliseconds(1)).count
        }
        received += neighbour.receiveFrames(280 - received, timeout: .seconds(10)).count
        #expect(received == 280, "local relay goes on while Redis does not read")
        #expect(a.stderr.wait(forLineWith: ["WARNING", "cluster: Redis is not taking our output", "max_output_bytes 64K",
                                            "REASON=cluster_output_limit"]))
        #expect(waitUntil(.seconds(5)) {
            guard let status = a.notify.all.last(where: { $0.value("STATUS") != nil })?.value("STATUS"),
                  let dropped = status.split(separator: ",").first(where: { $0.hasSuffix(" dropped") }) else { return false }
            return Int(dropped.split(separator: " ").first ?? "") ?? 0 > 0
        }, "STATUS= counts the dropped frames")
    }

    @Test("a daemon stopped and started again: the others hear its users leave (its bye), then join again; the conversation goes on both ways, nothing twice")
    func daemonRestart() throws {
        let redis = try RedisServer()
        let a = try clusterDaemon(redis, name: "restart")
        var b: Daemon? = try clusterDaemon(redis, name: "restart")
        let alice = try a.connect()
        var bob: TestClient? = try b!.connect()
        let ann = Wire.user("ann", room: "stage"), ben = Wire.user("ben", room: "stage")
        try alice.send(Wire.join(ann))
        #expect(alice.receiveFrame()?.wire == Wire.join(ann))
        #expect(redis.waitForSubscribers("roomcast:restart:room:stage", 1))
        try bob!.send(Wire.join(ben))
        #expect(bob!.receiveFrame()?.wire == Wire.join(ben))
        #expect(alice.receiveFrame()?.wire == Wire.join(ben))
        #expect(redis.waitForSubscribers("roomcast:restart:room:stage", 2))
        try alice.send(Wire.text(ann, "one"))
        #expect(bob!.receiveFrame()?.wire == Wire.text(ann, "one"))

        // A graceful stop (SIGTERM) with bob still connected: no leave on b
        // itself (docs/protocol/clients.md §10), but b says bye, and a's members
        // hear ben leave (§12, "Leaves").
        b!.child.kill(SIGTERM)
        #expect(b!.child.waitForExit() == 0)
        bob = nil
        b = nil
        #expect(redis.waitForSubscribers("roomcast:restart:room:stage", 1))
        let b2 = try clusterDaemon(redis, name: "restart")
        let bob2 = try b2.connect()
        try bob2.send(Wire.join(ben))
        #expect(bob2.receiveFrame()?.wire == Wire.join(ben))
        #expect(redis.waitForSubscribers("roomcast:restart:room:stage", 2))
        #expect(alice.receiveFrames(3, timeout: .seconds(2)).map(\.wire) == [Wire.text(ann, "one"), Wire.leave(ben), Wire.join(ben)],
                "alice's echo, ben's leave when b stopped, then the new daemon's join")
        #expect(a.stderr.line(with: ["cluster: daemon", "stopped (it said bye); 1 leave for its members"]) != nil)
        try alice.send(Wire.text(ann, "two"))
        try bob2.send(Wire.text(ben, "back"))
        #expect(bob2.receiveFrames(2).map(\.wire).sorted { $0.lexicographicallyPrecedes($1) }
                == [Wire.text(ann, "two"), Wire.text(ben, "back")].sorted { $0.lexicographicallyPrecedes($1) })
        #expect(alice.receiveFrames(2).map(\.wire).sorted { $0.lexicographicallyPrecedes($1) }
                == [Wire.text(ann, "two"), Wire.text(ben, "back")].sorted { $0.lexicographicallyPrecedes($1) })
        alice.expectNoFrame(within: .milliseconds(300))
        bob2.expectNoFrame(within: .milliseconds(300))
    }

    @Test("a daemon killed (SIGKILL): after cluster.timeout without its heartbeat, the others' members hear its users leave, once")
    func killedDaemonsUsersLeave() throws {
        let redis = try RedisServer()
        let settings = ["cluster.timeout": "1s"]
        let a = try clusterDaemon(redis, name: "gone", settings), b = try clusterDaemon(redis, name: "gone", settings)
        let alice = try a.connect(), bob = try b.connect(), cat = try b.connect()
        let ann = Wire.user("ann", room: "stage"), ben = Wire.user("ben", room: "stage"), cy = Wire.user("cy", room: "stage")
        try alice.send(Wire.join(ann))
        #expect(alice.receiveFrame()?.wire == Wire.join(ann))
        #expect(redis.waitForSubscribers("roomcast:gone:room:stage", 1))
        try bob.send(Wire.join(ben))
        #expect(redis.waitForSubscribers("roomcast:gone:room:stage", 2))
        try cat.send(Wire.join(cy))
        try cat.send(Wire.leave(cy))  // cy left before: no second leave for it
        #expect(alice.receiveFrames(3).map(\.wire) == [Wire.join(ben), Wire.join(cy), Wire.leave(cy)])
        let killedAt = monotonicMs()
        b.child.kill(SIGKILL)
        _ = b.child.waitForExit()
        let leave = alice.receiveFrame(timeout: .seconds(5))
        let ms = monotonicMs() - killedAt
        #expect(leave?.wire == Wire.leave(ben), "ben's leave, as for a local disconnect")
        #expect(ms >= 700 && ms <= 3_000, "after about cluster.timeout (1 s): \(ms) ms")
        alice.expectNoFrame(within: .milliseconds(500), "one leave, nothing for cy")
        #expect(a.stderr.line(with: ["cluster: daemon", "was not heard for 1s; 1 leave for its members"]) != nil, "\(a.stderr.current.suffix(1500))")
    }

    @Test("a room emptied here is unsubscribed (PUBSUB NUMSUB); the heartbeat channel stays")
    func emptiedRoomUnsubscribes() throws {
        let redis = try RedisServer()
        let a = try clusterDaemon(redis, name: "subs"), b = try clusterDaemon(redis, name: "subs")
        let channel = "roomcast:subs:room:side room"
        #expect(redis.subscribers(channel) == 0)
        let x = try a.connect(), y = try a.connect(), z = try b.connect()
        let xu = Wire.user("x", room: "side room"), yu = Wire.user("y", room: "side room"), zu = Wire.user("z", room: "side room")
        try z.send(Wire.join(zu))
        #expect(redis.waitForSubscribers(channel, 1))
        try x.send(Wire.join(xu))
        try y.send(Wire.join(yu))
        #expect(redis.waitForSubscribers(channel, 2), "one subscription per daemon, not per client")
        #expect(z.receiveFrames(3).map(\.wire) == [Wire.join(zu), Wire.join(xu), Wire.join(yu)])
        try x.send(Wire.leave(xu))
        #expect(z.receiveFrame()?.wire == Wire.leave(xu))
        #expect(redis.subscribers(channel) == 2, "y is still in it on a")
        y.reset()  // the last member on a goes: a unsubscribes, and its synthesized leave still reaches b
        #expect(z.receiveFrame()?.wire == Wire.leave(yu))
        #expect(redis.waitForSubscribers(channel, 1))
        try z.send(Wire.leave(zu))
        #expect(redis.waitForSubscribers(channel, 0))
        #expect(a.stderr.line(with: ["cluster_gap"]) == nil && b.stderr.line(with: ["cluster_gap"]) == nil)
        // Every room is empty now (x is in no room); each daemon keeps its heartbeat channel.
        #expect(redis.channels("roomcast:subs:room:*").isEmpty)
        let hb = redis.channels("roomcast:subs:hb:*")
        #expect(hb.count == 2, "\(hb)")
        #expect(waitUntil(.seconds(5)) {
            a.notify.all.last { $0.value("STATUS") != nil }?.value("STATUS")?.contains("cluster connected, 0 rooms subscribed") == true
        }, "a's STATUS=: \(a.notify.all.last { $0.value("STATUS") != nil }?.value("STATUS") ?? "none")")
    }

    @Test("no Redis at start: the daemon starts, relays locally, says so, and joins the cluster once Redis is there")
    func redisAbsentAtStart() throws {
        let redis = try RedisServer()
        redis.kill()
        let a = try Daemon(["cluster.redis": redis.address, "cluster.name": "late"])
        #expect(a.stderr.wait(forLineWith: ["WARNING", "cluster: cannot reach Redis at \(redis.address)", "Connection refused", "local relay goes on"]))
        let x = try a.connect(), y = try a.connect()
        try x.send(Wire.text(Wire.user("x"), "local"))
        #expect(y.receiveFrame()?.wire == Wire.text(Wire.user("x"), "local"))
        try redis.start()
        #expect(a.stderr.wait(forLineWith: ["cluster: connected to Redis at \(redis.address)", "subscribed to 1 room",
                                            "1 frames were not published before"], timeout: .seconds(10)))
        #expect(redis.waitForSubscribers("roomcast:late:room:lobby", 1))
    }

    @Test("a host name for [cluster] redis is refused with the file and line (exit 78)")
    func hostNameRefused() throws {
        let dir = try TempDirectory()
        let path = try dir.write("c.conf", "[cluster]\n# the broker\nredis = redis.internal:6379\n")
        let r = try runRoomcastd(["--config", path, "--check-config"])
        #expect(r.status == 78)
        #expect(r.stderr.contains("\(path):3: cluster.redis: 'redis.internal:6379' is not a Redis address"))
        #expect(r.stderr.contains("host names are not resolved"))
    }
}
