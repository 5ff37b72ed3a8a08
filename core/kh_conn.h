/* kh_conn.h: a TCP connection and the narrow interface to the protocol that runs on it.
 * Owns:  the uv_tcp_t, the unconsumed input (in), the output queue (out, plus one in-flight
 *        write, plus file bodies sent by sendfile on cleartext: kh_conn_sendfile), its timeout entry, the protocol's inline state, and on a TLS listener its
 *        kh_tls transport (then `in` and `out` hold plaintext).
 * In:    bytes from the socket (lent from the worker's read slab), protocol output, timeouts;
 *        the worker's flush pass and stop walks through its registry entry (wc).
 * Out:   on_read/on_eof/on_timeout/on_shutdown/on_close calls into the protocol; writes. Which
 *        protocol starts is kh_proto's choice (ALPN, preface, Upgrade), not this file's.
 * Never: parses a byte of HTTP.
 * Memory: an idle keep-alive connection holds this struct only (no buffer, no stream): 440 bytes
 *        (uv_tcp_t 248, worker and protocol 16, registry entry 40, TLS 8, in/out 48, the
 *        in-flight write 8, timer entry 24, kind/listener/flags/id 8, peer 20 + 4 padding, the
 *        protocol's inline state 16), from the worker's slab (kh_slab.h: no malloc header).
 *        An idle WebSocket keeps it besides its compact stream (bench/README.md). */
#ifndef KH_CONN_H
#define KH_CONN_H

#include <stdint.h>
#include <uv.h>

#include "kh_buf.h"
#include "kh_stream.h"
#include "kh_timer.h"
#include "kh_worker.h"

typedef struct kh_conn kh_conn;
typedef struct kh_tls kh_tls;
typedef struct kh_tls_ctx kh_tls_ctx;

typedef struct kh_proto_vt {
    const char *name;
    /* Plaintext bytes in. Returns how many were consumed; the connection keeps the rest and
     * offers them again (with more) on the next call. */
    size_t (*on_read)(kh_conn *c, char *p, size_t n);
    void (*on_eof)(kh_conn *c);
    void (*on_timeout)(kh_conn *c, int kind);
    /* Graceful stop: finish what is in flight, then close. */
    void (*on_shutdown)(kh_conn *c);
    /* The connection is closing: reset every stream, free protocol state. */
    void (*on_close)(kh_conn *c);
    /* Optional: the flush pass is about to write; a protocol that encodes lazily (h2: nghttp2's
     * mem_send) moves its pending frames into c->out here, as much as it wants queued, and one
     * that paused its input for output backpressure (h1, h2) resumes it here. Returns nonzero
     * when it stopped at its high-water mark with more to send, or still waits for the queue to
     * drain: the bytes then go through uv_write, whose callback runs the flush again on the next
     * loop turn even if the socket took everything at once (one batch per turn, see write_out). */
    int (*on_flush)(kh_conn *c);
} kh_proto_vt;

enum {
    KH_CONN_F_CLOSING = 1u << 0,     /* uv_close was called */
    KH_CONN_F_IN_FLUSH = 1u << 1,    /* unused: wc.in_flush says it (kept so bits do not move) */
    KH_CONN_F_PAUSED = 1u << 2,      /* the protocol takes no input now */
    KH_CONN_F_READING = 1u << 3,     /* uv_read_start is active */
    KH_CONN_F_REFEED = 1u << 4,      /* offer `in` to the protocol again at the next flush */
    KH_CONN_F_CLOSE_AFTER_WRITE = 1u << 5,
    KH_CONN_F_LINGERING = 1u << 6,   /* shut down for writing, draining input before close */
    KH_CONN_F_EOF = 1u << 7,         /* the peer sent FIN */
    KH_CONN_F_HAS_INPUT = 1u << 8,   /* at least one byte arrived since the last request */
    KH_CONN_F_DRAINED = 1u << 9,     /* the last read was short: the socket had no more then */
    KH_CONN_F_INPUT_DONE = 1u << 10, /* kh_conn_end_after_write: the protocol read all it wants */
    KH_CONN_F_WROTE = 1u << 11,      /* a write was made (the next one sets TCP_NODELAY first) */
    KH_CONN_F_NODELAY = 1u << 12,    /* TCP_NODELAY is set */
    KH_CONN_F_OPEN = 1u << 13,       /* uv_tcp_open ran: libuv polls `fd` (see kh_conn.c) */
};

struct kh_conn {
    uv_tcp_t tcp;
    kh_worker *w;
    const kh_proto_vt *proto; /* NULL while a TLS handshake runs */
    kh_wconn wc;              /* its entry in the worker's registry and flush list */
    kh_tls *tls;              /* NULL on a cleartext listener */
    kh_buf in;
    kh_buf out;
    struct kh_write_op *writing; /* the one write libuv holds, or NULL; the file bodies queued
                                  * after it (kh_conn_sendfile) hang off tcp.data (kh_conn.c) */
    kh_timer timer;
    uint8_t timer_kind;  /* what the protocol waits for (enum kh_timeout_kind) */
    uint8_t listener;    /* index of the listener that accepted it (cfg->listens), mod 256 */
    uint16_t flags;
    uint32_t id;
    kh_addr peer;
    int fd;                   /* the socket; libuv's too once KH_CONN_F_OPEN */
    uint64_t proto_inline[2]; /* the protocol's per-connection state, when it is this small */
};

struct sockaddr_storage;
/* Takes a connection accepted on worker w (fd from accept4, non-blocking; peer its address), as
 * kh_accept does; tls is the listener's TLS context, or NULL for cleartext. Returns 0: the fd is
 * the connection's (even if it closes at once); or a UV_E* code: the fd is still the caller's.
 * With defer_accept_s (TCP_DEFER_ACCEPT) it reads the first bytes at once, and may answer and
 * close the connection before it returns. */
int kh_conn_accept(kh_worker *w, int fd, const struct sockaddr_storage *peer, kh_tls_ctx *tls,
                   int listener);
/* The Alt-Svc value for responses on s's connection (h1 and h2 sinks: kh_sink_vt.alt_svc), or
 * NULL: with --http3, `h3=":PORT"; ma=86400` for the port of the listener that accepted it. */
const char *kh_conn_alt_svc(const kh_stream *s);

/* Output: append bytes (copied) and make sure a flush happens this loop turn. */
void kh_conn_write(kh_conn *c, const void *p, size_t n);
/* Reserve/commit for encoders that write in place. */
char *kh_conn_out_reserve(kh_conn *c, size_t n);
void kh_conn_out_commit(kh_conn *c, size_t n);

/* A file body (cleartext only): n bytes of fd from off go out with sendfile(2) after what is
 * queued now, and what is queued later waits for them. The connection owns fd from here (closes
 * it when sent or when the connection closes). The bytes queued before it go out first with
 * MSG_MORE, so that a response head and its first file bytes share packets (nginx's
 * tcp_nopush). A socket that takes no more is waited on with a uv_poll on a dup of its fd
 * (made on the first EAGAIN only), timed by the same progress checks as a pending write
 * (write_timeout_ms without progress closes). Pages not in the page cache are read by sendfile
 * on the loop, as nginx does with `sendfile on` and no aio. */
void kh_conn_sendfile(kh_conn *c, int fd, int64_t off, uint64_t n);

/* Bytes accepted for output and not yet written to the socket (out, the in-flight write and
 * file bodies not yet sent). */
size_t kh_conn_out_pending(const kh_conn *c);

/* Input flow: pause stops reading (bytes already received stay in `in`); resume offers `in` to
 * the protocol again at the next flush and restarts reading. */
void kh_conn_pause(kh_conn *c);
void kh_conn_resume(kh_conn *c);

/* Which timeout applies now (KH_TO_*); restarts its clock. While a socket write is pending its
 * progress checks run instead (write_timeout_ms without progress closes the connection, see
 * kh_write_op in kh_conn.c), and the protocol's kind applies again once the write completes. */
void kh_conn_set_timeout(kh_conn *c, int kind);

/* Sends what is queued, then closes: FIN, drain input for lingering_close_ms, close. */
void kh_conn_close_after_write(kh_conn *c);
/* The same, for a protocol that has read the whole of its input (an HTTP/1.1 request that said
 * `Connection: close`, read to its end): once the last byte is written, a connection with no
 * input left unread (nothing kept in `in`, and the last read emptied the socket or met the
 * peer's FIN) is closed at once, as nginx closes without lingering when nothing is left to
 * read (ngx_http_finalize_connection). close(2) still sends the queued bytes, then FIN. Else,
 * and over TLS (close_notify), it lingers as kh_conn_close_after_write does. */
void kh_conn_end_after_write(kh_conn *c);
/* Closes now; idempotent. */
void kh_conn_close(kh_conn *c);

/* The worker's flush pass calls this for each conn on its list. */
void kh__conn_flush(kh_conn *c);
/* Timeout expiry for queue `kind` (called by the worker's tick). */
void kh__conn_on_timer(kh_timer *t, int kind);

#endif
