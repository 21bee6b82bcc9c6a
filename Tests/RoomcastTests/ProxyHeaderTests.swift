// The PROXY protocol header parser and `proxy_from` prefixes (docs/protocol/proxy.md §14;
// HAProxy's proxy-protocol.txt, whose examples the cases follow).
import RoomcastCore
import Testing

private func ascii(_ s: String) -> [UInt8] { Array(s.utf8) }

/// A v2 header: signature, version/command, family, length, then `body`.
private func v2(_ versionCommand: UInt8, _ family: UInt8, _ body: [UInt8], length: Int? = nil) -> [UInt8] {
    let n = length ?? body.count
    return ProxyHeader.v2Signature + [versionCommand, family, UInt8(n >> 8), UInt8(n & 0xFF)] + body
}

/// Every proper prefix of `header` asks for more.
private func expectPrefixesNeedMore(_ header: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
    for n in 0..<header.count {
        #expect(ProxyHeader.parse(Array(header[0..<n])) == .needMore, "prefix of \(n) bytes", sourceLocation: sourceLocation)
    }
}

@Suite struct ProxyHeaderV1Tests {
    @Test func tcp4WorstCaseFromTheSpecification() throws {
        let line = ascii("PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n")
        #expect(line.count == 56)  // the specification's worst case for TCP4
        let step = ProxyHeader.parse(line + ascii("after"))
        guard case .header(let h) = step else { Issue.record("\(step)"); return }
        #expect(h.version == 1 && h.length == 56)
        #expect(h.source == .init(ip: [255, 255, 255, 255], port: 65535))
        #expect(h.source?.text == "255.255.255.255:65535")
        expectPrefixesNeedMore(line)
    }

    @Test func tcp6WorstCaseFromTheSpecification() throws {
        let ip = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        let line = ascii("PROXY TCP6 \(ip) \(ip) 65535 65535\r\n")
        #expect(line.count == 104)
        guard case .header(let h) = ProxyHeader.parse(line) else { Issue.record("not a header"); return }
        #expect(h.source?.text == "[\(ip)]:65535" && h.length == 104)
        let short = ProxyHeader.parse(ascii("PROXY TCP6 2001:db8::7 ::1 51234 9898\r\n"))
        guard case .header(let s) = short else { Issue.record("\(short)"); return }
        #expect(s.source?.text == "[2001:db8::7]:51234" && s.destination?.text == "[::1]:9898")
    }

    @Test func unknownKeepsTheProxysAddressAndMayCarryAnything() {
        #expect(ProxyHeader.parse(ascii("PROXY UNKNOWN\r\n")) == .header(.init(version: 1, source: nil, destination: nil, length: 15)))
        // The 107-byte worst case of the specification.
        let ip = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        let longest = ascii("PROXY UNKNOWN \(ip) \(ip) 65535 65535\r\n")
        #expect(longest.count == 107)
        #expect(ProxyHeader.parse(longest) == .header(.init(version: 1, source: nil, destination: nil, length: 107)))
    }

    @Test func aLineOver107BytesIsRefused() {
        let ip = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        let tooLong = ascii("PROXY UNKNOWN \(ip) \(ip) 65535 655350\r\n")  // 108 bytes
        #expect(ProxyHeader.parse(tooLong) == .invalid(.v1TooLong))
        #expect(ProxyHeader.parse(ascii("PROXY TCP4 " + String(repeating: "1", count: 120))) == .invalid(.v1TooLong))
        // 106 bytes without CR: could still end at 107.
        #expect(ProxyHeader.parse(ascii("PROXY UNKNOWN " + String(repeating: "x", count: 92))) == .needMore)
    }

    @Test(arguments: [
        ("PROXY TCP4 1.2.3.4 5.6.7.8 80a 9898\r\n", ProxyHeader.Failure.v1BadPort),
        ("PROXY TCP4 1.2.3.4 5.6.7.8 080 9898\r\n", .v1BadPort),
        ("PROXY TCP4 1.2.3.4 5.6.7.8 65536 9898\r\n", .v1BadPort),
        ("PROXY TCP4 1.2.3.4 5.6.7.8 -1 9898\r\n", .v1BadPort),
        ("PROXY TCP4 1.2.3.4 5.6.7.8 80 \r\n", .v1BadPort),
        ("PROXY TCP4 1.2.3.4  5.6.7.8 80 9898\r\n", .v1BadFields),
        ("PROXY TCP4 1.2.3.4 5.6.7.8 80 9898 x\r\n", .v1BadFields),
        ("PROXY TCP4 1.2.3.4 5.6.7.8 80 9898\n", .v1BadFields),
        ("PROXY TCP4 1.2.3.4 5.6.7.8 80 9898\rX", .v1BadFields),
        ("PROXY TCP4 ::1 5.6.7.8 80 9898\r\n", .v1BadAddress),
        ("PROXY TCP6 1.2.3.4 ::1 80 9898\r\n", .v1BadAddress),
        ("PROXY TCP4 1.2.3.256 5.6.7.8 80 9898\r\n", .v1BadAddress),
        ("PROXY UDP4 1.2.3.4 5.6.7.8 80 9898\r\n", .v1BadProtocol),
        ("PROXY tcp4 1.2.3.4 5.6.7.8 80 9898\r\n", .v1BadProtocol),
        ("PROXY\r\n", .badSignature),
        ("PROXX TCP4", .badSignature),
        ("GET / HTTP/1.1\r\n", .badSignature),
    ])
    func malformedLinesAreRefused(_ line: String, _ failure: ProxyHeader.Failure) {
        #expect(ProxyHeader.parse(ascii(line)) == .invalid(failure))
    }

    @Test func anLTBFrameIsNotAHeader() {
        #expect(ProxyHeader.parse([0x05, 0x00, 0x00, 0x00]) == .invalid(.badSignature))
        #expect(ProxyHeader.parse([]) == .needMore)
    }
}

@Suite struct ProxyHeaderV2Tests {
    @Test func proxyOverTCP4() {
        let header = v2(0x21, 0x11, [192, 0, 2, 7, 198, 51, 100, 1, 0xC8, 0x22, 0x26, 0xAA])
        guard case .header(let h) = ProxyHeader.parse(header + [0x05, 0, 0, 0]) else { Issue.record("not a header"); return }
        #expect(h.version == 2 && h.length == 28)
        #expect(h.source?.text == "192.0.2.7:51234" && h.destination?.text == "198.51.100.1:9898")
        expectPrefixesNeedMore(header)
    }

    @Test func proxyOverTCP6WithTLVsSkipped() {
        var body = [UInt8](repeating: 0, count: 36)
        body[0] = 0x20; body[1] = 0x01; body[2] = 0x0d; body[3] = 0xb8; body[15] = 7  // 2001:db8::7
        body[31] = 1  // ::1
        body[32] = 0x01; body[33] = 0xBB; body[34] = 0x26; body[35] = 0xAA
        let tlvs: [UInt8] = [0x01, 0x00, 0x02, 0x68, 0x32, 0x04, 0x00, 0x01, 0x00]  // ALPN "h2", NOOP
        let header = v2(0x21, 0x21, body + tlvs)
        guard case .header(let h) = ProxyHeader.parse(header + ascii("{}")) else { Issue.record("not a header"); return }
        #expect(h.length == 16 + 36 + tlvs.count)
        #expect(h.source?.text == "[2001:db8::7]:443" && h.destination?.text == "[::1]:9898")
        expectPrefixesNeedMore(header)
    }

    @Test func localKeepsTheProxysAddress() {
        // HAProxy's health check: LOCAL, UNSPEC, no addresses.
        #expect(ProxyHeader.parse(v2(0x20, 0x00, [])) == .header(.init(version: 2, source: nil, destination: nil, length: 16)))
        // LOCAL with addresses: they are discarded.
        let local = v2(0x20, 0x11, [1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2])
        #expect(ProxyHeader.parse(local) == .header(.init(version: 2, source: nil, destination: nil, length: 28)))
        // UNSPEC and UNIX with PROXY: no address the daemon can use.
        #expect(ProxyHeader.parse(v2(0x21, 0x00, [])) == .header(.init(version: 2, source: nil, destination: nil, length: 16)))
        let unix = v2(0x21, 0x31, [UInt8](repeating: 0, count: 216))
        #expect(ProxyHeader.parse(unix) == .header(.init(version: 2, source: nil, destination: nil, length: 232)))
    }

    @Test func strictAboutVersionCommandFamilyAndLength() {
        #expect(ProxyHeader.parse(v2(0x11, 0x11, [])) == .invalid(.v2BadVersion(1)))
        #expect(ProxyHeader.parse(v2(0x31, 0x11, [])) == .invalid(.v2BadVersion(3)))
        #expect(ProxyHeader.parse(v2(0x22, 0x11, [])) == .invalid(.v2BadCommand(2)))
        #expect(ProxyHeader.parse(v2(0x21, 0x41, [])) == .invalid(.v2BadFamily(0x41)))
        #expect(ProxyHeader.parse(v2(0x21, 0x13, [])) == .invalid(.v2BadFamily(0x13)))
        #expect(ProxyHeader.parse(v2(0x21, 0x12, [UInt8](repeating: 0, count: 12))) == .invalid(.v2BadFamily(0x12)))
        #expect(ProxyHeader.parse(v2(0x21, 0x11, [1, 2, 3, 4, 5, 6, 7, 8])) == .invalid(.v2BadLength(8)))
        #expect(ProxyHeader.parse(v2(0x21, 0x21, [UInt8](repeating: 0, count: 12))) == .invalid(.v2BadLength(12)))
        // A damaged signature is refused as soon as the bad byte is seen.
        var bad = ProxyHeader.v2Signature
        bad[7] = 0x50
        #expect(ProxyHeader.parse(Array(bad[0..<8])) == .invalid(.badSignature))
        // The version is checked before the rest arrives.
        #expect(ProxyHeader.parse(ProxyHeader.v2Signature + [0x10]) == .invalid(.v2BadVersion(1)))
    }

    @Test func aLongLengthWaitsForItsBytes() {
        let header = v2(0x21, 0x11, [1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2], length: 65535)
        #expect(ProxyHeader.parse(header) == .needMore)
        let full = header + [UInt8](repeating: 0, count: 65535 - 12)
        guard case .header(let h) = ProxyHeader.parse(full) else { Issue.record("not a header"); return }
        #expect(h.length == 16 + 65535 && h.source?.text == "1.2.3.4:1")
    }
}

@Suite struct IPPrefixTests {
    @Test func parsesAndMatches() throws {
        let p = try #require(IPPrefix("10.0.0.0/8"))
        #expect(p.contains([10, 255, 1, 2]) && !p.contains([11, 0, 0, 1]))
        #expect(p.description == "10.0.0.0/8")
        let host = try #require(IPPrefix("127.0.0.1"))
        #expect(host.bits == 32 && host.contains([127, 0, 0, 1]) && !host.contains([127, 0, 0, 2]))
        let v6 = try #require(IPPrefix("fd00::/8"))
        #expect(v6.contains(IPAddressText.parseIPv6("fd12::1")!) && !v6.contains(IPAddressText.parseIPv6("fe80::1")!))
        #expect(try #require(IPPrefix("[::1]")).contains(IPAddressText.parseIPv6("::1")!))
        #expect(try #require(IPPrefix("0.0.0.0/0")).contains([8, 8, 8, 8]))
        #expect(try #require(IPPrefix("::/0")).contains(IPAddressText.parseIPv6("2001:db8::1")!))
        #expect(!v6.contains([10, 0, 0, 1]) && !p.contains(IPAddressText.parseIPv6("fd00::1")!))
        // 172.16.0.0/12: a boundary inside a byte.
        let odd = try #require(IPPrefix("172.16.0.0/12"))
        #expect(odd.contains([172, 31, 255, 255]) && !odd.contains([172, 32, 0, 0]))
    }

    @Test func anIPv4MappedPeerMatchesIPv4Prefixes() throws {
        let p = try #require(IPPrefix("127.0.0.0/8"))
        #expect(p.contains(IPAddressText.parseIPv6("::ffff:127.0.0.3")!))
        #expect(!p.contains(IPAddressText.parseIPv6("::127.0.0.3")!))
    }

    @Test(arguments: ["", "10.0.0.1/8", "10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/08", "10.0.0.0/+8",
                      "host.example", "10.0.0", "1.2.3.4/8/8", "fd00::1/8"])
    func refuses(_ text: String) {
        #expect(IPPrefix(text) == nil)
    }
}

@Suite struct ProxyConfigTests {
    @Test func bothSectionsTakeTheKeys() throws {
        let c = try Config.parse("""
            [server]
            proxy_protocol = yes
            proxy_from = 127.0.0.1, 10.0.0.0/8 ,fd00::/8
            [json]
            proxy_protocol = on
            proxy_from = ::1
            """, file: "t.conf")
        #expect(c.server.proxy.enabled && c.json.proxy.enabled)
        #expect(c.server.proxy.from.map(\.description) == ["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"])
        #expect(c.json.proxy.from.map(\.description) == ["::1/128"])
        #expect(c.server.proxy.allows([10, 1, 2, 3]) && !c.json.proxy.allows([10, 1, 2, 3]))
        #expect(Config.defaults.server.proxy == .off && Config.defaults.json.proxy == .off)
    }

    @Test func yesWithoutProxyFromIsRefusedAtItsLine() {
        for section in ["server", "json"] {
            do {
                _ = try Config.parse("[\(section)]\n# comment\nproxy_protocol = yes\n", file: "t.conf")
                Issue.record("accepted proxy_protocol without proxy_from in [\(section)]")
            } catch {
                #expect(error.file == "t.conf" && error.line == 3)
                #expect(error.reason.contains("\(section).proxy_protocol = yes needs \(section).proxy_from"))
            }
        }
        // Listing proxies without turning it on is fine (nothing to check).
        #expect((try? Config.parse("[server]\nproxy_from = 127.0.0.1\n", file: "t.conf")) != nil)
    }

    @Test(arguments: ["10.0.0.1/8", "127.0.0.1,,10.0.0.0/8", "example.com", "127.0.0.1,"])
    func badProxyFromIsRefused(_ value: String) {
        do {
            _ = try Config.parse("[server]\nproxy_from = \(value)\n", file: "t.conf")
            Issue.record("accepted proxy_from = \(value)")
        } catch {
            #expect(error.line == 2 && error.reason.hasPrefix("server.proxy_from: "))
        }
    }
}
