/* kh_out_h2.c: a shared HTTP/2 client connection (see kh_out_h2.h for the interface).
 * The I/O loop (pump): while no write is in flight, send what the session has (cancelling the
 * pending read first, as kh_out runs one operation at a time; a cancelled read keeps the
 * connection and its buffered input), then read again; input that is already buffered is fed
 * at once. After each pass every waiter whose condition holds is called back, one at a time and
 * re-scanning the list after each, since a callback may resume Lua code that submits, forgets
 * or waits on this very connection. The object is freed only once no pass is on the stack
 * (`inside`). Waiters carry their own uv_timer_t (unref'd, like kh_out's handles: outbound
 * streams are few) and are freed in its close callback. */
#include "kh_out_h2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "kh_common.h"
#include "kh_err.h"
#include "kh_out.h"
#include "kh_worker.h"

typedef struct h2w {
    struct h2w *next;
    kh_out_h2 *h;
    int32_t id;
    int what;
    size_t low;
    kh_out_h2_cb cb;
    void *arg;
    uv_timer_t timer;
} h2w;

struct kh_out_h2 {
    kh_worker *w;
    kh_h2c *sess;
    kh_out *o;
    uint64_t io_timeout, idle_ms;
    h2w *waiters;
    uv_timer_t idle;
    uv_timer_t kick;  /* kh_out_h2_flush_later: a pass from the loop, not from the caller */
    int idle_on;
    int handles;      /* idle + kick, closed by maybe_free */
    int reading, writing;
    int failed, freed;
    int inside;       /* pump / notify frames on the stack */
    int in_pump, again;
    char err[256];
};

static void idle_close_cb(uv_handle_t *t)
{
    kh_out_h2 *h = t->data;
    if (--h->handles == 0)
        free(h);
}

static void maybe_free(kh_out_h2 *h)
{
    if (!h->freed || h->inside > 0 || h->sess == NULL)
        return;
    kh_h2c_free(h->sess);
    h->sess = NULL;
    h->idle.data = h;
    h->kick.data = h;
    uv_close((uv_handle_t *)&h->idle, idle_close_cb);
    uv_close((uv_handle_t *)&h->kick, idle_close_cb);
}

static void waiter_close_cb(uv_handle_t *t)
{
    free(t->data);
}

static void waiter_drop(h2w *wt)
{
    uv_timer_stop(&wt->timer);
    wt->timer.data = wt;
    uv_close((uv_handle_t *)&wt->timer, waiter_close_cb);
}

static h2w *waiter_unlink(kh_out_h2 *h, h2w *wt)
{
    for (h2w **pp = &h->waiters; *pp; pp = &(*pp)->next) {
        if (*pp == wt) {
            *pp = wt->next;
            wt->next = NULL;
            return wt;
        }
    }
    return NULL;
}

static void close_conn(kh_out_h2 *h)
{
    if (h->o) {
        kh_out_cancel(h->o);
        kh_out_close(h->o);
        h->o = NULL;
    }
    h->reading = h->writing = 0;
}

/* The connection is lost: every stream not ended gets the session's closed error, reported
 * with `why` (kh_out_h2_error). */
static void conn_fail(kh_out_h2 *h, const char *why)
{
    if (!h->failed) {
        h->failed = 1;
        snprintf(h->err, sizeof h->err, "%s", why);
        kh_h2c_eof(h->sess);
    }
    close_conn(h);
}

static int satisfied(kh_out_h2 *h, h2w *wt)
{
    kh_h2c_info i;
    kh_h2c_info_get(h->sess, wt->id, &i);
    if (!i.known || i.err || h->failed)
        return 1;
    switch (wt->what) {
    case KH_OUT_H2_HEAD:
        return i.status != 0;
    case KH_OUT_H2_BODY:
        return i.body_len > 0 || i.done;
    default:
        return i.done || kh_h2c_unsent(h->sess, wt->id) <= wt->low;
    }
}

static void notify(kh_out_h2 *h)
{
    h->inside++;
    for (;;) {
        h2w *hit = NULL;
        for (h2w *wt = h->waiters; wt; wt = wt->next) {
            if (satisfied(h, wt)) {
                hit = wt;
                break;
            }
        }
        if (hit == NULL || h->freed)
            break;
        waiter_unlink(h, hit);
        kh_out_h2_cb cb = hit->cb;
        void *arg = hit->arg;
        int32_t id = hit->id;
        waiter_drop(hit);
        cb(h, id, 0, arg);
    }
    h->inside--;
    maybe_free(h);
}

static void idle_cb(uv_timer_t *t)
{
    kh_out_h2 *h = t->data;
    h->idle_on = 0;
    if (h->o && kh_h2c_streams(h->sess) == 0)
        conn_fail(h, "idle");
}

static void idle_update(kh_out_h2 *h)
{
    if (h->freed)
        return;
    int want = h->o && !h->failed && kh_h2c_streams(h->sess) == 0 && h->idle_ms > 0;
    if (want && !h->idle_on) {
        h->idle_on = 1;
        uv_timer_start(&h->idle, idle_cb, h->idle_ms, 0);
    } else if (!want && h->idle_on) {
        h->idle_on = 0;
        uv_timer_stop(&h->idle);
    }
}

static void read_cb(kh_out *o, int status, void *arg);
static void write_cb(kh_out *o, int status, void *arg);

/* Feeds what kh_out has buffered to the session. */
static void feed(kh_out_h2 *h)
{
    size_t len;
    const char *p = kh_out_data(h->o, &len);
    if (len == 0)
        return;
    int rc = kh_h2c_recv(h->sess, (const uint8_t *)p, len);
    kh_out_consume(h->o, len);
    if (rc < 0) {
        /* the GOAWAY nghttp2 queued goes out if it can, then the connection closes */
        const uint8_t *q;
        ssize_t n;
        while ((n = kh_h2c_send(h->sess, &q)) > 0)
            if (kh_out_write(h->o, (const char *)q, (size_t)n, 1000, NULL, NULL) <= 0)
                break;
        conn_fail(h, kh_h2c_error_reason(KH_H2C_EPROTO));
    }
}

static void io_loop(kh_out_h2 *h)
{
    while (h->o && !h->failed && !h->writing) {
        const uint8_t *q;
        ssize_t n = kh_h2c_send(h->sess, &q);
        if (n > 0) {
            if (h->reading) {
                kh_out_cancel(h->o);
                h->reading = 0;
            }
            int r = kh_out_write(h->o, (const char *)q, (size_t)n, h->io_timeout, write_cb, h);
            if (r == 0) {
                h->writing = 1;
                return;
            }
            if (r < 0) {
                conn_fail(h, kh_out_strerror(r, h->o));
                return;
            }
            continue;
        }
        if (kh_h2c_dead(h->sess)) {
            /* GOAWAY received and nothing open, or the session ended: done with the socket */
            if (!h->failed) {
                h->failed = 1;
                snprintf(h->err, sizeof h->err, "%s", kh_h2c_error_reason(KH_H2C_EGOAWAY));
            }
            close_conn(h);
            return;
        }
        if (h->reading)
            return;
        int r = kh_out_read(h->o, KH_OUT_READ_SOME, 0, KH_OUT_NO_TIMEOUT, read_cb, h);
        if (r == 0) {
            h->reading = 1;
            return;
        }
        if (r == 1) {
            feed(h);
            continue;
        }
        conn_fail(h, kh_out_strerror(r, h->o));
        return;
    }
}

static void pump(kh_out_h2 *h)
{
    if (h->freed)
        return;
    if (h->in_pump) {
        h->again = 1;
        return;
    }
    h->in_pump = 1;
    h->inside++;
    do {
        h->again = 0;
        io_loop(h);
    } while (h->again && !h->freed);
    h->in_pump = 0;
    h->inside--;
    idle_update(h);
    notify(h);
}

static void read_cb(kh_out *o, int status, void *arg)
{
    (void)o;
    kh_out_h2 *h = arg;
    h->reading = 0;
    if (status == 0) {
        feed(h);
    } else if (status == UV_EOF) {
        conn_fail(h, "closed");
    } else {
        conn_fail(h, kh_out_strerror(status, h->o));
    }
    pump(h);
}

static void write_cb(kh_out *o, int status, void *arg)
{
    (void)o;
    kh_out_h2 *h = arg;
    h->writing = 0;
    if (status != 0)
        conn_fail(h, status == KH_ETIMEDOUT ? "timeout" : kh_out_strerror(status, h->o));
    pump(h);
}

static void waiter_timer_cb(uv_timer_t *t)
{
    h2w *wt = KH_CONTAINER_OF(t, h2w, timer);
    kh_out_h2 *h = wt->h;
    if (waiter_unlink(h, wt) == NULL)
        return;
    kh_out_h2_cb cb = wt->cb;
    void *arg = wt->arg;
    int32_t id = wt->id;
    waiter_drop(wt);
    h->inside++;
    cb(h, id, KH_ETIMEDOUT, arg);
    h->inside--;
    maybe_free(h);
}

/* ---- interface ---- */

kh_out_h2 *kh_out_h2_new(kh_worker *w, const kh_h2c_limits *lim, uint64_t io_timeout_ms,
                         uint64_t idle_ms)
{
    kh_out_h2 *h = kh_xcalloc(1, sizeof *h);
    h->w = w;
    h->sess = kh_h2c_new(lim);
    h->io_timeout = io_timeout_ms;
    h->idle_ms = idle_ms;
    uv_timer_init(&w->loop, &h->idle);
    h->idle.data = h;
    uv_unref((uv_handle_t *)&h->idle);
    uv_timer_init(&w->loop, &h->kick);
    h->kick.data = h;
    uv_unref((uv_handle_t *)&h->kick);
    h->handles = 2;
    return h;
}

void kh_out_h2_attach(kh_out_h2 *h, kh_out *o)
{
    if (h->failed || h->freed) {
        kh_out_close(o);
        return;
    }
    h->o = o;
    kh_out_setopt(o, "tcp-nodelay", 1);
    pump(h);
}

void kh_out_h2_fail(kh_out_h2 *h, const char *why)
{
    conn_fail(h, why);
    pump(h); /* notify */
}

kh_h2c *kh_out_h2_session(kh_out_h2 *h)
{
    return h->sess;
}

void kh_out_h2_flush(kh_out_h2 *h)
{
    pump(h);
}

int kh_out_h2_wait(kh_out_h2 *h, int32_t id, int what, size_t low, uint64_t timeout_ms,
                   kh_out_h2_cb cb, void *arg)
{
    h2w probe = {.id = id, .what = what, .low = low};
    if (satisfied(h, &probe))
        return 1;
    h2w *wt = kh_xcalloc(1, sizeof *wt);
    *wt = probe;
    wt->h = h;
    wt->cb = cb;
    wt->arg = arg;
    uv_timer_init(&h->w->loop, &wt->timer);
    uv_unref((uv_handle_t *)&wt->timer);
    if (timeout_ms != KH_OUT_NO_TIMEOUT)
        uv_timer_start(&wt->timer, waiter_timer_cb, timeout_ms, 0);
    wt->next = h->waiters;
    h->waiters = wt;
    return 0;
}

void kh_out_h2_unwait(kh_out_h2 *h, int32_t id)
{
    for (h2w *wt = h->waiters; wt; wt = wt->next) {
        if (wt->id == id) {
            waiter_unlink(h, wt);
            waiter_drop(wt);
            return;
        }
    }
}

void kh_out_h2_forget(kh_out_h2 *h, int32_t id)
{
    kh_out_h2_unwait(h, id);
    kh_h2c_forget(h->sess, id);
    pump(h); /* the RST_STREAM; the idle timer when it was the last stream */
}

static void kick_cb(uv_timer_t *t)
{
    pump(t->data);
}

void kh_out_h2_forget_later(kh_out_h2 *h, int32_t id)
{
    kh_out_h2_unwait(h, id);
    kh_h2c_forget(h->sess, id);
    if (!h->freed)
        uv_timer_start(&h->kick, kick_cb, 0, 0);
}

void kh_out_h2_free(kh_out_h2 *h)
{
    if (h == NULL || h->freed)
        return;
    while (h->waiters) {
        h2w *wt = h->waiters;
        h->waiters = wt->next;
        waiter_drop(wt);
    }
    close_conn(h);
    if (h->idle_on)
        uv_timer_stop(&h->idle);
    uv_timer_stop(&h->kick);
    h->freed = 1;
    maybe_free(h);
}

int kh_out_h2_can_submit(kh_out_h2 *h)
{
    return !h->failed && !h->freed && kh_h2c_can_submit(h->sess);
}

int kh_out_h2_dead(kh_out_h2 *h)
{
    return h->failed || h->freed || kh_h2c_dead(h->sess);
}

int kh_out_h2_attached(const kh_out_h2 *h)
{
    return h->o != NULL;
}

const char *kh_out_h2_error(const kh_out_h2 *h)
{
    return h->err;
}
