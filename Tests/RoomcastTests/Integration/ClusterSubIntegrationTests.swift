// The sender's sub across daemons (docs/protocol/across-daemons.md §12, envelope version
// 2): two real daemons on a real redis-server list each other's members
// with their sub; a daemon of the release before (simulated from the test:
// its heartbeats and frames published, its room channel read, with the
// decoder it has) keeps getting version 1 until it is gone; a muted sub's
// frame that reaches a daemon in version 2 is held back there.
import Foundation
import Glibc
import RoomcastCore
import Testing

/// A plain Redis client subscribed to channels: the messages pushed, as
/// an old daemon's subscriber would get them.
final class RedisSubscriber {
    private let fd: Int32
    private var input: [UInt8] = []

    init(_ redis: RedisServer, _ channels: [String]) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: \(errnoText())") }
        var tv = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let r = try withSocketAddress(host: "127.0.0.1", port: redis.port) { _, sa, len in Glibc.connect(fd, sa, len) }
        guard r == 0 else { let e = errno; close(fd); throw HarnessError("connect to Redis: \(errnoText(e))") }
        var command = Array("*\(channels.count + 1)\r\n$9\r\nSUBSCRIBE\r\n".utf8)
        for c in channels { command += Array("$\(c.utf8.count)\r\n\(c)\r\n".utf8) }
        _ = command.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    deinit { close(fd) }

    /// One RESP value's bulk strings if a whole array is buffered (nil: not yet).
    private func parseArray() -> [[UInt8]]? {
        var i = 0
        func line() -> String? {
            guard let end = input[i...].firstIndex(of: 0x0A) else { return nil }
            let s = String(decoding: input[i..<end], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            i = end + 1
            return s
        }
        guard let head = line(), head.first == "*", let n = Int(head.dropFirst()) else { return nil }
        var parts: [[UInt8]] = []
        for _ in 0..<n {
            guard let h = line() else { return nil }
            if h.first == ":" { parts.append(Array(h.dropFirst().utf8)); continue }
            guard h.first == "$", let length = Int(h.dropFirst()), input.count >= i + length + 2 else { return nil }
            parts.append(Array(input[i..<(i + length)]))
            i += length + 2
        }
        input.removeFirst(i)
        return parts
    }

    /// The payloads of the messages pushed within `timeout` (subscription confirmations skipped).
    func messages(timeout: Duration = .milliseconds(500)) -> [(channel: String, payload: [UInt8])] {
        var out: [(channel: String, payload: [UInt8])] = []
        let deadline = monotonicMs() + timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000
        var buffer = [UInt8](repeating: 0, count: 65536)
        while monotonicMs() < deadline {
            while let parts = parseArray() {
                if parts.count == 3, parts[0] == Array("message".utf8) { out.append((String(decoding: parts[1], as: UTF8.self), parts[2])) }
            }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n > 0 { input += buffer[0..<n] }
        }
        return out
    }
}

@Suite("Cluster: the sender's sub", .serialized)
struct ClusterSubIntegrationTests {
    static let apiKey = "k-0123456789abcdef"

    /// `[auth]` with the test keys, the API, a short `cluster.timeout`.
    static func settings(_ dir: TempDirectory, timeout: String = "1s") throws -> [String: String] {
        let keys = try dir.write("api.keys", "\(apiKey)\n")
        chmod(keys, 0o600)
        let authKeys = try TestKeys.writeKeyFile(dir, TestKeys.fileText)
        return ["auth.key_file": authKeys, "api.listen": "127.0.0.1:0", "api.key_file": keys, "cluster.timeout": timeout]
    }

    @Test("a member on daemon B appears in A's room listing with its sub and its daemon, once both read version 2")
    func remoteMemberListedWithSub() throws {
        let redis = try RedisServer()
        let dir = try TempDirectory()
        let settings = try Self.settings(dir)
        let a = try clusterDaemon(redis, name: "sub", settings)
        let b = try clusterDaemon(redis, name: "sub", settings)
        for d in [a, b] {
            #expect(d.stderr.wait(forLineWith: ["REASON=cluster_envelope_v2"], timeout: .seconds(10)), "\(d.stderr.current)")
        }
        let onA = try a.connect(), onB = try b.connect(), anon = try b.connect()
        let t = try mintTokens([TestKeys.hs(["sub": "u-a", "exp": TestKeys.now + 3600, "rooms": ["stage"]]),
                                TestKeys.hs(["sub": "u-b", "name": "bea", "exp": TestKeys.now + 3600, "rooms": ["stage"]])])
        try onA.send(Wire.join(user("u-a", room: "stage", token: t[0])))
        #expect(redis.waitForSubscribers("roomcast:sub:room:stage", 1))
        try onB.send(Wire.join(user("bea", room: "stage", token: t[1])))
        try anon.send(Wire.join(user("guest", room: "stage")))
        #expect(redis.waitForSubscribers("roomcast:sub:room:stage", 2))
        let api = try APITestClient(port: try #require(a.apiPort))
        var body = ""
        let listed = waitUntil(.seconds(10)) {
            body = api.request("GET", "/v1/rooms/stage")?.body ?? ""
            return body.contains(#""name": "bea", "sub": "u-b", "addr": "\#(onB.address)""#)
                && body.contains(#""name": "guest", "sub": null, "addr": "\#(anon.address)""#)
        }
        #expect(listed, "\(body)")
        #expect(body.contains(#""members": [{"id": "#) && body.contains(#""sub": "u-a""#), "A's own member as before: \(body)")
        #expect(body.contains(#""remote_next_cursor": null"#), "\(body)")
        // The daemon named is B's origin.
        let line = b.stderr.current.split(separator: "\n").first { $0.contains("cluster: origin ") }.map(String.init) ?? ""
        let origin = try #require(line.range(of: "cluster: origin ").map { String(line[$0.upperBound...].prefix(16)) })
        #expect(body.contains(#""daemon": "\#(origin)""#), "\(origin): \(body)")
        // Paged: one at a time, the cursor carried.
        let first = try #require(api.request("GET", "/v1/rooms/stage?limit=1")?.body)
        #expect(first.components(separatedBy: #""daemon""#).count == 2, "\(first)")
        #expect(!first.contains(#""remote_next_cursor": null"#), "\(first)")
        // B leaves: A's listing loses it.
        onB.hangUp()
        #expect(waitUntil(.seconds(10)) { api.request("GET", "/v1/rooms/stage")?.body.contains("u-b") == false })
    }

    @Test("with a daemon of the release before in the cluster, frames go out in version 1, which it reads; once it is gone, in version 2")
    func oldDaemonKeepsVersionOne() throws {
        let redis = try RedisServer()
        let dir = try TempDirectory()
        let t = try mintTokens([TestKeys.hs(["sub": "u-a", "exp": TestKeys.now + 3600, "rooms": ["stage"]])])
        // cluster.timeout 3 s: the old daemon's heartbeats below come far more often, however loaded the machine.
        let a = try clusterDaemon(redis, name: "mixed", try Self.settings(dir, timeout: "3s"))
        // The old daemon: heartbeats with no advertisement, a member in the room, its subscriber on the room.
        let old = try RedisPublisher(redis)
        let oldOrigin: UInt64 = 0x0123_4567_89ab_cdef
        let daemons = Array("roomcast:mixed:daemons".utf8), roomChannel = Array("roomcast:mixed:room:stage".utf8)
        func oldHeartbeat(_ seq: UInt64) throws {
            var hb: [UInt8] = []
            ClusterEnvelope.encode(kind: .heartbeat, origin: oldOrigin, stream: 0, seq: seq, room: RoomName(bytes: []), address: "",
                                   frame: UnsafeRawBufferPointer(start: nil, count: 0), into: &hb)
            try old.publish(daemons, hb)
        }
        try oldHeartbeat(1)
        let sub = try RedisSubscriber(redis, ["roomcast:mixed:room:stage"])
        let onA = try a.connect()
        try onA.send(Wire.join(user("u-a", room: "stage", token: t[0])))
        #expect(redis.waitForSubscribers("roomcast:mixed:room:stage", 2))
        _ = onA.receiveFrames(1, timeout: .seconds(2))
        // The old daemon's own member speaks in version 1: A delivers it.
        var fromOld: [UInt8] = []
        let oldText = Wire.text(Wire.user("olga"), "from the old release")
        oldText.withUnsafeBytes {
            ClusterEnvelope.encode(kind: .littleEndianFrame, origin: oldOrigin, stream: 1, seq: 1, room: "stage", address: "192.0.2.1:7",
                                   frame: $0, into: &fromOld)
        }
        try old.publish(roomChannel, fromOld)
        #expect(onA.receiveFrame()?.wire == oldText, "a version 1 frame from the old daemon reaches A's member")
        // It came after the old heartbeat on the same Redis connection: A has heard the old daemon.
        let mark = a.stderr.current.count
        _ = sub.messages(timeout: .milliseconds(300))
        // Past cluster.timeout, heard all along: A still sends version 1, and the old decoder reads every frame.
        var seq: UInt64 = 2
        let until = monotonicMs() + 4_000
        var texts: [[UInt8]] = []
        while monotonicMs() < until {
            try oldHeartbeat(seq)
            seq += 1
            let text = Wire.text(Wire.user("u-a"), "v1 \(seq)")
            try onA.send(text)
            texts.append(text)
            pause(.milliseconds(200))
        }
        let got = sub.messages(timeout: .seconds(1)).map(\.payload)
        let decoded = got.compactMap { try? ReleasedDecoder.decode($0).get() }
        #expect(decoded.count == got.count, "\(decoded.count) of \(got.count) read by the old decoder")
        #expect(decoded.map(\.frame) == texts, "A's frames, each in version 1")
        #expect(!a.stderr.current.dropFirst(mark).contains("REASON=cluster_envelope_v2"), "A did not switch while the old daemon was heard")
        // The old daemon stops (silent for cluster.timeout): A switches to version 2.
        #expect(a.stderr.wait(forLineWith: ["REASON=cluster_daemon_gone", "0123456789abcdef"], timeout: .seconds(10)))
        #expect(a.stderr.wait(forLineWith: ["REASON=cluster_envelope_v2"], timeout: .seconds(10)))
        let after = Wire.text(Wire.user("u-a"), "now with my sub")
        try onA.send(after)
        let v2 = try #require(sub.messages(timeout: .seconds(2)).map(\.payload).first { $0.count > 0 && $0[0] == 2 })
        try v2.withUnsafeBytes { p in
            let v = try ClusterEnvelope.decode(p).get()
            #expect(Array(v.sub) == Array("u-a".utf8) && Array(v.frame) == after)
        }
        if case .failure(let why) = ReleasedDecoder.decode(v2) { #expect(why == .unknownVersion(2)) } else { Issue.record("an old decoder would read it") }
    }

    @Test("a frame in version 2 from a sub muted here is held back; another sub's and a version 1 frame are delivered")
    func mutedSubHeldBack() throws {
        let redis = try RedisServer()
        let dir = try TempDirectory()
        let a = try clusterDaemon(redis, name: "mute", try Self.settings(dir))
        let onA = try a.connect()
        try onA.send(Wire.join(user("guest", room: "stage")))
        #expect(redis.waitForSubscribers("roomcast:mute:room:stage", 1))
        _ = onA.receiveFrames(1, timeout: .seconds(2))
        let api = try APITestClient(port: try #require(a.apiPort))
        #expect(api.request("PUT", "/v1/rooms/stage/mutes/u-m", body: #"{"seconds": 600}"#)?.status == 200)
        let other = try RedisPublisher(redis)
        let channel = Array("roomcast:mute:room:stage".utf8)
        var seq: UInt64 = 0
        func publish(_ frame: [UInt8], sub: String?) throws {
            seq += 1
            var e: [UInt8] = []
            frame.withUnsafeBytes {
                ClusterEnvelope.encode(kind: .littleEndianFrame, origin: 77, stream: 1, seq: seq, room: "stage", address: "192.0.2.9:1",
                                       sub: sub, frame: $0, into: &e)
            }
            try other.publish(channel, e)
        }
        let muted = Wire.text(Wire.user("mona"), "muted"), fine = Wire.text(Wire.user("otto"), "fine")
        let legacy = Wire.text(Wire.user("mona"), "no sub known")
        let join = Wire.join(Wire.user("mona", room: "stage"))
        try publish(join, sub: "u-m")
        try publish(muted, sub: "u-m")
        try publish(fine, sub: "u-o")
        try publish(legacy, sub: nil)
        let got = onA.receiveFrames(3, timeout: .seconds(5)).map(\.wire)
        #expect(got == [join, fine, legacy], "\(got.count) frames")
        #expect(a.stderr.wait(forLineWith: ["REASON=cluster_moderated", "USER_SUB=u-m"]))
    }
}
