// The pass's shared batch, one region per form (Fanout.swift): an LTB frame,
// its JSON form, its WebSocket binary and text messages each lie in their
// own region, so every member of a mixed room holds one range for all of a
// pass's frames of its room, and gets them in order, byte for byte, over a
// socket or a TLS session. Without the event loop, as OutputPathTests.
import COpenSSL
import Glibc
import Testing
@testable import RoomcastCore
@testable import RoomcastServer

@Suite struct BatchRegionTests {
    /// How a member of the test's room takes frames.
    enum Member: CaseIterable {
        case ltb, json, webSocketLTB, webSocketJSON, tlsLTB, tlsWebSocketLTB, tlsJSON
        var tls: Bool { self == .tlsLTB || self == .tlsWebSocketLTB || self == .tlsJSON }
        var dialect: Dialect {
            switch self {
            case .ltb, .tlsLTB: .ltb
            case .json, .tlsJSON: .json
            case .webSocketLTB, .webSocketJSON, .tlsWebSocketLTB: .webSocket
            }
        }
        var webSocketForm: WebSocketSubprotocol? {
            switch self {
            case .webSocketLTB, .tlsWebSocketLTB: .ltb
            case .webSocketJSON: .json
            default: nil
            }
        }
    }

    /// A connection table whose connections are socketpairs, some of them
    /// TLS sessions (the daemon's end made from a `TLSContext`, the peer's
    /// an OpenSSL client), handshaken before the test starts.
    final class Room {
        let table: ConnectionTable
        let members: [Member]
        var ours: [Int32] = [], peers: [Int32] = []
        /// The peer's TLS session of each member (nil: plain).
        var clients: [OpaquePointer?] = []
        let certs: TestCertificates
        let context: TLSContext
        let clientContext: OpaquePointer

        /// `clientSuites`: the TLS 1.3 suites the clients offer (OpenSSL's default when nil).
        init(_ members: [Member], hard: Int = 64 << 20, clientSuites: String? = nil) throws {
            self.members = members
            table = ConnectionTable(fanout: Fanout(outputHardBytes: hard, relaySettings: RelaySettings()))
            certs = try TestCertificates()
            var settings = Config.TLS()
            settings.certFile = certs.cert
            settings.keyFile = certs.key
            context = try TLSContext(settings)
            clientContext = try #require(SSL_CTX_new(TLS_client_method()))
            if let clientSuites { try #require(SSL_CTX_set_ciphersuites(clientContext, clientSuites) == 1) }
            for (i, m) in members.enumerated() {
                var sv: [Int32] = [0, 0]
                #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue), 0, &sv) == 0)
                #expect(table.add(fd: sv[0], dialect: m.dialect, address: "127.0.0.1:\(1000 + i)") == i)
                table.fanout.outboxes[i].webSocketForm = m.webSocketForm
                ours.append(sv[0])
                peers.append(sv[1])
                clients.append(nil)
                if m.tls { try handshake(i) }
            }
        }

        /// One more TLS LTB connection (after the members), handshaken.
        /// - Returns: the client's session (freed with the room).
        func addTLSMember() throws -> OpaquePointer {
            var sv: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue), 0, &sv) == 0)
            let i = table.add(fd: sv[0], dialect: .ltb, address: "127.0.0.1:\(1000 + ours.count)")
            ours.append(sv[0])
            peers.append(sv[1])
            clients.append(nil)
            return try handshake(i)
        }

        /// A TLS session between our end of `i` and an OpenSSL client on its
        /// peer (both freed with the room, whatever happens).
        /// - Returns: the client's session.
        @discardableResult
        private func handshake(_ i: Int) throws -> OpaquePointer {
            let server = try #require(SSL_new(context.ctx))
            table.fanout.outboxes[i].tls = server
            SSL_set_fd(server, ours[i])
            SSL_set_accept_state(server)
            let client = try #require(SSL_new(clientContext))
            clients[i] = client
            SSL_set_fd(client, peers[i])
            SSL_set_connect_state(client)
            var done = (server: false, client: false)
            for _ in 0..<100 where !(done.server && done.client) {
                if !done.client { done.client = SSL_do_handshake(client) == 1 }
                if !done.server { done.server = SSL_do_handshake(server) == 1 }
            }
            try #require(done.server && done.client, "the TLS handshake of member \(i) completed")
            return client
        }

        /// Everything the peer of `i` can read now (through its TLS session if it has one).
        func drain(_ i: Int) -> [UInt8] {
            guard let ssl = clients[i] else { return OutputPathTests.drain(peers[i]) }
            var out: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            while true {
                let n = buffer.withUnsafeMutableBytes { SSL_read(ssl, $0.baseAddress, Int32($0.count)) }
                if n <= 0 { return out }
                out += buffer[0..<Int(n)]
            }
        }

        /// End-of-pass flushes, then the reads of `readers`, repeated (as
        /// EPOLLOUT would bring them) until nothing is owed to an open member.
        /// - Returns: what each member's peer read, by member index.
        func flushUntilDrained(readers: Set<Int>? = nil) -> [[UInt8]] {
            let ids = Array(members.indices)
            var got = [[UInt8]](repeating: [], count: ids.count)
            for _ in 0..<2_000 {
                for id in ids { _ = table.fanout.write(id, keepCapacity: 0) }
                table.fanout.endPass()
                for id in ids where readers?.contains(id) ?? true { got[id] += drain(id) }
                if ids.allSatisfy({ table.fanout.outboxes[$0].pending == 0 || table.state($0) == .closing }) { break }
            }
            return got
        }

        /// The bytes member `m` must read for `frames` from `sender`: its form of each, in order.
        func expected(_ frames: [[UInt8]], for m: Member, sender: Int) -> [UInt8] {
            frames.flatMap { f -> [UInt8] in
                let json = f.withUnsafeBytes { JSONDialect.translate($0, settings: RelaySettings(), senderAddress: table.address(of: sender)) }!
                switch m {
                case .ltb, .tlsLTB: return f
                case .json, .tlsJSON: return json
                case .webSocketLTB, .tlsWebSocketLTB: return WebSocketFrameEncoder.encode(.binary, payload: f)
                case .webSocketJSON: return WebSocketFrameEncoder.encode(.text, payload: Array(json[JSONFrameCodec.headerSize...]))
                }
            }
        }

        deinit {
            for (i, c) in clients.enumerated() {
                if let c { SSL_free(c) }
                if let s = table.fanout.outboxes[i].tls { SSL_free(s) }
            }
            SSL_CTX_free(clientContext)
            for id in ours.indices { table.remove(id) }
            (ours + peers).forEach { close($0) }
        }
    }

    /// `count` chat frames of `textBytes` characters each, numbered.
    static func chat(_ count: Int, textBytes: Int = 40) -> [[UInt8]] {
        let s = RelaySettings()
        return (0..<count).map { i in
            let text = String(i) + ":" + String(repeating: Character(UnicodeScalar(UInt8(97 + i % 26))), count: max(0, textBytes - 8))
            return FrameCodec.encode(type: s.textType, body: ChatMessage(user: UserInfo(level: 1, name: "ann", iconURL: ""), text: text).serialized(),
                                     byteOrder: s.byteOrder)
        }
    }

    @Test("one pass to a room of LTB, JSON, WebSocket (ltb, json) and TLS members: each member holds one range of its form's region, nothing is copied, every frame arrives in order, byte for byte")
    func mixedRoomGetsOneRangePerMember() throws {
        let room = try Room(Member.allCases + [.ltb])
        let sender = room.members.count - 1  // an LTB member, not echoed
        let everyone = Array(room.members.indices)
        let frames = Self.chat(20)
        for f in frames {
            #expect(f.withUnsafeBytes { room.table.fanout.broadcast($0, from: sender, to: everyone, except: sender) } == everyone.count - 1)
        }
        for (i, m) in room.members.enumerated() where i != sender {
            #expect(room.table.fanout.outboxes[i].queue.count == 0, "\(m): its frames are adjacent in its region, no copy")
            #expect(room.table.fanout.outboxes[i].batchForm == Self.form(m))
        }
        let ltb = frames.reduce(0) { $0 + $1.count }
        #expect(room.table.fanout.batch(.ltb).count == ltb, "the LTB form once per frame, whatever the recipients")
        let got = room.flushUntilDrained()
        for (i, m) in room.members.enumerated() where i != sender {
            #expect(got[i] == room.expected(frames, for: m, sender: sender), "\(m): every frame, in order, byte for byte")
        }
        #expect(got[sender].isEmpty)
        for form in BatchForm.allCases { #expect(room.table.fanout.batch(form).count == 0, "\(form) emptied at the end of the pass") }
    }

    static func form(_ m: Member) -> BatchForm {
        switch m {
        case .ltb, .tlsLTB: .ltb
        case .json, .tlsJSON: .json
        case .webSocketLTB, .tlsWebSocketLTB: .webSocketBinary
        case .webSocketJSON: .webSocketText
        }
    }

    @Test("two rooms of mixed members interleaved in one pass: each member gets its own room's frames only, in order, in its form")
    func interleavedMixedRooms() throws {
        let room = try Room(Member.allCases + Member.allCases)
        let n = Member.allCases.count
        let a = Array(0..<n), b = Array(n..<2 * n)
        let fa = Self.chat(12, textBytes: 30), fb = Self.chat(12, textBytes: 300)
        for i in 0..<12 {
            _ = fa[i].withUnsafeBytes { room.table.fanout.broadcast($0, from: a[0], to: a, except: a[0]) }
            _ = fb[i].withUnsafeBytes { room.table.fanout.broadcast($0, from: b[0], to: b, except: b[0]) }
        }
        let got = room.flushUntilDrained()
        for (i, m) in room.members.enumerated() where i != a[0] && i != b[0] {
            let want = i < n ? room.expected(fa, for: m, sender: a[0]) : room.expected(fb, for: m, sender: b[0])
            #expect(got[i] == want, "member \(i) (\(m)): its room's frames, in order")
        }
    }

    @Test("a pass larger than the batch's retained capacity (300 x 16 KiB per form) reaches every form's member whole and in order; the regions give the excess back")
    func largePassCrossesTheBatchCapacity() throws {
        let room = try Room([.ltb, .ltb, .json, .webSocketLTB, .webSocketJSON, .tlsLTB, .tlsWebSocketLTB])
        let everyone = Array(room.members.indices)
        let frames = Self.chat(300, textBytes: 16 << 10)
        for f in frames { _ = f.withUnsafeBytes { room.table.fanout.broadcast($0, from: 0, to: everyone, except: 0) } }
        #expect(room.table.fanout.batch(.ltb).count > Fanout.retainedBatchBytes, "the pass holds more than the batch keeps")
        for i in everyone.dropFirst() { #expect(room.table.fanout.outboxes[i].queue.count == 0, "member \(i): one range") }
        let got = room.flushUntilDrained()
        #expect(room.table.closeList.isEmpty)
        for (i, m) in room.members.enumerated().dropFirst() {
            let want = room.expected(frames, for: m, sender: 0)
            #expect(got[i].count == want.count && got[i] == want, "member \(i) (\(m)): \(got[i].count) of \(want.count) bytes, in order")
        }
        for form in BatchForm.allCases {
            #expect(room.table.fanout.batch(form).capacity <= Fanout.retainedBatchBytes, "\(form): capacity over the retained size is given back")
        }
    }

    @Test("slow consumers in a mixed room (a WebSocket and a TLS member that never read) are cut at output_hard_bytes; every member that reads gets every frame")
    func slowConsumersInAMixedRoom() throws {
        let hard = 64 << 10
        let members: [Member] = [.ltb, .ltb, .json, .webSocketLTB, .webSocketJSON, .tlsLTB, .webSocketLTB, .tlsLTB]
        let slow: Set<Int> = [6, 7]
        let room = try Room(members, hard: hard)
        for fd in room.ours { OutputPathTests.setSendBuffer(fd, 4096) }
        let everyone = Array(members.indices)
        let frames = Self.chat(120, textBytes: 2000)
        var got = [[UInt8]](repeating: [], count: members.count)
        for f in frames {
            _ = f.withUnsafeBytes { room.table.fanout.broadcast($0, from: 0, to: everyone, except: 0) }
            for id in everyone { _ = room.table.fanout.write(id, keepCapacity: 0) }
            room.table.fanout.endPass()
            for id in everyone where !slow.contains(id) { got[id] += room.drain(id) }
        }
        let rest = room.flushUntilDrained(readers: Set(everyone).subtracting(slow))
        for id in everyone { got[id] += rest[id] }
        for id in slow {
            #expect(room.table.state(id) == .closing, "member \(id) (\(members[id])) never read: cut")
            #expect(room.table.slots[id]?.closeReason?.warning == "output_hard_limit")
        }
        for id in everyone.dropFirst() where !slow.contains(id) {
            #expect(room.table.state(id) == .open, "member \(id) (\(members[id])) reads: untouched")
            #expect(got[id] == room.expected(frames, for: members[id], sender: 0), "member \(id) (\(members[id])): every frame, in order")
        }
    }

    @Test("bytes for one WebSocket member alone (a pong) between two frames keep its order and leave the other members' ranges whole")
    func unicastKeepsOrderAndOthersRanges() throws {
        let room = try Room([.ltb, .webSocketLTB, .webSocketLTB])
        let frames = Self.chat(2)
        let pong = WebSocketFrameEncoder.encode(.pong, payload: [1, 2, 3])
        _ = frames[0].withUnsafeBytes { room.table.fanout.broadcast($0, from: 0, to: [0, 1, 2], except: 0) }
        room.table.fanout.unicast(pong, to: 1)
        _ = frames[1].withUnsafeBytes { room.table.fanout.broadcast($0, from: 0, to: [0, 1, 2], except: 0) }
        #expect(room.table.fanout.outboxes[2].queue.count == 0, "the pong did not come between member 2's frames")
        #expect(room.table.fanout.batch(.webSocketBinary).count == frames.reduce(0) { $0 + $1.count + 2 }, "each frame's binary form once")
        let got = room.flushUntilDrained()
        let binary = frames.map { WebSocketFrameEncoder.encode(.binary, payload: $0) }
        #expect(got[1] == binary[0] + pong + binary[1], "frame, pong, frame")
        #expect(got[2] == binary[0] + binary[1])
    }
}
