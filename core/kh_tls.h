/* kh_tls.h: TLS (RFC 8446; RFC 5246 only with --tls12) as a transport between kh_conn and the
 * protocol module (style.md §2: "OpenSSL on memory BIOs ... ALPN picks the kh_proto_vt").
 * Owns:  at start-up, on the main thread: one SSL_CTX per certificate (SNI picks among them, the
 *        first is the default) and the session-ticket key ring every worker shares; once, on the
 *        first worker that closes a TLS connection: each SSL_CTX's twin without the keylog
 *        callback (from the certificate and key in memory), which new handshakes start on so
 *        that OpenSSL formats only the secrets the hand-off needs (kh_tls.c, keylog_cb); per
 *        connection: the SSL object and the ciphertext waiting to be written.
 * In:    ciphertext the conn read (lent from the worker's read slab); plaintext from c->out.
 * Out:   plaintext appended to c->in; ciphertext handed to the conn's write; the protocol chosen
 *        by ALPN started through kh_proto_start.
 * Never: touches the socket or the loop (the conn does the I/O); changes an SSL_CTX after the
 *        workers start (they share them read-only; the twins are new SSL_CTXs, published whole
 *        with a release store); loads a file on a worker.
 * Memory: after a TLS 1.3 handshake the SSL object is freed and kh_tls13 protects the records
 *        (two AEAD contexts, ~2.3 KB); a TLS 1.2 connection keeps its SSL object (its record
 *        buffers released with SSL_MODE_RELEASE_BUFFERS). Idle: no ciphertext buffer either. */
#ifndef KH_TLS_H
#define KH_TLS_H

#include <stddef.h>
#include <stdint.h>

#include "kh_buf.h"

typedef struct kh_conn kh_conn;
typedef struct kh_tls_ctx kh_tls_ctx;
typedef struct kh_tls kh_tls;

typedef struct kh_tls_opts {
    const char **certs; /* PEM certificate chain files, paired with keys; [0] is the default */
    const char **keys;
    int num_certs;
    int self_signed;        /* no files: generate a P-256 certificate for localhost in memory */
    int tls12;              /* also accept TLS 1.2 (default: TLS 1.3 only) */
    uint64_t ticket_rotate_s; /* a ticket key encrypts for this long, then decrypts for as long */
    int own_records;        /* hand TLS 1.3 connections to kh_tls13 after the handshake */
    const char *alpn_wire;  /* ALPN protocols we accept, in preference order (RFC 7301 wire format) */
    size_t alpn_wire_len;
} kh_tls_opts;

/* Main thread, before the workers start. Returns NULL with a message naming the file in err. */
kh_tls_ctx *kh_tls_ctx_new(const kh_tls_opts *o, char *err, size_t errlen);
/* Base64 SHA-256 of the default certificate's SubjectPublicKeyInfo (Chromium's
 * --ignore-certificate-errors-spki-list takes it). Computed on the first call, which must be
 * on the main thread before the workers start (start-up skips it when nothing asks). */
const char *kh_tls_ctx_spki_sha256(const kh_tls_ctx *t);
void kh_tls_ctx_free(kh_tls_ctx *t);
/* Main thread: the default certificate (leaf first, then its chain) and its private key as PEM,
 * each malloc'd and NUL-terminated, for the QUIC module, which presents the same certificate
 * and key (also the --tls-self-signed one, so its logged SPKI hash holds for QUIC too). Returns
 * 0, or -1 with nothing allocated. Free both with kh_tls_pem_free (it wipes the key). */
int kh_tls_ctx_export_pem(const kh_tls_ctx *t, char **chain, size_t *chain_len, char **key,
                          size_t *key_len);
void kh_tls_pem_free(char *p, size_t len);

/* Per connection, on its worker. */
kh_tls *kh_tls_new(kh_tls_ctx *t, kh_conn *c);
void kh_tls_free(kh_tls *s, kh_bufcache *bufs);
/* Feeds n bytes of ciphertext: drives the handshake (calling kh_proto_start once ALPN is
 * settled) and appends the plaintext to c->in. Returns 0; 1 when the peer sent close_notify
 * (end of input); or a negative KH_E* code when the connection must close (peer garbage, a
 * failed handshake: logged at DEBUG). */
int kh_tls_read(kh_tls *s, const char *p, size_t n);
/* Encrypts the plaintext in `plain` (emptied) and returns the buffer of ciphertext to write,
 * which may also hold handshake bytes or an alert; the caller may take its memory. NULL when
 * encryption failed: the connection must close. */
kh_buf *kh_tls_write(kh_tls *s, kh_buf *plain);
/* Queues close_notify (RFC 8446 §6.1) once; returns 1 if bytes were added. */
int kh_tls_close_notify(kh_tls *s);
/* 1 once the handshake is done. */
int kh_tls_established(const kh_tls *s);

#endif
