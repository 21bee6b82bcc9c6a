// Idempotency-Key across the cluster (issue 28 item 5): two real roomcastd on
// one real redis-server. A keyed publish is claimed in Redis
// (`SET roomcast:NAME:idem:KEY ... NX PX 300000 GET`) before it is relayed,
// so the same request sent to both daemons relays once, the second daemon
// answering the first one's delivered count; another request under the key
// is 422 there; a key still being processed is 409; a value in Redis that
// no daemon of ours writes is refused (counted) and relays nothing; a Redis
// that does not answer leaves the key to the local cache (counted).
import Foundation
import Glibc
import Testing
@testable import RoomcastServer

@Suite("Idempotency-Key across the cluster (real redis-server)", .serialized)
struct ClusterIdempotencyTests {
    static func gift(_ name: String) -> String {
        #"{"type": "gift", "user": {"name": "shop"}, "giftname": "\#(name)", "giftcount": 1}"#
    }

    /// A daemon with the API on the cluster `name` of `redis`, its link up.
    static func daemon(_ redis: RedisServer, _ dir: TempDirectory, extra: [String: String] = [:]) throws -> (Daemon, APITestClient) {
        let keys = try dir.write("api-\(UUID().uuidString).keys", "\(APIIntegrationTests.key)\n")
        chmod(keys, 0o600)
        let d = try clusterDaemon(redis, name: "idem", ["api.listen": "127.0.0.1:0", "api.key_file": keys].merging(extra) { $1 })
        return (d, try APITestClient(port: try #require(d.apiPort)))
    }

    /// `name` joined to `room` on `d`, its own join read.
    static func member(_ d: Daemon, _ name: String, room: String = "r1") throws -> TestClient {
        let c = try d.connect()
        try c.send(Wire.join(Wire.user(name, room: room)))
        _ = c.receiveFrame()
        return c
    }

    @Test("the value in Redis: 64 lowercase hex digits, then a space and 1 ... 10 digits once answered; anything else is not ours")
    func claimValues() {
        let fp = (0..<32).map { UInt8($0 * 7 & 0xFF) }
        for v in [IdempotencyClaimValue(fingerprint: fp, delivered: nil), IdempotencyClaimValue(fingerprint: fp, delivered: 0),
                  IdempotencyClaimValue(fingerprint: fp, delivered: 4_294_967_295)] {
            let back = v.encoded.withUnsafeBytes { IdempotencyClaimValue($0) }
            #expect(back == v && v.encoded.count <= IdempotencyClaimValue.maxBytes)
        }
        let hex = IdempotencyClaimValue(fingerprint: fp, delivered: nil).encoded
        for bad in [[], Array(hex.dropLast()), hex + [0x20], hex + Array(" x".utf8), hex + Array(" 4294967296".utf8),
                    hex + Array(" 12345678901".utf8), hex + Array("\n1".utf8), Array(String(decoding: hex, as: UTF8.self).uppercased().utf8),
                    Array(hex.dropLast(2)) + Array("zz".utf8)] {
            #expect(bad.withUnsafeBytes { IdempotencyClaimValue($0) } == nil, "\(String(decoding: bad, as: UTF8.self))")
        }
    }

    @Test("the same key to two daemons relays once, the second answers the first's count; another body there is 422")
    func sameKeyTwoDaemons() throws {
        let redis = try RedisServer()
        let dir = try TempDirectory()
        let (a, apiA) = try Self.daemon(redis, dir)
        let (b, apiB) = try Self.daemon(redis, dir)
        let alice = try Self.member(a, "alice")
        #expect(redis.waitForSubscribers("roomcast:idem:room:r1", 1))
        let bob = try Self.member(b, "bob")
        let carol = try Self.member(b, "carol")
        #expect(redis.waitForSubscribers("roomcast:idem:room:r1", 2))
        _ = alice.receiveFrames(2)  // bob's and carol's joins, across
        _ = bob.receiveFrame()      // carol's

        let first = try #require(apiA.request("POST", "/v1/rooms/r1/publish", body: Self.gift("rose"), headers: ["Idempotency-Key: gift-1"]))
        #expect(first.status == 200 && first.body == "{\"delivered\": 1}\n", "\(first)")
        #expect(alice.receiveFrame()?.type == Wire.gift)
        #expect(bob.receiveFrame()?.type == Wire.gift && carol.receiveFrame()?.type == Wire.gift, "relayed across once")
        let stored = (redis.cli(["GET", "roomcast:idem:idem:gift-1"]) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(stored.count == 66 && stored.hasSuffix(" 1"), "the fingerprint and the delivered count: \(stored)")
        let ttl = Int((redis.cli(["PTTL", "roomcast:idem:idem:gift-1"]) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        #expect(ttl > 250_000 && ttl <= 300_000, "kept 5 minutes: \(ttl) ms left")

        // The backend's retry lands on the other daemon.
        let retry = try #require(apiB.request("POST", "/v1/rooms/r1/publish", body: Self.gift("rose"), headers: ["Idempotency-Key: gift-1"]))
        #expect(retry.status == 200 && retry.body == "{\"delivered\": 1}\n", "A's answer, not B's 2 members: \(retry)")
        let other = try #require(apiB.request("POST", "/v1/rooms/r1/publish", body: Self.gift("yacht"), headers: ["Idempotency-Key: gift-1"]))
        #expect(other.status == 422 && other.body.contains("idempotency_key_reused"), "\(other)")
        for c in [alice, bob, carol] { c.expectNoFrame(within: .milliseconds(300), "a second gift was relayed") }

        // A fresh key on B is B's own: relayed everywhere once.
        let fresh = try #require(apiB.request("POST", "/v1/rooms/r1/publish", body: Self.gift("rose"), headers: ["Idempotency-Key: gift-2"]))
        #expect(fresh.status == 200 && fresh.body == "{\"delivered\": 2}\n", "\(fresh)")
        #expect(alice.receiveFrame()?.type == Wire.gift)
        let metrics = apiB.request("GET", "/metrics")?.body ?? ""
        #expect(metrics.contains("roomcast_idempotency_cluster_fallbacks_total 0"), "\(metrics)")
    }

    @Test("a key another request still holds is 409; a value no daemon of ours writes is refused (counted) and relays nothing")
    func inProgressAndForeignValues() throws {
        let redis = try RedisServer()
        let dir = try TempDirectory()
        let (a, api) = try Self.daemon(redis, dir)
        let alice = try Self.member(a, "alice")
        let body = Self.gift("rose")
        let fp = IdempotencyCache.fingerprint(method: "POST", path: "/v1/rooms/r1/publish", body: Array(body.utf8))
        let hex = fp.map { String(format: "%02x", $0) }.joined()
        _ = redis.cli(["SET", "roomcast:idem:idem:busy", hex, "PX", "60000"])
        let busy = try #require(api.request("POST", "/v1/rooms/r1/publish", body: body, headers: ["Idempotency-Key: busy"]))
        #expect(busy.status == 409 && busy.body.contains("idempotency_key_in_progress"), "\(busy)")

        _ = redis.cli(["SET", "roomcast:idem:idem:odd", String(repeating: "Z", count: 64) + " 1", "PX", "60000"])
        let odd = try #require(api.request("POST", "/v1/rooms/r1/publish", body: body, headers: ["Idempotency-Key: odd"]))
        #expect(odd.status == 422, "\(odd)")
        _ = redis.cli(["SET", "roomcast:idem:idem:big", hex + " 99999999999", "PX", "60000"])
        #expect(api.request("POST", "/v1/rooms/r1/publish", body: body, headers: ["Idempotency-Key: big"])?.status == 422)
        alice.expectNoFrame(within: .milliseconds(300), "a key held in Redis was relayed")
        let metrics = api.request("GET", "/metrics")?.body ?? ""
        #expect(metrics.contains("roomcast_cluster_refused_total{reason=\"idempotency\"} 2"), "\(metrics)")

        // Pipelined behind a parked request: answered in order.
        api.send("POST /v1/rooms/r1/publish HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(APIIntegrationTests.key)\r\nIdempotency-Key: p-1\r\n"
                 + "Content-Length: \(body.utf8.count)\r\n\r\n\(body)GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(APIIntegrationTests.key)\r\n\r\n")
        #expect(api.answer()?.body == "{\"delivered\": 1}\n")
        #expect(api.answer()?.status == 200)
        #expect(alice.receiveFrame()?.type == Wire.gift)
    }

    @Test("Redis stops answering: the keyed publish is answered after cluster.timeout from the local cache, counted")
    func redisSilentFallsBack() throws {
        let redis = try RedisServer()
        let dir = try TempDirectory()
        let (a, api) = try Self.daemon(redis, dir, extra: ["cluster.timeout": "500ms"])
        let alice = try Self.member(a, "alice")
        redis.freeze()
        defer { redis.thaw() }
        let start = monotonicMs()
        let got = try #require(api.request("POST", "/v1/rooms/r1/publish", body: Self.gift("rose"), headers: ["Idempotency-Key: k"]))
        #expect(got.status == 200 && got.body == "{\"delivered\": 1}\n", "\(got)")
        #expect(monotonicMs() - start < 3_000, "answered within about cluster.timeout")
        #expect(alice.receiveFrame()?.type == Wire.gift)
        let again = try #require(api.request("POST", "/v1/rooms/r1/publish", body: Self.gift("rose"), headers: ["Idempotency-Key: k"]))
        #expect(again.status == 200, "the local cache answers the retry")
        alice.expectNoFrame(within: .milliseconds(300), "the retry was relayed again")
        let metrics = api.request("GET", "/metrics")?.body ?? ""
        #expect(metrics.contains("roomcast_idempotency_cluster_fallbacks_total 1") || metrics.contains("roomcast_idempotency_cluster_fallbacks_total 2"),
                "\(metrics)")
        #expect(a.stderr.wait(for: "could not be claimed in Redis", timeout: .seconds(2)))
    }
}
