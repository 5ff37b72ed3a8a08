/* kh_tls_client.h: the client side of TLS for outbound connections (kh_out), sans-io: bytes in,
 * bytes out, no socket, no loop. Implemented in khamsin-tls.so (kh_tls_client.c, OpenSSL);
 * the binary reaches it through the module's table (kh_tls_load.c loads the module on the
 * first kh_tls_client_new, from any worker, under a lock: a server with no TLS listener loads
 * it only when the app first makes a TLS connection).
 * Owns:  per connection its SSL and two memory BIOs; per process, behind a lock, one SSL_CTX
 *        per (verify, ca_file) pair, made on first use and kept until exit (they are read-only
 *        once made, as the server's are).
 * Never: touches a socket; calls back. */
#ifndef KH_TLS_CLIENT_H
#define KH_TLS_CLIENT_H

#include <stddef.h>

typedef struct kh_tls_client kh_tls_client;

typedef struct kh_tls_client_opts {
    const char *server_name; /* SNI (not sent for an IP literal) and the name checked */
    int verify;              /* 1: chain + name; 0: neither */
    const char *ca_file;     /* NULL: the system store (OpenSSL's default paths) */
    const unsigned char *alpn_wire; /* RFC 7301 wire format, or NULL */
    size_t alpn_len;
} kh_tls_client_opts;

/* NULL with a message in err (module missing, bad CA file, ...). */
kh_tls_client *kh_tls_client_new(const kh_tls_client_opts *o, char *err, size_t errlen);
void kh_tls_client_free(kh_tls_client *c);
/* Ciphertext from the peer. */
void kh_tls_client_feed(kh_tls_client *c, const char *p, size_t n);
/* Advances the handshake: 1 done, 0 needs more input (send kh_tls_client_pending first), < 0
 * failed (err: "tls: certificate verify failed: self-signed certificate", ...). */
int kh_tls_client_handshake(kh_tls_client *c, char *err, size_t errlen);
/* Plaintext out of what was fed: > 0 bytes written to out, 0 needs more input, -1 the peer
 * closed (close_notify), < -1 a TLS error. */
int kh_tls_client_read(kh_tls_client *c, char *out, size_t cap);
/* Encrypts n bytes (all of them); 0 or < 0 on error. */
int kh_tls_client_write(kh_tls_client *c, const char *p, size_t n);
/* Moves up to cap bytes of ciphertext to send into out; returns how many (0: none). */
size_t kh_tls_client_pending(kh_tls_client *c, char *out, size_t cap);
/* The ALPN protocol the server chose, or "" (valid until free). */
const char *kh_tls_client_alpn(kh_tls_client *c);

#endif
