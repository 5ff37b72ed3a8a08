/* kh_out_connect.c: kh_out_connect (see kh_out.h): a parked connection of the key when the
 * pool has one (no allocation then: the key is built on the stack), else a waiter when the
 * key's pool_size is reached (kh_out_pool.c wakes it), else a new kh_out: the name through the
 * worker's DNS cache (kh_dns), a non-blocking connect to each address in turn (skipping
 * private ones under deny_private) until one answers, then the TLS handshake (kh_out_tls.c)
 * when the target asks for it.
 * Owns:  nothing beyond the kh_out it makes (kh_out.c frees it).
 * Never: blocks, or calls the caller back from inside kh_out_connect (rc says "done now"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_common.h"
#include "kh_err.h"
#include "kh_out_int.h"

static void connect_cb(uv_connect_t *req, int status);
static int start_connect(kh_out *o);
static void dns_cb(void *arg, int status, const struct sockaddr_storage *addrs, int n);

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
            uv_close((uv_handle_t *)&o->tcp, kh__out_close_cb);
            return;
        }
        kh__out_op_done(o, status);
        return;
    }
    o->reg->connects++;
    uv_tcp_nodelay(&o->tcp, 1);
    if (o->want_tls) {
        int r = kh__out_tls_begin(o);
        if (r < 0)
            kh__out_op_done(o, r);
        return;
    }
    o->state = S_OPEN;
    kh__out_op_done(o, 0);
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

void kh__out_retry_connect(kh_out *o)
{
    uv_tcp_init(&o->reg->w->loop, &o->tcp);
    o->tcp.data = o->reg->w;
    uv_unref((uv_handle_t *)&o->tcp);
    int r = start_connect(o);
    if (r < 0)
        kh__out_op_done(o, r);
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
        kh__out_op_done(o, status);
        return;
    }
    memcpy(o->addrs, addrs, (size_t)n * sizeof *addrs);
    o->naddr = n;
    int r = start_connect(o);
    if (r < 0)
        kh__out_op_done(o, r);
}

kh_out *kh_out_connect(kh_worker *w, const kh_out_target *t, kh_out_cb cb, void *arg, int *rc)
{
    kh_out_reg *r = kh__out_reg_get(w);
    if (t->port <= 0 || t->port > 65535 || t->host == NULL || strlen(t->host) >= HOST_MAX) {
        *rc = UV_EINVAL;
        return NULL;
    }
    /* the pool first: the most recently parked connection with this key (the key is built on
     * the stack: a reused connection costs no allocation) */
    char key[KEY_MAX];
    tls_fields tf;
    if (t->tls)
        kh__out_tls_fields_of(t->host, t->tls, &tf);
    uint32_t kh = kh__out_key_build(key, t->pool, t->host, t->port, t->deny_private, t->tls ? &tf : NULL);
    for (kh_out *p = r->idle_tail; p; p = p->idle_prev) {
        if (p->keyhash == kh && strcmp(p->key, key) == 0) {
            kh__out_pool_take(p);
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
        kpool *kp = kh__out_kp_get(r, o->key);
        o->kp = kp;
        if (kp->conns >= t->pool_size) {
            /* every connection of the key is busy: wait for one (OpenResty's backlog) */
            if (kp->waiting >= t->backlog) {
                *rc = KH_EFULL;
                if (t->err && t->errlen)
                    snprintf(t->err, t->errlen, "too many waiting connections (pool_size %d "
                             "busy, backlog %d full)", t->pool_size, t->backlog);
                o->state = S_CLOSED;
                uv_close((uv_handle_t *)&o->timer, kh__out_close_cb);
                return NULL;
            }
            o->state = S_WAITING;
            if (kp->wait_tail)
                kp->wait_tail->wait_next = o;
            else
                kp->wait_head = o;
            kp->wait_tail = o;
            kp->waiting++;
            kh__out_start_op(o, OP_CONNECT, t->timeout_ms, cb, arg);
            *rc = 0;
            return o;
        }
    }
    kh__out_start_op(o, OP_CONNECT, t->timeout_ms, cb, arg);
    int err = kh__out_open_socket(o, t->err, t->errlen);
    if (err < 0) {
        *rc = err;
        return NULL;
    }
    *rc = 0;
    return o;
}

/* Makes the socket and starts the resolve and the connect. On an error at once: o is closed
 * (its message copied to err first) and the code returned. */
int kh__out_open_socket(kh_out *o, char *err, size_t errlen)
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
        uv_close((uv_handle_t *)&o->timer, kh__out_close_cb);
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

int kh_out_resolve(kh_worker *w, const char *host, struct sockaddr_storage *out,
                   kh_out_resolve_cb cb, void *arg, kh_dns_req **req)
{
    return kh_dns_resolve(kh__out_reg_get(w)->dns, host, 0, out, cb, arg, req);
}
