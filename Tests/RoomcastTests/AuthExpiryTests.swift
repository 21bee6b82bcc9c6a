// The expiry index of signed joins (Auth/AuthGate.swift, issue 28 item 2):
// one entry per connection holding a session, replaced on renewal, dropped
// when the connection is released. Time is injected: nothing sleeps.
import Testing
@testable import RoomcastServer

@Suite("AuthGate expiries: one per connection")
struct AuthExpiryTests {
    @Test("entries == live connections after joins, renewals and leaves; the last deadline is the one that fires")
    func countFollowsConnections() {
        var gate = AuthGate()
        var live: Set<Int> = []
        var rng = SystemRandomNumberGenerator()
        let start: UInt64 = 1_000_000
        for step in 0..<20_000 {
            let id = Int.random(in: 0..<300, using: &rng)
            if live.contains(id), Bool.random(using: &rng) {
                gate.forget(id)  // the connection went
                live.remove(id)
            } else {
                gate.schedule(id, deadlineMs: start + 600_000 + UInt64(step))  // a join, or a renewal
                live.insert(id)
            }
            #expect(gate.sessionCount == live.count)
        }
        #expect(gate.sessionCount == live.count)
        // Nothing is due before its deadline; then each live one once.
        #expect(gate.due(now: start + 500_000).isEmpty)
        let fired = gate.due(now: start + 700_000)
        #expect(Set(fired) == live && fired.count == live.count)
        #expect(gate.sessionCount == 0)
    }

    @Test("a renewal replaces the deadline: only the new one fires, once")
    func renewalReplaces() {
        var gate = AuthGate()
        gate.schedule(7, deadlineMs: 10_000)
        gate.schedule(7, deadlineMs: 50_000)
        #expect(gate.sessionCount == 1)
        #expect(gate.due(now: 20_000).isEmpty)
        #expect(gate.due(now: 50_000 + AuthGate.wheelTickMs) == [7])
        #expect(gate.due(now: 100_000).isEmpty)
    }

    @Test("a forgotten connection never fires, and its reused slot keeps only the new session's deadline")
    func forgottenNeverFires() {
        var gate = AuthGate()
        gate.schedule(3, deadlineMs: 10_000)
        gate.forget(3)
        gate.forget(3)
        #expect(gate.sessionCount == 0)
        #expect(gate.due(now: 20_000).isEmpty)
        gate.schedule(3, deadlineMs: 30_000)
        #expect(gate.due(now: 29_000).isEmpty)
        #expect(gate.due(now: 31_000) == [3])
    }
}
