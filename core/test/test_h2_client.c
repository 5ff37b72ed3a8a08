/* test_h2_client.c: unit tests of the sans-io HTTP/2 client session against an in-memory
 * nghttp2 server session (the test's fake server), bytes pumped both ways until neither side
 * has anything to say.
 * Owns:  the fake server (its session, the requests it saw, the responses it sends).
 * In:    kh_h2_client.h; nghttp2's server API for the fake.
 * Out:   TAP: multiplexed requests, request bodies, interim heads, RST_STREAM, GOAWAY, limits,
 *        flow control (the server stalls until the client takes the body), garbage, EOF.
 * Never: touches a socket. */
#include "kh_h2_client.h"
#include "kh_test.h"

#include <nghttp2/nghttp2.h>

typedef struct fake {
    nghttp2_session *ng;
    int32_t ids[16];
    int nids;
    char path[16][32];
    char req_body[1024];
    size_t req_body_len;
    const char *resp; /* body sent by fake_respond */
    size_t resp_len, resp_off;
    int rst_seen;
} fake;

static int f_on_frame(nghttp2_session *ng, const nghttp2_frame *fr, void *ud)
{
    (void)ng;
    fake *f = ud;
    if (fr->hd.type == NGHTTP2_RST_STREAM)
        f->rst_seen++;
    return 0;
}

static int f_on_header(nghttp2_session *ng, const nghttp2_frame *fr, const uint8_t *name,
                       size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                       void *ud)
{
    (void)ng;
    (void)flags;
    fake *f = ud;
    if (namelen == 5 && memcmp(name, ":path", 5) == 0 && f->nids < 16) {
        snprintf(f->path[f->nids], 32, "%.*s", (int)valuelen, value);
        f->ids[f->nids++] = fr->hd.stream_id;
    }
    return 0;
}

static int f_on_data(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *d, size_t len,
                     void *ud)
{
    (void)ng;
    (void)flags;
    (void)id;
    fake *f = ud;
    if (f->req_body_len + len <= sizeof(f->req_body))
        memcpy(f->req_body + f->req_body_len, d, len);
    f->req_body_len += len;
    return 0;
}

static void fake_init(fake *f)
{
    memset(f, 0, sizeof(*f));
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, f_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, f_on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, f_on_frame);
    nghttp2_session_server_new(&f->ng, cb, f);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry iv[1] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100}};
    nghttp2_submit_settings(f->ng, NGHTTP2_FLAG_NONE, iv, 1);
}

static ssize_t f_read(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                      nghttp2_data_source *src, void *ud)
{
    (void)ng;
    (void)id;
    (void)ud;
    fake *f = src->ptr;
    size_t n = KH_MIN(len, f->resp_len - f->resp_off);
    memcpy(buf, f->resp + f->resp_off, n);
    f->resp_off += n;
    if (f->resp_off == f->resp_len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static void fake_respond(fake *f, int32_t id, const char *status, const char *body)
{
    nghttp2_nv nv[2] = {
        {(uint8_t *)":status", (uint8_t *)status, 7, strlen(status), 0},
        {(uint8_t *)"x-test", (uint8_t *)"yes", 6, 3, 0},
    };
    f->resp = body;
    f->resp_len = body ? strlen(body) : 0;
    f->resp_off = 0;
    nghttp2_data_provider prd = {.source.ptr = f, .read_callback = f_read};
    nghttp2_submit_response(f->ng, id, nv, 2, body ? &prd : NULL);
}

/* Moves bytes both ways until neither side sends. Returns the bytes moved server -> client. */
static size_t pump(kh_h2c *c, fake *f)
{
    size_t s2c = 0;
    for (int round = 0; round < 1000; round++) {
        size_t moved = 0;
        const uint8_t *p;
        ssize_t n;
        while ((n = kh_h2c_send(c, &p)) > 0) {
            nghttp2_session_mem_recv(f->ng, p, (size_t)n);
            moved += (size_t)n;
        }
        while ((n = nghttp2_session_mem_send(f->ng, &p)) > 0) {
            kh_h2c_recv(c, p, (size_t)n);
            moved += (size_t)n;
            s2c += (size_t)n;
        }
        if (moved == 0)
            break;
    }
    return s2c;
}

static const kh_h2c_limits lim = {65535, 1 << 20, 16384, 100, 1 << 20};

static int32_t get(kh_h2c *c, const char *path)
{
    kh_h1_field fl[2] = {{KH_STR_LIT("Accept"), KH_STR_LIT("*/*")},
                         {KH_STR_LIT("Connection"), KH_STR_LIT("keep-alive")}};
    return kh_h2c_submit(c, KH_STR_LIT("GET"), KH_STR_LIT("https"), KH_STR_LIT("a.test"),
                         (kh_str){path, strlen(path)}, fl, 2, NULL, 0);
}

static void test_multiplexed(void)
{
    fake f;
    fake_init(&f);
    kh_h2c *c = kh_h2c_new(&lim);
    int32_t a = get(c, "/a"), b = get(c, "/b"), d = get(c, "/c");
    kh_ok(a > 0 && b > a && d > b, "three stream ids");
    pump(c, &f);
    kh_is_int(f.nids, 3, "server saw three requests on one connection");
    kh_is_int(kh_h2c_streams(c), 3, "three streams open");
    /* answer out of order */
    fake_respond(&f, d, "200", "see");
    pump(c, &f);
    fake_respond(&f, a, "404", "not found");
    pump(c, &f);
    kh_h2c_info i;
    kh_h2c_info_get(c, d, &i);
    kh_ok(i.done && i.status == 200 && i.body_len == 3, "third answered first: 200, 3 bytes");
    kh_h2c_info_get(c, a, &i);
    kh_ok(i.done && i.status == 404, "first: 404");
    kh_h2c_info_get(c, b, &i);
    kh_ok(!i.done && i.status == 0 && !i.err, "second still waiting");
    kh_str n, v;
    kh_ok(kh_h2c_field(c, a, 0, &n, &v) && kh_str_eq(n, "x-test", 6) && kh_str_eq(v, "yes", 3),
          "response field");
    const char *p;
    size_t len = kh_h2c_take(c, a, &p);
    kh_is_str(p, len, "not found", "body of the first");
    kh_is_int(kh_h2c_take(c, a, &p), 0, "taken once");
    fake_respond(&f, b, "200", NULL);
    pump(c, &f);
    kh_h2c_info_get(c, b, &i);
    kh_ok(i.done && i.status == 200 && i.body_total == 0, "second: headers-only response");
    kh_h2c_forget(c, a);
    kh_h2c_forget(c, b);
    kh_h2c_forget(c, d);
    kh_is_int(kh_h2c_streams(c), 0, "forgotten");
    kh_ok(kh_h2c_can_submit(c), "can submit more");
    kh_h2c_free(c);
    nghttp2_session_del(f.ng);
}

static void test_post_body(void)
{
    fake f;
    fake_init(&f);
    kh_h2c *c = kh_h2c_new(&lim);
    int32_t id = kh_h2c_submit(c, KH_STR_LIT("POST"), KH_STR_LIT("http"), KH_STR_LIT("a"),
                               KH_STR_LIT("/p"), NULL, 0, "hello body", 10);
    pump(c, &f);
    kh_is_str(f.req_body, f.req_body_len, "hello body", "server got the request body");
    fake_respond(&f, id, "201", "ok");
    pump(c, &f);
    kh_h2c_info i;
    kh_h2c_info_get(c, id, &i);
    kh_ok(i.done && i.status == 201, "201");
    kh_h2c_free(c);
    nghttp2_session_del(f.ng);
}

static void test_interim(void)
{
    fake f;
    fake_init(&f);
    kh_h2c *c = kh_h2c_new(&lim);
    int32_t id = get(c, "/");
    pump(c, &f);
    nghttp2_nv nv[1] = {{(uint8_t *)":status", (uint8_t *)"103", 7, 3, 0}};
    nghttp2_submit_headers(f.ng, NGHTTP2_FLAG_NONE, id, NULL, nv, 1, NULL);
    pump(c, &f);
    kh_h2c_info i;
    kh_h2c_info_get(c, id, &i);
    kh_ok(i.status == 0 && !i.err, "103 is not the final head");
    fake_respond(&f, id, "200", "x");
    pump(c, &f);
    kh_h2c_info_get(c, id, &i);
    kh_ok(i.done && i.status == 200 && i.num_fields == 1, "then 200 with its own fields only");
    if (!(i.done && i.status == 200 && i.num_fields == 1))
        printf("# done %d status %d fields %zu err %d\n", i.done, i.status, i.num_fields, i.err);
    kh_h2c_free(c);
    nghttp2_session_del(f.ng);
}

static void test_reset_and_goaway(void)
{
    fake f;
    fake_init(&f);
    kh_h2c *c = kh_h2c_new(&lim);
    int32_t a = get(c, "/a"), b = get(c, "/b"), d = get(c, "/c");
    pump(c, &f);
    nghttp2_submit_rst_stream(f.ng, NGHTTP2_FLAG_NONE, a, NGHTTP2_INTERNAL_ERROR);
    pump(c, &f);
    kh_h2c_info i;
    kh_h2c_info_get(c, a, &i);
    kh_ok(i.err == KH_H2C_ERESET && i.h2_code == NGHTTP2_INTERNAL_ERROR,
          "RST_STREAM: that stream fails with the code");
    kh_h2c_info_get(c, b, &i);
    kh_ok(!i.err, "the others are untouched");
    nghttp2_submit_goaway(f.ng, NGHTTP2_FLAG_NONE, b, NGHTTP2_NO_ERROR, NULL, 0);
    pump(c, &f);
    kh_h2c_info_get(c, d, &i);
    kh_ok(i.err == KH_H2C_EGOAWAY, "GOAWAY: the stream above last-stream-id fails (retryable)");
    kh_h2c_info_get(c, b, &i);
    kh_ok(!i.err, "the stream at last-stream-id goes on");
    kh_ok(!kh_h2c_can_submit(c), "no new requests after GOAWAY");
    kh_is_int(get(c, "/x"), KH_H2C_EGOAWAY, "submit refused after GOAWAY");
    fake_respond(&f, b, "200", "fin");
    pump(c, &f);
    kh_h2c_info_get(c, b, &i);
    kh_ok(i.done && i.body_len == 3, "it completes");
    kh_h2c_eof(c);
    kh_h2c_info_get(c, b, &i);
    kh_ok(i.done && !i.err, "EOF after the end changes nothing");
    kh_h2c_free(c);
    nghttp2_session_del(f.ng);
}

static void test_limits(void)
{
    fake f;
    fake_init(&f);
    kh_h2c_limits small = {65535, 1 << 20, 16384, 100, 5};
    kh_h2c *c = kh_h2c_new(&small);
    int32_t id = get(c, "/");
    pump(c, &f);
    fake_respond(&f, id, "200", "0123456789");
    pump(c, &f);
    kh_h2c_info i;
    kh_h2c_info_get(c, id, &i);
    kh_ok(i.err == KH_H2C_EBODYLEN && !i.done, "body over body_bytes: EBODYLEN");
    kh_is_int(f.rst_seen, 1, "and the client reset the stream");
    kh_h2c_free(c);
    nghttp2_session_del(f.ng);

    fake_init(&f);
    kh_h2c_limits tiny = {65535, 1 << 20, 4, 100, 1 << 20};
    c = kh_h2c_new(&tiny);
    id = get(c, "/");
    pump(c, &f);
    fake_respond(&f, id, "200", "x"); /* "x-test" + "yes" = 9 bytes > 4 */
    pump(c, &f);
    kh_h2c_info_get(c, id, &i);
    kh_ok(i.err == KH_H2C_EHEADLEN, "head over header_bytes: EHEADLEN");
    kh_ok(kh_h2c_can_submit(c), "the connection survives a stream's limit");
    kh_h2c_free(c);
    nghttp2_session_del(f.ng);
}

static void test_flow_control(void)
{
    static char big[200000];
    memset(big, 'z', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    fake f;
    fake_init(&f);
    kh_h2c_limits w = {16384, 65535, 16384, 100, 1 << 20};
    kh_h2c *c = kh_h2c_new(&w);
    int32_t id = get(c, "/big");
    pump(c, &f);
    fake_respond(&f, id, "200", big);
    pump(c, &f);
    kh_h2c_info i;
    kh_h2c_info_get(c, id, &i);
    kh_ok(!i.done && i.body_len <= 16384 && i.body_len > 0,
          "server stops at the stream window until the client takes (%zu buffered)", i.body_len);
    size_t total = 0;
    const char *p;
    for (int k = 0; k < 100 && !i.done; k++) {
        total += kh_h2c_take(c, id, &p);
        pump(c, &f);
        kh_h2c_info_get(c, id, &i);
        if (i.body_len > 16384)
            break;
    }
    total += kh_h2c_take(c, id, &p);
    kh_ok(i.done, "taking the body opens the window: the response completes");
    kh_is_int(total, sizeof(big) - 1, "every byte arrived");
    kh_h2c_free(c);
    nghttp2_session_del(f.ng);
}

static void test_garbage_and_eof(void)
{
    kh_h2c *c = kh_h2c_new(&lim);
    int32_t id = get(c, "/");
    const uint8_t *p;
    while (kh_h2c_send(c, &p) > 0) {
    }
    const char junk[] = "HTTP/1.1 200 OK\r\n\r\n";
    kh_is_int(kh_h2c_recv(c, (const uint8_t *)junk, sizeof(junk) - 1), KH_H2C_EPROTO,
              "an h1 answer to h2 is a protocol error");
    kh_h2c_info i;
    kh_h2c_info_get(c, id, &i);
    kh_is_int(i.err, KH_H2C_EPROTO, "the open stream gets it");
    kh_ok(kh_h2c_dead(c), "the session is dead");
    kh_h2c_free(c);

    fake f;
    fake_init(&f);
    c = kh_h2c_new(&lim);
    id = get(c, "/");
    pump(c, &f);
    kh_h2c_eof(c);
    kh_h2c_info_get(c, id, &i);
    kh_is_int(i.err, KH_H2C_ECLOSED, "EOF with a stream open: closed");
    kh_h2c_free(c);
    nghttp2_session_del(f.ng);
}

int main(void)
{
    test_multiplexed();
    test_post_body();
    test_interim();
    test_reset_and_goaway();
    test_limits();
    test_flow_control();
    test_garbage_and_eof();
    return kh_test_done();
}
