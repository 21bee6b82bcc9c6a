// Moderation across the cluster: two and three real roomcastd on one real
// redis-server (docs/api.md "Moderation"). A ban, mute or setting made
// through one daemon's API reaches the other daemons within a second, lives
// in Redis for a daemon started later, and a publish or kick through one
// reaches the members of another.
import Foundation
import Glibc
import RoomcastCore
import Testing

/// A daemon with the API, `[auth]` and the cluster on `redis`, its link up.
func moderationClusterDaemon(_ redis: RedisServer, name: String) throws -> ModerationDaemon {
    let m = try ModerationDaemon(["cluster.redis": redis.address, "cluster.name": name])
    guard m.daemon.stderr.wait(for: "cluster: connected to Redis at \(redis.address)", timeout: .seconds(10)) else {
        throw HarnessError("the daemon did not connect to Redis at \(redis.address):\n\(m.daemon.stderr.current)")
    }
    return m
}

@Suite("Moderation across the cluster (real redis-server)", .serialized)
struct ClusterModerationTests {
    @Test("a ban through one daemon removes the sub on the other and refuses its joins there within 1 s; a daemon started later refuses too")
    func banAcrossDaemons() throws {
        let redis = try RedisServer()
        let a = try moderationClusterDaemon(redis, name: "mod")
        let b = try moderationClusterDaemon(redis, name: "mod")
        let fan = try joinSigned(b.daemon, "fan", room: "stage")
        let troll = try joinSigned(b.daemon, "troll", room: "stage")
        drain(fan)
        #expect(redis.waitForSubscribers("roomcast:mod:control", 2))

        let token = try moderationToken("troll")
        let again = try b.daemon.connect()
        let start = monotonicMs()
        let put = try #require(a.api.request("PUT", "/v1/rooms/stage/bans/troll", body: #"{"seconds": 600, "reason": "raid"}"#))
        #expect(put.status == 200 && put.body.contains(#""kicked": 0"#), "\(put.body)")
        let notice = try #require(nextNotice(troll, timeout: .seconds(1)), "the ban did not reach the other daemon within 1 s")
        let removedMs = monotonicMs() - start
        #expect(notice.code == "banned" && (notice.retryAfterMs ?? 0) > 590_000)
        try again.send(Wire.join(user("troll", room: "stage", token: token)))
        #expect(nextNotice(again)?.code == "banned")
        let refusedMs = monotonicMs() - start
        #expect(refusedMs < 1_000, "refused on the other daemon \(refusedMs) ms after the ban was asked for")
        print("ban through A: removed from B \(removedMs) ms and its join refused there \(refusedMs) ms after the PUT was sent")
        troll.expectClosed()
        #expect(try fan.receiveFrame().map { try UserInfo(protobuf: $0.body).name } == "troll", "the room got the leave")

        // In Redis, readable, with its expiry.
        let stored = redis.cli(["HGETALL", "roomcast:mod:moderation"]) ?? ""
        #expect(stored.contains("ban:stage:troll") && stored.contains(" raid"), "\(stored)")

        // A daemon started after the ban refuses from its first join.
        let c = try moderationClusterDaemon(redis, name: "mod")
        let late = try c.daemon.connect()
        try late.send(Wire.join(user("troll", room: "stage", token: token)))
        #expect(nextNotice(late)?.code == "banned", "a daemon started later let the banned sub in")
        #expect(c.api.request("GET", "/v1/rooms/stage/bans")?.body.contains(#""sub": "troll""#) == true)

        // DELETE through the later daemon: everyone lets it in again.
        #expect(c.api.request("DELETE", "/v1/rooms/stage/bans/troll")?.status == 200)
        #expect(waitUntil(.seconds(3)) { b.api.request("GET", "/v1/rooms/stage/bans")?.body.contains(#""bans": []"#) == true })
        try again.send(Wire.join(user("troll", room: "stage", token: token)))
        #expect(again.receiveFrame()?.type == Wire.join, "still refused on B after the DELETE on C")
        #expect(redis.cli(["HGET", "roomcast:mod:moderation", "ban:stage:troll"])?.hasSuffix(" !\n") == true,
                "the removal is not in Redis (a daemon cut off meanwhile would keep the ban)")
    }

    @Test("mutes and slow mode through one daemon hold on the other; publish and kick through one reach the other's members")
    func muteSettingsPublishKickAcrossDaemons() throws {
        let redis = try RedisServer()
        let a = try moderationClusterDaemon(redis, name: "mod2")
        let b = try moderationClusterDaemon(redis, name: "mod2")
        let fan = try joinSigned(b.daemon, "fan", room: "stage")
        let loud = try joinSigned(b.daemon, "loud", room: "stage")
        drain(fan)
        #expect(redis.waitForSubscribers("roomcast:mod2:room:stage", 1))

        #expect(a.api.request("POST", "/v1/rooms/stage/publish", body: #"{"type": "text", "user": {"name": "system"}, "text": "hello from A"}"#)?.status == 200)
        #expect(try fan.receiveFrame(timeout: .seconds(1)).map { try ChatMessage(protobuf: $0.body).text } == "hello from A")
        drain(loud)

        #expect(a.api.request("PUT", "/v1/rooms/stage/mutes/loud", body: #"{"seconds": 300}"#)?.status == 200)
        #expect(waitUntil(.seconds(1)) { b.api.request("GET", "/v1/rooms/stage/mutes")?.body.contains(#""sub": "loud""#) == true })
        try loud.send(Wire.text(user("loud"), "shout"))
        #expect(nextNotice(loud)?.code == "muted")
        fan.expectNoFrame(within: .milliseconds(300), "a text muted through A was relayed on B")
        #expect(a.api.request("DELETE", "/v1/rooms/stage/mutes/loud")?.status == 200)
        #expect(waitUntil(.seconds(1)) { b.api.request("GET", "/v1/rooms/stage/mutes")?.body.contains(#""mutes": []"#) == true })

        #expect(a.api.request("PUT", "/v1/rooms/stage/settings", body: #"{"slow_mode_seconds": 60}"#)?.status == 200)
        #expect(waitUntil(.seconds(1)) { b.api.request("GET", "/v1/rooms/stage/settings")?.body.contains(#""slow_mode_seconds": 60"#) == true })
        try loud.send(Wire.text(user("loud"), "one"))
        #expect(try fan.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == "one")
        try loud.send(Wire.text(user("loud"), "two"))
        #expect(nextNotice(loud)?.code == "slow_mode")
        #expect(redis.cli(["HGET", "roomcast:mod2:moderation", "settings:stage"])?.hasPrefix("60 ") == true)
        drain(fan)

        let kick = try #require(a.api.request("POST", "/v1/rooms/stage/kick", body: #"{"sub": "loud"}"#))
        #expect(kick.status == 200 && kick.body.contains(#""kicked": 0"#), "A has no such member itself")
        #expect(nextNotice(loud, timeout: .seconds(1))?.code == "kicked", "the kick through A did not reach B within 1 s")
        loud.expectClosed()
        #expect(try fan.receiveFrame().map { try UserInfo(protobuf: $0.body).name } == "loud")
    }

    @Test("a Redis restarted empty (no persistence) is told the bans again by the daemons that hold them; a daemon started then refuses too")
    func bansOutliveAnEmptyRedis() throws {
        let redis = try RedisServer()
        let a = try moderationClusterDaemon(redis, name: "mod3")
        #expect(a.api.request("PUT", "/v1/rooms/stage/bans/troll", body: #"{"seconds": 600}"#)?.status == 200)
        #expect(redis.cli(["HEXISTS", "roomcast:mod3:moderation", "ban:stage:troll"]) == "1\n")
        redis.kill()
        #expect(waitUntil(.seconds(5)) { a.api.request("PUT", "/v1/rooms/stage/mutes/x", body: #"{"seconds": 5}"#)?.status == 503 },
                "a change while Redis is down is refused")
        try redis.start()
        #expect(waitUntil(.seconds(10)) { redis.cli(["HEXISTS", "roomcast:mod3:moderation", "ban:stage:troll"]) == "1\n" },
                "the daemon did not store its ban again in the empty Redis")
        let b = try moderationClusterDaemon(redis, name: "mod3")
        let c = try b.daemon.connect()
        try c.send(Wire.join(user("troll", room: "stage", token: try moderationToken("troll"))))
        #expect(nextNotice(c)?.code == "banned")
    }
}
