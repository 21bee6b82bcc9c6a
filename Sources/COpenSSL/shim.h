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


// TLS in the daemon (docs/protocol/tls.md §16): the macros of ssl.h and bio.h
// that Swift cannot import, as functions.

/// SSL_CTX settings every roomcastd context gets: SSL_write may return after
/// one record and be retried from a moved buffer holding the same bytes
/// (SSL_write(3)), no renegotiation, no compression, kernel TLS where the
/// kernel offers it, an EOF without close_notify read as an EOF, and
/// `min_version` as the oldest protocol, and TLS 1.3's AES-128-GCM suite
/// (the one RFC 8446 §9.1 makes mandatory) preferred over AES-256-GCM, then
/// ChaCha20-Poly1305: about 30 % less cipher work per byte with AES-NI, for
/// the daemon, which encrypts every delivery, and for its clients. With `release_buffers`, every
/// connection frees its record buffers whenever they are empty
/// (SSL_MODE_RELEASE_BUFFERS); without, the daemon frees those of idle
/// connections on its sweep (SSL_free_buffers(3)), so a busy one does not pay
/// a malloc and a free of 16 KiB per record.
static inline int roomcast_tls_configure(SSL_CTX *ctx, int min_version, int release_buffers) {
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER
                          | (release_buffers ? SSL_MODE_RELEASE_BUFFERS : 0));
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_ENABLE_KTLS
                             | SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_CIPHER_SERVER_PREFERENCE);
    if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256") != 1) return 0;
    return (int)SSL_CTX_set_min_proto_version(ctx, min_version);
}

/// Whether the kernel encrypts what this connection sends (BIO_get_ktls_send).
static inline int roomcast_tls_ktls_send(SSL *ssl) {
    BIO *b = SSL_get_wbio(ssl);
    return b != NULL && BIO_get_ktls_send(b) ? 1 : 0;
}

/// A memory BIO holding `n` bytes that were read from the socket before the
/// handshake began (after a PROXY header): reading past them asks for a retry.
static inline BIO *roomcast_tls_prefix_bio(const void *bytes, int n) {
    BIO *b = BIO_new(BIO_s_mem());
    if (b == NULL) return NULL;
    if (BIO_write(b, bytes, n) != n) { BIO_free(b); return NULL; }
    BIO_set_mem_eof_return(b, -1);
    return b;
}

/// The name a client sends in its ClientHello (SNI, RFC 6066 §3; SSL_set_tlsext_host_name).
static inline int roomcast_tls_set_server_name(SSL *ssl, const char *name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}

/// Bytes still unread in a memory BIO.
static inline size_t roomcast_tls_bio_pending(BIO *b) { return BIO_ctrl_pending(b); }

#endif
