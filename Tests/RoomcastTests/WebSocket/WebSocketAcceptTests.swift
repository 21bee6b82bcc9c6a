import Testing
@testable import RoomcastServer

/// `Sec-WebSocket-Accept` through OpenSSL (RFC 6455 §1.3 and §4.2.2).
@Suite struct WebSocketAcceptTests {
    @Test func rfcExampleKey() {
        // RFC 6455 §1.3's own example.
        #expect(webSocketAccept(key: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    }

    @Test func otherKeysGiveOtherAnswers() {
        // Computed independently: python3 -c 'import base64,hashlib;
        // print(base64.b64encode(hashlib.sha1(b"AAAAAAAAAAAAAAAAAAAAAA==258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()))'
        #expect(webSocketAccept(key: "AAAAAAAAAAAAAAAAAAAAAA==") == "ICX+Yqv66kxgM0FcWaLWlFLwTAI=")
    }
}
