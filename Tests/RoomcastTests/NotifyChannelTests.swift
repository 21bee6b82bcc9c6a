// Notifications to a PID 1 that is not reading : never blocking,
// merged while they wait, nothing that matters lost or reordered.
import Glibc
import RoomcastIO
@testable import RoomcastServer
import Testing

@Suite("NotifyChannel: a full notify socket never blocks; pending notifications are merged")
struct NotifyChannelTests {
    /// Every datagram `add`s produce, in sending order.
    static func datagrams(_ states: [String]) -> [String] {
        var p = PendingNotifications()
        for s in states { p.add(s) }
        var out: [String] = []
        while let d = p.next {
            out.append(d)
            p.removeNext()
        }
        #expect(p.isEmpty)
        return out
    }

    @Test("STATUS=: the newest line only; WATCHDOG=1: one ping")
    func statusAndWatchdogMerge() {
        #expect(Self.datagrams(["WATCHDOG=1", "STATUS=a", "WATCHDOG=1", "STATUS=b", "WATCHDOG=1"]) == ["STATUS=b\nWATCHDOG=1"])
        #expect(Self.datagrams(["STATUS=a"]) == ["STATUS=a"])
        #expect(Self.datagrams([]) == [])
    }

    @Test("READY, RELOADING (with its MONOTONIC_USEC) and STOPPING keep their order, one datagram each; STATUS and WATCHDOG ride on the last")
    func lifecycleOrderKept() {
        let sent = Self.datagrams(["READY=1\nSTATUS=s0", "WATCHDOG=1", "RELOADING=1\nMONOTONIC_USEC=5", "STATUS=s1",
                                   "READY=1\nSTATUS=s2", "STOPPING=1\nSTATUS=s3"])
        #expect(sent == ["READY=1", "RELOADING=1\nMONOTONIC_USEC=5", "READY=1", "STOPPING=1\nSTATUS=s3\nWATCHDOG=1"])
        // A failure's ERRNO= stays with what it came with.
        #expect(Self.datagrams(["STATUS=failed: x\nERRNO=22"]) == ["ERRNO=22\nSTATUS=failed: x"])
    }

    @Test("a reload that completed while PID 1 was not reading is dropped when a newer one starts; an unfinished one is not")
    func supersededReloadDropped() {
        let sent = Self.datagrams(["READY=1", "RELOADING=1\nMONOTONIC_USEC=1", "READY=1", "RELOADING=1\nMONOTONIC_USEC=2", "READY=1",
                                   "RELOADING=1\nMONOTONIC_USEC=3", "READY=1"])
        #expect(sent == ["READY=1", "RELOADING=1\nMONOTONIC_USEC=3", "READY=1"])
        #expect(Self.datagrams(["RELOADING=1\nMONOTONIC_USEC=1", "RELOADING=1\nMONOTONIC_USEC=2"])
                == ["RELOADING=1\nMONOTONIC_USEC=1", "RELOADING=1\nMONOTONIC_USEC=2"])
        var p = PendingNotifications()
        for i in 0..<100 { p.add("STOPPING=1\nX=\(i)") }
        #expect(p.ordered.count == PendingNotifications.maxOrdered, "bounded")
    }

    @Test("a socket nobody reads: notify returns at once; once it is read, what was owed arrives merged and in order",
          arguments: ["path", "abstract"])
    func fullSocket(kind: String) throws {
        let name = "/tmp/roomcast-notify-\(getpid())-\(kind)"
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_CLOEXEC.rawValue | SOCK_NONBLOCK.rawValue), 0)
        defer { close(fd); unlink(name) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(name.utf8)
        if kind == "abstract" { bytes[0] = 0 }
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: bytes) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (kind == "abstract" ? 0 : 1))
        let r = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        try #require(r == 0, "bind: \(String(cString: strerror(errno)))")
        let channel = try #require(NotifyChannel(address: kind == "abstract" ? "@" + name.dropFirst() : name))

        let start = monotonicMilliseconds()
        channel.notify("READY=1\nSTATUS=starting")
        for i in 0..<200 {
            channel.notify("WATCHDOG=1")
            channel.notify("STATUS=\(i) clients")
        }
        channel.notify("STOPPING=1")
        channel.notify("STATUS=stopping")
        #expect(monotonicMilliseconds() - start < 1_000, "notify never waits")
        #expect(channel.hasPending, "the socket's queue (max_dgram_qlen) is full")

        func drain() -> [String] {
            var got: [String] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while case let n = buffer.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, 0) }), n > 0 {
                got.append(String(decoding: buffer[0..<n], as: UTF8.self))
            }
            return got
        }
        var got = drain()
        channel.flush()
        got += drain()
        #expect(!channel.hasPending)
        #expect(got.first == "READY=1\nSTATUS=starting")
        #expect(got.last == "STOPPING=1\nSTATUS=stopping\nWATCHDOG=1", "the newest STATUS and the ping missed: \(got.suffix(3))")
        #expect(got.count < 100, "merged while waiting: \(got.count) datagrams for 403 notifications")
    }
}
