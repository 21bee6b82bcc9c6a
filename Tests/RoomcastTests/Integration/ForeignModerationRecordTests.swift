// Moderation records in Redis that no daemon wrote (docs/api.md "Across the
// cluster"): a value outside the API's bounds, in the hash a daemon loads
// at connect or on the control channel, is skipped like a foreign field and
// said in the journal; the daemon keeps relaying. A slow mode of 2^63 - 1
// seconds used to be taken, and the next text in its room trapped the
// daemon (its interval in ms overflowed).
import Foundation
import Glibc
import RoomcastCore
import Testing

@Suite("Moderation records outside the API's bounds (real redis-server)", .serialized)
struct ForeignModerationRecordTests {
    @Test("a slow mode beyond 120 s in the hash or on the control channel is skipped; texts keep flowing")
    func outOfRangeSlowModeIsSkipped() throws {
        let redis = try RedisServer()
        _ = redis.cli(["HSET", "roomcast:wild:moderation", "settings:stage", "9223372036854775807 1", "settings:calm", "10 1"])
        let m = try moderationClusterDaemon(redis, name: "wild")
        #expect(m.daemon.stderr.wait(for: "cluster: moderation loaded from Redis", timeout: .seconds(10)))
        #expect(m.daemon.stderr.wait(for: "1 fields of roomcast:wild:moderation are not roomcast's; skipped", timeout: .seconds(2)),
                "the out-of-range slow mode was taken")
        #expect(m.api.request("GET", "/v1/rooms/calm/settings")?.body.contains(#""slow_mode_seconds": 10"#) == true, "a good field beside it was lost")
        #expect(m.api.request("GET", "/v1/rooms/stage/settings")?.body.contains(#""slow_mode_seconds": 0"#) == true)

        let fan = try joinSigned(m.daemon, "fan", room: "stage")
        let chatty = try joinSigned(m.daemon, "chatty", room: "stage")
        drain(fan)
        for text in ["one", "two"] {
            try chatty.send(Wire.text(user("chatty"), text))
            #expect(try fan.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == text, "\(text) was not relayed")
        }

        // The same from "another daemon" on the control channel: 2^64 / 1000 + 1 s.
        #expect(redis.waitForSubscribers("roomcast:wild:control", 1))
        _ = redis.cli(["PUBLISH", "roomcast:wild:control", "00000000000000ab set settings:stage 18446744073709552 1"])
        #expect(m.daemon.stderr.wait(for: "control message that is not roomcast's", timeout: .seconds(5)), "the control message was taken")
        try chatty.send(Wire.text(user("chatty"), "three"))
        #expect(try fan.receiveFrame().map { try ChatMessage(protobuf: $0.body).text } == "three", "three was not relayed")
        #expect(m.daemon.child.process.isRunning, "the daemon died:\n\(m.daemon.stderr.current.suffix(2000))")
    }
}
