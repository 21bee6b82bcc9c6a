// The test process initialises OpenSSL before main() with
// OPENSSL_INIT_NO_ATEXIT (OPENSSL_init_crypto(3)), so OpenSSL does not run
// OPENSSL_cleanup() from atexit.
//
// Why: the tests call OpenSSL on Swift Testing's worker threads, and each
// such thread gets a 904-byte error state (ERR_STATE, OpenSSL 3.0) that a
// thread-exit destructor frees. OPENSSL_cleanup() at exit deletes that
// destructor's thread-local key while worker threads still run; a worker
// that ends in the moment between the cleanup and LeakSanitizer's check
// leaves its error state unfreed, and `make test-asan` failed on it once
// ("Direct leak of 904 byte(s) ... in CRYPTO_zalloc"). Without the atexit
// cleanup the key stays, thread exits free their state, and what OpenSSL
// still holds at exit is reachable from its globals: a leaked SSL_CTX or
// SSL of ours is still reported. roomcastd is one thread and keeps the
// default.
#include <openssl/crypto.h>

static int initialised;

__attribute__((constructor))
static void roomcast_test_openssl_init(void) {
    initialised = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

int roomcast_test_openssl_no_atexit(void) { return initialised; }
