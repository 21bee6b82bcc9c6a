// RFC 6455 §5 decoder of client frames: peeks at the start of the bytes
// received, checks every rule the header alone can decide (mask, RSV bits,
// opcode, control-frame size, the message bound) before waiting for or
// copying a payload, and reassembles fragmented messages.

/// Why a client's stream was refused: the close code to send and a reason for
/// the log and the close frame. After a failure the stream cannot be read
/// any further (RFC 6455 §7.1.7, "Fail the WebSocket Connection").
public struct WebSocketFailure: Error, Equatable, Sendable, CustomStringConvertible {
    /// 1002 (framing), 1007 (not UTF-8) or 1009 (over the message bound).
    public var code: WebSocketCloseCode
    /// What was wrong, e.g. `client frame not masked (RFC 6455 §5.1)`.
    public var reason: String
    public init(_ code: WebSocketCloseCode, _ reason: String) { self.code = code; self.reason = reason }
    public var description: String { "\(code.rawValue): \(reason)" }
}

/// The per-connection decoder state: a plain value (the message being
/// reassembled, its opcode and the UTF-8 state of its text), so that it can
/// be copied, compared and carried across a restart beside the unread bytes.
///
/// It owns no input buffer: the caller keeps the bytes not yet consumed and
/// calls ``next(_:)`` on them; each step consumes one whole frame or nothing,
/// and the next call must present the same unconsumed bytes again, grown
/// (the decoder remembers how much of an incomplete text frame it checked).
/// A frame header that claims more than the bound is refused on its header
/// alone, so no allocation ever follows a hostile length.
public struct WebSocketDecoder: Equatable, Sendable {
    /// The largest message, in bytes, after reassembling its fragments
    /// (`[websocket] max_message_bytes`); a larger one fails with 1009.
    public let maxMessageBytes: Int
    /// The opcode (text or binary) of a fragmented message in progress.
    public private(set) var messageOpcode: WebSocketOpcode?
    /// The payload of that message so far (at most `maxMessageBytes`).
    public private(set) var message: [UInt8] = []
    /// UTF-8 state of that message when it is text.
    public private(set) var utf8 = UTF8Validator()
    /// Payload bytes of the text frame still arriving that were already
    /// checked, and the UTF-8 state after them: invalid text is refused as
    /// soon as it arrives, not when its frame is complete (RFC 6455 §8.1).
    public private(set) var checkedOfPartialFrame = 0
    private var partialUTF8 = UTF8Validator()

    public init(maxMessageBytes: Int) {
        self.maxMessageBytes = maxMessageBytes
    }

    /// Everything the decoder keeps but its bound, which the next process's
    /// config gives: what a restart carries (`HandOverState`), beside the
    /// connection's unconsumed bytes.
    public struct Carried: Equatable, Sendable {
        /// The opcode (text or binary) of a fragmented message in progress; nil: none.
        public var messageOpcode: WebSocketOpcode?
        /// That message's payload so far, in bytes.
        public var message: [UInt8]
        /// UTF-8 state after the message's complete fragments.
        public var utf8: UTF8Validator
        /// Payload bytes of the incomplete text frame already checked, and
        /// the UTF-8 state after them.
        public var checkedOfPartialFrame: Int
        public var partialUTF8: UTF8Validator

        public init(messageOpcode: WebSocketOpcode? = nil, message: [UInt8] = [], utf8: UTF8Validator = UTF8Validator(),
                    checkedOfPartialFrame: Int = 0, partialUTF8: UTF8Validator = UTF8Validator()) {
            self.messageOpcode = messageOpcode
            self.message = message
            self.utf8 = utf8
            self.checkedOfPartialFrame = checkedOfPartialFrame
            self.partialUTF8 = partialUTF8
        }
    }

    /// The state to carry across a restart.
    public var carried: Carried {
        Carried(messageOpcode: messageOpcode, message: message, utf8: utf8, checkedOfPartialFrame: checkedOfPartialFrame, partialUTF8: partialUTF8)
    }

    /// A decoder that goes on from `carried` (the previous process's
    /// ``carried``), presented the same unconsumed bytes. A message already
    /// over a lowered `maxMessageBytes` fails (1009) at its next fragment.
    public init(maxMessageBytes: Int, carried: Carried) {
        self.maxMessageBytes = maxMessageBytes
        messageOpcode = carried.messageOpcode
        message = carried.message
        utf8 = carried.utf8
        checkedOfPartialFrame = carried.checkedOfPartialFrame
        partialUTF8 = carried.partialUTF8
    }

    /// What one whole frame amounted to.
    public enum Event: Equatable, Sendable {
        /// A whole message: an unfragmented frame, or the final fragment.
        /// Text is valid UTF-8.
        case message(WebSocketOpcode, [UInt8])
        /// A non-final fragment, kept for the message.
        case fragment
        /// A ping with its application data (to send back in a pong, §5.5.2).
        case ping([UInt8])
        /// A pong (§5.5.3).
        case pong([UInt8])
        /// A close frame (§5.5.1): its code (nil for an empty payload) and reason.
        case close(WebSocketCloseCode?, String)
    }

    /// The result of looking at the start of the received bytes.
    public enum Step: Equatable, Sendable {
        /// Fewer bytes than the next frame needs; nothing is consumed.
        case needMore
        /// One frame of `consumed` bytes (header, mask and payload).
        case event(Event, consumed: Int)
        /// The stream broke a rule of RFC 6455: close with `failure.code`.
        case failure(WebSocketFailure)
    }

    /// Largest control-frame payload, in bytes (RFC 6455 §5.5).
    public static let maxControlPayload = 125

    /// Decodes the frame at the start of `bytes`, if it is all there.
    /// O(payload) for the unmasking copy; allocates only for a frame whose
    /// header passed every check and whose bytes have all arrived.
    public mutating func next(_ bytes: UnsafeRawBufferPointer) -> Step {
        guard bytes.count >= 2 else { return .needMore }
        let b0 = bytes[0], b1 = bytes[1]
        let fin = b0 & 0x80 != 0
        if b0 & 0x70 != 0 {
            return fail(.protocolError, "RSV bits 0x\(String(b0 & 0x70, radix: 16)) set, but no extension was negotiated (RFC 6455 §5.2)")
        }
        guard let opcode = WebSocketOpcode(rawValue: b0 & 0x0F) else {
            return fail(.protocolError, "reserved opcode 0x\(String(b0 & 0x0F, radix: 16)) (RFC 6455 §5.2)")
        }
        guard b1 & 0x80 != 0 else { return fail(.protocolError, "client frame not masked (RFC 6455 §5.1)") }
        let short = Int(b1 & 0x7F)
        if opcode.isControl {
            if !fin { return fail(.protocolError, "fragmented \(opcode) frame (RFC 6455 §5.5: control frames are never fragmented)") }
            if short > Self.maxControlPayload {
                return fail(.protocolError, "\(opcode) frame over 125 bytes (RFC 6455 §5.5)")
            }
        }
        let lengthBytes = short == 126 ? 2 : short == 127 ? 8 : 0
        guard bytes.count >= 2 + lengthBytes else { return .needMore }
        var length = UInt64(short)
        if lengthBytes > 0 {
            length = 0
            for i in 0..<lengthBytes { length = length << 8 | UInt64(bytes[2 + i]) }
            if length >> 63 != 0 { return fail(.protocolError, "payload length with its most significant bit set (RFC 6455 §5.2)") }
        }
        if !opcode.isControl {
            switch (opcode, messageOpcode) {
            case (.continuation, nil):
                return fail(.protocolError, "continuation frame without a message to continue (RFC 6455 §5.4)")
            case (.text, .some), (.binary, .some):
                return fail(.protocolError, "new \(opcode) message before the fragmented one ended (RFC 6455 §5.4)")
            default:
                break
            }
            if length > UInt64(max(0, maxMessageBytes - message.count)) {
                return fail(.messageTooBig, "message of \(UInt64(message.count) + length) bytes or more exceeds max_message_bytes (\(maxMessageBytes))")
            }
        }
        let headerSize = 2 + lengthBytes + 4
        let n = Int(length)  // within maxMessageBytes or 125: fits
        let isText = opcode == .text || (opcode == .continuation && messageOpcode == .text)
        guard bytes.count - headerSize >= n else {
            if isText && bytes.count > headerSize + checkedOfPartialFrame {
                return checkPartialText(bytes, headerSize: headerSize, newMessage: opcode == .text)
            }
            return .needMore
        }
        let consumed = headerSize + n
        let payload = Self.unmask(bytes, keyAt: headerSize - 4, count: n)

        switch opcode {
        case .ping: return .event(.ping(payload), consumed: consumed)
        case .pong: return .event(.pong(payload), consumed: consumed)
        case .close:
            switch Self.parseClose(payload) {
            case .success(let (code, reason)): return .event(.close(code, reason), consumed: consumed)
            case .failure(let f): return .failure(f)
            }
        case .text, .binary, .continuation:
            let kind = opcode == .continuation ? messageOpcode! : opcode
            if kind == .text {
                let checked = checkedOfPartialFrame
                if checked > 0 {
                    utf8 = partialUTF8
                    checkedOfPartialFrame = 0
                } else if opcode != .continuation {
                    utf8 = UTF8Validator()
                }
                guard payload.withUnsafeBytes({ utf8.feed(UnsafeRawBufferPointer(rebasing: $0[checked...])) }) else {
                    return fail(.invalidPayload, "text message is not valid UTF-8 (RFC 6455 §8.1)")
                }
                if fin && !utf8.isComplete {
                    return fail(.invalidPayload, "text message ends inside a UTF-8 sequence (RFC 6455 §8.1)")
                }
            }
            if !fin {
                message.append(contentsOf: payload)
                messageOpcode = kind
                return .event(.fragment, consumed: consumed)
            }
            if opcode != .continuation { return .event(.message(kind, payload), consumed: consumed) }
            var whole: [UInt8] = []
            swap(&whole, &message)
            whole.append(contentsOf: payload)
            messageOpcode = nil
            utf8 = UTF8Validator()
            return .event(.message(kind, whole), consumed: consumed)
        }
    }

    /// Checks the payload bytes of an incomplete text frame that arrived
    /// since the last call (the caller presents the same frame again, grown).
    private mutating func checkPartialText(_ bytes: UnsafeRawBufferPointer, headerSize: Int, newMessage: Bool) -> Step {
        var v = checkedOfPartialFrame > 0 ? partialUTF8 : (newMessage ? UTF8Validator() : utf8)
        let arrived = bytes.count - headerSize
        let k = headerSize - 4
        let key = [bytes[k], bytes[k + 1], bytes[k + 2], bytes[k + 3]]
        // Only the bytes new since the last call: O(n) over a frame's life.
        let fresh = (checkedOfPartialFrame..<arrived).map { bytes[headerSize + $0] ^ key[$0 & 3] }
        let ok = v.feed(fresh)
        guard ok else { return fail(.invalidPayload, "text message is not valid UTF-8 (RFC 6455 §8.1)") }
        partialUTF8 = v
        checkedOfPartialFrame = arrived
        return .needMore
    }

    private func fail(_ code: WebSocketCloseCode, _ reason: String) -> Step {
        .failure(WebSocketFailure(code, reason))
    }

    /// The payload of `count` bytes after the 4-byte key at `keyAt`, unmasked
    /// (RFC 6455 §5.3: byte i XOR key[i mod 4]).
    static func unmask(_ bytes: UnsafeRawBufferPointer, keyAt k: Int, count n: Int) -> [UInt8] {
        guard n > 0 else { return [] }
        let key = (bytes[k], bytes[k + 1], bytes[k + 2], bytes[k + 3])
        let start = k + 4
        return [UInt8](unsafeUninitializedCapacity: n) { out, initialized in
            var i = 0
            // Eight bytes at a time with the key repeated in a word.
            let word = UInt64(key.0) | UInt64(key.1) << 8 | UInt64(key.2) << 16 | UInt64(key.3) << 24
            let key8 = word | word << 32
            let raw = UnsafeMutableRawPointer(out.baseAddress!)
            while i + 8 <= n {
                let v = bytes.loadUnaligned(fromByteOffset: start + i, as: UInt64.self)
                raw.storeBytes(of: v ^ key8.littleEndian, toByteOffset: i, as: UInt64.self)
                i += 8
            }
            while i < n {
                let m: UInt8
                switch i & 3 { case 0: m = key.0; case 1: m = key.1; case 2: m = key.2; default: m = key.3 }
                out[i] = bytes[start + i] ^ m
                i += 1
            }
            initialized = n
        }
    }

    /// A close frame's payload (RFC 6455 §5.5.1, §7.4): empty, or a code
    /// that may be sent on the wire and a UTF-8 reason.
    static func parseClose(_ payload: [UInt8]) -> Result<(WebSocketCloseCode?, String), WebSocketFailure> {
        if payload.isEmpty { return .success((nil, "")) }
        guard payload.count >= 2 else {
            return .failure(WebSocketFailure(.protocolError, "close frame with a 1-byte payload (RFC 6455 §5.5.1)"))
        }
        let code = WebSocketCloseCode(rawValue: UInt16(payload[0]) << 8 | UInt16(payload[1]))
        guard code.isValidOnTheWire else {
            return .failure(WebSocketFailure(.protocolError, "close code \(code.rawValue) may not be sent (RFC 6455 §7.4)"))
        }
        let reason = payload[2...]
        var v = UTF8Validator()
        guard reason.withUnsafeBytes({ v.feed($0) }), v.isComplete else {
            return .failure(WebSocketFailure(.invalidPayload, "close reason is not valid UTF-8 (RFC 6455 §5.5.1)"))
        }
        return .success((code, String(decoding: reason, as: UTF8.self)))
    }
}

extension WebSocketOpcode: CustomStringConvertible {
    public var description: String {
        switch self {
        case .continuation: "continuation"
        case .text: "text"
        case .binary: "binary"
        case .close: "close"
        case .ping: "ping"
        case .pong: "pong"
        }
    }
}
