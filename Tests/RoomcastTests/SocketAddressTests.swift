// SocketAddress (RoomcastIO): Unix-domain addresses as unix(7) lays them out,
// the one form every AF_UNIX bind and connect of the daemon, the Redis link
// and `roomcast admin` use.
import Glibc
import Testing
import RoomcastIO

@Suite("SocketAddress: Unix-domain addresses (unix(7))")
struct SocketAddressTests {
    @Test("a path: the family, the bytes and one NUL; bind and connect take it; text is unix:PATH")
    func pathAddress() throws {
        let path = "/tmp/roomcast-sa-\(getpid()).sock"
        unlink(path)
        defer { unlink(path) }
        let a = try #require(SocketAddress.unix(path: path))
        #expect(a.family == AF_UNIX)
        #expect(a.bytes.count == MemoryLayout<sa_family_t>.size + path.utf8.count + 1)
        #expect(a.bytes.last == 0)
        #expect(a.text == "unix:" + path)
        let server = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0), client = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(server); close(client) }
        #expect(a.withSockaddr { bind(server, $0, $1) } == 0, "bind: \(String(cString: strerror(errno)))")
        #expect(listen(server, 1) == 0)
        #expect(a.withSockaddr { connect(client, $0, $1) } == 0, "connect: \(String(cString: strerror(errno)))")
    }

    @Test("an abstract name (@NAME): a leading NUL, no terminator; text keeps the @")
    func abstractAddress() throws {
        let name = "@roomcast-sa-\(getpid())"
        let a = try #require(SocketAddress.unix(path: name))
        #expect(a.bytes.count == MemoryLayout<sa_family_t>.size + name.utf8.count)
        #expect(a.bytes[MemoryLayout<sa_family_t>.size] == 0)
        #expect(a.text == "unix:" + name)
        let server = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        defer { close(server) }
        #expect(a.withSockaddr { bind(server, $0, $1) } == 0)
        #expect(SocketAddress.of(server) == nil, "of(_:) reads IPv4 and IPv6 only")
    }

    @Test("what does not fit sun_path (108 bytes) is refused, never cut short; an empty path too")
    func tooLong() {
        #expect(SocketAddress.unix(path: "/" + String(repeating: "a", count: 106)) != nil, "107 bytes and the NUL fit")
        #expect(SocketAddress.unix(path: "/" + String(repeating: "a", count: 107)) == nil, "108 bytes leave no room for the NUL")
        #expect(SocketAddress.unix(path: "@" + String(repeating: "a", count: 107)) != nil, "an abstract name needs no NUL")
        #expect(SocketAddress.unix(path: "") == nil)
    }
}
