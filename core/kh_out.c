/* kh_out.c: outbound connections (see kh_out.h for the interface and the rules).
 * Owns:  each kh_out (freed in its handles' close callback), the per-worker kh_out_reg.
 * States: RESOLVING -> CONNECTING -> (HANDSHAKE) -> OPEN <-> IDLE (in the pool) -> CLOSED.
 * Why a uv_timer_t per connection (style.md counts 152 B against a uv_timer_t per inbound
 * connection): outbound connections are few (outbound_sockets), and their timeouts are set by
 * the caller per operation, so the fixed-duration kh_timeq queues do not fit them.
 * The writes: one uv_write in flight; bytes that come while it is (TLS handshake records, a
 * write after a read) wait in `pend` and go in the next one. The input buffer grows to what the
 * pending read needs, capped by socket_buffer_bytes. */
#include "kh_out.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "kh_common.h"
#include "kh_dns.h"
#include "kh_err.h"
#include "kh_log.h"
#include "kh_tls_client.h"
#include "kh_worker.h"

enum { S_NEW = 0, S_WAITING, S_RESOLVING, S_CONNECTING, S_HANDSHAKE, S_OPEN, S_IDLE, S_CLOSED };
enum { OP_NONE = 0, OP_CONNECT, OP_TLS, OP_WRITE, OP_READ };

#define HOST_MAX 256
#define KEY_MAX 1024
#define READ_CHUNK 16384
/* Reading stays on between operations until this much input waits (then TCP pushes back):
 * stopping and restarting it around every request/reply exchange costs two epoll_ctl calls. */
#define KEEP_READING 65536

/* Connections of one key when the caller caps them (kh_out_target.pool_size): how many are
 * open (idle ones included) and who waits for one (the backlog), oldest first. */
typedef struct kpool {
    char key[KEY_MAX];
    int conns, waiting;
    kh_out *wait_head, *wait_tail;
    struct kpool *next;
} kpool;

struct kh_out_reg {
    kh_worker *w;
    kh_dns *dns;
    kpool *kpools;
    kh_out *idle_head, *idle_tail; /* the pool, oldest first */
    uint64_t open, idle, connects, reuses, evicted, max_open, max_idle;
    int closing;
};

struct kh_out {
    uv_tcp_t tcp;     /* tcp.data = the worker: kh_worker's handle walks skip it (not a kh_conn) */
    uv_timer_t timer; /* the operation's timeout, or the idle timeout in the pool */
    kh_out_reg *reg;
    int state, op;
    int handles;      /* handles still to close */
    kh_out_cb cb;
    void *arg;
    /* connect */
    struct sockaddr_storage addrs[KH_DNS_MAX_ADDRS];
    int naddr;
    int ai;           /* the address being tried; the next one after a refusal */
    int retrying;     /* tcp is closing to connect again to addrs[ai] */
    kh_dns_req *dreq;
    uv_connect_t creq;
    int deny_private;
    int port;
    char host[HOST_MAX];
    char key[KEY_MAX];
    uint32_t keyhash; /* of key: the pool's scans compare it before the strings */
    const char *pool; /* points into key when the caller named the pool */
    /* TLS */
    kh_tls_client *tls;
    int want_tls;     /* connect then handshake */
    int verify;
    char sni[HOST_MAX];
    char ca[HOST_MAX];
    char alpn[128];
    char alpn_sel[32];
    /* input (plaintext) */
    char *in;
    size_t in_len, in_cap;
    int rmode;
    size_t rn, ready;
    int reading, eof, rerr;
    /* output */
    uv_write_t wreq;
    char *wbuf;
    size_t wbuf_len;
    int wbusy;
    char *pend;
    size_t pend_len, pend_cap;
    size_t op_len, written;
    uv_shutdown_t sreq;
    int shut, broken;
    uint32_t reused;
    kh_out *idle_prev, *idle_next;
    /* a capped key (pool_size): the connection counts in kp->conns; a waiter (S_WAITING, no
     * socket yet) is queued on kp until a connection of the key is parked (handed over to it:
     * `handover`) or closed (then it connects itself) */
    kpool *kp;
    kh_out *wait_next;
    kh_out *handover;
    int woken;        /* a waiter given a slot, its timer set to fire at once */
    uint64_t connect_timeout;
    char errmsg[512];
};

/* ---- registry ---- */

static kh_out_reg *reg_get(kh_worker *w)
{
    if (w->out_reg == NULL) {
        kh_out_reg *r = kh_xcalloc(1, sizeof *r);
        r->w = w;
        r->dns = kh_dns_new(&w->loop, w->limits->dns_cache_ms);
        w->out_reg = r;
    }
    return w->out_reg;
}

void kh_out_stats_get(kh_worker *w, kh_out_stats *st)
{
    memset(st, 0, sizeof *st);
    kh_out_reg *r = w->out_reg;
    if (r == NULL)
        return;
    st->open = r->open;
    st->idle = r->idle;
    st->connects = r->connects;
    st->reuses = r->reuses;
    st->evicted = r->evicted;
    st->max_open = r->max_open;
    st->max_idle = r->max_idle;
    kh_dns_counts(r->dns, &st->dns_hits, &st->dns_lookups);
}

static void idle_unlink(kh_out *o)
{
    kh_out_reg *r = o->reg;
    if (o->idle_prev)
        o->idle_prev->idle_next = o->idle_next;
    else
        r->idle_head = o->idle_next;
    if (o->idle_next)
        o->idle_next->idle_prev = o->idle_prev;
    else
        r->idle_tail = o->idle_prev;
    o->idle_prev = o->idle_next = NULL;
    r->idle--;
}

void kh_out_reg_close(kh_worker *w)
{
    kh_out_reg *r = w->out_reg;
    if (r == NULL)
        return;
    r->closing = 1;
    while (r->idle_head)
        kh_out_close(r->idle_head);
}

void kh_out_reg_free(kh_worker *w)
{
    kh_out_reg *r = w->out_reg;
    if (r == NULL)
        return;
    kh_dns_free(r->dns);
    while (r->kpools) {
        kpool *kp = r->kpools;
        r->kpools = kp->next;
        free(kp);
    }
    free(r);
    w->out_reg = NULL;
}

/* ---- life ---- */

static void retry_connect(kh_out *o);

static void close_cb(uv_handle_t *h)
{
    kh_out *o = h->type == UV_TCP ? KH_CONTAINER_OF((uv_tcp_t *)h, kh_out, tcp)
                                  : KH_CONTAINER_OF((uv_timer_t *)h, kh_out, timer);
    if (h->type == UV_TCP && o->retrying) {
        o->retrying = 0;
        if (o->state != S_CLOSED) {
            retry_connect(o); /* the handle is free again: the next address */
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

static void kp_unqueue(kh_out *o)
{
    kpool *kp = o->kp;
    kh_out **pp = &kp->wait_head;
    kh_out *prev = NULL;
    while (*pp && *pp != o) {
        prev = *pp;
        pp = &(*pp)->wait_next;
    }
    if (*pp == NULL)
        return;
    *pp = o->wait_next;
    if (kp->wait_tail == o)
        kp->wait_tail = prev;
    o->wait_next = NULL;
    kp->waiting--;
}

static void kp_slot_freed(kpool *kp);

void kh_out_close(kh_out *o)
{
    if (o == NULL || o->state == S_CLOSED)
        return;
    int waiter = o->state == S_WAITING;
    if (o->state == S_IDLE)
        idle_unlink(o);
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
        kp_unqueue(o);
        if (o->handover) {
            /* the handed connection holds the slot: closing it frees it */
            kh_out *h = o->handover;
            o->handover = NULL;
            kh_out_close(h);
        } else if (o->woken) {
            o->kp->conns--; /* the slot it was given */
            kp_slot_freed(o->kp);
        }
        uv_close((uv_handle_t *)&o->timer, close_cb);
        return;
    }
    o->reg->open--;
    if (!o->retrying) /* else its close is under way (close_cb counts it) */
        uv_close((uv_handle_t *)&o->tcp, close_cb);
    uv_close((uv_handle_t *)&o->timer, close_cb);
    if (o->kp) {
        o->kp->conns--;
        kp_slot_freed(o->kp);
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
static void op_done(kh_out *o, int status)
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

static void wake_waiter(kh_out *o);

static void timer_cb(uv_timer_t *t)
{
    kh_out *o = KH_CONTAINER_OF(t, kh_out, timer);
    if (o->state == S_WAITING) {
        wake_waiter(o);
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
    op_done(o, KH_ETIMEDOUT);
}

static void start_op(kh_out *o, int op, uint64_t timeout_ms, kh_out_cb cb, void *arg)
{
    o->op = op;
    o->cb = cb;
    o->arg = arg;
    if (timeout_ms != KH_OUT_NO_TIMEOUT)
        uv_timer_start(&o->timer, timer_cb, timeout_ms, 0);
}

/* ---- output ---- */

static void write_cb(uv_write_t *req, int status);

static int write_now(kh_out *o)
{
    uv_buf_t b = uv_buf_init(o->wbuf, (unsigned)o->wbuf_len);
    int r = uv_write(&o->wreq, (uv_stream_t *)&o->tcp, &b, 1, write_cb);
    if (r == 0)
        o->wbusy = 1;
    return r;
}

/* Queues n bytes for the socket: tries to write them at once, keeps the rest. */
static int send_raw(kh_out *o, const char *p, size_t n)
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
            op_done(o, status);
        return;
    }
    if (o->pend_len) {
        o->wbuf = o->pend;
        o->wbuf_len = o->pend_len;
        o->pend = NULL;
        o->pend_len = o->pend_cap = 0;
        int r = write_now(o);
        if (r < 0 && (o->op == OP_WRITE || o->op == OP_CONNECT || o->op == OP_TLS))
            op_done(o, r);
        return;
    }
    if (o->op == OP_WRITE) {
        o->written = o->op_len;
        op_done(o, 0);
    }
}

/* Moves the TLS client's ciphertext to the socket. */
static int flush_tls(kh_out *o)
{
    char buf[READ_CHUNK];
    size_t n;
    while ((n = kh_tls_client_pending(o->tls, buf, sizeof buf)) > 0) {
        int r = send_raw(o, buf, n);
        if (r < 0)
            return r;
    }
    return 0;
}

/* ---- input ---- */

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void tls_step(kh_out *o);

static char *in_reserve(kh_out *o, size_t extra)
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
    buf->base = in_reserve(o, READ_CHUNK);
    buf->len = o->in_cap - o->in_len;
}

static int start_reading(kh_out *o)
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
        op_done(o, 0);
        return;
    }
    if (o->eof) {
        op_done(o, UV_EOF);
        return;
    }
    if (o->rerr) {
        op_done(o, o->rerr);
        return;
    }
    if (o->in_len >= o->reg->w->limits->socket_buffer_bytes) {
        snprintf(o->errmsg, sizeof o->errmsg, "receive buffer full (socket_buffer_bytes=%llu)",
                 (unsigned long long)o->reg->w->limits->socket_buffer_bytes);
        op_done(o, KH_ELIMIT);
    }
}

/* Decrypts what the TLS client holds into `in`. */
static void tls_drain(kh_out *o)
{
    for (;;) {
        char *p = in_reserve(o, READ_CHUNK);
        int n = kh_tls_client_read(o->tls, p, o->in_cap - o->in_len);
        if (n > 0) {
            o->in_len += (size_t)n;
            continue;
        }
        if (n == -1)
            o->eof = 1;
        else if (n < -1) {
            o->rerr = KH_EPROTO;
            snprintf(o->errmsg, sizeof o->errmsg, "tls: bad record from the peer");
        }
        break;
    }
    if (flush_tls(o) < 0)
        o->rerr = UV_EPIPE;
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
            tls_drain(o);
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
            tls_step(o);
            return;
        }
        tls_drain(o);
    } else {
        o->in_len += (size_t)nread;
    }
    if (o->state == S_HANDSHAKE) {
        o->state = S_OPEN;
        snprintf(o->errmsg, sizeof o->errmsg, "tls: the peer closed the connection during the "
                 "handshake");
        op_done(o, KH_EPROTO);
        return;
    }
    check_read(o);
}

/* ---- TLS ---- */

/* The TLS settings as a connection keeps them (and its pool key spells them). */
typedef struct tls_fields {
    char sni[HOST_MAX];
    char ca[HOST_MAX];
    char alpn[128];
    int verify;
} tls_fields;

static void tls_fields_of(const char *host, const kh_out_tls_opts *t, tls_fields *f)
{
    snprintf(f->sni, sizeof f->sni, "%s", t->server_name && *t->server_name ? t->server_name : host);
    /* "[::1]" -> "::1" for the name check */
    size_t l = strlen(f->sni);
    if (l >= 2 && f->sni[0] == '[' && f->sni[l - 1] == ']') {
        memmove(f->sni, f->sni + 1, l - 2);
        f->sni[l - 2] = '\0';
    }
    f->verify = t->verify;
    snprintf(f->ca, sizeof f->ca, "%s", t->ca_file ? t->ca_file : "");
    snprintf(f->alpn, sizeof f->alpn, "%s", t->alpn ? t->alpn : "");
}

static void copy_tls_opts(kh_out *o, const kh_out_tls_opts *t)
{
    tls_fields f;
    tls_fields_of(o->host, t, &f);
    memcpy(o->sni, f.sni, sizeof o->sni);
    memcpy(o->ca, f.ca, sizeof o->ca);
    memcpy(o->alpn, f.alpn, sizeof o->alpn);
    o->verify = f.verify;
}

static uint32_t key_hash(const char *k)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *k; k++)
        h = (h ^ (unsigned char)*k) * 16777619u;
    return h;
}

/* The pool key of (host, port, deny_private, TLS settings | NULL), or the caller's pool name:
 * deny_private is part of it, so a connection made without the check is never handed to a
 * caller that asked for it. Returns its hash. */
static uint32_t key_build(char key[KEY_MAX], const char *pool, const char *host, int port,
                          int deny_private, const tls_fields *tf)
{
    if (pool && *pool) {
        snprintf(key, KEY_MAX, "%s", pool);
    } else if (tf) {
        snprintf(key, KEY_MAX, "%s:%d%s:tls:%s:%d:%s:%s", host, port, deny_private ? ":dp" : "",
                 tf->sni, tf->verify, tf->ca, tf->alpn);
    } else {
        /* the common case, once per request: by hand rather than through snprintf */
        size_t hl = strlen(host); /* < HOST_MAX */
        char *p = key;
        memcpy(p, host, hl);
        p += hl;
        *p++ = ':';
        char digits[8];
        int nd = 0;
        do {
            digits[nd++] = (char)('0' + port % 10);
            port /= 10;
        } while (port > 0);
        while (nd > 0)
            *p++ = digits[--nd];
        if (deny_private) {
            memcpy(p, ":dp", 3);
            p += 3;
        }
        *p = '\0';
    }
    return key_hash(key);
}

static void make_key(kh_out *o, const char *pool)
{
    tls_fields tf;
    int tls = !(pool && *pool) && (o->want_tls || o->tls);
    if (tls) {
        memcpy(tf.sni, o->sni, sizeof tf.sni);
        memcpy(tf.ca, o->ca, sizeof tf.ca);
        memcpy(tf.alpn, o->alpn, sizeof tf.alpn);
        tf.verify = o->verify;
    }
    o->keyhash = key_build(o->key, pool, o->host, o->port, o->deny_private, tls ? &tf : NULL);
    o->pool = pool && *pool ? o->key : NULL;
}

static int tls_begin(kh_out *o)
{
    unsigned char wire[128];
    size_t wl = 0;
    const char *p = o->alpn;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0 && n < 256 && wl + 1 + n <= sizeof wire) {
            wire[wl++] = (unsigned char)n;
            memcpy(wire + wl, p, n);
            wl += n;
        }
        p += n + (e ? 1 : 0);
    }
    kh_tls_client_opts co = {
        .server_name = o->sni,
        .verify = o->verify,
        .ca_file = o->ca[0] ? o->ca : NULL,
        .alpn_wire = wl ? wire : NULL,
        .alpn_len = wl,
    };
    o->tls = kh_tls_client_new(&co, o->errmsg, sizeof o->errmsg);
    if (o->tls == NULL)
        return KH_EPROTO;
    o->state = S_HANDSHAKE;
    tls_step(o);
    return 0;
}

/* Advances the handshake; ends the operation when it is done or failed. */
static void tls_step(kh_out *o)
{
    int r = kh_tls_client_handshake(o->tls, o->errmsg, sizeof o->errmsg);
    int f = flush_tls(o);
    if (r < 0 || f < 0) {
        o->state = S_OPEN;
        op_done(o, r < 0 ? KH_EPROTO : f);
        return;
    }
    if (r == 1) {
        o->state = S_OPEN;
        snprintf(o->alpn_sel, sizeof o->alpn_sel, "%s", kh_tls_client_alpn(o->tls));
        o->errmsg[0] = '\0';
        tls_drain(o); /* application data that came with the last handshake flight */
        op_done(o, 0);
        return;
    }
    int s = start_reading(o);
    if (s < 0) {
        o->state = S_OPEN;
        op_done(o, s);
    }
}

int kh_out_tls(kh_out *o, const kh_out_tls_opts *t, uint64_t timeout_ms, kh_out_cb cb, void *arg)
{
    if (o->state != S_OPEN || o->broken)
        return UV_ENOTCONN;
    if (o->op != OP_NONE)
        return UV_EBUSY;
    if (o->tls) {
        /* a pooled TLS connection: already done, if it was made for the same settings */
        tls_fields probe;
        tls_fields_of(o->host, t, &probe);
        if (strcmp(probe.sni, o->sni) == 0 && probe.verify == o->verify &&
            strcmp(probe.ca, o->ca) == 0 && strcmp(probe.alpn, o->alpn) == 0)
            return 1;
        snprintf(o->errmsg, sizeof o->errmsg, "tls: the connection already speaks TLS with "
                 "other settings");
        return UV_EINVAL;
    }
    copy_tls_opts(o, t);
    o->want_tls = 1;
    if (o->pool == NULL)
        make_key(o, NULL);
    start_op(o, OP_TLS, timeout_ms, cb, arg);
    int r = tls_begin(o);
    if (r < 0) {
        uv_timer_stop(&o->timer);
        o->op = OP_NONE;
        o->cb = NULL;
        o->broken = 1;
        return r;
    }
    if (o->op == OP_NONE) /* cannot happen: the first flight always waits for the server */
        return o->broken ? KH_EPROTO : 1;
    return 0;
}

/* ---- connect ---- */

static void connect_cb(uv_connect_t *req, int status)
{
    kh_out *o = KH_CONTAINER_OF(req, kh_out, creq);
    if (o->state == S_CLOSED || o->op != OP_CONNECT)
        return;
    if (status < 0) {
        /* the next address, if any (IPv4 first: "localhost" reaches a service on ::1 too) */
        int next = o->ai + 1;
        while (next < o->naddr && o->deny_private &&
               kh_dns_is_private((const struct sockaddr *)&o->addrs[next]))
            next++;
        if (next < o->naddr && status != UV_ECANCELED) {
            o->ai = next;
            o->retrying = 1;
            uv_close((uv_handle_t *)&o->tcp, close_cb);
            return;
        }
        op_done(o, status);
        return;
    }
    o->reg->connects++;
    uv_tcp_nodelay(&o->tcp, 1);
    if (o->want_tls) {
        int r = tls_begin(o);
        if (r < 0)
            op_done(o, r);
        return;
    }
    o->state = S_OPEN;
    op_done(o, 0);
}

static int start_connect(kh_out *o)
{
    const struct sockaddr *sa = NULL;
    for (int i = o->ai; i < o->naddr && sa == NULL; i++)
        if (!o->deny_private || !kh_dns_is_private((const struct sockaddr *)&o->addrs[i])) {
            sa = (const struct sockaddr *)&o->addrs[i];
            o->ai = i;
        }
    if (sa == NULL) {
        snprintf(o->errmsg, sizeof o->errmsg, "refused: %.255s resolves to a private or loopback "
                 "address (deny_private)", o->host);
        return UV_EACCES;
    }
    o->state = S_CONNECTING;
    return uv_tcp_connect(&o->creq, &o->tcp, sa, connect_cb);
}

static void retry_connect(kh_out *o)
{
    uv_tcp_init(&o->reg->w->loop, &o->tcp);
    o->tcp.data = o->reg->w;
    uv_unref((uv_handle_t *)&o->tcp);
    int r = start_connect(o);
    if (r < 0)
        op_done(o, r);
}

static void dns_cb(void *arg, int status, const struct sockaddr_storage *addrs, int n)
{
    kh_out *o = arg;
    o->dreq = NULL;
    if (o->state == S_CLOSED || o->op != OP_CONNECT)
        return;
    if (status < 0) {
        snprintf(o->errmsg, sizeof o->errmsg, "%.255s: %.200s", o->host,
                 status == UV_EAI_NONAME ? "host not found" : uv_strerror(status));
        op_done(o, status);
        return;
    }
    memcpy(o->addrs, addrs, (size_t)n * sizeof *addrs);
    o->naddr = n;
    int r = start_connect(o);
    if (r < 0)
        op_done(o, r);
}

/* Takes a parked connection out of the pool. Reading stays on (it was on while parked): stopping
 * and restarting it around every reuse would cost two epoll_ctl calls per request. */
static void pool_take(kh_out *o)
{
    kh_out_reg *r = o->reg;
    idle_unlink(o);
    uv_timer_stop(&o->timer);
    o->state = S_OPEN;
    o->reused++;
    r->reuses++;
}

static kpool *kp_get(kh_out_reg *r, const char *key)
{
    for (kpool *kp = r->kpools; kp; kp = kp->next)
        if (strcmp(kp->key, key) == 0)
            return kp;
    kpool *kp = kh_xcalloc(1, sizeof *kp);
    snprintf(kp->key, sizeof kp->key, "%s", key);
    kp->next = r->kpools;
    r->kpools = kp;
    return kp;
}

static int open_socket(kh_out *o, char *err, size_t errlen);

/* A connection of the key closed or was parked: the oldest waiter gets the slot. The waiter
 * is woken from its own timer (0 ms), never from inside the caller's kh_out_* call. */
static void kp_slot_freed(kpool *kp)
{
    kh_out *wt = kp->wait_head;
    if (wt == NULL)
        return;
    kp->wait_head = wt->wait_next;
    if (kp->wait_head == NULL)
        kp->wait_tail = NULL;
    wt->wait_next = NULL;
    kp->waiting--;
    kp->conns++; /* the slot is the waiter's from now: nobody else takes it meanwhile */
    uv_timer_start(&wt->timer, timer_cb, 0, 0);
    wt->woken = 1;
}

/* The waiter's timer fired: its connect timed out, or it was given a slot (a parked
 * connection in `handover`, or room to connect). */
static void wake_waiter(kh_out *o)
{
    if (!o->woken) { /* still queued: the connect timeout */
        kp_unqueue(o);
        kh_out_cb cb = o->cb;
        void *arg = o->arg;
        o->op = OP_NONE;
        o->cb = NULL;
        o->broken = 1;
        snprintf(o->errmsg, sizeof o->errmsg, "timeout");
        if (cb)
            cb(o, KH_ETIMEDOUT, arg);
        return;
    }
    kh_out_cb cb = o->cb;
    void *arg = o->arg;
    if (o->handover) {
        /* a parked connection: it becomes the caller's, the waiter goes */
        kh_out *h = o->handover;
        o->handover = NULL;
        o->cb = NULL;
        o->state = S_CLOSED;
        uv_close((uv_handle_t *)&o->timer, close_cb);
        if (cb)
            cb(h, 0, arg);
        return;
    }
    /* room to connect: this waiter becomes a connection */
    o->kp->conns--; /* open_socket counts it again */
    o->woken = 0;
    o->state = S_NEW;
    if (o->connect_timeout != KH_OUT_NO_TIMEOUT)
        uv_timer_start(&o->timer, timer_cb, o->connect_timeout, 0);
    int r = open_socket(o, o->errmsg, sizeof o->errmsg);
    if (r < 0 && cb)
        cb(o, r, arg); /* o is closed, its memory kept until the loop's next turn */
}

kh_out *kh_out_connect(kh_worker *w, const kh_out_target *t, kh_out_cb cb, void *arg, int *rc)
{
    kh_out_reg *r = reg_get(w);
    if (t->port <= 0 || t->port > 65535 || t->host == NULL || strlen(t->host) >= HOST_MAX) {
        *rc = UV_EINVAL;
        return NULL;
    }
    /* the pool first: the most recently parked connection with this key (the key is built on
     * the stack: a reused connection costs no allocation) */
    char key[KEY_MAX];
    tls_fields tf;
    if (t->tls)
        tls_fields_of(t->host, t->tls, &tf);
    uint32_t kh = key_build(key, t->pool, t->host, t->port, t->deny_private, t->tls ? &tf : NULL);
    for (kh_out *p = r->idle_tail; p; p = p->idle_prev) {
        if (p->keyhash == kh && strcmp(p->key, key) == 0) {
            pool_take(p);
            *rc = 1;
            return p;
        }
    }
    kh_out *o = kh_xcalloc(1, sizeof *o);
    o->reg = r;
    o->port = t->port;
    snprintf(o->host, sizeof o->host, "%s", t->host);
    if (t->tls) {
        memcpy(o->sni, tf.sni, sizeof o->sni);
        memcpy(o->ca, tf.ca, sizeof o->ca);
        memcpy(o->alpn, tf.alpn, sizeof o->alpn);
        o->verify = tf.verify;
        o->want_tls = 1;
    }
    o->deny_private = t->deny_private;
    memcpy(o->key, key, sizeof o->key);
    o->keyhash = kh;
    o->pool = t->pool && *t->pool ? o->key : NULL;
    o->connect_timeout = t->timeout_ms;
    uv_timer_init(&w->loop, &o->timer);
    o->timer.data = o;
    uv_unref((uv_handle_t *)&o->timer);
    o->handles = 1;
    if (t->pool_size > 0) {
        kpool *kp = kp_get(r, o->key);
        o->kp = kp;
        if (kp->conns >= t->pool_size) {
            /* every connection of the key is busy: wait for one (OpenResty's backlog) */
            if (kp->waiting >= t->backlog) {
                *rc = KH_EFULL;
                if (t->err && t->errlen)
                    snprintf(t->err, t->errlen, "too many waiting connections (pool_size %d "
                             "busy, backlog %d full)", t->pool_size, t->backlog);
                o->state = S_CLOSED;
                uv_close((uv_handle_t *)&o->timer, close_cb);
                return NULL;
            }
            o->state = S_WAITING;
            if (kp->wait_tail)
                kp->wait_tail->wait_next = o;
            else
                kp->wait_head = o;
            kp->wait_tail = o;
            kp->waiting++;
            start_op(o, OP_CONNECT, t->timeout_ms, cb, arg);
            *rc = 0;
            return o;
        }
    }
    start_op(o, OP_CONNECT, t->timeout_ms, cb, arg);
    int err = open_socket(o, t->err, t->errlen);
    if (err < 0) {
        *rc = err;
        return NULL;
    }
    *rc = 0;
    return o;
}

/* Makes the socket and starts the resolve and the connect. On an error at once: o is closed
 * (its message copied to err first) and the code returned. */
static int open_socket(kh_out *o, char *err, size_t errlen)
{
    kh_out_reg *r = o->reg;
    kh_worker *w = r->w;
    uint64_t cap = w->limits->outbound_sockets;
    while (r->open >= cap && r->idle_head) {
        r->evicted++;
        kh_out_close(r->idle_head);
    }
    if (r->open >= cap) {
        if (err && errlen)
            snprintf(err, errlen, "%s", kh_out_strerror(KH_ELIMIT, NULL));
        o->cb = NULL;
        o->op = OP_NONE;
        uv_timer_stop(&o->timer);
        o->state = S_CLOSED;
        uv_close((uv_handle_t *)&o->timer, close_cb);
        return KH_ELIMIT;
    }
    uv_tcp_init(&w->loop, &o->tcp);
    o->tcp.data = w;
    uv_unref((uv_handle_t *)&o->tcp);
    o->handles = 2;
    o->state = S_RESOLVING;
    r->open++;
    if (r->open > r->max_open)
        r->max_open = r->open;
    if (o->kp)
        o->kp->conns++;
    int n = kh_dns_resolve(r->dns, o->host, o->port, o->addrs, dns_cb, o, &o->dreq);
    int e = 0;
    if (n > 0) {
        o->naddr = n;
        e = start_connect(o);
    } else if (n < 0) {
        e = n;
    }
    if (e < 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s", kh_out_strerror(e, o));
        kh_out_close(o);
        return e;
    }
    return 0;
}

int kh_out_tls_preload(int verify, const char *ca_file, char *err, size_t errlen)
{
    kh_tls_client_opts co = {.server_name = "localhost", .verify = verify, .ca_file = ca_file};
    kh_tls_client *c = kh_tls_client_new(&co, err, errlen);
    if (c == NULL)
        return -1;
    kh_tls_client_free(c);
    return 0;
}

int kh_out_resolve(kh_worker *w, const char *host, struct sockaddr_storage *out,
                   kh_out_resolve_cb cb, void *arg, kh_dns_req **req)
{
    return kh_dns_resolve(reg_get(w)->dns, host, 0, out, cb, arg, req);
}

/* ---- operations ---- */

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
            r = flush_tls(o);
    } else {
        r = send_raw(o, p, n);
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
    start_op(o, OP_WRITE, timeout_ms, cb, arg);
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
    start_op(o, OP_READ, timeout_ms, cb, arg);
    int r = start_reading(o);
    if (r < 0) {
        uv_timer_stop(&o->timer);
        o->op = OP_NONE;
        o->cb = NULL;
        o->broken = 1;
        return r;
    }
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

int kh_out_keepalive(kh_out *o, uint64_t idle_ms, int pool_size)
{
    kh_out_reg *r = o->reg;
    if (o->state != S_OPEN || o->op != OP_NONE || o->broken || o->eof || o->rerr || o->shut ||
        o->wbusy)
        return UV_ENOTCONN;
    /* Input nobody read yet, or a peer that already closed: not reusable. When reading is on
     * (it stays on after a read: the usual case, a request/reply exchange), libuv has taken
     * what the loop's last poll saw, so the buffer and the eof flag tell; whatever comes later
     * finds the connection parked, and read_cb closes it there. No syscall then. Only a
     * connection that never read (connect, send, setkeepalive) asks the kernel (MSG_PEEK).
     * What this gives up: bytes that arrived after the poll that is being dispatched, on a
     * connection parked and taken again before the next poll, are read as the next reply;
     * MSG_PEEK only narrowed that window, as a FIN or a byte can come right after it too. */
    ssize_t k = -1;
    uv_os_fd_t fd;
    if (!o->reading && uv_fileno((uv_handle_t *)&o->tcp, &fd) == 0) {
        char probe;
        k = recv(fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k > 0 && o->tls) {
            /* over TLS the bytes may be only post-handshake messages (TLS 1.3 session
             * tickets): let the TLS client take them (on the loop's thread, between two of
             * libuv's reads) */
            ssize_t got;
            while ((got = recv(fd, r->w->read_slab, 65536, MSG_DONTWAIT)) > 0)
                kh_tls_client_feed(o->tls, r->w->read_slab, (size_t)got);
            tls_drain(o);
            k = got == 0 || o->eof ? 0 : -1;
            if (o->rerr)
                return o->rerr;
        }
    }
    if (o->in_len > 0 || k > 0) {
        snprintf(o->errmsg, sizeof o->errmsg, "unread data in the buffer");
        return UV_EBUSY;
    }
    if (k == 0)
        return UV_EOF;
    if (o->kp && o->kp->wait_head && !r->closing) {
        /* someone waits for a connection of this key: it gets this one, not the pool */
        kpool *kp = o->kp;
        kh_out *wt = kp->wait_head;
        kp->conns--;        /* kp_slot_freed gives the slot to wt... */
        kp_slot_freed(kp);
        wt->handover = o;   /* ...with this connection in it */
        o->reused++;
        r->reuses++;
        return 0;
    }
    uint64_t cap = r->w->limits->outbound_pool;
    if (r->closing || pool_size <= 0 || cap == 0) {
        kh_out_close(o);
        return 0;
    }
    /* room for it under its key's size and the worker's outbound_pool: the oldest go first */
    int same = 0;
    for (kh_out *p = r->idle_head; p; p = p->idle_next)
        same += p->keyhash == o->keyhash && strcmp(p->key, o->key) == 0;
    for (kh_out *p = r->idle_head; p && same >= pool_size;) {
        kh_out *next = p->idle_next;
        if (p->keyhash == o->keyhash && strcmp(p->key, o->key) == 0) {
            r->evicted++;
            kh_out_close(p);
            same--;
        }
        p = next;
    }
    while (r->idle >= cap && r->idle_head) {
        r->evicted++;
        kh_out_close(r->idle_head);
    }
    o->state = S_IDLE;
    o->idle_prev = r->idle_tail;
    o->idle_next = NULL;
    if (r->idle_tail)
        r->idle_tail->idle_next = o;
    else
        r->idle_head = o;
    r->idle_tail = o;
    r->idle++;
    if (r->idle > r->max_idle)
        r->max_idle = r->idle;
    if (idle_ms > 0 && idle_ms != KH_OUT_NO_TIMEOUT)
        uv_timer_start(&o->timer, timer_cb, idle_ms, 0);
    if (start_reading(o) < 0) {
        r->evicted++;
        kh_out_close(o);
    }
    return 0;
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
