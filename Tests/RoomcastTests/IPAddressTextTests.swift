// The core's own IPv4/IPv6 text parser and printer against glibc's
// inet_pton(3) and inet_ntop(3), the reference they must match exactly.
import Glibc
import Testing
@testable import RoomcastCore

@Suite struct IPAddressTextTests {
    static func glibcParse(_ text: String, v6: Bool) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 16)
        guard inet_pton(v6 ? AF_INET6 : AF_INET, text, &buffer) == 1 else { return nil }
        return v6 ? buffer : Array(buffer[0..<4])
    }

    static func glibcFormat(_ bytes: [UInt8]) -> String {
        var out = [CChar](repeating: 0, count: 64)
        _ = bytes.withUnsafeBytes { inet_ntop(bytes.count == 16 ? AF_INET6 : AF_INET, $0.baseAddress, &out, 64) }
        return String(cString: out)
    }

    static let samples = [
        "", "0.0.0.0", "127.0.0.1", "255.255.255.255", "256.1.1.1", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1.02.3.4", "0.0.0.00",
        "1..2.3", ".1.2.3", "1.2.3.", " 1.2.3.4", "1.2.3.4 ", "1.2.3.-4", "1.2.3.4a", "999.1.1.1", "00.0.0.0",
        "::", "::1", "1::", "::ffff:1.2.3.4", "::1.2.3.4", "::ffff:0:0", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9",
        "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1::8", "2001:db8::1", "2001:DB8:0:0:0:0:0:1", "fe80::1%eth0", ":::",
        "1:::2", ":1::2", "1::2:", "1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:7:1.2.3.4", "::12345", "::0000", "::00000",
        "0:0:0:0:0:0:0:0", "0:0:1:0:0:0:1:0", "1:0:0:2:0:0:0:3", "1:0:0:2:0:0:3:0", "::ffff:1.2.3", "::1.2.3.4.5",
        "abcd:ef01:2345:6789:abcd:ef01:2345:6789", "g::1", "1:2:3:4:5:6:7", "::a.b.c.d", "::1.2.3.04", "[::1]",
        "1::2::3", "ffff::ffff:1.2.3.4", "0:0:0:0:0:ffff:102:304", "0:0:0:0:0:0:102:304",
    ]

    @Test("parsing matches inet_pton on fixed samples, both families")
    func parseMatchesGlibc() {
        for text in Self.samples {
            #expect(IPAddressText.parseIPv4(text) == Self.glibcParse(text, v6: false), "IPv4 \(text)")
            #expect(IPAddressText.parseIPv6(text) == Self.glibcParse(text, v6: true), "IPv6 \(text)")
        }
    }

    @Test("printing matches inet_ntop on fixed and random addresses with runs of zeros")
    func formatMatchesGlibc() {
        var rng = SystemRandomNumberGenerator()
        var cases: [[UInt8]] = Self.samples.compactMap { Self.glibcParse($0, v6: true) }
        for _ in 0..<5_000 {
            // Mostly zero groups, so that every shape of zero runs appears.
            var bytes: [UInt8] = []
            for _ in 0..<8 {
                let word: UInt16 = Int.random(in: 0..<3, using: &rng) == 0 ? UInt16.random(in: 0...0xFFFF, using: &rng)
                    : Bool.random(using: &rng) ? 0 : 0xFFFF
                bytes += [UInt8(word >> 8), UInt8(word & 0xFF)]
            }
            cases.append(bytes)
        }
        for bytes in cases {
            let ours = IPAddressText.formatIPv6(bytes)
            #expect(ours == Self.glibcFormat(bytes), "\(bytes)")
            #expect(IPAddressText.parseIPv6(ours) == bytes, "round trip of \(ours)")
        }
        for _ in 0..<1_000 {
            let bytes = (0..<4).map { _ in UInt8.random(in: 0...255, using: &rng) }
            #expect(IPAddressText.formatIPv4(bytes) == Self.glibcFormat(bytes))
        }
    }

    @Test("random strings over the address alphabet parse as inet_pton parses them")
    func randomStringsMatchGlibc() {
        var rng = SystemRandomNumberGenerator()
        let alphabet = Array("0123456789abcdefABCDEFg:.x ".utf8)
        for _ in 0..<20_000 {
            let n = Int.random(in: 0...20, using: &rng)
            let text = String(decoding: (0..<n).map { _ in alphabet.randomElement(using: &rng)! }, as: UTF8.self)
            #expect(IPAddressText.parseIPv4(text) == Self.glibcParse(text, v6: false), "IPv4 \(text)")
            #expect(IPAddressText.parseIPv6(text) == Self.glibcParse(text, v6: true), "IPv6 \(text)")
        }
    }
}
