// The test process's OpenSSL set-up (Tests/COpenSSLNoAtExit/no_atexit.c):
// initialised before main() without the atexit cleanup, whose deletion of
// OpenSSL's thread-exit key made a worker thread ending at exit leak its
// 904-byte error state under LeakSanitizer (`make test-asan`).
import COpenSSL
import COpenSSLNoAtExit
import Testing

@Suite("OpenSSL in the test process")
struct OpenSSLProcessTests {
    @Test("initialised by the constructor with OPENSSL_INIT_NO_ATEXIT, before any test used OpenSSL")
    func noAtExitCleanup() {
        #expect(roomcast_test_openssl_no_atexit() == 1)
        // A later init with other flags succeeds and keeps the first one's.
        #expect(OPENSSL_init_crypto(UInt64(OPENSSL_INIT_LOAD_CRYPTO_STRINGS), nil) == 1)
    }
}
