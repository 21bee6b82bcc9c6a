// A restart that keeps the clients keeps a proxied client's address, the one
// its PROXY header gave (docs/protocol/proxy.md §14), not the proxy's: in-process,
// with HandOverTests' two servers and fake fd store.
import Glibc
import Testing
@testable import RoomcastCore
import RoomcastIO
@testable import RoomcastServer

@Suite("PROXY protocol across a hand-over")
struct ProxyHandOverTests {
    @Test("a proxied client keeps the header's address, its room and its per-IP count across a restart")
    func proxiedAddressCarriesOver() throws {
        let sections = "proxy_protocol = yes\nproxy_from = 127.0.0.1\nmax_clients_per_ip = 1\n" + HandOverTests.config
        let clock = HandOverTests.ManualClock()
        let a = try HandOverTests.Node(sections, clock: clock)
        let listen = a.server.listeners.all[0].address
        let port = try #require(UInt16(listen[listen.index(after: listen.lastIndex(of: ":")!)...]))
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        let r = try withSocketAddress(host: "127.0.0.1", port: port) { _, sa, len in connect(fd, sa, len) }
        try #require(r == 0)
        HandOverTests.send(fd, Array("PROXY TCP4 203.0.113.9 127.0.0.1 4444 9898\r\n".utf8) + HandOverTests.join("alice", room: "r1"))
        for _ in 0..<200 where a.server.relay.memberCount(of: "r1") < 1 {
            try a.tick()
            usleep(5_000)
        }
        try #require(a.server.table.count == 1)
        #expect(a.server.table.address(of: a.server.table.ids[0]) == "203.0.113.9:4444")

        let b = try HandOverTests.handOver(a, sections: sections)
        let s = b.server
        #expect(s.table.count == 1)
        let id = try #require(s.table.ids.first)
        #expect(s.table.address(of: id) == "203.0.113.9:4444", "the restored address is the header's, not 127.0.0.1")
        #expect(s.relay.memberCount(of: "r1") == 1 && s.relay.name(of: id) == "alice")
        #expect(s.table.perIP["203.0.113.9"] == 1 && s.table.perIP["127.0.0.1"] == nil)
        // The client goes on after the restart without a second header.
        _ = HandOverTests.drain(fd)
        HandOverTests.send(fd, HandOverTests.join("alice2", room: "r1"))
        for _ in 0..<200 where s.relay.name(of: id) != "alice2" {
            try b.tick()
            usleep(5_000)
        }
        #expect(s.relay.name(of: id) == "alice2")
    }
}
