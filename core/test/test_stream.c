/* test_stream.c: what kh_stream_send_head hands the sink, with a sink that records it.
 * Checks the fields the engine adds: X-Request-Id as limit request_id_header says (kh_reqid.h;
 * by default only on a 5xx for a client without an id of its own, 2 on every stream, 0 never:
 * a client's id echoed is spec/request_id_header_spec's, over every protocol), and the security
 * fields on TLS streams (HSTS, nosniff): added once, after the handler's fields, never when the
 * handler set its own (any case), the security ones not at all when the limits are 0; a head
 * whose fields already hold all of them reaches the sink as the very array the app passed.
 * And kh_stream_compact: a held tunnel moves into a compact stream (refs, body, method and path
 * kept, the old pair stale, no headers), and goes back to the compact pool. */
#include <stdio.h>
#include <string.h>

#include "kh_err.h"
#include "kh_stream.h"
#include "kh_test.h"
#include "kh_worker.h"

/* ---- a sink that keeps a copy of the last head ---- */

static struct {
    const kh_header *ptr; /* the array the sink was given */
    size_t n;
    int64_t clen;
    char names[32][64], values[32][64];
} got;

static int rec_head(kh_stream *s, int status, const kh_header *h, size_t n, int64_t clen)
{
    (void)s, (void)status;
    got.ptr = h;
    got.n = n;
    got.clen = clen;
    for (size_t i = 0; i < n && i < 32; i++) {
        snprintf(got.names[i], sizeof got.names[i], "%.*s", (int)h[i].name.len, h[i].name.ptr);
        snprintf(got.values[i], sizeof got.values[i], "%.*s", (int)h[i].value.len, h[i].value.ptr);
    }
    return 0;
}

static int rec_data(kh_stream *s, const char *p, size_t n, int fin)
{
    (void)s, (void)p, (void)n, (void)fin;
    return 0;
}

static void rec_want_body(kh_stream *s)
{
    (void)s;
}

static void rec_reset(kh_stream *s, int err)
{
    (void)s, (void)err;
}

static const kh_sink_vt rec_sink = {"rec", rec_head, rec_data, rec_want_body, rec_reset,
                                     NULL, NULL, NULL, NULL, NULL, NULL, NULL};

static kh_worker W;
static kh_config cfg;
static int proto_token; /* any non-NULL proto */

static void setup(void)
{
    kh_limits_init(&cfg.limits);
    cfg.access_log_fd = -1;
    W.cfg = &cfg;
    W.limits = &cfg.limits;
    uv_loop_init(&W.loop);
    kh_bufcache_init(&W.bufs, 64);
}

/* Sends a head of n fields on a fresh stream (TLS or not); the result is in `got`. */
static int send_status = 200; /* the status send_one answers with */

static void send_one(int tls, const kh_header *h, size_t n, int64_t clen)
{
    memset(&got, 0, sizeof got);
    kh_stream *s = kh_stream_open(&W, &rec_sink, &proto_token);
    if (tls)
        s->flags |= KH_STREAM_F_TLS;
    kh_is_int(kh_stream_send_head(s, send_status, h, n, clen), 0, "send_head");
    kh_stream_release(s);
}

/* Index of the field named exactly `name` in got, or -1; counts matches (any case) in *count. */
static int find(const char *name, int *count)
{
    int at = -1;
    *count = 0;
    for (size_t i = 0; i < got.n; i++) {
        if (strcasecmp(got.names[i], name) == 0) {
            (*count)++;
            if (at < 0)
                at = (int)i;
        }
    }
    return at;
}

/* kh_stream_compact: a held tunnel moves into a compact stream with a sink that can move it;
 * the old pair goes stale, the new one has what a tunnel uses, the request's part reads empty,
 * and its release puts it in the compact pool (ASan: nothing read past the compact size). */
static kh_stream *moved_from, *moved_to;

static int tun_tunnel(kh_stream *s, const kh_header *h, size_t n)
{
    (void)s, (void)h, (void)n;
    return 0;
}

static void tun_moved(kh_stream *s, kh_stream *t)
{
    moved_from = s;
    moved_to = t;
}

static const kh_sink_vt tun_sink = {.name = "tun", .head = rec_head, .data = rec_data,
                                    .want_body = rec_want_body, .reset = rec_reset,
                                    .tunnel = tun_tunnel, .moved = tun_moved};

static void test_compact(void)
{
    kh_header h[2] = {{KH_STR_LIT("Upgrade"), KH_STR_LIT("websocket")},
                      {KH_STR_LIT("Sec-WebSocket-Key"), KH_STR_LIT("k")}};
    for (int round = 0; round < 2; round++) {
        kh_stream *s = kh_stream_open(&W, &tun_sink, &proto_token);
        kh_stream_set_head(s, KH_STR_LIT("GET"), KH_STR_LIT("/ws?x=1"), KH_STR_LIT("/ws"),
                           KH_STR_LIT("x=1"), KH_STR_LIT("h"), 1, 1, h, 2);
        kh_stream_mark_tunnel(s, KH_STR_LIT("websocket"));
        kh_ok(kh_stream_compact(s) == s, "not a held tunnel yet: stays");
        kh_is_int(kh_stream_accept_tunnel(s, NULL, 0), 0, "accepted");
        kh_stream_hold(s);
        kh_stream_retain(s); /* the app's hold */
        kh_stream_on_body(s, "abc", 3);
        uint32_t gen = s->gen, id = s->id;
        kh_stream *t = kh_stream_compact(s);
        kh_ok(t != s && moved_from == s && moved_to == t, "moved, the sink told (round %d)", round);
        kh_ok(s->gen != gen, "the old pair is stale");
        kh_ok((t->flags & KH_STREAM_F_COMPACT) && (t->flags & KH_STREAM_F_TUNNEL), "compact tunnel");
        kh_is_int(t->refs, 2, "refs kept");
        kh_is_int(t->id, id, "the same id (logs)");
        kh_ok(t->proto == &proto_token && t->body.len == 3 && memcmp(t->body.base, "abc", 3) == 0,
              "protocol and unread input kept");
        kh_ok(kh_str_eq(t->method, "GET", 3) && kh_str_eq(t->path, "/ws", 3), "method and path kept");
        kh_ok(kh_stream_header(t, "upgrade", 7) == NULL, "no headers");
        kh_ok(kh_stream_compact(t) == t, "once");
        kh_is_int(kh_stream_send_data(t, "x", 1, 0), 0, "send_data on it");
        kh_stream_body_consume(t, 3);
        kh_stream_release(t);
        kh_stream_release(t);
        kh_ok(W.compact_pool == t, "released into the compact pool");
    }
}

/* kh_stream_head_build: the fields h2 and h3 send (one builder for both) */
static int hb_has(const kh_head_buf *b, const char *name, const char *value)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->f[i].name.len == strlen(name) && memcmp(b->f[i].name.ptr, name, strlen(name)) == 0)
            return value == NULL || (b->f[i].value.len == strlen(value) &&
                                     memcmp(b->f[i].value.ptr, value, strlen(value)) == 0);
    return 0;
}

static void test_head_build(void)
{
    kh_stream *s = kh_stream_open(&W, &rec_sink, &proto_token);
    kh_head_buf b;
    kh_header h[3] = {{KH_STR_LIT("Content-Type"), KH_STR_LIT("text/plain")},
                      {KH_STR_LIT("Connection"), KH_STR_LIT("close")},
                      {KH_STR_LIT("Content-Length"), KH_STR_LIT("99")}};
    kh_stream_head_build(&b, s, 200, h, 3, 5);
    kh_is_int(b.n, 5, "status, server, date, content-type, content-length");
    kh_ok(b.f[0].name.len == 7 && memcmp(b.f[0].name.ptr, ":status", 7) == 0 &&
              hb_has(&b, ":status", "200"),
          ":status first");
    kh_ok(hb_has(&b, "server", "khamsin") && hb_has(&b, "date", NULL), "server and date added");
    kh_ok(hb_has(&b, "content-type", "text/plain"), "names lower-cased, values as given");
    kh_ok(!hb_has(&b, "connection", NULL), "connection-specific fields dropped");
    kh_ok(hb_has(&b, "content-length", "5"), "content-length is the builder's own");
    kh_ok(!b.no_data && b.f == b.f_local && b.lower == b.lower_local, "no allocation");
    kh_stream_head_free(&b);

    kh_header own[2] = {{KH_STR_LIT("Server"), KH_STR_LIT("mine")},
                        {KH_STR_LIT("DATE"), KH_STR_LIT("then")}};
    kh_stream_head_build(&b, s, 304, own, 2, 10);
    kh_is_int(b.n, 3, "the app's server and date kept, not doubled; 304: no content-length");
    kh_ok(hb_has(&b, "server", "mine") && hb_has(&b, "date", "then") && b.no_data, "304");
    kh_stream_head_free(&b);
    kh_stream_head_build(&b, s, 999, NULL, 0, 7);
    kh_ok(hb_has(&b, ":status", "999"), ":status 999");
    kh_stream_head_free(&b);
    kh_stream_head_build(&b, s, 0, NULL, 0, 7);
    kh_ok(hb_has(&b, ":status", "0"), "a status out of range as a number");
    kh_stream_head_free(&b);
    kh_stream_head_build(&b, s, 200, NULL, 0, 0);
    kh_ok(b.no_data && hb_has(&b, "content-length", "0"), "length 0: no data");
    kh_stream_head_free(&b);
    kh_stream_head_build(&b, s, 200, NULL, 0, -1);
    kh_ok(!b.no_data && !hb_has(&b, "content-length", NULL), "streamed: no content-length");
    kh_stream_head_free(&b);

    /* past the on-stack room: the heap (ASan checks it is freed) */
    kh_header many[KH_HEAD_LOCAL];
    char longname[300];
    memset(longname, 'N', sizeof longname);
    for (int i = 0; i < KH_HEAD_LOCAL; i++)
        many[i] = (kh_header){KH_STR_LIT("X-Many"), KH_STR_LIT("v")};
    many[0].name = (kh_str){longname, sizeof longname};
    kh_stream_head_build(&b, s, 200, many, KH_HEAD_LOCAL, 1);
    kh_is_int(b.n, KH_HEAD_LOCAL + 4, "all fields");
    kh_ok(b.f != b.f_local && b.lower != b.lower_local, "fields and names on the heap");
    kh_ok(b.f[3].name.len == 300 && b.f[3].name.ptr[0] == 'n' && b.f[3].name.ptr[299] == 'n',
          "a long name lower-cased whole");
    kh_ok(hb_has(&b, "x-many", "v") && hb_has(&b, "content-length", "1"), "the rest");
    kh_stream_head_free(&b);
    kh_stream_release(s);
}

/* kh_stream_set_head: header names lower-cased (a word at a time: every length from 0 to 40,
 * every byte value at every place), values as given; the arena comes back through the worker's
 * cache (blocks of two sizes, a larger head malloc'd) and kh_stream_hold's block goes to malloc. */
static void test_set_head(void)
{
    char name[41], value[41];
    int bad = 0;
    for (size_t n = 0; n <= 40; n++)
        for (int v = 0; v < 256; v += 1) {
            kh_stream *s = kh_stream_open(&W, &rec_sink, &proto_token);
            for (size_t i = 0; i < n; i++)
                name[i] = (char)((i * 37 + (size_t)v * 11) & 0xff), value[i] = name[i];
            if (n)
                name[(size_t)v % n] = (char)v;
            kh_header h[2] = {{{name, n}, {value, n}}, {KH_STR_LIT("X-Big"), {NULL, 0}}};
            char big[1600];
            memset(big, 'v', sizeof big);
            /* every 4th head is past the cache's largest block: malloc'd */
            h[1].value = (kh_str){big, (v & 3) == 3 ? sizeof big : (size_t)v};
            kh_stream_set_head(s, KH_STR_LIT("GET"), KH_STR_LIT("/"), KH_STR_LIT("/"),
                               (kh_str){NULL, 0}, KH_STR_LIT("h"), 1, 1, h, 2);
            const kh_header *g = &s->headers[0];
            for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)name[i];
                char want = (char)(c >= 'A' && c <= 'Z' ? c | 0x20 : c);
                bad += g->name.ptr[i] != want || g->value.ptr[i] != value[i];
            }
            bad += g->name.len != n || g->name.ptr[n] != '\0' || g->value.len != n;
            bad += !kh_str_eq(s->headers[1].name, "x-big", 5) || s->headers[1].value.len != h[1].value.len;
            if (v == 7)
                kh_stream_hold(s); /* the held stream's small block: malloc'd, freed with it */
            kh_stream_release(s);
        }
    kh_is_int(bad, 0, "names lower-cased, values kept, at every length and byte");
    /* HTTP/2: the names are lower case already (kh_h2_fields_check): copied as they are */
    kh_stream *s2 = kh_stream_open(&W, &rec_sink, &proto_token);
    kh_header h2[1] = {{KH_STR_LIT("x-h2"), KH_STR_LIT("V")}};
    kh_stream_set_head(s2, KH_STR_LIT("GET"), KH_STR_LIT("/"), KH_STR_LIT("/"), (kh_str){NULL, 0},
                       KH_STR_LIT("h"), 2, 0, h2, 1);
    kh_ok(kh_str_eq(s2->headers[0].name, "x-h2", 4) && kh_str_eq(s2->headers[0].value, "V", 1),
          "h2: name and value copied");
    kh_stream_release(s2);
    kh_ok(W.arena_cached > 0 && W.arena_free[0] != NULL, "arenas back in the worker's cache");
    kh_stream_arena_drain(&W);
    kh_ok(W.arena_cached == 0 && W.arena_free[0] == NULL && W.arena_free[1] == NULL, "drained");
}

/* kh_stream_content_type: the engine's two types come back as its constants, which send_head
 * passes unscanned; any other value (the same bytes at another address included) is checked as
 * a field of the app's: a CR or LF in it is refused. */
static void test_content_type(void)
{
    char text[] = "text/plain; charset=utf-8", json[] = "application/json";
    kh_header t = kh_stream_content_type(text, strlen(text));
    kh_header j = kh_stream_content_type(json, strlen(json));
    kh_ok(t.value.ptr != text && t.value.len == 25 && memcmp(t.value.ptr, text, 25) == 0 &&
              strcmp(t.name.ptr, "Content-Type") == 0,
          "content_type(text/plain; charset=utf-8): the engine's constant");
    kh_ok(j.value.ptr != json && j.value.len == 16 && memcmp(j.value.ptr, json, 16) == 0,
          "content_type(application/json): the engine's constant");
    char other[] = "text/html";
    kh_header o = kh_stream_content_type(other, strlen(other));
    kh_ok(o.value.ptr == other && o.name.ptr != t.name.ptr, "another type: its own bytes");
    send_one(0, &t, 1, 5);
    kh_ok(got.n == 2 && strcmp(got.values[0], "text/plain; charset=utf-8") == 0,
          "the constant is sent");
    char bad[] = "text/plain\r\nX-Evil: 1";
    kh_header b = kh_stream_content_type(bad, strlen(bad));
    kh_stream *s = kh_stream_open(&W, &rec_sink, &proto_token);
    kh_is_int(kh_stream_send_head(s, 200, &b, 1, 0), KH_EINVAL,
              "a type with CR LF from the app: still refused");
    kh_stream_release(s);
    char cut[] = "text/plain; charset=utf-8\r\n";
    b = kh_stream_content_type(cut, strlen(cut)); /* not the constant: 27 bytes */
    s = kh_stream_open(&W, &rec_sink, &proto_token);
    kh_is_int(kh_stream_send_head(s, 200, &b, 1, 0), KH_EINVAL,
              "the text type followed by CR LF: refused");
    kh_stream_release(s);
}

int main(void)
{
    setup();
    test_compact();
    test_set_head();
    kh_header ct = {KH_STR_LIT("Content-Type"), KH_STR_LIT("text/plain")};
    int count, at;

    /* the default (1): no id of the client's, so none on a 200, a made one on a 5xx */
    kh_is_int(cfg.limits.request_id_header, 1, "request_id_header: 1 by default");
    send_one(0, &ct, 1, 5);
    kh_ok(got.ptr == &ct && got.n == 1, "default, cleartext 200, no client id: the app's fields as is");
    send_one(1, &ct, 1, 5);
    find("X-Request-Id", &count);
    kh_ok(got.n == 3 && count == 0, "default, TLS 200: the security fields, no X-Request-Id");
    send_status = 500;
    send_one(0, &ct, 1, 5);
    kh_ok(got.n == 2 && strcmp(got.names[1], "X-Request-Id") == 0, "default, a 500: the id added");
    send_status = 503;
    send_one(0, NULL, 0, 0);
    kh_ok(got.n == 1 && strcmp(got.names[0], "X-Request-Id") == 0, "default, a 503: the id added");
    send_status = 499;
    send_one(0, &ct, 1, 5);
    kh_is_int(got.n, 1, "default, a 499: none");
    send_status = 200;
    cfg.limits.request_id_header = 0;
    send_status = 500;
    send_one(0, &ct, 1, 5);
    kh_ok(got.ptr == &ct && got.n == 1, "request_id_header 0, a 500: none");
    send_status = 200;

    /* 2: on every stream; the rest of the checks below count it */
    cfg.limits.request_id_header = 2;
    send_one(0, &ct, 1, 5);
    kh_is_int(got.n, 2, "cleartext: X-Request-Id added");
    kh_ok(strcmp(got.names[1], "X-Request-Id") == 0, "after the handler's fields");
    unsigned wid, sid;
    char hex[9];
    kh_ok(sscanf(got.values[1], "%8[0-9a-f]-%u-%u", hex, &wid, &sid) == 3 && strlen(hex) == 8,
          "a made id: %s", got.values[1]);
    char first[64];
    snprintf(first, sizeof first, "%s", got.values[1]);
    send_one(0, &ct, 1, 5);
    kh_ok(strcmp(first, got.values[1]) != 0, "the next stream's id differs: %s", got.values[1]);
    kh_header rid[2] = {ct, {KH_STR_LIT("x-REQUEST-id"), KH_STR_LIT("mine")}};
    send_one(0, rid, 2, 5);
    kh_ok(got.ptr == rid && got.n == 2, "cleartext with the app's X-Request-Id (any case): as is");

    send_one(1, &ct, 1, -1);
    kh_is_int(got.n, 4, "TLS: three fields added");
    kh_ok(strcmp(got.names[0], "Content-Type") == 0, "the handler's fields first");
    at = find("Strict-Transport-Security", &count);
    kh_is_int(count, 1, "one Strict-Transport-Security");
    kh_ok(at >= 0 && strcmp(got.values[at], "max-age=31536000") == 0, "default max-age: %s",
          at >= 0 ? got.values[at] : "-");
    at = find("X-Content-Type-Options", &count);
    kh_is_int(count, 1, "one X-Content-Type-Options");
    kh_ok(at >= 0 && strcmp(got.values[at], "nosniff") == 0, "nosniff");
    kh_is_int(got.clen, -1, "a streamed head keeps its unknown length");

    send_one(1, NULL, 0, 0);
    kh_is_int(got.n, 3, "TLS, no fields from the app: the three are still added");

    kh_header own[2] = {{KH_STR_LIT("STRICT-transport-Security"), KH_STR_LIT("max-age=5")}, ct};
    send_one(1, own, 2, 0);
    kh_is_int(got.n, 4, "the handler's HSTS (any case): only X-Request-Id and nosniff added");
    find("strict-transport-security", &count);
    kh_is_int(count, 1, "HSTS not doubled");
    kh_ok(strcmp(got.values[0], "max-age=5") == 0, "and its value kept");

    kh_header both[3] = {{KH_STR_LIT("x-content-type-options"), KH_STR_LIT("nosniff")},
                         {KH_STR_LIT("strict-transport-security"), KH_STR_LIT("max-age=0")},
                         {KH_STR_LIT("X-Request-Id"), KH_STR_LIT("abc")}};
    send_one(1, both, 3, 0);
    kh_ok(got.ptr == both && got.n == 3, "all three set by the handler: its array, as is");

    /* more fields than the on-stack copy holds: the heap copy (ASan checks it is freed) */
    kh_header many[20];
    for (int i = 0; i < 20; i++)
        many[i] = (kh_header){KH_STR_LIT("X-Many"), KH_STR_LIT("v")};
    send_one(1, many, 20, 0);
    kh_is_int(got.n, 23, "20 fields + 3");
    kh_ok(strcmp(got.names[20], "X-Request-Id") == 0 &&
              strcmp(got.names[21], "Strict-Transport-Security") == 0 &&
              strcmp(got.names[22], "X-Content-Type-Options") == 0,
          "added after the handler's fields");

    cfg.limits.hsts_max_age = 600;
    send_one(1, &ct, 1, 0);
    at = find("Strict-Transport-Security", &count);
    kh_ok(at >= 0 && strcmp(got.values[at], "max-age=600") == 0, "hsts_max_age=600: %s",
          at >= 0 ? got.values[at] : "-");

    cfg.limits.hsts_max_age = 0;
    send_one(1, &ct, 1, 0);
    kh_is_int(got.n, 3, "hsts_max_age=0: no HSTS, X-Request-Id and nosniff still added");
    find("Strict-Transport-Security", &count);
    kh_is_int(count, 0, "no HSTS");

    cfg.limits.tls_nosniff = 0;
    send_one(1, &ct, 1, 0);
    kh_is_int(got.n, 2, "both off: only X-Request-Id added");
    send_one(1, rid, 2, 0);
    kh_ok(got.ptr == rid && got.n == 2, "both off, the app's X-Request-Id: as is");

    test_head_build();
    test_content_type();
    return kh_test_done();
}
