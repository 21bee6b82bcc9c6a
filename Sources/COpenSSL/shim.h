// OpenSSL 3.0 (Debian's libssl-dev): every piece of cryptography roomcastd
// uses comes from here, never from code of its own: SHA-1 and base64 for
// the WebSocket handshake (RFC 6455 §4.2.2), HMAC and constant-time
// comparison (CRYPTO_memcmp) for signed tokens, TLS. One target for all of
// them, so each feature includes nothing of its own.
#ifndef ROOMCAST_COPENSSL_SHIM_H
#define ROOMCAST_COPENSSL_SHIM_H

#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/hmac.h>
#include <openssl/crypto.h>
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/rand.h>

#endif
