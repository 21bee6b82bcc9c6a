// The TLS 1.3 suite the daemon chooses (docs/protocol/tls.md §16): its own
// order decides, AES-128-GCM first, whatever order the client offers.
import COpenSSL
import Testing
@testable import RoomcastServer

@Suite struct TLSCipherTests {
    @Test("a TLS 1.3 client offering OpenSSL's default order (AES-256-GCM first) gets TLS_AES_128_GCM_SHA256")
    func aes128IsPreferred() throws {
        let room = try BatchRegionTests.Room([.tlsLTB])
        let client = try #require(room.clients[0])
        #expect(String(cString: SSL_get_version(client)) == "TLSv1.3")
        let cipher = try #require(SSL_get_current_cipher(client))
        #expect(String(cString: SSL_CIPHER_get_name(cipher)) == "TLS_AES_128_GCM_SHA256")
    }

    @Test("a client that offers only ChaCha20-Poly1305 still gets it")
    func chachaOnlyClientIsServed() throws {
        let room = try BatchRegionTests.Room([], clientSuites: "TLS_CHACHA20_POLY1305_SHA256")
        let client = try room.addTLSMember()
        let cipher = try #require(SSL_get_current_cipher(client))
        #expect(String(cString: SSL_CIPHER_get_name(cipher)) == "TLS_CHACHA20_POLY1305_SHA256")
    }
}
