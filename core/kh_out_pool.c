/* kh_out_pool.c: the per-worker registry of outbound connections and its keep-alive pool.
 * Owns:  kh_out_reg (made on first use, freed by kh_out_reg_free), the idle list (oldest first),
 *        the per-key caps (kpool: connections open and waiters, oldest first), the counters
 *        behind kh_out_stats.
 * Keys:  host:port (+":dp" under deny_private, + the TLS settings), or the caller's pool name;
 *        compared by hash first.
 * Parking (kh_out_keepalive) costs no syscall when reading is on (the usual case after a
 *        reply): reading stays on while parked, so input or EOF then finds the connection idle
 *        and closes it (kh_out.c's read_cb), and taking it again (kh__out_pool_take) keeps it
 *        on: no epoll_ctl pair and no MSG_PEEK per reuse. A connection that never read is
 *        checked with one MSG_PEEK.
 * Never: hands a connection to a caller whose key differs, or keeps more than pool_size per
 *        key and outbound_pool per worker (the oldest go first). */
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_common.h"
#include "kh_err.h"
#include "kh_out_int.h"

static uint32_t key_hash(const char *k);

kh_out_reg *kh__out_reg_get(kh_worker *w)
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

void kh__out_idle_unlink(kh_out *o)
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
uint32_t kh__out_key_build(char key[KEY_MAX], const char *pool, const char *host, int port,
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

void kh__out_make_key(kh_out *o, const char *pool)
{
    tls_fields tf;
    int tls = !(pool && *pool) && (o->want_tls || o->tls);
    if (tls) {
        memcpy(tf.sni, o->sni, sizeof tf.sni);
        memcpy(tf.ca, o->ca, sizeof tf.ca);
        memcpy(tf.alpn, o->alpn, sizeof tf.alpn);
        tf.verify = o->verify;
    }
    o->keyhash = kh__out_key_build(o->key, pool, o->host, o->port, o->deny_private, tls ? &tf : NULL);
    o->pool = pool && *pool ? o->key : NULL;
}

/* Takes a parked connection out of the pool. Reading stays on (it was on while parked): stopping
 * and restarting it around every reuse would cost two epoll_ctl calls per request. */
void kh__out_pool_take(kh_out *o)
{
    kh_out_reg *r = o->reg;
    kh__out_idle_unlink(o);
    uv_timer_stop(&o->timer);
    o->state = S_OPEN;
    o->reused++;
    r->reuses++;
}

kpool *kh__out_kp_get(kh_out_reg *r, const char *key)
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

void kh__out_kp_unqueue(kh_out *o)
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

/* A connection of the key closed or was parked: the oldest waiter gets the slot. The waiter
 * is woken from its own timer (0 ms), never from inside the caller's kh_out_* call. */
void kh__out_kp_slot_freed(kpool *kp)
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
    uv_timer_start(&wt->timer, kh__out_timer_cb, 0, 0);
    wt->woken = 1;
}

/* The waiter's timer fired: its connect timed out, or it was given a slot (a parked
 * connection in `handover`, or room to connect). */
void kh__out_wake_waiter(kh_out *o)
{
    if (!o->woken) { /* still queued: the connect timeout */
        kh__out_kp_unqueue(o);
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
        uv_close((uv_handle_t *)&o->timer, kh__out_close_cb);
        if (cb)
            cb(h, 0, arg);
        return;
    }
    /* room to connect: this waiter becomes a connection */
    o->kp->conns--; /* open_socket counts it again */
    o->woken = 0;
    o->state = S_NEW;
    if (o->connect_timeout != KH_OUT_NO_TIMEOUT)
        uv_timer_start(&o->timer, kh__out_timer_cb, o->connect_timeout, 0);
    int r = kh__out_open_socket(o, o->errmsg, sizeof o->errmsg);
    if (r < 0 && cb)
        cb(o, r, arg); /* o is closed, its memory kept until the loop's next turn */
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
            kh__out_tls_drain(o);
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
        kh__out_kp_slot_freed(kp);
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
        uv_timer_start(&o->timer, kh__out_timer_cb, idle_ms, 0);
    if (kh__out_start_reading(o) < 0) {
        r->evicted++;
        kh_out_close(o);
    }
    return 0;
}
