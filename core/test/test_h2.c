/* test_h2.c: kh_h2 over a fake connection, talking to an nghttp2 client session in memory.
 * Owns:  a worker-shaped struct (loop, limits, buffers, router, timeout queues), one kh_conn per
 *        case with no socket (its out buffer is handed to the client at each flush), and a C
 *        app whose dispatches are counted.
 * Checks what the specs cannot see from outside: which streams reach the app, that windows are
 * given back only as the body is buffered, HEAD without DATA, GOAWAY on shutdown with the
 * stream in flight completed, a peer reset reaching a handler that waits for its body; the
 * input scanner's checks with the input cut at every size (frames on closed streams, PRIORITY
 * on itself, PRIORITY counted as a flood), and streams reset at the peer's FIN when they can no
 * longer complete. */
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <string.h>

#include "kh_conn.h"
#include "kh_h1.h"
#include "kh_h2.h"
#include "kh_log.h"
#include "kh_router.h"
#include "kh_stream.h"
#include "kh_test.h"
#include "kh_worker.h"

/* ---- the app: "/" answers "hello"; "/echo" answers its body; "/hold" is answered by the test */

static int dispatched, aborted;
static kh_stream *held;

static void respond_body(kh_stream *s)
{
    kh_header ct = {KH_STR_LIT("Content-Type"), KH_STR_LIT("text/plain")};
    if (s->body_state == KH_BODY_COMPLETE)
        kh_stream_respond(s, 201, &ct, 1, s->body.base ? s->body.base : "", s->body.len);
}

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

static void app_dispatch(void *app, kh_stream *s)
{
    (void)app;
    dispatched++;
    if (s->route_value == 1) {
        kh_header ct = {KH_STR_LIT("Content-Type"), KH_STR_LIT("text/plain")};
        kh_stream_respond(s, 200, &ct, 1, "hello", 5);
    } else if (s->route_value == 2 && s->body_state == KH_BODY_READING) {
        s->app_wait = 1;
        return; /* keeps its ref until the body is in or the stream is gone */
    } else if (s->route_value == 2) {
        respond_body(s);
    } else if (s->route_value == 3) {
        held = s;
        return;
    }
    kh_stream_release(s);
}

static void app_on_body(void *app, kh_stream *s)
{
    (void)app;
    if (!s->app_wait)
        return;
    s->app_wait = 0;
    respond_body(s);
    kh_stream_release(s);
}

static void app_on_abort(void *app, kh_stream *s)
{
    (void)app;
    aborted++;
    if (s == held)
        held = NULL;
    if (s->app_wait || s->route_value == 3) {
        s->app_wait = 0;
        kh_stream_release(s);
    }
}

static const kh_app_vt test_app = {
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
    kh_log_level = getenv("KH_DEBUG") ? KH_LOG_DEBUG : KH_LOG_ERROR;
    kh_limits_init(&cfg.limits);
    cfg.access_log_fd = -1;
    cfg.app = &test_app;
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
    kh_router_add(W.router, "GET", 3, "/hold", 5, 3, &err);
}

/* ---- the client side ---- */

typedef struct resp {
    int status;
    char clen[24];
    int has_date, has_server, has_connection;
    size_t body;
    int ended, reset;
    uint32_t reset_code;
    int data_frames;
    int closed;
    uint32_t close_code;
} resp;

static resp R[64];
static int goaway_code = -1, goaway_last = -1, window_updates;

static int c_on_header(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *n, size_t nl,
                       const uint8_t *v, size_t vl, uint8_t flags, void *ud)
{
    (void)ng, (void)flags, (void)ud;
    resp *r = &R[f->hd.stream_id % 64];
    if (nl == 7 && !memcmp(n, ":status", 7))
        r->status = atoi((const char *)v);
    else if (nl == 14 && !memcmp(n, "content-length", 14))
        snprintf(r->clen, sizeof r->clen, "%.*s", (int)vl, v);
    else if (nl == 4 && !memcmp(n, "date", 4))
        r->has_date = 1;
    else if (nl == 6 && !memcmp(n, "server", 6))
        r->has_server = 1;
    else if (nl == 10 && !memcmp(n, "connection", 10))
        r->has_connection = 1;
    return 0;
}

static int c_on_data(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *d, size_t n,
                     void *ud)
{
    (void)ng, (void)flags, (void)d, (void)ud;
    R[id % 64].body += n;
    return 0;
}

static int c_on_frame(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    (void)ng, (void)ud;
    resp *r = &R[f->hd.stream_id % 64];
    if (f->hd.type == NGHTTP2_GOAWAY) {
        goaway_code = (int)f->goaway.error_code;
        goaway_last = f->goaway.last_stream_id;
    } else if (f->hd.type == NGHTTP2_WINDOW_UPDATE) {
        window_updates++;
    } else if (f->hd.type == NGHTTP2_RST_STREAM) {
        r->reset = 1;
        r->reset_code = f->rst_stream.error_code;
    } else if (f->hd.type == NGHTTP2_DATA) {
        r->data_frames++;
    }
    if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) &&
        (f->hd.flags & NGHTTP2_FLAG_END_STREAM))
        r->ended = 1;
    return 0;
}

static int c_on_close(nghttp2_session *ng, int32_t id, uint32_t code, void *ud)
{
    (void)ng, (void)ud;
    R[id % 64].closed = 1;
    R[id % 64].close_code = code;
    return 0;
}

static nghttp2_session *client;
static kh_conn *C;
static kh_buf in;
static size_t chunk; /* when nonzero, pump() hands the server its input in pieces of this size */

static kh_conn *new_conn(void)
{
    kh_conn *c = kh_slab_alloc(&W.conn_slab, sizeof *c); /* kh_conn.c frees it there */
    memset(c, 0, sizeof *c);
    c->w = &W;
    uv_tcp_init(&W.loop, &c->tcp); /* (tcp.data: kh_conn.c's file-body queue, NULL) */
    W.num_conns++;
    c->id = ++W.next_conn_id;
    c->proto = &kh_h1_proto;
    kh_h1_start(c);
    return c;
}

/* Moves bytes both ways until neither side has anything to say. */
static void pump(void)
{
    for (int round = 0; round < 1000; round++) {
        int moved = 0;
        const uint8_t *d;
        ssize_t n;
        while ((n = nghttp2_session_mem_send(client, &d)) > 0) {
            kh_buf_append(&in, &W.bufs, d, (size_t)n);
            moved = 1;
        }
        /* like kh_conn: bytes not consumed are offered again with the next ones */
        size_t offer = chunk;
        while (in.len && !(C->flags & KH_CONN_F_CLOSING)) {
            size_t piece = chunk ? KH_MIN(offer, in.len) : in.len;
            size_t used = C->proto->on_read(C, in.base, piece);
            kh_buf_consume(&in, used);
            C->flags &= ~KH_CONN_F_PAUSED;
            if (used == 0 && piece == in.len)
                break;
            offer = used ? chunk : offer + chunk;
        }
        while (W.flush_head) {
            kh_wconn *f = W.flush_head;
            W.flush_head = f->flush_next;
            f->in_flush = 0;
        }
        W.flush_tail = &W.flush_head;
        if (!(C->flags & KH_CONN_F_CLOSING) && C->proto->on_flush)
            C->proto->on_flush(C);
        if (C->out.len) {
            nghttp2_session_mem_recv(client, (const uint8_t *)C->out.base, C->out.len);
            C->out.len = 0;
            moved = 1;
        }
        if (!moved)
            return;
    }
}

static void start(int (*cb_setup)(nghttp2_session_callbacks *))
{
    memset(R, 0, sizeof R);
    goaway_code = goaway_last = -1;
    window_updates = dispatched = aborted = 0;
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, c_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, c_on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, c_on_frame);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, c_on_close);
    if (cb_setup)
        cb_setup(cb);
    nghttp2_session_client_new(&client, cb, NULL);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(client, NGHTTP2_FLAG_NONE, NULL, 0);
    C = new_conn();
    pump();
}

static void finish(void)
{
    kh_conn_close(C);
    W.flush_head = NULL;
    W.flush_tail = &W.flush_head;
    uv_run(&W.loop, UV_RUN_NOWAIT);
    kh_buf_release(&in, &W.bufs);
    nghttp2_session_del(client);
}

#define NV(n, v)                                                                                   \
    {                                                                                              \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, NGHTTP2_NV_FLAG_NONE         \
    }

static int32_t get(const char *method, const char *path)
{
    nghttp2_nv nv[] = {NV(":method", ""), NV(":scheme", "http"), NV(":path", ""),
                       NV(":authority", "t")};
    nv[0].value = (uint8_t *)method;
    nv[0].valuelen = strlen(method);
    nv[2].value = (uint8_t *)path;
    nv[2].valuelen = strlen(path);
    return nghttp2_submit_request(client, NULL, nv, 4, NULL, NULL);
}

static size_t upload_left;
static ssize_t upload_read(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len,
                           uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)ng, (void)id, (void)src, (void)ud;
    size_t k = KH_MIN(len, upload_left);
    memset(buf, 'u', k);
    upload_left -= k;
    if (upload_left == 0)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)k;
}

static int32_t post(const char *path, size_t len)
{
    char cl[24];
    snprintf(cl, sizeof cl, "%zu", len);
    nghttp2_nv nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":path", ""),
                       NV(":authority", "t"), NV("content-length", "")};
    nv[2].value = (uint8_t *)path;
    nv[2].valuelen = strlen(path);
    nv[4].value = (uint8_t *)cl;
    nv[4].valuelen = strlen(cl);
    upload_left = len;
    nghttp2_data_provider prd = {.read_callback = upload_read};
    return nghttp2_submit_request(client, NULL, nv, 5, &prd, NULL);
}

/* Raw frame bytes for the server, behind whatever the client session queued. */
static void raw_frame(uint8_t type, uint8_t flags, int32_t id, const void *payload, size_t len)
{
    uint8_t hd[9] = {(uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len, type, flags,
                     (uint8_t)(id >> 24), (uint8_t)(id >> 16), (uint8_t)(id >> 8), (uint8_t)id};
    kh_buf_append(&in, &W.bufs, hd, sizeof hd);
    if (len)
        kh_buf_append(&in, &W.bufs, payload, len);
}

int main(void)
{
    kh_header ct = {KH_STR_LIT("Content-Type"), KH_STR_LIT("text/plain")};
    setup();

    kh_subtest("GET and HEAD");
    start(NULL);
    int32_t a = get("GET", "/"), b = get("HEAD", "/"), c404 = get("GET", "/nope");
    pump();
    kh_is_int(R[a].status, 200, "GET / answers 200");
    kh_is_int(R[a].body, 5, "with its 5-byte body");
    kh_is_str(R[a].clen, strlen(R[a].clen), "5", "and content-length 5");
    kh_ok(R[a].has_date && R[a].has_server && !R[a].has_connection,
          "date and server, no connection field");
    kh_is_int(R[b].status, 200, "HEAD / answers 200");
    kh_is_str(R[b].clen, strlen(R[b].clen), "5", "HEAD has the GET's content-length");
    kh_is_int(R[b].data_frames, 0, "HEAD gets no DATA frame");
    kh_ok(R[b].ended, "HEAD's HEADERS end the stream");
    kh_is_int(R[c404].status, 404, "an unknown path is 404 without the app");
    kh_is_int(dispatched, 2, "two requests reached the app");
    finish();

    kh_subtest("request body and flow control");
    start(NULL);
    int32_t e = post("/echo", 300000);
    pump();
    kh_is_int(R[e].status, 201, "a 300000-byte upload is echoed");
    kh_is_int(R[e].body, 300000, "every byte back");
    kh_ok(window_updates > 0, "windows were given back as the body was buffered (%d)",
          window_updates);
    finish();

    kh_subtest("413 past body_bytes, the connection goes on");
    cfg.limits.body_bytes = 1000;
    start(NULL);
    int32_t big = post("/echo", 5000000); /* more than the window the client holds */
    pump();
    int32_t after = get("GET", "/");
    pump();
    kh_is_int(R[big].status, 413, "over body_bytes: 413");
    kh_ok(R[big].reset && R[big].reset_code == NGHTTP2_NO_ERROR, "then RST_STREAM(NO_ERROR)");
    kh_ok(upload_left > 0, "the client did not have to send it all (%zu left)", upload_left);
    kh_is_int(R[after].status, 200, "the next request on the connection is answered");
    kh_is_int(goaway_code, -1, "no GOAWAY");
    finish();
    cfg.limits.body_bytes = 8388608;

    kh_subtest("rapid reset never reaches the app");
    start(NULL);
    for (int i = 0; i < 20; i++) {
        int32_t id = get("GET", "/");
        nghttp2_submit_rst_stream(client, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    }
    pump();
    kh_is_int(dispatched, 0, "HEADERS + RST_STREAM in one read: no dispatch");
    kh_is_int(goaway_code, -1, "20 resets are under h2_peer_resets");
    finish();

    kh_subtest("graceful stop: GOAWAY, the stream in flight completes");
    start(NULL);
    int32_t h = get("GET", "/hold");
    pump();
    kh_ok(held != NULL, "the handler holds its stream");
    C->proto->on_shutdown(C);
    pump();
    kh_is_int(goaway_code, NGHTTP2_NO_ERROR, "GOAWAY(NO_ERROR)");
    kh_is_int(goaway_last, h, "last_stream_id is the stream in flight");
    kh_ok(!(C->flags & KH_CONN_F_CLOSE_AFTER_WRITE), "the connection stays open for it");
    kh_stream_respond(held, 200, &ct, 1, "late", 4);
    kh_stream_release(held);
    held = NULL;
    pump();
    kh_is_int(R[h].status, 200, "the held stream is answered after the GOAWAY");
    kh_ok(C->flags & KH_CONN_F_CLOSE_AFTER_WRITE, "then the connection closes");
    finish();

    kh_subtest("a streamed response: DEFERRED until the next bytes, then resumed");
    start(NULL);
    int32_t sr = get("GET", "/hold");
    pump();
    kh_stream *hs = held;
    kh_ok(hs != NULL, "held");
    kh_is_int(kh_stream_send_head(hs, 200, &ct, 1, -1), 0, "head without a length");
    pump();
    kh_is_int(R[sr].status, 200, "the head is out before any body byte");
    kh_ok(!R[sr].ended, "the stream stays open");
    kh_stream_send_data(hs, "abc", 3, 0);
    pump();
    kh_is_int(R[sr].body, 3, "the first bytes arrive (provider resumed)");
    kh_stream_send_data(hs, "defg", 4, 1);
    pump();
    kh_is_int(R[sr].body, 7, "then the rest");
    kh_ok(R[sr].ended && R[sr].clen[0] == 0, "END_STREAM, and no content-length");
    kh_stream_release(hs);
    held = NULL;
    finish();

    kh_subtest("a peer reset reaches a handler waiting for its body");
    start(NULL);
    char cl[] = "10";
    nghttp2_nv nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":path", "/echo"),
                       NV(":authority", "t"), NV("content-length", "")};
    nv[4].value = (uint8_t *)cl;
    nv[4].valuelen = 2;
    int32_t w = nghttp2_submit_headers(client, NGHTTP2_FLAG_NONE, -1, NULL, nv, 5, NULL);
    pump();
    kh_is_int(dispatched, 1, "dispatched before the body");
    nghttp2_submit_rst_stream(client, NGHTTP2_FLAG_NONE, w, NGHTTP2_CANCEL);
    pump();
    kh_is_int(aborted, 1, "the app's on_abort ran");
    finish();

    kh_subtest("ALPN path: kh_h2_start on a fresh connection, before any byte");
    start(NULL);
    kh_conn_close(C);
    W.flush_head = NULL;
    W.flush_tail = &W.flush_head;
    uv_run(&W.loop, UV_RUN_NOWAIT);
    nghttp2_session_del(client);
    kh_buf_release(&in, &W.bufs);
    {
        nghttp2_session_callbacks *cb;
        nghttp2_session_callbacks_new(&cb);
        nghttp2_session_callbacks_set_on_header_callback(cb, c_on_header);
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, c_on_data);
        nghttp2_session_callbacks_set_on_frame_recv_callback(cb, c_on_frame);
        nghttp2_session_client_new(&client, cb, NULL);
        nghttp2_session_callbacks_del(cb);
    }
    memset(R, 0, sizeof R);
    C = new_conn();
    kh_h2_start(C); /* what kh_tls does when ALPN picked "h2" */
    kh_ok(C->proto == &kh_h2_proto, "the connection speaks h2");
    /* the server's SETTINGS leave first, before the client said anything */
    W.flush_head = NULL;
    W.flush_tail = &W.flush_head;
    C->flags &= ~KH_CONN_F_IN_FLUSH;
    C->proto->on_flush(C);
    kh_ok(C->out.len >= 9 && C->out.base[3] == NGHTTP2_SETTINGS, "SETTINGS queued at once");
    nghttp2_submit_settings(client, NGHTTP2_FLAG_NONE, NULL, 0);
    int32_t al = get("GET", "/");
    pump();
    kh_is_int(R[al].status, 200, "a request after the preface is answered");
    finish();

    kh_subtest("a header list over header_bytes: 431 on its stream");
    start(NULL);
    static char big_value[20000];
    memset(big_value, 'v', sizeof big_value - 1);
    nghttp2_nv hv[] = {NV(":method", "GET"), NV(":scheme", "http"), NV(":path", "/"),
                       NV(":authority", "t"), NV("x-big", "")};
    hv[4].value = (uint8_t *)big_value;
    hv[4].valuelen = sizeof big_value - 1;
    int32_t t = nghttp2_submit_request(client, NULL, hv, 5, NULL, NULL);
    int32_t t2 = get("GET", "/");
    pump();
    kh_is_int(R[t].status, 431, "431");
    kh_is_int(R[t2].status, 200, "the next stream is answered");
    kh_is_int(dispatched, 1, "only the second reached the app");
    finish();

    kh_subtest("the input cut at every size: requests and bodies are unchanged");
    for (chunk = 1; chunk <= 23; chunk += 1 + chunk / 4) {
        start(NULL);
        int32_t g = get("GET", "/"), pe = post("/echo", 40000);
        pump();
        kh_ok(R[g].status == 200 && R[pe].status == 201 && R[pe].body == 40000 &&
                  goaway_code == -1,
              "pieces of %zu bytes: GET 200, 40000-byte echo (status %d, %zu bytes, GOAWAY %d)",
              chunk, R[pe].status, R[pe].body, goaway_code);
        finish();
    }
    chunk = 0;

    static const uint8_t self_dep[5] = {0, 0, 0, 1, 15};
    for (chunk = 1; chunk <= 9; chunk += 8) {
        char name[80];
        snprintf(name, sizeof name, "PRIORITY on itself, in pieces of %zu: PROTOCOL_ERROR", chunk);
        kh_subtest(name);
        start(NULL);
        raw_frame(NGHTTP2_PRIORITY, 0, 1, self_dep, 5);
        pump();
        kh_is_int(goaway_code, NGHTTP2_PROTOCOL_ERROR, "GOAWAY(PROTOCOL_ERROR)");
        kh_ok(C->flags & (KH_CONN_F_CLOSE_AFTER_WRITE | KH_CONN_F_CLOSING), "closing");
        finish();

        snprintf(name, sizeof name, "DATA on an ended stream, in pieces of %zu: STREAM_CLOSED", chunk);
        kh_subtest(name);
        start(NULL);
        int32_t d = get("GET", "/");
        pump();
        kh_ok(R[d].ended && R[d].closed, "stream %d answered and closed", d);
        raw_frame(NGHTTP2_DATA, 0, d, "x", 1);
        pump();
        kh_is_int(goaway_code, NGHTTP2_STREAM_CLOSED, "GOAWAY(STREAM_CLOSED)");
        finish();
    }
    chunk = 0;

    kh_subtest("DATA in flight on a stream the server reset is ignored");
    cfg.limits.body_bytes = 1000;
    start(NULL);
    nghttp2_nv big_nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":path", "/echo"),
                           NV(":authority", "t"), NV("content-length", "50000000")};
    int32_t rs = nghttp2_submit_headers(client, NGHTTP2_FLAG_NONE, -1, NULL, big_nv, 5, NULL);
    pump();
    kh_is_int(R[rs].status, 413, "413");
    kh_ok(R[rs].reset && R[rs].reset_code == NGHTTP2_NO_ERROR, "RST_STREAM(NO_ERROR)");
    static uint8_t body[1000];
    raw_frame(NGHTTP2_DATA, 0, rs, body, sizeof body);
    raw_frame(NGHTTP2_DATA, 0, rs, body, sizeof body);
    pump();
    int32_t after_rs = get("GET", "/");
    pump();
    kh_is_int(goaway_code, -1, "no GOAWAY");
    kh_is_int(R[after_rs].status, 200, "the next request is answered");
    finish();
    cfg.limits.body_bytes = 8388608;

    kh_subtest("PRIORITY frames count toward h2_flood_frames");
    start(NULL);
    static const uint8_t pri[5] = {0, 0, 0, 0, 15};
    for (int i = 0; i <= (int)cfg.limits.h2_flood_frames; i++)
        raw_frame(NGHTTP2_PRIORITY, 0, 3 + 2 * i, pri, 5);
    pump();
    kh_is_int(goaway_code, NGHTTP2_ENHANCE_YOUR_CALM, "h2_flood_frames + 1: ENHANCE_YOUR_CALM");
    finish();

    kh_subtest("the peer's FIN while a finished response waits for window: closed at once");
    start(NULL);
    nghttp2_settings_entry zero = {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 0};
    nghttp2_submit_settings(client, NGHTTP2_FLAG_NONE, &zero, 1);
    int32_t z = get("GET", "/");
    pump();
    kh_is_int(R[z].status, 200, "the head is out");
    kh_is_int(R[z].body, 0, "no body byte (window 0)");
    kh_ok(!(C->flags & (KH_CONN_F_CLOSE_AFTER_WRITE | KH_CONN_F_CLOSING)), "the connection waits");
    C->proto->on_eof(C);
    pump();
    kh_ok(R[z].reset && R[z].reset_code == NGHTTP2_CANCEL, "at FIN: RST_STREAM(CANCEL)");
    kh_ok(C->flags & (KH_CONN_F_CLOSE_AFTER_WRITE | KH_CONN_F_CLOSING), "and the connection closes");
    finish();

    kh_subtest("answered while the upload still comes: reset after a body gap, or at FIN");
    for (int at_fin = 0; at_fin < 2; at_fin++) {
        start(NULL);
        nghttp2_nv up_nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":path", "/"),
                              NV(":authority", "t"), NV("content-length", "90000")};
        int32_t up = nghttp2_submit_headers(client, NGHTTP2_FLAG_NONE, -1, NULL, up_nv, 5, NULL);
        pump();
        kh_ok(R[up].status >= 400 && R[up].ended && !R[up].reset,
              "answered at once (%d), no reset: the rest of the upload fits the window",
              R[up].status);
        if (at_fin) {
            C->proto->on_eof(C);
            pump();
            kh_ok(C->flags & (KH_CONN_F_CLOSE_AFTER_WRITE | KH_CONN_F_CLOSING),
                  "at FIN: the connection closes");
        } else {
            C->proto->on_timeout(C, KH_TO_BODY);
            pump();
            kh_ok(R[up].reset && R[up].reset_code == NGHTTP2_NO_ERROR,
                  "after body_timeout: RST_STREAM(NO_ERROR)");
            int32_t next = get("GET", "/");
            pump();
            kh_is_int(R[next].status, 200, "and the connection goes on");
        }
        finish();
    }

    kh_router_free(W.router);
    kh_bufcache_destroy(&W.bufs);
    uv_loop_close(&W.loop);
    return kh_test_done();
}
