// COpenSSLNoAtExit: links into the test bundle only (see the .c file).
#ifndef ROOMCAST_TEST_OPENSSL_NO_ATEXIT_H
#define ROOMCAST_TEST_OPENSSL_NO_ATEXIT_H

/// 1 once the constructor has initialised OpenSSL with
/// OPENSSL_INIT_NO_ATEXIT (OPENSSL_init_crypto(3)), 0 if that call failed.
int roomcast_test_openssl_no_atexit(void);

#endif
