/* kh_conn.c: TCP connection I/O and lifecycle (see kh_conn.h).
 * Owns:  the socket and the bytes around it; frees itself only in uv_close's callback. On a
 *        TLS listener the bytes on the socket are ciphertext: read_cb hands them to kh_tls_read
 *        (plaintext lands in `in`), write_out writes what kh_tls_write made of `out`, and every
 *        close sends close_notify first (after the last write, or in one try from
 *        kh_conn_close); everything else is the same for both.
 * In:    libuv read/write callbacks, the worker's flush pass and timeouts.
 * Out:   kh_proto_vt calls; bytes to the socket.
 * Never: parses HTTP, calls Lua, or frees memory that a callback on the stack still uses. */
#include "kh_conn.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "kh_err.h"
#include "kh_h1.h"
#include "kh_h2.h"
#include "kh_log.h"
#include "kh_tls.h"

/* The protocols a connection can run, by ALPN id (RFC 7301), in our order of preference: TLS
 * advertises exactly these, and the first one the client also offers is started. */
static const struct {
    const char *alpn;
    const kh_proto_vt *vt;
    void (*start)(kh_conn *c);
} protos[] = {
    {"h2", &kh_h2_proto, kh_h2_start},
    {"http/1.1", &kh_h1_proto, kh_h1_start},
};

/* The one write libuv holds for a connection: the bytes must live until write_cb (libuv). */
typedef struct kh_write_op {
    uv_write_t req;
    kh_conn *c;
    kh_buf buf;
    size_t off;
} kh_write_op;

static void on_close(uv_handle_t *h);
static void read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *b);

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    kh_conn *c = h->data;
    /* Lend the worker's slab: read_cb consumes or copies before the next read can start. */
    b->base = c->w->read_slab;
    b->len = 65536;
}

static void start_reading(kh_conn *c)
{
    if (c->flags & (KH_CONN_F_READING | KH_CONN_F_CLOSING | KH_CONN_F_EOF))
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) == 0)
        c->flags |= KH_CONN_F_READING;
}

static void stop_reading(kh_conn *c)
{
    if (!(c->flags & KH_CONN_F_READING))
        return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->flags &= ~KH_CONN_F_READING;
}

static void peer_from_sockaddr(kh_addr *a, const struct sockaddr_storage *ss)
{
    memset(a, 0, sizeof *a);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        a->family = 4;
        memcpy(a->bytes, &in->sin_addr, 4);
        a->port = ntohs(in->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        a->family = 6;
        memcpy(a->bytes, &in6->sin6_addr, 16);
        a->port = ntohs(in6->sin6_port);
    }
}

size_t kh_conn_alpn_wire(unsigned char *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < KH_ARRAY_LEN(protos); i++) {
        size_t len = strlen(protos[i].alpn);
        if (n + 1 + len > cap)
            break;
        out[n++] = (unsigned char)len;
        memcpy(out + n, protos[i].alpn, len);
        n += len;
    }
    return n;
}

void kh_conn_start_proto(kh_conn *c, const char *alpn, size_t len)
{
    size_t i = KH_ARRAY_LEN(protos) - 1; /* http/1.1: cleartext, or no ALPN in the ClientHello */
    for (size_t j = 0; j < KH_ARRAY_LEN(protos) && len; j++)
        if (strlen(protos[j].alpn) == len && memcmp(protos[j].alpn, alpn, len) == 0)
            i = j;
    c->proto = protos[i].vt;
    protos[i].start(c);
}

void kh_conn_accept(kh_worker *w, uv_stream_t *listener, kh_tls_ctx *tls)
{
    kh_conn *c = kh_xcalloc(1, sizeof *c);
    c->w = w;
    uv_tcp_init(&w->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_close);
        c->flags |= KH_CONN_F_CLOSING;
        w->num_conns++;
        return;
    }
    w->num_conns++;
    c->id = ++w->next_conn_id;
    if (w->num_conns > w->limits->connections || w->stopping) {
        KH_LOG_WARN("connection limit (%llu) reached: closing a new connection",
                    (unsigned long long)w->limits->connections);
        kh_conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0)
        peer_from_sockaddr(&c->peer, &ss);
    if (tls) {
        /* The protocol starts once the handshake has picked it (kh_conn_start_proto). */
        c->tls = kh_tls_new(tls, c);
        if (c->tls == NULL) {
            KH_LOG_WARN("tls: cannot create a session: closing a new connection");
            kh_conn_close(c);
            return;
        }
        kh_conn_set_timeout(c, KH_TO_TLS_HANDSHAKE);
    } else {
        kh_conn_start_proto(c, NULL, 0);
    }
    start_reading(c);
}

/* Offers the unconsumed input to the protocol; data is either the slab (fresh bytes, `in`
 * empty) or `in` itself. Whatever the protocol leaves is kept in `in`. */
static void feed(kh_conn *c, char *data, size_t n, int from_in)
{
    size_t used = c->proto->on_read(c, data, n);
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    if (from_in) {
        kh_buf_consume(&c->in, used);
    } else if (used < n) {
        kh_buf_append(&c->in, &c->w->bufs, data + used, n - used);
    }
    if (c->in.len == 0)
        kh_buf_release(&c->in, &c->w->bufs);
    if (c->flags & KH_CONN_F_PAUSED)
        stop_reading(c);
}

/* Ciphertext in: kh_tls appends the plaintext to `in`, which the protocol is offered as usual. */
static void tls_read(kh_conn *c, const char *p, size_t n)
{
    size_t before = c->in.len;
    int r = kh_tls_read(c->tls, p, n);
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    if (r < 0) {
        /* Peer garbage or a failed handshake: send the alert OpenSSL queued, then close. */
        kh_conn_set_timeout(c, KH_TO_NONE);
        kh_conn_close_after_write(c);
        return;
    }
    if (c->in.len > before)
        c->flags |= KH_CONN_F_HAS_INPUT;
    if (c->in.len && c->proto && before) {
        feed(c, c->in.base, c->in.len, 1); /* as read_cb does when `in` held bytes already */
    } else if (c->in.len && c->proto) {
        /* Fresh plaintext only: offer it the way read_cb offers the slab, with `in` empty while
         * the protocol looks (h1 reads in.len as "bytes of a next request are waiting"); what
         * it leaves is copied back into `in`. */
        kh_buf plain = c->in;
        memset(&c->in, 0, sizeof c->in);
        feed(c, plain.base, plain.len, 0);
        kh_buf_release(&plain, &c->w->bufs);
    } else if (c->flags & KH_CONN_F_PAUSED) {
        stop_reading(c);
    }
    if (r == 1 && !(c->flags & KH_CONN_F_CLOSING)) {
        stop_reading(c); /* close_notify: no more input, as with a FIN */
        c->flags |= KH_CONN_F_EOF;
        if (c->proto && c->proto->on_eof)
            c->proto->on_eof(c);
        else
            kh_conn_close(c);
    }
}

static void read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
    kh_conn *c = st->data;
    if (n == 0)
        return;
    if (n < 0) {
        stop_reading(c);
        c->flags |= KH_CONN_F_EOF;
        if (c->flags & KH_CONN_F_LINGERING) {
            kh_conn_close(c);
            return;
        }
        if (n != UV_EOF)
            KH_LOG_DEBUG("c%u read: %s", c->id, uv_strerror((int)n));
        if (n == UV_EOF && c->proto && c->proto->on_eof)
            c->proto->on_eof(c);
        else
            kh_conn_close(c);
        return;
    }
    if (c->flags & KH_CONN_F_LINGERING)
        return; /* draining after an error reply: the bytes are dropped */
    if (c->tls) {
        tls_read(c, b->base, (size_t)n);
    } else {
        c->flags |= KH_CONN_F_HAS_INPUT;
        if (c->in.len) {
            kh_buf_append(&c->in, &c->w->bufs, b->base, (size_t)n);
            feed(c, c->in.base, c->in.len, 1);
        } else {
            feed(c, b->base, (size_t)n, 0);
        }
    }
    /* Answers to everything this read carried leave now, in one write: waiting for the flush
     * pass would hold the first connection of a busy turn until the last one was handled
     * (bench: p99 at 256 connections). Late answers (from waits) still go by the flush pass.
     * Over TLS the handshake flight leaves the same way. */
    if ((c->out.len || c->tls) && !(c->flags & KH_CONN_F_CLOSING))
        kh__conn_flush(c);
}

void kh_conn_pause(kh_conn *c)
{
    c->flags |= KH_CONN_F_PAUSED;
}

void kh_conn_resume(kh_conn *c)
{
    c->flags &= ~KH_CONN_F_PAUSED;
    c->flags |= KH_CONN_F_REFEED;
    kh_worker_schedule_flush(c->w, c);
}

char *kh_conn_out_reserve(kh_conn *c, size_t n)
{
    return kh_buf_reserve(&c->out, &c->w->bufs, n);
}

void kh_conn_out_commit(kh_conn *c, size_t n)
{
    c->out.len += n;
    kh_worker_schedule_flush(c->w, c);
}

size_t kh_conn_out_pending(const kh_conn *c)
{
    size_t n = c->out.len;
    if (c->writing)
        n += c->writing->buf.len - c->writing->off;
    return n;
}

void kh_conn_write(kh_conn *c, const void *p, size_t n)
{
    kh_buf_append(&c->out, &c->w->bufs, p, n);
    kh_worker_schedule_flush(c->w, c);
}

static void apply_timer(kh_conn *c)
{
    int kind = c->writing ? KH_TO_WRITE : c->timer_kind;
    if (c->flags & KH_CONN_F_LINGERING)
        kind = KH_TO_LINGER;
    if (kind == KH_TO_NONE || (c->flags & KH_CONN_F_CLOSING))
        kh_timer_remove(&c->timer);
    else
        kh_timeq_add(&c->w->timeq[kind], &c->timer, uv_now(&c->w->loop));
}

void kh_conn_set_timeout(kh_conn *c, int kind)
{
    c->timer_kind = (uint8_t)kind;
    apply_timer(c);
}

void kh__conn_on_timer(kh_timer *t, int kind)
{
    kh_conn *c = KH_CONTAINER_OF(t, kh_conn, timer);
    /* a write libuv holds has stalled; KH_TO_WRITE without one was set by the protocol (h2: a
     * response held back by the peer's window) and is the protocol's to handle */
    if (kind == KH_TO_WRITE && c->writing) {
        KH_LOG_DEBUG("c%u write stalled: closing", c->id);
        kh_conn_close(c);
    } else if (kind == KH_TO_LINGER) {
        kh_conn_close(c);
    } else if (kind == KH_TO_TLS_HANDSHAKE) {
        KH_LOG_DEBUG("c%u tls handshake timed out: closing", c->id);
        kh_conn_close(c);
    } else {
        c->proto->on_timeout(c, kind);
    }
}

/* TLS: close_notify before the close on the paths that close at once too (timeouts, graceful
 * stop, the peer's close_notify, a FIN), as RFC 8446 §6.1 asks; one try, no wait. Not after a
 * fatal alert (kh_tls knows), and not when a write is pending or plaintext is unsent: then the
 * connection ends mid-response, and close_notify would make a truncation look complete. */
static void close_notify_now(kh_conn *c)
{
    if (c->tls == NULL || c->writing || c->out.len || !kh_tls_close_notify(c->tls))
        return;
    kh_buf *src = kh_tls_write(c->tls, &c->out);
    if (src && src->len) {
        uv_buf_t b = uv_buf_init(src->base, (unsigned)src->len);
        uv_try_write((uv_stream_t *)&c->tcp, &b, 1); /* what does not fit is dropped */
    }
}

void kh_conn_close(kh_conn *c)
{
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    c->flags |= KH_CONN_F_CLOSING;
    kh_timer_remove(&c->timer);
    close_notify_now(c);
    if (c->proto && c->proto->on_close)
        c->proto->on_close(c);
    stop_reading(c);
    /* A pending write gets UV_ECANCELED before on_close runs, and frees its own op. */
    uv_close((uv_handle_t *)&c->tcp, on_close);
}

static void on_close(uv_handle_t *h)
{
    kh_conn *c = h->data;
    kh_worker *w = c->w;
    kh_buf_release(&c->in, &w->bufs);
    kh_buf_release(&c->out, &w->bufs);
    kh_tls_free(c->tls, &w->bufs);
    /* a close callback runs after this turn's flush pass, but the conn may have been queued
     * again since */
    kh_worker_unschedule_flush(w, c);
    free(c);
    w->num_conns--;
    if (w->stopping && w->num_conns == 0)
        uv_async_send(&w->wakeup); /* let the worker finish its stop now */
}

static void shutdown_cb(uv_shutdown_t *req, int status)
{
    kh_conn *c = req->data;
    free(req);
    if (c->flags & KH_CONN_F_CLOSING)
        return; /* UV_ECANCELED from uv_close */
    /* A failed shutdown (ENOTCONN: the peer already reset) has nothing left to drain; before,
     * this returned and left the connection open with no timer until the grace period. */
    if (status != 0 || (c->flags & KH_CONN_F_EOF) || c->w->limits->lingering_close_ms == 0) {
        kh_conn_close(c);
        return;
    }
    /* Lingering close (nginx's lingering_close): after our FIN, read and drop what the client
     * still sends, so that closing with unread input does not turn into an RST that destroys
     * the error reply before the client reads it. */
    c->flags |= KH_CONN_F_LINGERING;
    c->flags &= ~KH_CONN_F_PAUSED;
    apply_timer(c);
    start_reading(c);
}

static void start_lingering_close(kh_conn *c)
{
    uv_shutdown_t *req = kh_xmalloc(sizeof *req);
    req->data = c;
    if (uv_shutdown(req, (uv_stream_t *)&c->tcp, shutdown_cb) != 0) {
        free(req);
        kh_conn_close(c);
    }
}

void kh_conn_close_after_write(kh_conn *c)
{
    c->flags |= KH_CONN_F_CLOSE_AFTER_WRITE;
    kh_worker_schedule_flush(c->w, c);
}

static void write_cb(uv_write_t *req, int status)
{
    kh_write_op *op = KH_CONTAINER_OF(req, kh_write_op, req);
    kh_conn *c = op->c;
    kh_buf_release(&op->buf, &c->w->bufs);
    free(op);
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    c->writing = NULL;
    if (status != 0) {
        KH_LOG_DEBUG("c%u write: %s", c->id, uv_strerror(status));
        kh_conn_close(c);
        return;
    }
    apply_timer(c);
    kh_worker_schedule_flush(c->w, c);
}

/* Writes c->out (over TLS: the ciphertext kh_tls made of it): try the socket directly first
 * (most responses leave in this one syscall), then hand the rest to libuv with the buffer moved
 * into the write op. */
static void write_out(kh_conn *c)
{
    if (c->writing)
        return;
    kh_buf *src = c->tls ? kh_tls_write(c->tls, &c->out) : &c->out;
    if (src == NULL) {
        kh_conn_close(c);
        return;
    }
    if (src->len == 0)
        return;
    uv_buf_t b = uv_buf_init(src->base, (unsigned)src->len);
    int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n == (int)src->len) {
        src->len = 0;
        kh_buf_release(src, &c->w->bufs);
        return;
    }
    if (n < 0 && n != UV_EAGAIN) {
        KH_LOG_DEBUG("c%u write: %s", c->id, uv_strerror(n));
        kh_conn_close(c);
        return;
    }
    kh_write_op *op = kh_xmalloc(sizeof *op);
    op->c = c;
    op->buf = *src;
    op->off = n > 0 ? (size_t)n : 0;
    memset(src, 0, sizeof *src);
    uv_buf_t rest = uv_buf_init(op->buf.base + op->off, (unsigned)(op->buf.len - op->off));
    int r = uv_write(&op->req, (uv_stream_t *)&c->tcp, &rest, 1, write_cb);
    if (r != 0) {
        kh_buf_release(&op->buf, &c->w->bufs);
        free(op);
        kh_conn_close(c);
        return;
    }
    c->writing = op;
    apply_timer(c);
}

void kh__conn_flush(kh_conn *c)
{
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    if ((c->flags & KH_CONN_F_REFEED) && !(c->flags & KH_CONN_F_PAUSED)) {
        c->flags &= ~KH_CONN_F_REFEED;
        if (c->in.len)
            feed(c, c->in.base, c->in.len, 1);
        if (c->flags & KH_CONN_F_CLOSING)
            return;
        if (!(c->flags & KH_CONN_F_PAUSED) && !(c->flags & KH_CONN_F_CLOSE_AFTER_WRITE))
            start_reading(c);
    }
    int more = 0;
    if (c->proto && c->proto->on_flush) {
        more = c->proto->on_flush(c);
        if (c->flags & KH_CONN_F_CLOSING)
            return;
    }
    write_out(c);
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    if (more && !c->writing)
        kh_worker_schedule_flush(c->w, c);
    if ((c->flags & KH_CONN_F_CLOSE_AFTER_WRITE) && !c->writing && c->out.len == 0 &&
        !(c->flags & KH_CONN_F_LINGERING)) {
        /* TLS: close_notify goes out before our FIN (RFC 8446 §6.1), so that the peer can
         * tell a complete response from a truncation. */
        if (c->tls && kh_tls_close_notify(c->tls)) {
            write_out(c);
            if ((c->flags & KH_CONN_F_CLOSING) || c->writing)
                return; /* write_cb schedules the next flush */
        }
        c->flags &= ~KH_CONN_F_CLOSE_AFTER_WRITE;
        stop_reading(c);
        start_lingering_close(c);
    }
}
