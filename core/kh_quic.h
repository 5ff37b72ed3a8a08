/* kh_quic.h: inside khamsin-h3.so, the interface between QUIC (kh_quic.c, ngtcp2) and HTTP/3
 * (kh_h3.c, nghttp3): kh_h3 never calls ngtcp2, kh_quic never calls nghttp3, so the 0.12 API
 * stays in kh_quic.c and kh_quic_crypto.c, which an ngtcp2 1.x backend would replace.
 * Owns:  nothing; declarations only. */
#ifndef KH_QUIC_H
#define KH_QUIC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kh_stream.h"

typedef struct kh_quic_conn kh_quic_conn;
typedef struct kh_h3 kh_h3;
typedef struct kh_worker kh_worker;

/* {base, len}, the layout of both ngtcp2_vec and nghttp3_vec */
typedef struct kh_iov {
    uint8_t *base;
    size_t len;
} kh_iov;

/* ---- QUIC, for the module's table (kh_h3_module.c) ---- */
typedef struct kh_h3_ctx kh_h3_ctx;
typedef struct kh_h3_opts kh_h3_opts;
kh_h3_ctx *kh_quic_ctx_new(const kh_h3_opts *o, char *err, size_t errlen);
void kh_quic_ctx_free(kh_h3_ctx *ctx);
int kh_quic_worker_open(kh_worker *w, kh_h3_ctx *ctx, char *err, size_t errlen);
void kh_quic_worker_close(kh_worker *w);
const char *kh_quic_versions(void);

/* ---- QUIC, for kh_h3 ---- */
kh_worker *kh_quic_worker(kh_quic_conn *q);
uint32_t kh_quic_id(kh_quic_conn *q);
const kh_addr *kh_quic_peer(kh_quic_conn *q);
/* Credits n consumed bytes of stream sid back to the peer (stream and connection windows). */
void kh_quic_consumed(kh_quic_conn *q, int64_t sid, size_t n);
/* The two halves of kh_quic_consumed, for an incremental body: the connection's window at
 * once, the stream's as the app consumes. */
void kh_quic_consumed_conn(kh_quic_conn *q, size_t n);
void kh_quic_consumed_stream(kh_quic_conn *q, int64_t sid, size_t n);
void kh_quic_stop_sending(kh_quic_conn *q, int64_t sid, uint64_t code);
void kh_quic_reset_stream(kh_quic_conn *q, int64_t sid, uint64_t code);
int kh_quic_open_uni(kh_quic_conn *q, int64_t *sid);
uint64_t kh_quic_max_bidi_streams(kh_quic_conn *q);
/* There is something to send: write at the flush pass. */
void kh_quic_dirty(kh_quic_conn *q);
/* An HTTP/3 connection error: CONNECTION_CLOSE with this application error code. */
void kh_quic_app_error(kh_quic_conn *q, uint64_t code);

/* ---- HTTP/3, for kh_quic ---- */
kh_h3 *kh_h3_new(kh_quic_conn *q); /* NULL on failure */
void kh_h3_free(kh_h3 *h);
/* Stream data in; returns how many bytes may be credited now, or < 0: connection error. */
ssize_t kh_h3_recv(kh_h3 *h, int64_t sid, const uint8_t *p, size_t n, int fin);
int kh_h3_acked(kh_h3 *h, int64_t sid, uint64_t n);
int kh_h3_stream_closed(kh_h3 *h, int64_t sid, uint64_t code);
/* the read side ended: RESET_STREAM from the peer (stop_sending 0), or our own STOP_SENDING
 * went out (1: ngtcp2's stream_stop_sending callback) */
void kh_h3_peer_reset(kh_h3 *h, int64_t sid, int stop_sending);
void kh_h3_unblock(kh_h3 *h, int64_t sid);
void kh_h3_max_bidi(kh_h3 *h, uint64_t n);
/* Output: up to n vecs of stream data to send; returns the count (sid -1: nothing), < 0 on
 * error. Then tell how it went: blocked, write side shut, or n bytes taken. */
ssize_t kh_h3_writev(kh_h3 *h, int64_t *sid, int *fin, kh_iov *v, size_t n);
void kh_h3_blocked(kh_h3 *h, int64_t sid);
void kh_h3_write_shut(kh_h3 *h, int64_t sid);
int kh_h3_written(kh_h3 *h, int64_t sid, size_t n);
/* After the write pass, outside ngtcp2/nghttp3 callbacks: streams waiting for drain whose
 * queue shrank are told (the app may run and queue more: the connection is marked dirty). */
void kh_h3_after_write(kh_h3 *h);
/* Graceful stop: GOAWAY; returns 1 once no request stream is left (then close). */
void kh_h3_shutdown(kh_h3 *h);
int kh_h3_done(kh_h3 *h);
/* 1 while a request stream is open (kh_quic then keeps the connection alive with PINGs) */
int kh_h3_busy(kh_h3 *h);
const char *kh_h3_versions(void);
/* The allocator kh_quic gives ngtcp2 and hands kh_h3 for nghttp3 (ngtcp2_mem / nghttp3_mem
 * shape): malloc'd blocks of 6 KiB and more (pools) are mmap'd, so a pool's untouched pages are
 * not resident; calloc'd ones (whole objects) stay in the heap. */
void *kh_quic_malloc(size_t n, void *ud);
void *kh_quic_calloc(size_t nmemb, size_t size, void *ud);
void kh_quic_free(void *p, void *ud);
void *kh_quic_realloc(void *p, size_t n, void *ud);
/* The application's timeouts (header, body, keep-alive idle): the deadline (loop ms) of the
 * earliest, or UINT64_MAX; kh_h3_on_timeout acts on those that passed (returns 1 when the
 * connection should close: idle). */
uint64_t kh_h3_deadline(kh_h3 *h);
int kh_h3_on_timeout(kh_h3 *h, uint64_t now);

#endif
