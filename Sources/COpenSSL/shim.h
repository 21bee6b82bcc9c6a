// OpenSSL 3 (Debian's libssl-dev): libcrypto for signed joins (HMAC-SHA256,
// Ed25519, CRYPTO_memcmp) and libssl for TLS listeners. One general target
// so every user of OpenSSL in the package links the same library.
#ifndef ROOMCAST_COPENSSL_SHIM_H
#define ROOMCAST_COPENSSL_SHIM_H

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>

#endif
