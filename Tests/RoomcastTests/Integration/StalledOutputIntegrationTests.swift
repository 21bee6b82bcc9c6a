// Issue 11, item 1: a busy systemd, a journald that does not read its socket
// or a stderr nobody reads must not freeze the rooms. Each test stalls one
// reader, measures a text relayed every 100 ms and a newcomer accepted every
// second while it is stalled, then lets it read again and checks what arrives.
// The stall lasts 4 s (10 s under ROOMCAST_SLOW_TESTS=1, as `make test` runs).
import Foundation
import Glibc
import RoomcastCore
import Testing

/// How long each test keeps its reader stalled, in seconds.
private let stallSeconds = slowTestsEnabled ? 10 : 4

/// What `probeRelay` saw.
struct RelayProbe: CustomStringConvertible {
    var sent = 0
    var received = 0
    /// Between consecutive arrivals at the receiver, from the start of the
    /// window to its end (a frozen loop shows as one long gap), in ms.
    var gapsMs: [Int64] = []
    /// From each newcomer's connect(2) to the first text it got, in ms;
    /// `nil` for a newcomer that got nothing within 2 s.
    var acceptMs: [Int64?] = []

    var maxGapMs: Int64 { gapsMs.max() ?? 0 }
    var description: String {
        "\(received)/\(sent) texts, longest gap \(maxGapMs) ms, newcomers served after (ms): "
            + acceptMs.map { $0.map(String.init) ?? "never" }.joined(separator: " ")
    }
}

/// For `seconds`: `a` sends a text every 100 ms and `b` (in the same room)
/// receives them; every second a newcomer connects without waiting for the
/// accept, must receive a text within 2 s (proof that it was accepted and
/// put in the room), and closes.
func probeRelay(_ d: Daemon, from a: TestClient, to b: TestClient, seconds: Int) throws -> RelayProbe {
    var probe = RelayProbe()
    let user = Wire.user("prober")
    let start = monotonicMs()
    var last = start
    var newcomer: (client: TestClient, since: Int64)?
    for tick in 0..<(seconds * 10) {
        let tickStart = start + Int64(tick) * 100
        if tick % 10 == 0 && newcomer == nil {
            newcomer = (try TestClient(host: d.host, port: d.port, owner: d), monotonicMs())
        }
        try a.send(Wire.text(user, "tick \(tick)"))
        probe.sent += 1
        // Take what arrives at `b` until the next tick.
        while case let left = tickStart + 100 - monotonicMs(), left > 0 {
            guard let f = b.receiveFrame(timeout: .milliseconds(Int(left))) else { break }
            guard f.type == Wire.text else { continue }
            let now = monotonicMs()
            probe.received += 1
            probe.gapsMs.append(now - last)
            last = now
        }
        if let (c, since) = newcomer {
            var served = false
            while !served, let f = c.receiveFrame(timeout: .milliseconds(1)) { served = f.type == Wire.text }
            if served {
                probe.acceptMs.append(monotonicMs() - since)
                newcomer = nil
            } else if monotonicMs() - since > 2_000 {
                probe.acceptMs.append(nil)
                newcomer = nil
            }
        }
    }
    probe.gapsMs.append(monotonicMs() - last)
    if ProcessInfo.processInfo.environment["ROOMCAST_TEST_FIGURES"] != nil { print("probe: \(probe)") }
    return probe
}

@Suite("A stalled systemd, journald or stderr does not freeze the rooms (issue 11)", .serialized)
struct StalledOutputIntegrationTests {
    @Test("NOTIFY_SOCKET stops being read after READY=1: relaying and accepting go on; the newest STATUS and WATCHDOG=1 arrive once it is read")
    func busySystemd() throws {
        let d = try Daemon(environment: ["WATCHDOG_USEC": "300000"])
        _ = try #require(d.notify.wait(for: "READY=1"))
        let a = try d.connect(), b = try d.connect()
        d.notify.pauseReading()
        defer { d.notify.resumeReading() }  // else the old daemon's STOPPING=1 would hang the teardown
        let probe = try probeRelay(d, from: a, to: b, seconds: stallSeconds)
        #expect(probe.maxGapMs <= 500, "\(probe)")
        #expect(probe.received >= probe.sent - 2, "\(probe)")
        #expect(!probe.acceptMs.isEmpty && probe.acceptMs.allSatisfy { $0 != nil && $0! <= 1_000 }, "\(probe)")

        // The newest STATUS is the one with no client: it must be what arrives
        // once PID 1 reads again, with the ping that was missed.
        a.reset()
        b.reset()
        #expect(d.stderr.wait(forLineWith: ["client disconnected", "CLIENT_ADDR=\(b.address) "]))
        pause(.milliseconds(1_200))  // STATUS= follows a change in the count within a second
        let resumed = d.notify.all.count
        d.notify.resumeReading()
        let newest = d.notify.wait(from: resumed, timeout: .seconds(3)) { $0.hasPrefix("STATUS=0 clients,") }
        #expect(newest != nil, "no STATUS=0 clients after reading again: \(d.notify.all.dropFirst(resumed).map(\.lines))")
        #expect(d.notify.wait(for: "WATCHDOG=1", from: resumed, timeout: .seconds(2)) != nil)
        // Pings are back to their rhythm (every 100 ms).
        pause(.milliseconds(1_000))
        let recent = d.notify.all.filter { $0.lines.contains("WATCHDOG=1") && $0.atMs >= monotonicMs() - 600 }
        #expect(recent.count >= 3, "\(recent.count) WATCHDOG=1 in the last 600 ms")
    }
}
