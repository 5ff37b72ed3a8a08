/* fuzz_h3_stream.c: the HTTP/3 stream side (kh_h3.c on nghttp3) fed without QUIC: kh_quic's
 * interface (kh_quic.h) is stubbed here, so the bytes reach nghttp3 as stream data would.
 * Owns:  one worker-shaped struct built once; per input one kh_h3 connection.
 * In:    records [selector][length][bytes]: selector & 3 picks the stream (0: request stream 0,
 *        1: request stream 4, 2: the client's control stream 2, 3: its QPACK encoder stream
 *        6), selector & 4 ends it (FIN). After each record everything kh_h3 has to send is
 *        taken and acknowledged at once (the response body chunks are freed on ack); at the
 *        end, a graceful shutdown (GOAWAY) when the last byte is odd, then kh_h3_free.
 * Out:   nothing; a crash, a sanitizer report or a leak is the finding. A connection error
 *        (kh_h3_recv < 0) ends the input, as kh_quic would close the connection.
 * Never: touches a socket or ngtcp2. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_log.h"
#include "kh_quic.h"
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
static int64_t next_uni = 3;

static void noop_timer(kh_timer *t)
{
    (void)t;
}

/* ---- kh_quic.h, stubbed: the fuzzer plays the QUIC layer ---- */
struct kh_quic_conn {
    int dummy;
};
static kh_quic_conn Q;
static kh_addr peer = {4, {127, 0, 0, 1}, 1234};

kh_worker *kh_quic_worker(kh_quic_conn *q) { (void)q; return &W; }
uint32_t kh_quic_id(kh_quic_conn *q) { (void)q; return 1; }
const kh_addr *kh_quic_peer(kh_quic_conn *q) { (void)q; return &peer; }
void kh_quic_consumed(kh_quic_conn *q, int64_t sid, size_t n) { (void)q, (void)sid, (void)n; }
void kh_quic_consumed_conn(kh_quic_conn *q, size_t n) { (void)q, (void)n; }
void kh_quic_consumed_stream(kh_quic_conn *q, int64_t sid, size_t n) { (void)q, (void)sid, (void)n; }
void kh_quic_stop_sending(kh_quic_conn *q, int64_t sid, uint64_t c) { (void)q, (void)sid, (void)c; }
void kh_quic_reset_stream(kh_quic_conn *q, int64_t sid, uint64_t c) { (void)q, (void)sid, (void)c; }
int kh_quic_open_uni(kh_quic_conn *q, int64_t *sid)
{
    (void)q;
    *sid = next_uni;
    next_uni += 4;
    return 0;
}
uint64_t kh_quic_max_bidi_streams(kh_quic_conn *q) { (void)q; return 100; }
void kh_quic_dirty(kh_quic_conn *q) { (void)q; }
void kh_quic_app_error(kh_quic_conn *q, uint64_t code) { (void)q, (void)code; }
const char *kh_quic_versions(void) { return "fuzz"; }
/* kh_quic's allocator for nghttp3: plain libc here (ASan sees every block) */
void *kh_quic_malloc(size_t n, void *ud) { (void)ud; return malloc(n); }
void *kh_quic_calloc(size_t a, size_t b, void *ud) { (void)ud; return calloc(a, b); }
void kh_quic_free(void *p, void *ud) { (void)ud; free(p); }
void *kh_quic_realloc(void *p, size_t n, void *ud) { (void)ud; return realloc(p, n); }

static void setup(void)
{
    kh_log_level = -1;
    kh_limits_init(&cfg.limits);
    cfg.limits.body_bytes = 4096;
    cfg.limits.header_bytes = 2048;
    cfg.access_log_fd = -1;
    cfg.app = &fuzz_app;
    W.cfg = &cfg;
    W.limits = &cfg.limits;
    W.flush_tail = &W.flush_head;
    W.conns.prev = W.conns.next = &W.conns;
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

/* Takes and acknowledges everything kh_h3 has to send. */
static int drain(kh_h3 *h)
{
    for (int guard = 0; guard < 4096; guard++) {
        int64_t sid = -1;
        int fin = 0;
        kh_iov v[16];
        ssize_t n = kh_h3_writev(h, &sid, &fin, v, 16);
        if (n < 0)
            return -1;
        if (sid < 0)
            return 0;
        size_t len = 0;
        for (ssize_t i = 0; i < n; i++)
            len += v[i].len;
        if (kh_h3_written(h, sid, len) != 0 || kh_h3_acked(h, sid, len) != 0)
            return -1;
        if (fin && (sid & 3) == 0 && kh_h3_stream_closed(h, sid, 0x100) != 0)
            return -1; /* the request stream is done both ways */
        if (n == 0 && !fin)
            return 0;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    next_uni = 3;
    kh_h3 *h = kh_h3_new(&Q);
    if (h == NULL)
        return 0;
    static const int64_t sids[4] = {0, 4, 2, 6};
    size_t at = 0;
    int dead = 0;
    while (at + 2 <= size && !dead) {
        uint8_t sel = data[at], len = data[at + 1];
        at += 2;
        if (len > size - at)
            len = (uint8_t)(size - at);
        if (kh_h3_recv(h, sids[sel & 3], data + at, len, (sel & 4) != 0) < 0)
            dead = 1;
        at += len;
        if (!dead && drain(h) != 0)
            dead = 1;
    }
    if (!dead && size && (data[size - 1] & 1)) {
        kh_h3_shutdown(h);
        drain(h);
    }
    kh_h3_free(h);
    uv_run(&W.loop, UV_RUN_NOWAIT);
    return 0;
}
