/// The PROXY protocol header a proxy or load balancer sends before the
/// client's own bytes, versions 1 (text) and 2 (binary), as HAProxy's
/// specification defines it ("The PROXY protocol", proxy-protocol.txt,
/// shipped in the haproxy package's documentation). Pure logic: it peeks at
/// the start of a byte stream and says how many bytes the header takes.
///
/// Strict: a header that is not exactly what the specification allows is an
/// error (a bad signature, a v1 line over 107 bytes or with a non-numeric
/// port, an unknown version or command, a v2 length too short for its
/// address family). TLVs after the v2 addresses are skipped.
public enum ProxyHeader {
    /// The v2 signature (proxy-protocol.txt §2.2): `\r\n\r\n\0\r\nQUIT\n`, 12 bytes.
    public static let v2Signature: [UInt8] = [0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A]
    /// The longest v1 line, `\r\n` included, in bytes (proxy-protocol.txt §2.1).
    public static let v1MaxBytes = 107
    /// The v2 fixed part: signature, version/command, family/protocol, length (bytes).
    public static let v2FixedBytes = 16

    /// An address and port from the header.
    public struct Endpoint: Equatable, Sendable {
        /// 4 bytes (IPv4) or 16 bytes (IPv6), network order.
        public var ip: [UInt8]
        public var port: UInt16

        public init(ip: [UInt8], port: UInt16) {
            self.ip = ip
            self.port = port
        }

        /// `1.2.3.4:P` or `[::1]:P`, as the daemon prints peer addresses
        /// (inet_ntop(3) text).
        public var text: String {
            ip.count == 4 ? "\(IPAddressText.formatIPv4(ip)):\(port)" : "[\(IPAddressText.formatIPv6(ip))]:\(port)"
        }
    }

    /// A complete, valid header.
    public struct Header: Equatable, Sendable {
        /// 1 or 2.
        public var version: Int
        /// The client (source) and the address it connected to (destination);
        /// nil for the v2 LOCAL command, v1 `UNKNOWN`, or a v2 family the
        /// daemon does not take (UNSPEC, UNIX): the receiver then keeps the
        /// connection's own addresses, the proxy's (proxy-protocol.txt §2.1, §2.2).
        public var source: Endpoint?
        public var destination: Endpoint?
        /// The header's size in bytes: the client's first byte follows it.
        public var length: Int

        public init(version: Int, source: Endpoint?, destination: Endpoint?, length: Int) {
            self.version = version
            self.source = source
            self.destination = destination
            self.length = length
        }
    }

    /// Why a header is refused.
    public enum Failure: Error, Equatable, Sendable {
        /// Neither `PROXY ` nor the v2 signature starts the stream.
        case badSignature
        /// A v1 line with no `\r\n` within 107 bytes.
        case v1TooLong
        /// A v1 protocol other than TCP4, TCP6, UNKNOWN.
        case v1BadProtocol
        /// A v1 line without exactly `PROTO SRC DST SPORT DPORT` separated by single spaces.
        case v1BadFields
        /// A v1 address that is not of its protocol's family (inet_pton(3) rules).
        case v1BadAddress
        /// A v1 port that is not a decimal 0 ... 65535 without leading zeros.
        case v1BadPort
        /// A v2 version other than 2 (the high nibble of byte 13).
        case v2BadVersion(UInt8)
        /// A v2 command other than LOCAL (0) or PROXY (1).
        case v2BadCommand(UInt8)
        /// A v2 family/protocol byte the specification does not define, or a
        /// datagram protocol on this stream connection.
        case v2BadFamily(UInt8)
        /// A v2 length shorter than its family's address block.
        case v2BadLength(Int)

        /// One line for the log.
        public var description: String {
            switch self {
            case .badSignature: "not a PROXY protocol header (no \"PROXY \" and no v2 signature)"
            case .v1TooLong: "PROXY v1 line longer than 107 bytes"
            case .v1BadProtocol: "PROXY v1 protocol is not TCP4, TCP6 or UNKNOWN"
            case .v1BadFields: "PROXY v1 line does not have the fields PROTO SRC DST SPORT DPORT"
            case .v1BadAddress: "PROXY v1 address is not a valid address of its protocol"
            case .v1BadPort: "PROXY v1 port is not a decimal number 0..65535"
            case .v2BadVersion(let v): "PROXY v2 version \(v) is not 2"
            case .v2BadCommand(let c): "PROXY v2 command \(c) is neither LOCAL nor PROXY"
            case .v2BadFamily(let f): "PROXY v2 family/protocol byte 0x\(String(f, radix: 16)) is not supported"
            case .v2BadLength(let n): "PROXY v2 length \(n) is too short for its address family"
            }
        }
    }

    /// What the start of a stream holds.
    public enum Step: Equatable, Sendable {
        /// A valid prefix of a header: read more.
        case needMore
        case header(Header)
        case invalid(Failure)
    }

    /// Peeks at `bytes`, the first bytes a connection sent.
    public static func parse(_ bytes: UnsafeRawBufferPointer) -> Step {
        guard let first = bytes.first else { return .needMore }
        if first == UInt8(ascii: "P") { return parseV1(bytes) }
        if first == v2Signature[0] { return parseV2(bytes) }
        return .invalid(.badSignature)
    }

    /// `parse` over an array (tests, fuzzing).
    public static func parse(_ bytes: [UInt8]) -> Step {
        bytes.withUnsafeBytes { parse($0) }
    }

    // MARK: - v1

    private static let v1Prefix = Array("PROXY ".utf8)

    private static func parseV1(_ b: UnsafeRawBufferPointer) -> Step {
        let prefixed = min(b.count, v1Prefix.count)
        for i in 0..<prefixed where b[i] != v1Prefix[i] { return .invalid(.badSignature) }
        // The line ends at the first CR, which must be followed by LF, the
        // two within 107 bytes; a bare LF is not an end.
        var end: Int?
        for i in 0..<min(b.count, v1MaxBytes) where b[i] == 0x0D || b[i] == 0x0A {
            guard b[i] == 0x0D else { return .invalid(.v1BadFields) }
            end = i
            break
        }
        guard let cr = end else { return b.count >= v1MaxBytes ? .invalid(.v1TooLong) : .needMore }
        guard cr + 2 <= v1MaxBytes else { return .invalid(.v1TooLong) }
        guard cr + 1 < b.count else { return .needMore }
        guard b[cr + 1] == 0x0A, cr >= v1Prefix.count else { return .invalid(.v1BadFields) }
        let line = Array(b[v1Prefix.count..<cr])
        let fields = line.split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
        let length = cr + 2
        switch fields.first.map({ String(decoding: $0, as: UTF8.self) }) {
        case "UNKNOWN":
            // "the receiver must ignore anything presented before the CRLF" (§2.1).
            return .header(Header(version: 1, source: nil, destination: nil, length: length))
        case "TCP4", "TCP6":
            guard fields.count == 5 else { return .invalid(.v1BadFields) }
            let ipv6 = fields[0].last == UInt8(ascii: "6")
            let text = { (f: ArraySlice<UInt8>) in String(decoding: f, as: UTF8.self) }
            let parseIP: (String) -> [UInt8]? = ipv6 ? { IPAddressText.parseIPv6($0) } : { IPAddressText.parseIPv4($0) }
            guard let src = parseIP(text(fields[1])), let dst = parseIP(text(fields[2])) else { return .invalid(.v1BadAddress) }
            guard let sport = port(fields[3]), let dport = port(fields[4]) else { return .invalid(.v1BadPort) }
            return .header(Header(version: 1, source: Endpoint(ip: src, port: sport),
                                  destination: Endpoint(ip: dst, port: dport), length: length))
        default:
            return .invalid(.v1BadProtocol)
        }
    }

    /// A decimal port 0 ... 65535, no sign, no leading zero.
    private static func port(_ f: ArraySlice<UInt8>) -> UInt16? {
        guard !f.isEmpty, f.count <= 5, f.count == 1 || f.first != UInt8(ascii: "0") else { return nil }
        var n = 0
        for c in f {
            guard c >= 0x30 && c <= 0x39 else { return nil }
            n = n * 10 + Int(c - 0x30)
        }
        return n <= 65535 ? UInt16(n) : nil
    }

    // MARK: - v2

    private static func parseV2(_ b: UnsafeRawBufferPointer) -> Step {
        for i in 0..<min(b.count, v2Signature.count) where b[i] != v2Signature[i] { return .invalid(.badSignature) }
        guard b.count >= 13 else { return .needMore }
        let versionCommand = b[12]
        guard versionCommand >> 4 == 2 else { return .invalid(.v2BadVersion(versionCommand >> 4)) }
        let command = versionCommand & 0x0F
        guard command <= 1 else { return .invalid(.v2BadCommand(command)) }
        guard b.count >= 14 else { return .needMore }
        let family = b[13]
        // Address block sizes (§2.2): INET 12, INET6 36, UNIX 216; UNSPEC 0.
        let addressBytes: Int
        switch family {
        case 0x00: addressBytes = 0  // UNSPEC
        case 0x11: addressBytes = 12  // TCP over IPv4
        case 0x21: addressBytes = 36  // TCP over IPv6
        case 0x31: addressBytes = 216  // UNIX stream
        case 0x12, 0x22, 0x32:
            // Datagram families: a LOCAL header ignores the family, a PROXY one
            // cannot describe this stream connection.
            guard command == 0 else { return .invalid(.v2BadFamily(family)) }
            addressBytes = 0
        default:
            return .invalid(.v2BadFamily(family))
        }
        guard b.count >= v2FixedBytes else { return .needMore }
        let length = Int(b[14]) << 8 | Int(b[15])
        // LOCAL: "the receiver must accept this connection as valid and must use
        // the real connection endpoints and discard the protocol block" (§2.2).
        if command == 1 && length < addressBytes { return .invalid(.v2BadLength(length)) }
        let total = v2FixedBytes + length
        guard b.count >= total else { return .needMore }
        guard command == 1, family == 0x11 || family == 0x21 else {
            return .header(Header(version: 2, source: nil, destination: nil, length: total))
        }
        let a = v2FixedBytes
        let ipBytes = family == 0x11 ? 4 : 16
        let src = Array(b[a..<(a + ipBytes)])
        let dst = Array(b[(a + ipBytes)..<(a + 2 * ipBytes)])
        let p = a + 2 * ipBytes
        let sport = UInt16(b[p]) << 8 | UInt16(b[p + 1])
        let dport = UInt16(b[p + 2]) << 8 | UInt16(b[p + 3])
        return .header(Header(version: 2, source: Endpoint(ip: src, port: sport),
                              destination: Endpoint(ip: dst, port: dport), length: total))
    }
}

/// An IPv4 or IPv6 address prefix (`ADDR` or `ADDR/BITS`, RFC 4632 §3.1 and
/// RFC 4291 §2.3 notation), for `proxy_from`.
public struct IPPrefix: Equatable, Sendable, CustomStringConvertible {
    /// 4 or 16 bytes, the bits past `bits` cleared.
    public let network: [UInt8]
    /// 0 ... 32 (IPv4) or 0 ... 128 (IPv6).
    public let bits: Int

    /// Parses `1.2.3.4`, `10.0.0.0/8`, `::1`, `fd00::/8` (brackets allowed
    /// around IPv6). Host bits set past the prefix are an error (nil), so
    /// `10.0.0.1/8` is refused rather than silently widened.
    public init?(_ text: some StringProtocol) {
        var addressText = Substring(text)
        var bits: Int?
        if let slash = addressText.firstIndex(of: "/") {
            let digits = addressText[addressText.index(after: slash)...]
            guard !digits.isEmpty, digits.count <= 3, digits.allSatisfy({ $0.isASCII && $0.isNumber }),
                  digits.count == 1 || digits.first != "0", let n = Int(digits) else { return nil }
            bits = n
            addressText = addressText[..<slash]
        }
        if addressText.hasPrefix("["), addressText.hasSuffix("]") { addressText = addressText.dropFirst().dropLast() }
        guard let bytes = IPAddressText.parseIPv4(addressText) ?? IPAddressText.parseIPv6(addressText) else { return nil }
        let width = bytes.count * 8
        let n = bits ?? width
        guard n <= width else { return nil }
        guard Self.masked(bytes, n) == bytes else { return nil }
        self.network = bytes
        self.bits = n
    }

    /// Whether `ip` (4 or 16 bytes) is inside. An IPv4-mapped IPv6 address
    /// (`::ffff:a.b.c.d`, RFC 4291 §2.5.5.2, what a dual-stack socket reports
    /// for an IPv4 peer) matches IPv4 prefixes as its IPv4 address.
    public func contains(_ ip: [UInt8]) -> Bool {
        var ip = ip
        if network.count == 4, ip.count == 16, ip[0..<10].allSatisfy({ $0 == 0 }), ip[10] == 0xFF, ip[11] == 0xFF {
            ip = Array(ip[12...])
        }
        return ip.count == network.count && Self.masked(ip, bits) == network
    }

    /// `ADDR/BITS` in canonical form.
    public var description: String {
        (network.count == 4 ? IPAddressText.formatIPv4(network) : IPAddressText.formatIPv6(network)) + "/\(bits)"
    }

    private static func masked(_ bytes: [UInt8], _ bits: Int) -> [UInt8] {
        var out = bytes
        for i in out.indices {
            let keep = max(0, min(8, bits - i * 8))
            out[i] &= keep == 8 ? 0xFF : ~(0xFF >> UInt8(keep))
        }
        return out
    }
}
