/* kh_conn.c: TCP connection I/O and lifecycle (see kh_conn.h).
 * Owns:  the socket and the bytes around it; frees itself only in uv_close's callback. On a
 *        TLS listener the bytes on the socket are ciphertext: read_cb hands them to kh_tls_read
 *        (plaintext lands in `in`), write_out writes what kh_tls_write made of `out`, and every
 *        close sends close_notify first (in the same write as the last bytes, after the last
 *        write, or in one try from kh_conn_close); everything else is the same for both. File bodies (cleartext only,
 *        kh_conn_sendfile) go out in queue order by file_out: the bytes queued before each
 *        with send(MSG_MORE), then sendfile(2); a full socket is waited on by a uv_poll on a
 *        dup of the fd, with the same stall checks as a pending uv_write.
 *        Closing after a response: kh_conn_close_after_write shuts the socket down for writing
 *        (FIN; shutdown(2) at once, reading left on: start_lingering_close) and reads and drops
 *        input until the peer's FIN or lingering_close_ms; when the
 *        protocol has read its whole input and none is left unread (kh_conn_end_after_write,
 *        may_close_now) the socket is closed at once instead (one close(2); bench/perconn.sh,
 *        one `Connection: close` GET per connection: 12.5 -> 7.4 syscalls per connection, no
 *        shutdown, no second read, two epoll_ctl fewer).
 *        libuv takes the socket only when it has to wait on it: an accepted fd stays ours
 *        (c->fd, KH_CONN_F_OPEN clear) until the connection first reads through libuv, queues
 *        a uv_write or shuts down (open_handle: uv_tcp_open). Before that it is read, written
 *        and closed with plain syscalls: with TCP_DEFER_ACCEPT (kh_accept.c) the request is
 *        already in when the connection is accepted (read_now), and a `Connection: close`
 *        exchange answered in that turn is accept4, read, send, close, with no ioctl(FIONBIO)
 *        (uv_tcp_open's; accept4 made the fd non-blocking) and no epoll_ctl ADD or DEL
 *        (bench/perconn.sh: 7.45 -> 4.02 syscalls and 9,439 -> 8,650 user instructions per
 *        connection; nginx + lua: 6.0 and ~17,000).
 * In:    libuv read/write callbacks, the worker's flush pass and timeouts.
 * Out:   kh_proto_vt calls; bytes to the socket.
 * Never: parses HTTP, calls Lua, or frees memory that a callback on the stack still uses. */
#include "kh_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kh_asan.h"
#include "kh_err.h"
#include "kh_log.h"
#include "kh_proto.h"
#include "kh_tls.h"

/* The one write libuv holds for a connection: the bytes must live until write_cb (libuv).
 * uv_write calls back only once the whole buffer is in the kernel, which for a slow reader can
 * take far longer than write_timeout_ms while bytes flow all along; so the write timeout does
 * not time the op. While an op is pending the conn's timer sits in the KH_TO_WRITE_CHECK queue
 * (write_timeout_ms / 4); each check compares what the peer has not acknowledged yet (libuv's
 * queue plus the kernel's send queue, SIOCOUTQ) with the last check: less is progress. The
 * connection is closed once write_timeout_ms passes with no progress, i.e. after a stall of
 * write_timeout_ms to 1.25 x that (plus the tick). Why not write in bounded pieces instead: a
 * piece completes when it enters the kernel, and a full send buffer (autotuned to MBs) wakes
 * the writer only after a third of it drained, so a steady 100 KB/s reader can show no
 * completion for many seconds; pieces would also cost a loop turn each (write_cb is deferred)
 * on fast large responses. The checks cost nothing on the keep-alive fast path: a response
 * that leaves in uv_try_write arms no check, and one that completes within a check interval
 * never makes the ioctl (bench/callgrind.sh, hello world: 7,515 / 7,594 / 7,581 instructions
 * per request before, 7,614 / 7,567 / 7,569 after, i.e. within its noise; bench/http1.sh was
 * too noisy on the shared 2-core box to show anything either way). */
typedef struct kh_write_op {
    uv_write_t req;
    kh_conn *c;
    kh_buf buf;
    size_t off;
    size_t unacked;       /* what unacked() returned at the last progress */
    uint64_t progress_ms; /* loop time of the last progress (the op's start, at first) */
} kh_write_op;

/* A file body queued by kh_conn_sendfile: the bytes queued before it (head, moved out of `out`
 * when it was queued), then `left` bytes of fd from `off`. Ops form a list in queue order; the
 * bytes in `out` come after the last one. */
typedef struct kh_file_op {
    kh_conn *c;
    struct kh_file_op *next;
    kh_buf head;
    size_t hoff;
    int fd;
    int pfd;              /* dup of the socket's fd for `poll`, -1 until the first EAGAIN */
    int polling;          /* waits for the socket to be writable */
    int64_t off;
    uint64_t left;
    size_t unacked;       /* progress checks, as in kh_write_op */
    uint64_t progress_ms;
    uv_poll_t poll;
} kh_file_op;

/* The queue of file bodies hangs off the handle's user pointer, tcp.data: they are rare (h1
 * cleartext responses from k.static / res:file), and a pointer of their own made kh_conn 448
 * bytes instead of 440 (memory per idle WebSocket, bench/README.md). Nothing else uses
 * tcp.data: the libuv callbacks find the connection as the struct that starts with tcp. */
static inline kh_file_op *files(const kh_conn *c)
{
    return c->tcp.data;
}

static inline void set_files(kh_conn *c, kh_file_op *f)
{
    c->tcp.data = f;
}

_Static_assert(offsetof(kh_conn, tcp) == 0, "a libuv callback's handle is its kh_conn");
#define CONN_OF(h) ((kh_conn *)(void *)(h))

static void on_close(uv_handle_t *h);
static void file_op_free(kh_file_op *f);
static void set_nodelay(kh_conn *c);
static void read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *b);
static void read_now(kh_conn *c);

#define READ_SLAB 65536 /* bytes of the worker's read slab a read may fill */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    kh_conn *c = CONN_OF(h);
    /* Lend the worker's slab: read_cb consumes or copies before the next read can start. */
    b->base = c->w->read_slab;
    b->len = READ_SLAB;
}

/* Hands the socket to libuv (once), for a read, a queued write or a shutdown to wait on. */
static int open_handle(kh_conn *c)
{
    if (KH_LIKELY(c->flags & KH_CONN_F_OPEN))
        return 0;
    int r = uv_tcp_open(&c->tcp, c->fd);
    if (r != 0) {
        KH_LOG_DEBUG("c%u uv_tcp_open: %s", c->id, uv_strerror(r));
        return r;
    }
    c->flags |= KH_CONN_F_OPEN;
    return 0;
}

static void start_reading(kh_conn *c)
{
    if (c->flags & (KH_CONN_F_READING | KH_CONN_F_CLOSING | KH_CONN_F_EOF))
        return;
    if (open_handle(c) != 0) {
        kh_conn_close(c);
        return;
    }
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) == 0)
        c->flags |= KH_CONN_F_READING;
}

/* send(2) on the socket, as uv_try_write does (libuv holds no write of ours when this runs).
 * Returns the bytes taken, UV_EAGAIN, or another UV_E* code. Through syscall(2), not glibc's
 * send(): that one is a thread-cancellation point, and in a process with threads it brackets
 * the call with enabling and disabling asynchronous cancellation, which no khamsin thread ever
 * uses: 4,248 -> 4,209 instructions per h1 hello request (REQUESTS=20000 CONNS=64
 * bench/callgrind.sh). Under ASan it stays send(), whose interceptor checks the buffer read. */
static int send_now(kh_conn *c, const char *p, size_t n, int flags)
{
    ssize_t r;
    do
#ifdef KH_ASAN
        r = send(c->fd, p, n, flags | MSG_NOSIGNAL);
#else
        r = syscall(SYS_sendto, c->fd, p, n, flags | MSG_NOSIGNAL, NULL, 0);
#endif
    while (r < 0 && errno == EINTR);
    if (r >= 0)
        return (int)r;
    return (errno == EAGAIN || errno == EWOULDBLOCK) ? UV_EAGAIN : -errno;
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

static void wc_flush(kh_wconn *wc)
{
    kh__conn_flush(KH_CONTAINER_OF(wc, kh_conn, wc));
}

static void wc_shutdown(kh_wconn *wc)
{
    kh_conn *c = KH_CONTAINER_OF(wc, kh_conn, wc);
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    if (c->proto && c->proto->on_shutdown)
        c->proto->on_shutdown(c);
    else if (c->proto == NULL)
        kh_conn_close(c); /* still in its TLS handshake: no request to finish */
}

static void wc_close(kh_wconn *wc)
{
    kh_conn_close(KH_CONTAINER_OF(wc, kh_conn, wc));
}

static const kh_wconn_vt conn_wc_vt = {wc_flush, wc_shutdown, wc_close};

const char *kh_conn_alt_svc(const kh_stream *s)
{
    const kh_conn *c = s->proto;
    const kh_listen_addr *la = &c->w->cfg->listens[c->listener];
    return la->alt_svc[0] ? la->alt_svc : NULL;
}

int kh_conn_accept(kh_worker *w, int fd, const struct sockaddr_storage *peer, kh_tls_ctx *tls,
                   int listener)
{
    kh_conn *c = kh_slab_alloc(&w->conn_slab, sizeof *c);
    memset(c, 0, sizeof *c);
    c->w = w;
    uv_tcp_init(&w->loop, &c->tcp); /* opened on fd later, if ever (open_handle) */
    set_files(c, NULL);
    c->fd = fd;
    kh_worker_conn_add(w, &c->wc, &conn_wc_vt);
    c->id = ++w->next_conn_id;
    c->listener = (uint8_t)listener;
    /* kh_accept pauses accepting at the `connections` limit and while stopping. TCP_NODELAY
     * waits for the connection's second write (see before_write): most connections that make
     * only one never need it. */
    peer_from_sockaddr(&c->peer, peer);
    if (tls) {
        /* The protocol starts once the handshake has picked it (kh_proto_start). */
        c->tls = kh_tls_new(tls, c);
        if (c->tls == NULL) {
            KH_LOG_WARN("tls: cannot create a session: closing a new connection");
            kh_conn_close(c);
            return 0;
        }
        kh_conn_set_timeout(c, KH_TO_TLS_HANDSHAKE);
    } else {
        kh_proto_start(c, NULL, 0);
    }
    if (w->limits->defer_accept_s)
        read_now(c); /* TCP_DEFER_ACCEPT: the first bytes are (nearly always) in */
    else
        start_reading(c);
    return 0;
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
    kh_conn *c = CONN_OF(st);
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
    /* a short read: the socket had nothing more (libuv reads again only after a full one) */
    if ((size_t)n < b->len)
        c->flags |= KH_CONN_F_DRAINED;
    else
        c->flags &= ~KH_CONN_F_DRAINED;
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

/* A read without waiting for epoll, right after accept: read_cb's work, then reading goes on
 * through libuv as read_cb would leave it (unless the connection closed or paused its input,
 * as a `Connection: close` request answered at once does). Nothing there yet (EAGAIN): one
 * read(2) wasted, and libuv waits as usual. */
static void read_now(kh_conn *c)
{
    ssize_t n;
    do
        n = read(c->fd, c->w->read_slab, READ_SLAB);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        start_reading(c);
        return;
    }
    uv_buf_t b = uv_buf_init(c->w->read_slab, READ_SLAB);
    read_cb((uv_stream_t *)&c->tcp, n > 0 ? n : n == 0 ? UV_EOF : -errno, &b);
    if (!(c->flags & (KH_CONN_F_CLOSING | KH_CONN_F_PAUSED)))
        start_reading(c);
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
    for (const kh_file_op *f = files(c); f; f = f->next)
        n += f->head.len - f->hoff + (size_t)f->left;
    return n;
}

void kh_conn_write(kh_conn *c, const void *p, size_t n)
{
    kh_buf_append(&c->out, &c->w->bufs, p, n);
    kh_worker_schedule_flush(c->w, c);
}

/* Bytes written by the app and not yet acknowledged by the peer: libuv's write queue plus the
 * socket's send queue (Linux SIOCOUTQ: unsent + unacknowledged; 0 where unsupported, then only
 * libuv's queue counts). Over TLS, ciphertext bytes. */
static size_t unacked(kh_conn *c)
{
    size_t n = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    int q = 0;
    if (ioctl(c->fd, SIOCOUTQ, &q) == 0 && q > 0)
        n += (size_t)q;
    return n;
}

static void apply_timer(kh_conn *c)
{
    /* a pending write keeps its progress checks (write_out arms them); the protocol's kind is
     * recorded in timer_kind and applies again when the write completes */
    if ((c->writing || (files(c) && files(c)->polling)) &&
        !(c->flags & (KH_CONN_F_LINGERING | KH_CONN_F_CLOSING)))
        return;
    int kind = c->timer_kind;
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
    /* KH_TO_WRITE is the protocol's (h2: a response held back by the peer's window); the
     * socket's own write stalls are timed by KH_TO_WRITE_CHECK */
    if (kind == KH_TO_WRITE_CHECK) {
        size_t *ua;
        uint64_t *pm;
        if (c->writing) {
            ua = &c->writing->unacked;
            pm = &c->writing->progress_ms;
        } else if (files(c) && files(c)->polling) {
            ua = &files(c)->unacked;
            pm = &files(c)->progress_ms;
        } else {
            apply_timer(c);
            return;
        }
        uint64_t now = uv_now(&c->w->loop);
        size_t left = unacked(c);
        if (left < *ua) {
            *ua = left;
            *pm = now;
        }
        if (now - *pm >= c->w->limits->write_timeout_ms) {
            KH_LOG_DEBUG("c%u write stalled (%zu bytes unacknowledged for %llu ms): closing",
                         c->id, left, (unsigned long long)(now - *pm));
            kh_conn_close(c);
            return;
        }
        kh_timeq_add(&c->w->timeq[KH_TO_WRITE_CHECK], &c->timer, now);
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
    if (src && src->len)
        send_now(c, src->base, src->len, 0); /* what does not fit is dropped */
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
    while (files(c)) {
        kh_file_op *f = files(c);
        set_files(c, f->next);
        file_op_free(f);
    }
    /* A pending write gets UV_ECANCELED before on_close runs, and frees its own op. A handle
     * never opened has no fd to close and none to take off epoll: the fd is closed here. */
    if (!(c->flags & KH_CONN_F_OPEN))
        close(c->fd);
    uv_close((uv_handle_t *)&c->tcp, on_close);
}

static void on_close(uv_handle_t *h)
{
    kh_conn *c = CONN_OF(h);
    kh_worker *w = c->w;
    kh_buf_release(&c->in, &w->bufs);
    kh_buf_release(&c->out, &w->bufs);
    kh_tls_free(c->tls, &w->bufs);
    kh_worker_conn_remove(w, &c->wc);
    kh_slab_free(&w->conn_slab, c);
}

/* Lingering close (nginx's lingering_close): our FIN, then read and drop what the client still
 * sends, so that closing with unread input does not turn into an RST that destroys the reply
 * before the client reads it (RFC 9112 §9.6). Runs from kh__conn_flush once nothing is queued
 * (no write held by libuv, no file body, `out` empty), so shutdown(2) is called here directly
 * instead of by uv_shutdown, whose callback comes a loop turn later. Reading goes on as it was:
 * stopping it first and starting it again made libuv's epoll_ctl ADD fail (EEXIST: libuv leaves
 * a stopped fd in the epoll set) and fall back to MOD, two epoll_ctl per lingering close. No
 * shutdown when it would be followed by the close at once: the peer's FIN or reset was seen
 * (nothing more can come), or lingering is off (shutdown then close sends what close sends). A
 * failed shutdown (ENOTCONN: the peer's reset arrived since the last read) has nothing left to
 * drain either. */
static void start_lingering_close(kh_conn *c)
{
    if ((c->flags & KH_CONN_F_EOF) || c->w->limits->lingering_close_ms == 0 ||
        shutdown(c->fd, SHUT_WR) != 0) {
        kh_conn_close(c);
        return;
    }
    c->flags |= KH_CONN_F_LINGERING;
    c->flags &= ~KH_CONN_F_PAUSED;
    apply_timer(c);
    start_reading(c); /* opens the handle if need be; no-op while it reads */
}

void kh_conn_close_after_write(kh_conn *c)
{
    c->flags |= KH_CONN_F_CLOSE_AFTER_WRITE;
    kh_worker_schedule_flush(c->w, c);
}

static void file_poll_closed(uv_handle_t *h)
{
    kh_file_op *f = h->data;
    close(f->pfd);
    free(f);
}

/* Closes the file and frees the op (after its poll handle closed, when it has one). */
static void file_op_free(kh_file_op *f)
{
    close(f->fd);
    kh_buf_release(&f->head, &f->c->w->bufs);
    if (f->pfd >= 0)
        uv_close((uv_handle_t *)&f->poll, file_poll_closed);
    else
        free(f);
}

void kh_conn_sendfile(kh_conn *c, int fd, int64_t off, uint64_t n)
{
    kh_file_op *f = kh_xcalloc(1, sizeof *f);
    f->c = c;
    f->fd = fd;
    f->pfd = -1;
    f->off = off;
    f->left = n;
    f->head = c->out; /* what is queued now goes first */
    memset(&c->out, 0, sizeof c->out);
    kh_file_op *last = files(c);
    if (last == NULL) {
        set_files(c, f);
    } else {
        while (last->next)
            last = last->next;
        last->next = f;
    }
    kh_worker_schedule_flush(c->w, c);
}

static void file_writable(uv_poll_t *p, int status, int events)
{
    (void)events;
    kh_file_op *f = p->data;
    kh_conn *c = f->c;
    uv_poll_stop(p);
    f->polling = 0;
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    if (status != 0) {
        KH_LOG_DEBUG("c%u sendfile poll: %s", c->id, uv_strerror(status));
        kh_conn_close(c);
        return;
    }
    apply_timer(c);
    kh__conn_flush(c);
}

/* The socket took no more: wait until it is writable, with the write progress checks. */
static int file_wait(kh_conn *c, kh_file_op *f, int sfd)
{
    if (f->pfd < 0) {
        f->pfd = dup(sfd);
        if (f->pfd < 0)
            return -1;
        if (uv_poll_init(&c->w->loop, &f->poll, f->pfd) != 0) {
            close(f->pfd);
            f->pfd = -1;
            return -1;
        }
        f->poll.data = f;
    }
    if (uv_poll_start(&f->poll, UV_WRITABLE, file_writable) != 0)
        return -1;
    f->polling = 1;
    f->unacked = unacked(c);
    uv_update_time(&c->w->loop);
    f->progress_ms = uv_now(&c->w->loop);
    kh_timeq_add(&c->w->timeq[KH_TO_WRITE_CHECK], &c->timer, f->progress_ms);
    return 0;
}

/* Sends the queued file bodies in order (each: the bytes before it with MSG_MORE, then the file
 * with sendfile until the socket takes no more). Returns 1 while a file body is still queued
 * (sending waits for the socket or for `writing`), 0 when none is left, -1 after closing. */
static int file_out(kh_conn *c)
{
    int sfd = c->fd;
    while (files(c)) {
        kh_file_op *f = files(c);
        if (c->writing || f->polling)
            return 1;
        /* a body in several writes: its last short segment must not wait for Nagle */
        if (!(c->flags & KH_CONN_F_NODELAY))
            set_nodelay(c);
        c->flags |= KH_CONN_F_WROTE;
        while (f->hoff < f->head.len) {
            ssize_t n = send(sfd, f->head.base + f->hoff, f->head.len - f->hoff,
                             MSG_NOSIGNAL | MSG_DONTWAIT | (f->left ? MSG_MORE : 0));
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && errno != EAGAIN) {
                KH_LOG_DEBUG("c%u write: %s", c->id, strerror(errno));
                kh_conn_close(c);
                return -1;
            }
            if (n < 0)
                goto wait;
            f->hoff += (size_t)n;
        }
        while (f->left) {
            size_t want = f->left > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)f->left;
            off_t off = (off_t)f->off;
            ssize_t n = sendfile(sfd, f->fd, &off, want);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && errno == EAGAIN)
                goto wait;
            if (n <= 0) {
                /* n == 0: the file shrank after its length was promised; the reply cannot end */
                KH_LOG_WARN("c%u sendfile: %s: closing", c->id,
                            n == 0 ? "the file shrank during the reply" : strerror(errno));
                kh_conn_close(c);
                return -1;
            }
            f->off += n;
            f->left -= (uint64_t)n;
        }
        set_files(c, f->next);
        file_op_free(f);
        /* the protocol may wait for the queue to go down (h1: pipelined requests): look again */
        kh_worker_schedule_flush(c->w, c);
        continue;
    wait:
        if (file_wait(c, f, sfd) != 0) {
            kh_conn_close(c);
            return -1;
        }
        return 1;
    }
    return 0;
}

void kh_conn_end_after_write(kh_conn *c)
{
    c->flags |= KH_CONN_F_CLOSE_AFTER_WRITE | KH_CONN_F_INPUT_DONE;
    kh_worker_schedule_flush(c->w, c);
}

/* kh_conn_end_after_write's test, once everything is written: may the socket close without
 * lingering? Only if no byte the peer sent is left unread, in `in` or (as far as the last read
 * could tell) in the socket: close(2) with unread input sends RST instead of FIN, and an RST can
 * destroy the response before the client reads it. A byte that arrives after the last read
 * still does that, as it does for nginx; a client that sent `Connection: close` sends nothing
 * more. Over TLS the peer answers close_notify with its own, which lingering reads. */
static int may_close_now(const kh_conn *c)
{
    return (c->flags & KH_CONN_F_INPUT_DONE) && c->tls == NULL && c->in.len == 0 &&
           (c->flags & (KH_CONN_F_DRAINED | KH_CONN_F_EOF));
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

/* Nagle's algorithm (TCP_NODELAY off) holds a small segment back while an earlier small one is
 * unacknowledged (Linux: Minshall's variant), so a connection's first write always leaves at
 * once; a later one could wait for the client's delayed ACK (up to 40 ms). So TCP_NODELAY is
 * set just before a connection's second write, as nginx sets it when a connection goes
 * keep-alive: a `Connection: close` exchange (one write) spares the setsockopt. A connection's
 * last write (write_out's `last`: the FIN follows at once) spares it too: shutdown(2) and
 * close(2) push what Nagle would hold with the FIN (Linux tcp_send_fin: TCP_NAGLE_OFF); over
 * TLS that is the response after the handshake flight (s_time -new/-reuse: one setsockopt
 * fewer per connection). Bytes handed to libuv (uv_write) may leave in several writes:
 * TCP_NODELAY goes first then too. */
static void set_nodelay(kh_conn *c)
{
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* as uv_tcp_nodelay does */
    c->flags |= KH_CONN_F_NODELAY;
}

static void before_write(kh_conn *c, int last)
{
    if (KH_LIKELY(c->flags & KH_CONN_F_NODELAY))
        return;
    if ((c->flags & KH_CONN_F_WROTE) && !last)
        set_nodelay(c);
    c->flags |= KH_CONN_F_WROTE;
}

/* The connection's last bytes, when kh__conn_flush closes the socket right after them
 * (may_close_now): sent with MSG_MORE, so that the kernel holds a short tail back and close(2)
 * tacks the FIN onto it (tcp_send_fin): answer and FIN leave in one segment, and the client
 * acknowledges both at once (bench/perconn.sh, TOOLS=segments: 10 -> 8 TCP segments per
 * `Connection: close` exchange; nginx sends 10). What does not fit goes through uv_write, whose
 * writes have no MSG_MORE and push it all. Returns as uv_try_write does. */
static int write_last(kh_conn *c, const kh_buf *src)
{
    return send_now(c, src->base, src->len, MSG_MORE);
}

/* Writes c->out (over TLS: the ciphertext kh_tls made of it): try the socket directly first
 * (most responses leave in this one syscall), then hand the rest to libuv with the buffer moved
 * into the write op. With `batch` (the protocol has more to send, or waits for the queue to
 * drain before it reads again) everything goes through uv_write: libuv still writes at once,
 * but its callback, which runs the next flush, comes on the next loop turn even when the socket
 * took it all. So a connection whose peer reads as fast as we write (pipelined large responses,
 * a big h2 download) moves one batch per loop turn instead of holding the whole flush pass. */
static void write_out(kh_conn *c, int batch)
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
    /* The connection's last bytes: the protocol has nothing more (close_after_write, no batch,
     * no file body, over TLS all plaintext encrypted), and if this write takes them all,
     * kh__conn_flush ends the connection right after it (close, or shutdown and linger). */
    int last = !batch && (c->flags & KH_CONN_F_CLOSE_AFTER_WRITE) && !files(c) &&
               (c->tls == NULL || c->out.len == 0);
    /* TLS: close_notify joins them now rather than in a send of its own after them
     * (kh__conn_flush; RFC 8446 §6.1): one sendto and one segment fewer per closed connection */
    if (last && c->tls)
        kh_tls_close_notify(c->tls);
    before_write(c, last);
    int n;
    if (batch)
        n = 0;
    else if ((c->flags & KH_CONN_F_CLOSE_AFTER_WRITE) && may_close_now(c))
        n = write_last(c, src);
    else
        n = send_now(c, src->base, src->len, 0); /* uv_try_write's write(2), without libuv */
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
    if (open_handle(c) != 0) {
        kh_conn_close(c);
        return;
    }
    kh_write_op *op = kh_xmalloc(sizeof *op);
    op->c = c;
    op->buf = *src;
    op->off = n > 0 ? (size_t)n : 0;
    memset(src, 0, sizeof *src);
    if (!(c->flags & KH_CONN_F_NODELAY))
        set_nodelay(c);
    uv_buf_t rest = uv_buf_init(op->buf.base + op->off, (unsigned)(op->buf.len - op->off));
    int r = uv_write(&op->req, (uv_stream_t *)&c->tcp, &rest, 1, write_cb);
    if (r != 0) {
        kh_buf_release(&op->buf, &c->w->bufs);
        free(op);
        kh_conn_close(c);
        return;
    }
    c->writing = op;
    op->unacked = unacked(c);
    /* the loop's cached time can be well behind when a handler ran long in this turn, and the
     * checks would count that time as a stall */
    uv_update_time(&c->w->loop);
    op->progress_ms = uv_now(&c->w->loop);
    kh_timeq_add(&c->w->timeq[KH_TO_WRITE_CHECK], &c->timer, op->progress_ms);
}

void kh__conn_flush(kh_conn *c)
{
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    /* read_cb flushes at once what a read produced, and the flush pass would flush it again
     * for nothing (the writes of the answer scheduled it): it is skipped unless something asks
     * for a flush after this one (~80 of ~5,190 instructions per h1 hello request) */
    kh_worker_flushed(&c->wc);
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
    if (files(c)) {
        int r = file_out(c);
        if (r != 0)
            return; /* closed, or a file body still goes first: it flushes again when done */
    }
    write_out(c, more);
    if (c->flags & KH_CONN_F_CLOSING)
        return;
    if (more && !c->writing)
        kh_worker_schedule_flush(c->w, c); /* nothing was left to write: ask again now */
    if ((c->flags & KH_CONN_F_CLOSE_AFTER_WRITE) && !c->writing && c->out.len == 0 &&
        !(c->flags & KH_CONN_F_LINGERING)) {
        /* TLS: close_notify goes out before our FIN (RFC 8446 §6.1), so that the peer can
         * tell a complete response from a truncation. */
        if (c->tls && kh_tls_close_notify(c->tls)) {
            write_out(c, 0);
            if ((c->flags & KH_CONN_F_CLOSING) || c->writing)
                return; /* write_cb schedules the next flush */
        }
        c->flags &= ~KH_CONN_F_CLOSE_AFTER_WRITE;
        if (may_close_now(c)) {
            kh_conn_close(c);
            return;
        }
        start_lingering_close(c);
    }
}
