import Testing
@testable import RoomcastCore
@testable import roomcast_bench

/// roomcast-bench's API publishers (`--api-port`, bench/publish.sh): the
/// request the daemon reads, the answers the generator reads back, and the
/// daemon's own count it checks its figures against.
@Suite struct BenchAPITests {
    static func options(_ args: [String]) throws -> roomcast_bench.Options {
        try roomcast_bench.Options.parse(args)
    }

    static let apiArgs = ["--mode", "publish", "--api-port", "9899", "--api-key-file", "/nonexistent"]

    /// The request as the daemon's own reader takes it, stamped as the engine stamps it.
    static func daemonReads(_ r: APIPublishRequest, seq: UInt64, time: UInt64) throws -> (HTTPRequest, [UInt8]) {
        var bytes = r.bytes
        bytes.withUnsafeMutableBytes { raw in
            storeHex(seq, digits: 16, at: raw.baseAddress! + r.sequenceAt)
            storeHex(time, digits: 16, at: raw.baseAddress! + r.timeAt)
            if let k = r.keySequenceAt { storeHex(seq, digits: 16, at: raw.baseAddress! + k) }
        }
        var reader = HTTPRequestReader()
        guard case .request(let request, let body, let consumed, let keepAlive) = bytes.withUnsafeBytes({ reader.next($0) }) else {
            throw BenchTestError("the daemon's reader did not take the request as one whole request")
        }
        #expect(consumed == bytes.count && keepAlive)
        return (request, Array(bytes[body]))
    }

    struct BenchTestError: Error, CustomStringConvertible {
        var description: String
        init(_ d: String) { description = d }
    }

    /// The daemon makes the publish's JSON a ChatMessage (APIRoutes.swift):
    /// it must be the LTB publishers' body byte for byte, sequence and time
    /// where members read them, so one parser serves both runs.
    @Test(arguments: [64, 100, 200])
    func publishRequestBecomesTheLTBBodyWithSequenceAndTime(size: Int) throws {
        let o = try Self.options(Self.apiArgs + ["--size", String(size), "--room", "live 42"])
        let wire = roomcast_bench.Wire(o)
        let r = APIPublishRequest(wire: wire, publisher: 3, room: o.room, key: "k0123456789abcdef", idempotency: false, run: 1)
        let (request, body) = try Self.daemonReads(r, seq: 0x1234_5678_9abc_def0, time: 42)
        #expect(request.method == "POST")
        #expect(request.path == "/v1/rooms/live%2042/publish")
        #expect(request.value("authorization") == "Bearer k0123456789abcdef")
        #expect(request.value("idempotency-key") == nil)
        let json = try parseJSON(body)
        guard case .string(let text)? = json["text"], case .object? = json["user"],
              case .string(let name)? = json["user"]?["name"], case .number(let level)? = json["user"]?["level"] else {
            Issue.record("not a text publish: \(String(decoding: body, as: UTF8.self))")
            return
        }
        #expect(json["type"] == .string("text"))
        let frameBody = ChatMessage(user: UserInfo(level: Int32(level), name: name, iconURL: ""), text: text).serialized()
        #expect(frameBody.count == size)
        var template = wire.bodyTemplate(publisher: 3)
        template.withUnsafeMutableBytes { raw in
            storeHex(0x1234_5678_9abc_def0, digits: 16, at: raw.baseAddress! + wire.payloadOffset + 8)
            storeHex(42, digits: 16, at: raw.baseAddress! + wire.payloadOffset + 24)
        }
        #expect(frameBody == template)
        frameBody.withUnsafeBytes { raw in
            let p = raw.baseAddress! + wire.payloadOffset
            #expect(loadHex(p, digits: 8) == 3)
            #expect(loadHex(p + 8, digits: 16) == 0x1234_5678_9abc_def0)
            #expect(loadHex(p + 24, digits: 16) == 42)
        }
    }

    /// A repeated key is not relayed again (docs/api.md): every request's key
    /// is its own, across publishers, sequences and runs. The keys of a second
    /// run against the same daemon were once the first run's: its first
    /// publishes were answered from the cache and never relayed (the bench
    /// saw it as 94,000 lost deliveries).
    @Test func idempotencyKeysDifferPerPublisherSequenceAndRun() throws {
        let o = try Self.options(Self.apiArgs + ["--idempotency"])
        let wire = roomcast_bench.Wire(o)
        func request(_ publisher: Int, run: UInt64) -> APIPublishRequest {
            APIPublishRequest(wire: wire, publisher: publisher, room: "bench", key: "k0123456789abcdef", idempotency: true, run: run)
        }
        let keys = try [(request(0, run: 1), 0), (request(0, run: 1), 1), (request(1, run: 1), 0), (request(1, run: 1), 1),
                        (request(0, run: 2), 0), (request(0, run: 2), 1)].map { r, seq in
            try Self.daemonReads(r, seq: UInt64(seq), time: 7).0.value("idempotency-key") ?? ""
        }
        #expect(Set(keys).count == keys.count && keys.allSatisfy { !$0.isEmpty && $0.utf8.count <= 255 })
        #expect(keys[1] == "bench-0000000000000001-00000000-0000000000000001")
    }

    @Test func answersAreIncompleteUntilWholeThenPipelined() {
        let one = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 18\r\n\r\n{\"delivered\": 50}\n"
        let two = Array((one + "HTTP/1.1 422 Unprocessable Content\r\ncontent-length: 3\r\n\r\nabc").utf8)
        let first = one.utf8.count
        for cut in 0..<first {
            #expect(two[0..<cut].withUnsafeBytes { HTTPAnswer.parse($0) } == .incomplete, "cut at \(cut)")
        }
        let whole = two.withUnsafeBytes { HTTPAnswer.parse($0) }
        #expect(whole == .answer(status: 200, bodyAt: first - 18, bodyLength: 18, end: first))
        #expect(two[(first - 18)..<first].withUnsafeBytes { deliveredCount($0) } == 50)
        let next = two[first...].withUnsafeBytes { HTTPAnswer.parse($0) }
        guard case .answer(let status, _, let length, let end) = next else { Issue.record("\(next)"); return }
        #expect(status == 422 && length == 3 && end == two.count - first)
    }

    @Test func answersThisClientCannotReadAreMalformed() {
        func parse(_ s: String) -> HTTPAnswer { Array(s.utf8).withUnsafeBytes { HTTPAnswer.parse($0) } }
        guard case .malformed = parse("SSH-2.0-OpenSSH\r\n\r\n") else { Issue.record("not HTTP taken"); return }
        guard case .malformed = parse("HTTP/1.1 200 OK\r\n\r\n") else { Issue.record("no Content-Length taken"); return }
        guard case .malformed = parse("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n") else { Issue.record("negative length taken"); return }
        #expect(parse("HTTP/1.1 204 No Content\r\n\r\n") == .answer(status: 204, bodyAt: 27, bodyLength: 0, end: 27))
        let endless = "HTTP/1.1 200 OK\r\n" + String(repeating: "X-A: b\r\n", count: 2000)
        guard case .malformed = parse(endless) else { Issue.record("an endless head is not refused"); return }
    }

    @Test func deliveredCountReadsOnlyThePublishAnswer() {
        func count(_ s: String) -> Int? { Array(s.utf8).withUnsafeBytes { deliveredCount($0) } }
        #expect(count("{\"delivered\": 1000}\n") == 1000)
        #expect(count("{\"delivered\":0}") == 0)
        #expect(count("{\"error\": \"bad_publish\", \"message\": \"type\"}\n") == nil)
        #expect(count("{\"delivered\": \"x\"}") == nil)
    }

    @Test func prometheusSampleTakesTheExactSeries() {
        let text = """
            # HELP roomcast_frames_delivered_total Frames queued for a recipient, by type.
            # TYPE roomcast_frames_delivered_total counter
            roomcast_frames_delivered_total{type="join"} 999
            roomcast_frames_delivered_total{type="textual"} 5
            roomcast_frames_delivered_total{type="text"} 123456789
            roomcast_frames_delivered_total{type="gift"} 7
            """
        #expect(prometheusSample(text, series: APIProbe.series) == 123_456_789)
        #expect(prometheusSample(text, series: "roomcast_frames_delivered_total{type=\"gift\"}") == 7)
        #expect(prometheusSample(text, series: "roomcast_frames_received_total{type=\"text\"}") == nil)
        #expect(prometheusSample("roomcast_frames_delivered_total{type=\"text\"} NaN", series: APIProbe.series) == nil)
    }

    @Test func keyFileGivesItsFirstKey() {
        #expect(firstAPIKey("# backend keys\n\n  bench-key-0123456789abcdef  \nsecond-key-0123456789\n") == "bench-key-0123456789abcdef")
        #expect(firstAPIKey("# only a comment\n") == nil)
    }

    @Test func publishModeNeedsTheAPIAndAClosedLoopOfText() throws {
        let o = try Self.options(Self.apiArgs)
        #expect(o.api && o.members == 1_000 && o.publishers == 1 && o.body == .text && o.closedLoop && !o.idempotency)
        let four = try Self.options(Self.apiArgs + ["--publishers", "4", "--members", "50"])
        #expect(four.publishers == 4 && four.members == 50)
        for bad in [["--mode", "publish"],
                    ["--mode", "publish", "--api-port", "9899"],
                    Self.apiArgs + ["--rate", "100"],
                    Self.apiArgs + ["--body", "opaque"],
                    ["--mode", "fanout", "--idempotency"]] {
            #expect(throws: roomcast_bench.Options.UsageError.self, "\(bad)") { try Self.options(bad) }
        }
    }
}
