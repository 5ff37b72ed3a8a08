/* kh_out.c: outbound connections (see kh_out.h for the interface and the rules): a connection's
 * life and its operations (the other files: kh_out_int.h).
 * Owns:  each kh_out (freed in its handles' close callback); the registry is kh_out_pool.c's.
 * States: RESOLVING -> CONNECTING -> (HANDSHAKE) -> OPEN <-> IDLE (in the pool) -> CLOSED.
 * Why a uv_timer_t per connection (style.md counts 152 B against a uv_timer_t per inbound
 * connection): outbound connections are few (outbound_sockets), and their timeouts are set by
 * the caller per operation, so the fixed-duration kh_timeq queues do not fit them.
 * The writes: one uv_write in flight; bytes that come while it is (TLS handshake records, a
 * write after a read) wait in `pend` and go in the next one. The input buffer grows to what the
 * pending read needs, capped by socket_buffer_bytes. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_common.h"
#include "kh_err.h"
#include "kh_out_int.h"

static void stop_reading(kh_out *o);
static int write_now(kh_out *o);
static void write_cb(uv_write_t *req, int status);
static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static int satisfied(kh_out *o);
static void check_read(kh_out *o);
static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void shutdown_cb(uv_shutdown_t *req, int status);

void kh__out_close_cb(uv_handle_t *h)
{
    kh_out *o = h->type == UV_TCP ? KH_CONTAINER_OF((uv_tcp_t *)h, kh_out, tcp)
                                  : KH_CONTAINER_OF((uv_timer_t *)h, kh_out, timer);
    if (h->type == UV_TCP && o->retrying) {
        o->retrying = 0;
        if (o->state != S_CLOSED) {
            kh__out_retry_connect(o); /* the handle is free again: the next address */
            return;
        }
    }
    if (--o->handles > 0)
        return;
    if (o->tls)
        kh_tls_client_free(o->tls);
    free(o->in);
    free(o->wbuf);
    free(o->pend);
    free(o);
}

void kh_out_close(kh_out *o)
{
    if (o == NULL || o->state == S_CLOSED)
        return;
    int waiter = o->state == S_WAITING;
    if (o->state == S_IDLE)
        kh__out_idle_unlink(o);
    if (o->dreq) {
        kh_dns_cancel(o->dreq);
        o->dreq = NULL;
    }
    o->op = OP_NONE;
    o->cb = NULL;
    o->state = S_CLOSED;
    uv_timer_stop(&o->timer);
    if (waiter) {
        /* a waiter has no socket; a connection already handed to it goes back (closed: the
         * next waiter, if any, then connects) */
        kh__out_kp_unqueue(o);
        if (o->handover) {
            /* the handed connection holds the slot: closing it frees it */
            kh_out *h = o->handover;
            o->handover = NULL;
            kh_out_close(h);
        } else if (o->woken) {
            o->kp->conns--; /* the slot it was given */
            kh__out_kp_slot_freed(o->kp);
        }
        uv_close((uv_handle_t *)&o->timer, kh__out_close_cb);
        return;
    }
    o->reg->open--;
    if (!o->retrying) /* else its close is under way (close_cb counts it) */
        uv_close((uv_handle_t *)&o->tcp, kh__out_close_cb);
    uv_close((uv_handle_t *)&o->timer, kh__out_close_cb);
    if (o->kp) {
        o->kp->conns--;
        kh__out_kp_slot_freed(o->kp);
    }
}

static void stop_reading(kh_out *o)
{
    if (o->reading) {
        uv_read_stop((uv_stream_t *)&o->tcp);
        o->reading = 0;
    }
}

/* The operation ends: its callback is the last thing the caller of op_done does with o (the
 * callback may resume Lua code that closes it or starts the next operation). */
void kh__out_op_done(kh_out *o, int status)
{
    kh_out_cb cb = o->cb;
    void *arg = o->arg;
    uv_timer_stop(&o->timer);
    o->op = OP_NONE;
    o->cb = NULL;
    o->arg = NULL;
    if (status != 0 && status != KH_ETIMEDOUT)
        o->broken = 1;
    if (status == KH_ETIMEDOUT && o->state != S_OPEN)
        o->broken = 1; /* a connect or handshake that timed out */
    if (o->state == S_OPEN && (o->in_len >= KEEP_READING || o->eof || o->rerr))
        stop_reading(o); /* nobody waits for that much input: TCP pushes back */
    if (cb)
        cb(o, status, arg);
}

void kh__out_timer_cb(uv_timer_t *t)
{
    kh_out *o = KH_CONTAINER_OF(t, kh_out, timer);
    if (o->state == S_WAITING) {
        kh__out_wake_waiter(o);
        return;
    }
    if (o->state == S_IDLE) {
        o->reg->evicted++;
        kh_out_close(o);
        return;
    }
    if (o->op == OP_NONE)
        return;
    if (o->op != OP_READ && o->dreq) {
        kh_dns_cancel(o->dreq);
        o->dreq = NULL;
    }
    kh__out_op_done(o, KH_ETIMEDOUT);
}

void kh__out_start_op(kh_out *o, int op, uint64_t timeout_ms, kh_out_cb cb, void *arg)
{
    o->op = op;
    o->cb = cb;
    o->arg = arg;
    if (timeout_ms != KH_OUT_NO_TIMEOUT)
        uv_timer_start(&o->timer, kh__out_timer_cb, timeout_ms, 0);
}

int kh__out_start_failed(kh_out *o, int r)
{
    uv_timer_stop(&o->timer);
    o->op = OP_NONE;
    o->cb = NULL;
    o->broken = 1;
    return r;
}

static int write_now(kh_out *o)
{
    uv_buf_t b = uv_buf_init(o->wbuf, (unsigned)o->wbuf_len);
    int r = uv_write(&o->wreq, (uv_stream_t *)&o->tcp, &b, 1, write_cb);
    if (r == 0)
        o->wbusy = 1;
    return r;
}

/* Queues n bytes for the socket: tries to write them at once, keeps the rest. */
int kh__out_send_raw(kh_out *o, const char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (o->wbusy) {
        if (o->pend_len + n > o->pend_cap) {
            size_t cap = o->pend_cap ? o->pend_cap : 4096;
            while (cap < o->pend_len + n)
                cap *= 2;
            o->pend = realloc(o->pend, cap);
            if (o->pend == NULL)
                abort();
            o->pend_cap = cap;
        }
        memcpy(o->pend + o->pend_len, p, n);
        o->pend_len += n;
        return 0;
    }
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
    int k = uv_try_write((uv_stream_t *)&o->tcp, &b, 1);
    if (k < 0 && k != UV_EAGAIN)
        return k;
    size_t done = k > 0 ? (size_t)k : 0;
    if (o->tls == NULL && o->op == OP_WRITE)
        o->written += done;
    if (done == n)
        return 0;
    free(o->wbuf);
    o->wbuf_len = n - done;
    o->wbuf = kh_xmalloc(o->wbuf_len);
    memcpy(o->wbuf, p + done, o->wbuf_len);
    return write_now(o);
}

static void write_cb(uv_write_t *req, int status)
{
    kh_out *o = KH_CONTAINER_OF(req, kh_out, wreq);
    o->wbusy = 0;
    if (o->state == S_CLOSED)
        return;
    if (status == 0 && o->tls == NULL && o->op == OP_WRITE)
        o->written += o->wbuf_len;
    free(o->wbuf);
    o->wbuf = NULL;
    o->wbuf_len = 0;
    if (status < 0) {
        o->broken = 1;
        if (o->op == OP_WRITE || o->op == OP_CONNECT || o->op == OP_TLS)
            kh__out_op_done(o, status);
        return;
    }
    if (o->pend_len) {
        o->wbuf = o->pend;
        o->wbuf_len = o->pend_len;
        o->pend = NULL;
        o->pend_len = o->pend_cap = 0;
        int r = write_now(o);
        if (r < 0 && (o->op == OP_WRITE || o->op == OP_CONNECT || o->op == OP_TLS))
            kh__out_op_done(o, r);
        return;
    }
    if (o->op == OP_WRITE) {
        o->written = o->op_len;
        kh__out_op_done(o, 0);
    }
}

char *kh__out_in_reserve(kh_out *o, size_t extra)
{
    if (o->in_cap - o->in_len < extra) {
        size_t cap = o->in_cap ? o->in_cap : READ_CHUNK;
        while (cap - o->in_len < extra)
            cap *= 2;
        o->in = realloc(o->in, cap);
        if (o->in == NULL)
            abort();
        o->in_cap = cap;
    }
    return o->in + o->in_len;
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)hint;
    kh_out *o = KH_CONTAINER_OF((uv_tcp_t *)h, kh_out, tcp);
    if (o->tls || o->state == S_IDLE) {
        /* ciphertext (or bytes an idle connection should not get) pass through the worker's
         * read slab, which is free between two callbacks */
        buf->base = o->reg->w->read_slab;
        buf->len = 65536;
        return;
    }
    buf->base = kh__out_in_reserve(o, READ_CHUNK);
    buf->len = o->in_cap - o->in_len;
}

int kh__out_start_reading(kh_out *o)
{
    if (o->reading)
        return 0;
    int r = uv_read_start((uv_stream_t *)&o->tcp, alloc_cb, read_cb);
    if (r == 0)
        o->reading = 1;
    return r;
}

/* 1 when the pending read has what it asked for (o->ready set). */
static int satisfied(kh_out *o)
{
    switch (o->rmode) {
    case KH_OUT_READ_SOME:
        o->ready = o->rn > 0 && o->rn < o->in_len ? o->rn : o->in_len;
        return o->in_len > 0;
    case KH_OUT_READ_LINE: {
        const char *nl = o->in_len ? memchr(o->in, '\n', o->in_len) : NULL;
        if (nl == NULL)
            return 0;
        o->ready = (size_t)(nl - o->in) + 1;
        return 1;
    }
    case KH_OUT_READ_N:
        o->ready = o->rn;
        return o->in_len >= o->rn;
    default: /* ALL */
        o->ready = o->in_len;
        return o->eof;
    }
}

static void check_read(kh_out *o)
{
    if (o->op != OP_READ) {
        /* input between two reads (the next reply already): kept, up to KEEP_READING */
        if (o->in_len >= KEEP_READING)
            stop_reading(o);
        return;
    }
    if (satisfied(o)) {
        kh__out_op_done(o, 0);
        return;
    }
    if (o->eof) {
        kh__out_op_done(o, UV_EOF);
        return;
    }
    if (o->rerr) {
        kh__out_op_done(o, o->rerr);
        return;
    }
    if (o->in_len >= o->reg->w->limits->socket_buffer_bytes) {
        snprintf(o->errmsg, sizeof o->errmsg, "receive buffer full (socket_buffer_bytes=%llu)",
                 (unsigned long long)o->reg->w->limits->socket_buffer_bytes);
        kh__out_op_done(o, KH_ELIMIT);
    }
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    kh_out *o = KH_CONTAINER_OF((uv_tcp_t *)s, kh_out, tcp);
    (void)buf;
    if (o->state == S_CLOSED || nread == 0)
        return;
    if (o->state == S_IDLE) {
        /* the peer closed it, or sent what nobody asked for: it cannot be reused (over TLS,
         * post-handshake messages such as session tickets are taken and the wait goes on) */
        if (o->tls && nread > 0) {
            kh_tls_client_feed(o->tls, buf->base, (size_t)nread);
            kh__out_tls_drain(o);
            if (o->in_len == 0 && !o->eof && !o->rerr)
                return;
        }
        o->reg->evicted++;
        kh_out_close(o);
        return;
    }
    if (nread < 0) {
        if (nread == UV_EOF)
            o->eof = 1;
        else
            o->rerr = (int)nread;
        stop_reading(o);
    } else if (o->tls) {
        kh_tls_client_feed(o->tls, buf->base, (size_t)nread);
        if (o->state == S_HANDSHAKE) {
            kh__out_tls_step(o);
            return;
        }
        kh__out_tls_drain(o);
    } else {
        o->in_len += (size_t)nread;
    }
    if (o->state == S_HANDSHAKE) {
        o->state = S_OPEN;
        snprintf(o->errmsg, sizeof o->errmsg, "tls: the peer closed the connection during the "
                 "handshake");
        kh__out_op_done(o, KH_EPROTO);
        return;
    }
    check_read(o);
}

int kh_out_write(kh_out *o, const char *p, size_t n, uint64_t timeout_ms, kh_out_cb cb, void *arg)
{
    if (o->state != S_OPEN || o->broken || o->shut)
        return o->shut ? UV_EPIPE : UV_ENOTCONN;
    if (o->op != OP_NONE)
        return UV_EBUSY;
    o->op_len = n;
    o->written = 0;
    o->op = OP_WRITE; /* counts `written` while sending */
    int r;
    if (o->tls) {
        r = kh_tls_client_write(o->tls, p, n);
        if (r == 0)
            r = kh__out_flush_tls(o);
    } else {
        r = kh__out_send_raw(o, p, n);
    }
    o->op = OP_NONE;
    if (r < 0) {
        o->broken = 1;
        return r;
    }
    if (!o->wbusy) {
        o->written = n;
        return 1;
    }
    kh__out_start_op(o, OP_WRITE, timeout_ms, cb, arg);
    return 0;
}

size_t kh_out_written(const kh_out *o)
{
    return o->written;
}

int kh_out_read(kh_out *o, int mode, size_t n, uint64_t timeout_ms, kh_out_cb cb, void *arg)
{
    if (o->state != S_OPEN)
        return UV_ENOTCONN;
    if (o->op != OP_NONE)
        return UV_EBUSY;
    o->rmode = mode;
    o->rn = n;
    if (satisfied(o))
        return 1;
    if (o->eof)
        return UV_EOF;
    if (o->rerr || o->broken)
        return o->rerr ? o->rerr : UV_ENOTCONN;
    kh__out_start_op(o, OP_READ, timeout_ms, cb, arg);
    int r = kh__out_start_reading(o);
    if (r < 0)
        return kh__out_start_failed(o, r);
    return 0;
}

const char *kh_out_data(const kh_out *o, size_t *len)
{
    *len = o->in_len;
    return o->in ? o->in : "";
}

int kh_out_input_ended(const kh_out *o)
{
    return o->state != S_OPEN || o->eof || o->rerr != 0;
}

size_t kh_out_ready(const kh_out *o)
{
    return o->ready;
}

void kh_out_consume(kh_out *o, size_t n)
{
    if (n >= o->in_len) {
        o->in_len = 0;
        return;
    }
    memmove(o->in, o->in + n, o->in_len - n);
    o->in_len -= n;
}

void kh_out_cancel(kh_out *o)
{
    if (o == NULL || o->op == OP_NONE)
        return;
    if (o->dreq) {
        kh_dns_cancel(o->dreq);
        o->dreq = NULL;
    }
    if (o->op != OP_READ)
        o->broken = 1;
    uv_timer_stop(&o->timer);
    o->op = OP_NONE;
    o->cb = NULL;
    o->arg = NULL;
    if (o->state == S_OPEN)
        stop_reading(o);
}

static void shutdown_cb(uv_shutdown_t *req, int status)
{
    (void)req;
    (void)status;
}

int kh_out_shutdown(kh_out *o)
{
    if (o->state != S_OPEN || o->shut)
        return UV_ENOTCONN;
    o->shut = 1;
    return uv_shutdown(&o->sreq, (uv_stream_t *)&o->tcp, shutdown_cb);
}

int kh_out_reused(const kh_out *o)
{
    return (int)o->reused;
}

int kh_out_is_tls(const kh_out *o)
{
    return o->tls != NULL;
}

const char *kh_out_alpn(const kh_out *o)
{
    return o->alpn_sel;
}

int kh_out_peer(const kh_out *o, char *ip, size_t iplen, int *port)
{
    if (o->state != S_OPEN) /* a waiter has no socket yet; a closed one none any more */
        return UV_ENOTCONN;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    int r = uv_tcp_getpeername(&o->tcp, (struct sockaddr *)&ss, &len);
    if (r < 0)
        return r;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        uv_ip4_name(a, ip, iplen);
        *port = ntohs(a->sin_port);
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, ip, iplen);
        *port = ntohs(a->sin6_port);
    }
    return 0;
}

int kh_out_setopt(kh_out *o, const char *name, int value)
{
    if (o->state != S_OPEN)
        return UV_ENOTCONN;
    if (strcmp(name, "tcp-nodelay") == 0)
        return uv_tcp_nodelay(&o->tcp, value);
    if (strcmp(name, "keepalive") == 0)
        return uv_tcp_keepalive(&o->tcp, value, 60);
    return UV_EINVAL;
}

const char *kh_out_strerror(int code, const kh_out *o)
{
    if (o && o->errmsg[0] && (code == KH_EPROTO || code == UV_EACCES || code == KH_ELIMIT ||
                              code == UV_EAI_NONAME || code == UV_EINVAL || code == UV_EBUSY))
        return o->errmsg;
    switch (code) {
    case KH_ETIMEDOUT:
        return "timeout";
    case UV_EOF:
        return "closed";
    case UV_ECONNREFUSED:
        return "connection refused";
    case UV_ECONNRESET:
        return "connection reset by peer";
    case UV_EPIPE:
        return "broken pipe";
    case UV_ENOTCONN:
        return "closed";
    case UV_EAI_NONAME:
        return "host not found";
    case UV_EACCES:
        return "refused: a private or loopback address (deny_private)";
    case KH_ELIMIT:
        return "too many outbound sockets (outbound_sockets)";
    default:
        return code <= -5000 ? kh_strerror(code) : uv_strerror(code);
    }
}
