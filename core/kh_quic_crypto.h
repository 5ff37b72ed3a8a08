/* kh_quic_crypto.h: inside khamsin-h3.so, the TLS side of QUIC. kh_quic_crypto.c is the only
 * file that knows GnuTLS (through ngtcp2_crypto_gnutls); an OpenSSL >= 3.5 backend would
 * replace that one file.
 * Owns:  the certificate credentials (made once on the main thread, shared read-only by every
 *        worker's sessions) and each connection's TLS session (kh_quic.c frees it once the
 *        handshake is complete: ngtcp2 keeps the keys and AEAD contexts it needs after that). */
#ifndef KH_QUIC_CRYPTO_H
#define KH_QUIC_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

typedef struct kh_quic_creds kh_quic_creds;
struct ngtcp2_conn;
struct ngtcp2_crypto_conn_ref;

/* Main thread. NULL with a message in err. */
kh_quic_creds *kh_quic_creds_new(const char *cert_pem, size_t cert_len, const char *key_pem,
                                 size_t key_len, char *err, size_t errlen);
void kh_quic_creds_free(kh_quic_creds *c);
/* A server session for one connection, ALPN "h3" only, bound to qc through ref (whose
 * get_conn the caller has set); returns the session (opaque) or NULL. */
void *kh_quic_session_new(kh_quic_creds *c, struct ngtcp2_conn *qc,
                          struct ngtcp2_crypto_conn_ref *ref);
void kh_quic_session_free(void *session);
/* Cryptographic randomness. */
void kh_quic_rand(uint8_t *p, size_t n);
const char *kh_quic_crypto_version(void);

#endif
