import Testing
@testable import RoomcastCore
@testable import roomcast_bench

/// The load generator's own pieces (BENCHMARKS.md): bodies of exactly the
/// requested size that carry publisher, sequence and time where receivers
/// look for them, and a histogram whose percentiles are within its error.
@Suite struct BenchGeneratorTests {
    static func options(_ args: [String]) throws -> roomcast_bench.Options {
        try roomcast_bench.Options.parse(args)
    }

    @Test(arguments: [64, 100, 127, 128, 129, 200, 1000, 16384])
    func textBodiesHaveTheExactSizeAndAreValidChatMessages(size: Int) throws {
        let wire = roomcast_bench.Wire(try Self.options(["--body", "text", "--size", String(size)]))
        let body = wire.bodyTemplate(publisher: 7)
        #expect(body.count == size)
        let message = try ChatMessage(protobuf: body)
        #expect(message.text.utf8.count == size - wire.payloadOffset)
        // The payload (8 hex publisher, 16 sequence, 16 time) starts the text.
        body.withUnsafeBytes { raw in
            #expect(loadHex(raw.baseAddress! + wire.payloadOffset, digits: 8) == 7)
        }
    }

    @Test func opaqueFramesCarrySequenceAndTimeLittleEndian() throws {
        let wire = roomcast_bench.Wire(try Self.options(["--size", "64"]))
        let (bytes, at) = wire.dataTemplate(publisher: 3, channel: "bench")
        #expect(bytes.count == FrameCodec.headerSize + 64)
        guard case .frame(let type, let length) = bytes.withUnsafeBytes({
            FrameCodec.parse($0, byteOrder: .little, maxFrameBytes: 1 << 20)
        }) else { Issue.record("not a frame"); return }
        #expect(type == 100 && length == 64)
        bytes.withUnsafeBytes { raw in
            #expect(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt32.self)) == 3)
        }
    }

    @Test func redisPublishIsAValidRESPCommand() throws {
        let wire = roomcast_bench.Wire(try Self.options(["--target", "redis", "--size", "20"]))
        let (bytes, at) = wire.dataTemplate(publisher: 0, channel: "room")
        let prefix = "*3\r\n$7\r\nPUBLISH\r\n$4\r\nroom\r\n$20\r\n"
        #expect(Array(bytes.prefix(prefix.utf8.count)) == Array(prefix.utf8))
        #expect(at == prefix.utf8.count)
        #expect(Array(bytes.suffix(2)) == Array("\r\n".utf8))
        #expect(bytes.count == prefix.utf8.count + 20 + 2)
    }

    @Test func hexRoundTrip() {
        var buffer = [UInt8](repeating: 0, count: 16)
        var rng = SystemRandomNumberGenerator()
        let samples: [UInt64] = [0, 1, 0xdead_beef, .max, 1_234_567_890_123, 0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210]
            + (0..<1000).map { _ in rng.next() }
        for v in samples {
            buffer.withUnsafeMutableBytes { storeHex(v, digits: 16, at: $0.baseAddress!) }
            #expect(buffer.withUnsafeBytes { loadHex($0.baseAddress!, digits: 16) } == v)
            // The eight-at-a-time decoder against the digit-by-digit one.
            #expect(buffer.withUnsafeBytes { loadHex($0.baseAddress!, digits: 8) } == v >> 32)
            #expect(buffer.withUnsafeBytes { loadHex($0.baseAddress! + 4, digits: 12) } == v & 0xFFFF_FFFF_FFFF)
        }
    }

    @Test func histogramPercentilesAreWithinTwoPercent() {
        var h = roomcast_bench.Histogram()
        defer { h.release() }
        for v in 1...100_000 { h.record(UInt64(v) * 1000) }   // 1 us ... 100 ms
        for (p, exact) in [(0.5, 50_000_000.0), (0.9, 90_000_000.0), (0.99, 99_000_000.0)] {
            let got = Double(h.percentile(p))
            #expect(abs(got - exact) / exact < 0.02, "p\(p): \(got) vs \(exact)")
        }
        #expect(h.maxValue == 100_000_000)
        #expect(h.total == 100_000)
    }

    @Test func modesSetTheIssueWorkloadsAndOptionsOverrideThem() throws {
        let fanout = try Self.options(["--mode", "fanout"])
        #expect(fanout.members == 1_000 && fanout.publishers == 1 && fanout.size == 64 && fanout.closedLoop)
        let latency = try Self.options(["--members", "10", "--mode", "latency"])
        #expect(latency.members == 10 && latency.rate == 200)
        let idle = try Self.options(["--idle", "--connections", "100"])
        #expect(idle.mode == .idle && idle.connections == 100)
        #expect(throws: roomcast_bench.Options.UsageError.self) { try Self.options(["--host", "10.0.0.1"]) }
        #expect(throws: roomcast_bench.Options.UsageError.self) { try Self.options(["--members", "19000", "--connections", "1000"]) }
    }

    /// The independent generator's workloads: closed loop with a window of 64 and
    /// validated text bodies for every load workload (BENCHMARKS.md,
    /// "Loopback"); the old definitions stay one option away.
    @Test func loadModesUseAWindowOf64AndValidatedBodies() throws {
        for (mode, members, publishers, size) in [("fanout", 1_000, 1, 64), ("pub10", 100, 10, 64), ("large", 100, 1, 16_384)] {
            let o = try Self.options(["--mode", mode])
            #expect(o.members == members && o.publishers == publishers && o.size == size, "\(mode)")
            #expect(o.closedLoop && o.window == 64 && o.body == .text, "\(mode)")
        }
        #expect(try Self.options(["--mode", "latency"]).body == .text)
        let old = try Self.options(["--mode", "large", "--window", "16", "--body", "opaque"])
        #expect(old.window == 16 && old.body == .opaque && old.size == 16_384)
        let named = try Self.options(["--mode", "fanout", "--server", "relay"])
        #expect(named.server == "relay" && named.target == .roomcast)
    }
}
