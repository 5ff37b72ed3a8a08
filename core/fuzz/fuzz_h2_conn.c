/* fuzz_h2_conn.c: drives kh_h1 -> kh_h2 over a fake connection with a C app (style.md "Fuzz").
 * Owns:  one worker-shaped struct (loop, limits, buffers, router, timeouts) built once; per
 *        input one kh_conn that has no socket: its output is dropped at every flush.
 * In:    bytes after the HTTP/2 connection preface, fed in two pieces split at data[0] (so
 *        frame boundaries fall everywhere); HEADERS blocks the fuzzer finds reach a route.
 *        Then the peer's FIN (when the last byte is odd) or a graceful shutdown.
 * Out:   nothing; a crash, a sanitizer report or a leak is the finding.
 * Never: writes to a socket (the conn's tcp handle is initialised but never connected). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_conn.h"
#include "kh_h1.h"
#include "kh_h2.h"
#include "kh_log.h"
#include "kh_router.h"
#include "kh_stream.h"
#include "kh_worker.h"

/* ---- a C app: answers at once, or when the body is in; a stream it holds is released on
 * abort, so every ref is accounted for at the end of an input ---- */

static int app_init(kh_worker *w, kh_app_inst *r, void **app, char *err, size_t errlen)
{
    (void)w, (void)r, (void)err, (void)errlen;
    *app = NULL;
    return 0;
}

static void app_close(void *app)
{
    (void)app;
}

static void answer(kh_stream *s)
{
    if (getenv("KH_FUZZ_TRACE"))
        fprintf(stderr, "answer %.*s %.*s body %zu\n", (int)s->method.len, s->method.ptr,
                (int)s->target.len, s->target.ptr, s->body.len);
    kh_header ct = {KH_STR_LIT("Content-Type"), KH_STR_LIT("text/plain")};
    if (s->body_state == KH_BODY_COMPLETE)
        kh_stream_respond(s, 200, &ct, 1, s->body.base ? s->body.base : "", s->body.len);
    else
        kh_stream_respond_error(s, 400, "no body", 0);
}

static void app_dispatch(void *app, kh_stream *s)
{
    (void)app;
    if (s->body_state == KH_BODY_READING) {
        s->app_wait = 1; /* waits for the body; released in on_body or on_abort */
        return;
    }
    answer(s);
    kh_stream_release(s);
}

static void app_on_body(void *app, kh_stream *s)
{
    (void)app;
    if (!s->app_wait)
        return;
    s->app_wait = 0;
    answer(s);
    kh_stream_release(s);
}

static void app_on_abort(void *app, kh_stream *s)
{
    (void)app;
    if (!s->app_wait)
        return;
    s->app_wait = 0;
    kh_stream_release(s);
}

static const kh_app_vt fuzz_app = {
    .worker_init = app_init,
    .worker_close = app_close,
    .dispatch = app_dispatch,
    .on_body = app_on_body,
    .on_abort = app_on_abort,
};

static kh_worker W;
static kh_config cfg;

static void noop_timer(kh_timer *t)
{
    (void)t;
}

static void setup(void)
{
    kh_log_level = -1; /* peer garbage logs at debug/warn: keep the fuzzer quiet */
    kh_limits_init(&cfg.limits);
    cfg.limits.body_bytes = 4096;
    cfg.limits.header_bytes = 2048;
    cfg.access_log_fd = -1;
    cfg.app = &fuzz_app;
    W.cfg = &cfg;
    W.limits = &cfg.limits;
    W.flush_tail = &W.flush_head;
    uv_loop_init(&W.loop);
    for (int k = 0; k < KH_TO__COUNT; k++)
        kh_timeq_init(&W.timeq[k], 1000, noop_timer);
    kh_bufcache_init(&W.bufs, 64);
    W.router = kh_router_new();
    const char *err = NULL;
    kh_router_add(W.router, "GET", 3, "/", 1, 1, &err);
    kh_router_add(W.router, "POST", 4, "/echo", 5, 2, &err);
    kh_router_add(W.router, "*", 1, "/any/:x", 7, 3, &err);
}

/* The flush pass without a socket: run the protocol's on_flush and drop what it queued. */
static void flush(kh_conn *c)
{
    for (int round = 0; round < 64 && W.flush_head; round++) {
        while (W.flush_head) {
            kh_wconn *f = W.flush_head;
            W.flush_head = f->flush_next;
            f->in_flush = 0;
        }
        W.flush_tail = &W.flush_head;
        if (c->flags & KH_CONN_F_CLOSING)
            return;
        if (c->proto->on_flush)
            c->proto->on_flush(c);
        c->out.len = 0;
    }
}

static void feed(kh_conn *c, kh_buf *in, const uint8_t *p, size_t n)
{
    kh_buf_append(in, &W.bufs, p, n);
    for (int i = 0; i < 4 && in->len && !(c->flags & KH_CONN_F_CLOSING); i++) {
        size_t used = c->proto->on_read(c, in->base, in->len);
        kh_buf_consume(in, used);
        c->flags &= ~KH_CONN_F_PAUSED;
        flush(c);
        if (used == 0)
            break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    if (size == 0)
        return 0;
    kh_conn *c = kh_slab_alloc(&W.conn_slab, sizeof *c); /* kh_conn.c frees it there */
    memset(c, 0, sizeof *c);
    c->w = &W;
    uv_tcp_init(&W.loop, &c->tcp); /* (tcp.data: kh_conn.c's file-body queue, NULL) */
    W.num_conns++;
    c->id = ++W.next_conn_id;
    c->proto = &kh_h1_proto;
    kh_h1_start(c);
    kh_buf in = {0};
    feed(c, &in, (const uint8_t *)KH_H2_PREFACE, KH_H2_PREFACE_LEN);
    size_t cut = size > 1 ? (size_t)data[0] % size : 0;
    feed(c, &in, data, cut);
    feed(c, &in, data + cut, size - cut);
    if (!(c->flags & KH_CONN_F_CLOSING) && (data[size - 1] & 1) && c->proto->on_eof) {
        c->proto->on_eof(c);
        flush(c);
    } else if (!(c->flags & KH_CONN_F_CLOSING) && c->proto->on_shutdown) {
        c->proto->on_shutdown(c);
        flush(c);
    }
    kh_buf_release(&in, &W.bufs);
    kh_conn_close(c); /* resets every stream; the close callback frees c */
    W.flush_head = NULL;
    W.flush_tail = &W.flush_head;
    uv_run(&W.loop, UV_RUN_NOWAIT);
    return 0;
}
