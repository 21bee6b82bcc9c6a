// Idempotency-Key (docs/api.md; IETF draft "The Idempotency-Key HTTP Header
// Field" §2.7), issue 28 item 5: the same key with another room or body was
// answered with the first reply, 200 {"delivered": 1}, and relayed nothing.
// Now it is refused with 422 idempotency_key_reused; a true repeat still gets
// the first reply and relays nothing.
import Foundation
import Testing
@testable import RoomcastServer

@Suite("Idempotency-Key: another request under a used key is 422", .serialized)
struct IdempotencyIntegrationTests {
    @Test("the cache tells a repeat (replay) from a reused key (mismatch) by the request's SHA-256 fingerprint")
    func cacheLookups() {
        var cache = IdempotencyCache()
        let a = IdempotencyCache.fingerprint(method: "POST", path: "/v1/rooms/a/publish", body: Array("{}".utf8))
        let b = IdempotencyCache.fingerprint(method: "POST", path: "/v1/rooms/b/publish", body: Array("{}".utf8))
        let c = IdempotencyCache.fingerprint(method: "POST", path: "/v1/rooms/a/publish", body: Array("{ }".utf8))
        #expect(a.count == 32 && a != b && a != c)
        #expect(IdempotencyCache.fingerprint(method: "POST", path: "/x", body: Array("y".utf8))
                != IdempotencyCache.fingerprint(method: "POST", path: "/xy", body: []))
        #expect(cache.lookup("k", fingerprint: a, now: 0) == .unseen)
        cache.remember("k", fingerprint: a, delivered: 1, now: 0)
        #expect(cache.lookup("k", fingerprint: a, now: 1_000) == .replay(delivered: 1))
        #expect(cache.lookup("k", fingerprint: b, now: 1_000) == .mismatch)
        #expect(cache.lookup("k", fingerprint: c, now: 1_000) == .mismatch)
        #expect(cache.lookup("k", fingerprint: b, now: IdempotencyCache.keepMs) == .unseen, "forgotten after 5 minutes")
    }

    @Test("the same key with another room or body: 422 idempotency_key_reused, relayed nowhere; a true repeat replays 200")
    func reusedKeyIs422() throws {
        let (d, _) = try APIIntegrationTests.daemon()
        let alice = try d.connect(), bob = try d.connect()
        try alice.send(Wire.join(Wire.user("alice", room: "a")))
        try bob.send(Wire.join(Wire.user("bob", room: "b")))
        _ = alice.receiveFrame()
        _ = bob.receiveFrame()
        let c = try APITestClient(port: try #require(d.apiPort))
        func text(_ t: String) -> String { #"{"type": "gift", "user": {"name": "shop"}, "giftname": "\#(t)", "giftcount": 1}"# }
        let first = try #require(c.request("POST", "/v1/rooms/a/publish", body: text("rose"), headers: ["Idempotency-Key: gift-1"]))
        #expect(first.status == 200 && first.body == "{\"delivered\": 1}\n")
        #expect(alice.receiveFrame()?.type == Wire.gift)

        let otherRoom = try #require(c.request("POST", "/v1/rooms/b/publish", body: text("rose"), headers: ["Idempotency-Key: gift-1"]))
        #expect(otherRoom.status == 422 && otherRoom.body.contains("idempotency_key_reused"), "\(otherRoom)")
        let otherBody = try #require(c.request("POST", "/v1/rooms/a/publish", body: text("yacht"), headers: ["Idempotency-Key: gift-1"]))
        #expect(otherBody.status == 422 && otherBody.body.contains("idempotency_key_reused"), "\(otherBody)")
        bob.expectNoFrame(within: .milliseconds(300), "a reused key relayed into another room")

        let repeatFirst = try #require(c.request("POST", "/v1/rooms/a/publish", body: text("rose"), headers: ["Idempotency-Key: gift-1"]))
        #expect(repeatFirst.status == 200 && repeatFirst.body == "{\"delivered\": 1}\n")
        alice.expectNoFrame(within: .milliseconds(300), "a repeat (or a reused key) was relayed again")
    }
}
