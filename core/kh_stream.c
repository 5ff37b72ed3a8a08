/* kh_stream.c: the protocol-neutral request/response (see kh_stream.h).
 * Owns:  stream pooling and generations, the head arena, the request body buffer, routing (on
 *        the path's normal form, kh_path.h) and the replies the engine gives without the app
 *        (400 for a path with no normal form or a param holding "..", 413; 404 and 405 unless
 *        the app asked for them: kh_router_set_fallback).
 *        Two reply-path hooks, each in its own functions: the 304 for a conditional GET/HEAD
 *        (kh_cond.h) and response compression (kh_compress.h, only with the compress limit on).
 * In:    kh_stream_on_* from protocols; kh_stream_send_* from the app.
 * Out:   sink calls; kh_app_vt calls; access-log lines.
 * Never: formats wire bytes. */
#include "kh_stream.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "kh_app.h"
#include "kh_asan.h"
#include "kh_compress.h"
#include "kh_cond.h"
#include "kh_err.h"
#include "kh_log.h"
#include "kh_path.h"
#include "kh_reqid.h"
#include "kh_worker.h"

/* the Content-Type fields the engine writes itself (kh_stream_content_type, header_ok) */
static const char ctype_name[] = "Content-Type";
static const char ctype_text[] = "text/plain; charset=utf-8";
static const char ctype_json[] = "application/json";

size_t kh_addr_format(const kh_addr *a, char *buf, size_t cap)
{
    const char *r = NULL;
    if (a->family == 4)
        r = inet_ntop(AF_INET, a->bytes, buf, (socklen_t)cap);
    else if (a->family == 6)
        r = inet_ntop(AF_INET6, a->bytes, buf, (socklen_t)cap);
    if (r == NULL) {
        snprintf(buf, cap, "-");
    }
    return strlen(buf);
}

/* ---- the request head's arena ----
 * One block per request (kh_stream_set_head), freed when the stream is. Under h2load -c 64 -m 10
 * a read's worth of streams is in flight at once (640), more of one size than glibc's per-thread
 * cache keeps (7), so most went through _int_malloc/_int_free: ~390 instructions a request
 * (bench/h2.sh PARTS=ir). The worker keeps released blocks of two sizes, up to ARENA_CACHE_BYTES
 * (drained at the worker's end: kh_stream_arena_drain); a larger head, and kh_stream_hold's small
 * block, are malloc'd (ARENA_MALLOC). Under ASan a cached block is poisoned past its link. */
enum { ARENA_NCLASS = 2, ARENA_MALLOC = 0xff, ARENA_CACHE_BYTES = 512 * 1024 };
static const uint16_t arena_size[ARENA_NCLASS] = {512, 1536};

static char *arena_alloc(kh_stream *s, size_t bytes)
{
    kh_worker *w = s->worker;
    unsigned k = bytes <= arena_size[0] ? 0 : bytes <= arena_size[1] ? 1 : ARENA_MALLOC;
    char *b;
    s->arena_class = (uint8_t)k;
    if (k == ARENA_MALLOC)
        return kh_xmalloc(bytes);
    if ((b = w->arena_free[k]) != NULL) {
#ifdef KH_ASAN
        ASAN_UNPOISON_MEMORY_REGION(b, arena_size[k]);
#endif
        memcpy(&w->arena_free[k], b, sizeof(void *));
        w->arena_cached -= arena_size[k];
        return b;
    }
    return kh_xmalloc(arena_size[k]);
}

static void arena_free(kh_stream *s)
{
    kh_worker *w = s->worker;
    char *b = s->arena;
    unsigned k = s->arena_class;
    s->arena = NULL;
    if (b == NULL)
        return;
    if (k == ARENA_MALLOC || w->arena_cached + arena_size[k] > ARENA_CACHE_BYTES) {
        free(b);
        return;
    }
    memcpy(b, &w->arena_free[k], sizeof(void *));
    w->arena_free[k] = b;
    w->arena_cached += arena_size[k];
#ifdef KH_ASAN
    ASAN_POISON_MEMORY_REGION(b + sizeof(void *), arena_size[k] - sizeof(void *));
#endif
}

void kh_stream_arena_drain(kh_worker *w)
{
    for (int k = 0; k < ARENA_NCLASS; k++)
        while (w->arena_free[k]) {
            void *p = w->arena_free[k];
#ifdef KH_ASAN
            ASAN_UNPOISON_MEMORY_REGION(p, arena_size[k]);
#endif
            memcpy(&w->arena_free[k], p, sizeof p);
            free(p);
        }
    w->arena_cached = 0;
}

kh_stream *kh_stream_open(kh_worker *w, const kh_sink_vt *sink, void *proto)
{
    kh_stream *s = w->stream_pool;
    uint32_t gen = 1;
    if (s) {
        w->stream_pool = s->pool_next;
        gen = s->gen;
    } else {
        s = kh_slab_alloc(&w->stream_slab, sizeof *s);
    }
    /* Clear only the request-scoped header; the params array is filled up to num_params. */
    memset(s, 0, offsetof(kh_stream, params));
    s->params = s->params_inline;
    s->gen = gen;
    s->sink = sink;
    s->proto = proto;
    s->worker = w;
    s->refs = 1;
    s->id = ++w->next_stream_id;
    s->status = 0;
    s->compress = NULL;
    s->bytes_sent = 0;
    s->app_data = NULL;
    s->app_wait = 0;
    s->app_defer = NULL;
    s->tunnel_proto[0] = '\0';
    s->inst = NULL;
    s->body_limit = w->limits->body_bytes;
    s->start_ms = uv_now(&w->loop);
    return s;
}

void kh_stream_retain(kh_stream *s)
{
    s->refs++;
}

void kh_stream_release(kh_stream *s)
{
    if (--s->refs > 0)
        return;
    kh_worker *w = s->worker;
    if (s->inst) {
        kh_app_inst_release(s->inst);
        s->inst = NULL;
    }
    arena_free(s);
    kh_buf_release(&s->body, &w->bufs);
    kh_compress_free(s->compress); /* a compressed reply that never finished */
    s->compress = NULL;
    s->gen++; /* every {pointer, generation} pair the app still holds is now stale */
    s->proto = NULL;
    if (s->flags & KH_STREAM_F_COMPACT) {
        s->pool_next = w->compact_pool;
        w->compact_pool = s;
        return;
    }
    if (s->params != s->params_inline)
        free(s->params);
    s->params = s->params_inline;
    s->pool_next = w->stream_pool;
    w->stream_pool = s;
}

kh_stream *kh_stream_compact(kh_stream *s)
{
    if ((s->flags & (KH_STREAM_F_TUNNEL | KH_STREAM_F_HELD | KH_STREAM_F_COMPACT)) !=
            (KH_STREAM_F_TUNNEL | KH_STREAM_F_HELD) ||
        s->proto == NULL || s->sink->moved == NULL || s->compress)
        return s;
    kh_worker *w = s->worker;
    kh_stream *t = w->compact_pool;
    uint32_t gen = 1;
    if (t) {
        w->compact_pool = t->pool_next;
        gen = t->gen;
    } else {
        t = kh_slab_alloc(&w->compact_slab, KH_STREAM_COMPACT_SIZE + KH_STREAM_COMPACT_INLINE);
    }
    memcpy(t, s, KH_STREAM_COMPACT_SIZE);
    t->gen = gen;
    t->flags |= KH_STREAM_F_COMPACT;
    size_t ml = s->method.len, pl = s->path.len;
    if (ml + pl + 2 <= KH_STREAM_COMPACT_INLINE) {
        /* the access log's method and path in the tail: kh_stream_hold's block goes back */
        char *a = (char *)t + KH_STREAM_COMPACT_SIZE;
        memcpy(a, s->method.ptr ? s->method.ptr : "", ml);
        a[ml] = '\0';
        memcpy(a + ml + 1, s->path.ptr ? s->path.ptr : "", pl);
        a[ml + 1 + pl] = '\0';
        t->method = (kh_str){a, ml};
        t->path = (kh_str){a + ml + 1, pl};
        t->arena = NULL;
        arena_free(s);
    }
    s->sink->moved(s, t);
    /* s gives everything it owned to t (arena, body, inst, refs) and goes back to the pool
     * without an access log line or an app event: the stream lives on as t */
    s->arena = NULL;
    s->body = (kh_buf){0};
    s->inst = NULL;
    s->app_data = s->app_defer = NULL;
    s->refs = 1;
    kh_stream_release(s);
    return t;
}

/* A request-head string into the arena, NUL-terminated; header names lower-cased. memcpy for the
 * rest: a byte loop with the lower test was 416 of ~7,400 instructions per h1 hello request
 * (bench/callgrind.sh, wrk -c64: method, target, authority, one Host header). */
/* n bytes of src into dst, ASCII upper case lowered, 8 bytes at a time (a name of 12 bytes: one
 * word and an overlapping last word, not 12 tests): the byte loop was ~10 instructions a byte,
 * ~250 a response and ~150 a request of h2load's (bench/h2.sh PARTS=ir). */
static void lower_copy(char *dst, const char *src, size_t n)
{
    if (n < 8) {
        for (size_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)src[i];
            dst[i] = (char)(ch | ((unsigned char)(ch - 'A') < 26u ? 0x20 : 0));
        }
        return;
    }
    for (size_t i = 0;; i += 8) {
        if (i + 8 > n)
            i = n - 8; /* the last word overlaps the one before: lowering twice changes nothing */
        uint64_t x, h;
        memcpy(&x, src + i, 8);
        h = x & 0x7f7f7f7f7f7f7f7fu;
        /* bit 7 of each byte: h >= 'A' (h + 0x3f), h > 'Z' (h + 0x25), and the byte is ASCII */
        uint64_t up = (h + 0x3f3f3f3f3f3f3f3fu) & ~(h + 0x2525252525252525u) & ~x &
                      0x8080808080808080u;
        x |= up >> 2; /* 0x80 >> 2 = 0x20 */
        memcpy(dst + i, &x, 8);
        if (i + 8 == n)
            return;
    }
}

static void copy_str(char **at, kh_str *dst, kh_str src, int lower)
{
    char *p = *at;
    if (lower) {
        lower_copy(p, src.ptr, src.len);
    } else if (src.len) {
        memcpy(p, src.ptr, src.len);
    }
    p[src.len] = '\0';
    dst->ptr = src.ptr ? p : NULL;
    dst->len = src.len;
    *at = p + src.len + 1;
}

void kh_stream_set_head(kh_stream *s, kh_str method, kh_str target, kh_str path, kh_str query,
                        kh_str authority, int major, int minor, const kh_header *h, size_t n)
{
    /* One block: the header array first (aligned), then every string NUL-terminated. */
    size_t bytes = n * sizeof(kh_header) + method.len + target.len + path.len + query.len +
                   authority.len + 5;
    for (size_t i = 0; i < n; i++)
        bytes += h[i].name.len + h[i].value.len + 2;
    s->arena = arena_alloc(s, bytes);
    s->headers = (kh_header *)s->arena;
    char *at = s->arena + n * sizeof(kh_header);
    copy_str(&at, &s->method, method, 0);
    copy_str(&at, &s->target, target, 0);
    /* The router and req.path see the normal form (kh_path.h); req.target stays raw. It is never
     * longer than the raw path, so the arena's room for path.len bytes holds it. */
    ssize_t plen = kh_path_normalize(path.ptr, path.len, at, 0);
    if (plen >= 0) {
        s->path = (kh_str){path.ptr ? at : NULL, (size_t)plen};
        at[plen] = '\0';
        at += path.len + 1;
    } else {
        s->path_error = (int8_t)plen; /* answered 400 by kh_stream_on_head */
        copy_str(&at, &s->path, path, 0);
    }
    copy_str(&at, &s->query, query, 0);
    copy_str(&at, &s->authority, authority, 0);
    /* HTTP/2's names are lower case already: kh_h2_fields_check refuses any other (RFC 9113
     * §8.2.1), so they are copied as they are (lower_copy was ~50 instructions an h2load
     * request, bench/h2.sh PARTS=ir) */
    int lower = major != 2;
    for (size_t i = 0; i < n; i++) {
        copy_str(&at, &s->headers[i].name, h[i].name, lower);
        copy_str(&at, &s->headers[i].value, h[i].value, 0);
        /* If-None-Match, If-Modified-Since (13, 17 bytes): checked at send_head (kh_cond.h) */
        if (KH_UNLIKELY(h[i].name.len == 13 || h[i].name.len == 17) &&
            (kh_str_eq(s->headers[i].name, "if-none-match", 13) ||
             kh_str_eq(s->headers[i].name, "if-modified-since", 17)))
            s->flags |= KH_STREAM_F_COND;
    }
    s->num_headers = (uint32_t)n;
    s->version_major = (uint8_t)major;
    s->version_minor = (uint8_t)minor;
    if (kh_str_eq(s->method, "HEAD", 4))
        s->flags |= KH_STREAM_F_HEAD_METHOD;
    if (!(s->flags & KH_STREAM_F_HEAD_METHOD) && !kh_str_eq(s->method, "GET", 3))
        s->flags &= (uint16_t)~KH_STREAM_F_COND; /* 304 is for GET and HEAD only */
}

const kh_header *kh_stream_header(const kh_stream *s, const char *lname, size_t len)
{
    if (s->flags & KH_STREAM_F_COMPACT)
        return NULL;
    for (uint32_t i = 0; i < s->num_headers; i++)
        if (kh_str_eq(s->headers[i].name, lname, len))
            return &s->headers[i];
    return NULL;
}

int kh_stream_expect_body(kh_stream *s, int64_t length)
{
    s->body_expected = length;
    if (length == 0) {
        s->body_state = KH_BODY_COMPLETE;
        return 0;
    }
    s->body_state = KH_BODY_READING;
    if (length > 0 && (uint64_t)length > s->body_limit) {
        s->body_state = KH_BODY_TOO_LARGE;
        return KH_ELIMIT;
    }
    return 0;
}

/* The app state a stream's calls go to: its instance's, or the worker's for a worker-shaped
 * test harness that has no instances. app_gone: its instance is closed (the worker stops). */
static void *stream_app(kh_stream *s)
{
    return s->inst ? s->inst->app : s->worker->app;
}

static int app_gone(kh_stream *s)
{
    return s->inst && s->inst->closed;
}

static void notify_body(kh_stream *s)
{
    if ((s->flags & KH_STREAM_F_APP) && s->app_wait && !app_gone(s)) {
        kh_worker *w = s->worker;
        w->cfg->app->on_body(stream_app(s), s);
    }
}

int kh_stream_on_body(kh_stream *s, const char *p, size_t n)
{
    if (s->body_state != KH_BODY_READING)
        return s->body_state == KH_BODY_TOO_LARGE ? KH_ELIMIT : 0;
    if (s->body_received + n > s->body_limit) {
        s->body_state = KH_BODY_TOO_LARGE;
        kh_buf_release(&s->body, &s->worker->bufs);
        kh_stream_respond_error(s, 413, "Request body too large", 1);
        notify_body(s);
        return KH_ELIMIT;
    }
    s->body_received += n;
    kh_buf_append(&s->body, &s->worker->bufs, p, n);
    if (s->flags & KH_STREAM_F_BODY_STREAM)
        notify_body(s); /* incremental: every arrival wakes a reader (the window bounds s->body) */
    return 0;
}

void kh_stream_on_body_end(kh_stream *s)
{
    if (s->body_state != KH_BODY_READING)
        return;
    s->body_state = KH_BODY_COMPLETE;
    notify_body(s);
}

void kh_stream_on_body_error(kh_stream *s, int status, const char *reason)
{
    kh_stream_retain(s);
    if (s->body_state == KH_BODY_READING)
        s->body_state = KH_BODY_ABORTED;
    kh_stream_respond_error(s, status, reason, 1);
    notify_body(s);
    kh_stream_release(s);
}

void kh_stream_on_head(kh_stream *s)
{
    kh_worker *w = s->worker;
    if (s->body_state == KH_BODY_TOO_LARGE) {
        kh_stream_respond_error(s, 413, "Request body too large", 1);
        return;
    }
    if (s->path_error) {
        kh_stream_respond_error(s, 400, kh_path_strerror(s->path_error), 0);
        return;
    }
    kh_route_match m;
    m.num_params = 0;
    const kh_router *rt = w->inst ? w->inst->router : w->router;
    if (s->flags & KH_STREAM_F_TUNNEL_REQ) {
        /* a route of the tunnel kind ("@websocket") first; without one the request is an
         * ordinary one (an h1 GET + Upgrade is served as HTTP/1.1, the Upgrade ignored) */
        char kind[KH_TUNNEL_PROTO_MAX + 1];
        size_t klen = strlen(s->tunnel_proto);
        kind[0] = '@';
        memcpy(kind + 1, s->tunnel_proto, klen);
        kh_router_match(rt, (kh_str){kind, klen + 1}, s->path, &m);
        if (m.status != 0 && m.status != 400) {
            s->flags &= ~KH_STREAM_F_TUNNEL_REQ;
            m.num_params = 0;
            kh_router_match(rt, s->method, s->path, &m);
        }
    } else {
        kh_router_match(rt, s->method, s->path, &m);
    }
    if (m.status == 400) {
        kh_stream_respond_error(s, 400, "a path parameter holds a '..' segment", 0);
        return;
    }
    if ((m.status == 404 || m.status == 405) && kh_router_fallback(rt) != 0) {
        /* the app has middleware or error handlers: they see unmatched requests too */
        m.value = kh_router_fallback(rt);
        s->route_status = (int16_t)m.status;
    } else if (m.status == 404) {
        kh_stream_respond_error(s, 404, "Not Found", 0);
        return;
    }
    else if (m.status == 405 && m.allow[0] == '\0') {
        /* the path has routes of a tunnel kind only (k.websocket): RFC 9110 §15.5.22 */
        kh_stream_respond_error(s, 426, "Upgrade Required", 0);
        return;
    } else if (m.status == 405) {
        kh_header allow = {KH_STR_LIT("Allow"), {m.allow, strlen(m.allow)}};
        kh_header hs[2] = {allow, kh_stream_content_type(ctype_text, sizeof ctype_text - 1)};
        kh_stream_respond(s, 405, hs, 2, "Method Not Allowed\n", 19);
        return;
    }
    if (m.value & KH_ROUTE_BODY_STREAM) {
        m.value &= ~KH_ROUTE_BODY_STREAM;
        if (s->body_state == KH_BODY_READING)
            kh_stream_body_stream(s); /* declared for the route: no body_bytes, a window */
    }
    s->route_value = m.value;
    s->num_params = (uint32_t)m.num_params;
    if (m.num_params > KH_ARRAY_LEN(s->params_inline))
        s->params = kh_xmalloc(m.num_params * sizeof m.params[0]);
    memcpy(s->params, m.params, m.num_params * sizeof m.params[0]);
    s->flags |= KH_STREAM_F_APP;
    kh_stream_retain(s);
    if (w->inst) {
        s->inst = w->inst;
        kh_app_inst_retain(s->inst);
    }
    w->cfg->app->dispatch(stream_app(s), s);
}

void kh_stream_on_reset(kh_stream *s, int err)
{
    if (s->flags & KH_STREAM_F_ABORTED)
        return;
    s->flags |= KH_STREAM_F_ABORTED;
    s->proto = NULL;
    if (s->body_state == KH_BODY_READING)
        s->body_state = KH_BODY_ABORTED;
    /* (ws branch) an app still waiting on the body of a stream whose response it ended (a
     * tunnel ended by a push from another coroutine while its reader waits for input) is told
     * too, or its coroutine would wait forever and keep the stream */
    if ((s->flags & KH_STREAM_F_APP) && (!(s->flags & KH_STREAM_F_ENDED) || s->app_wait) &&
        !app_gone(s)) {
        kh_worker *w = s->worker;
        w->cfg->app->on_abort(stream_app(s), s);
    }
    kh_stream_release(s); /* the protocol's ref */
}

void kh_stream_want_body(kh_stream *s)
{
    if (s->proto && s->body_state == KH_BODY_READING)
        s->sink->want_body(s);
}

/* RFC 9110 §5.6.2 tchar, and §5.5 field-value bytes (VCHAR, obs-text, SP, HTAB): nothing that
 * could end a line or smuggle a header. Tables, not strchr: this runs for every response header
 * (bench/callgrind.sh: 506 -> ~60 instructions per hello-world response). */
static const uint8_t tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1,
    ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
    ['8'] = 1, ['9'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,
    ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1,
    ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
    ['Y'] = 1, ['Z'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1,
    ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1,
    ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
    ['y'] = 1, ['z'] = 1,
};

/* A field value has no byte below 0x20 but HTAB, and no DEL: eight bytes at a time (SWAR, as
 * Lwan's string_as_uint64), a byte loop for the tail (bench/callgrind.sh: header_ok was 388 of
 * ~7,400 instructions per h1 hello request, for one Content-Type). */
static int value_ok(const unsigned char *p, size_t n)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        /* nonzero when some byte is < 0x20, or is 0x7f (the classic "has less" / "has zero"
         * tests: exact about whether one exists, not about which) */
        uint64_t del = v ^ (ones * 0x7f);
        if ((((v - ones * 0x20) & ~v) | ((del - ones) & ~del)) & high)
            break; /* a word with a control byte or HTAB: the byte loop decides */
    }
    for (; i < n; i++)
        if ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f)
            return 0;
    return 1;
}

/* The Content-Type fields the engine writes itself: kh_stream_content_type hands out this name
 * only beside one of these values, so a field whose name is this very array was checked here,
 * once, and header_ok passes it on a pointer test. Scanning the name and value of every reply's
 * text/plain type was ~140 instructions per h1 hello request: 5,577 -> 5,463
 * (REQUESTS=20000 CONNS=64 bench/callgrind.sh). The arrays are at the top of the file. */
kh_header kh_stream_content_type(const char *value, size_t len)
{
    if (len == sizeof ctype_text - 1 && memcmp(value, ctype_text, len) == 0)
        return (kh_header){{ctype_name, sizeof ctype_name - 1}, {ctype_text, len}};
    if (len == sizeof ctype_json - 1 && memcmp(value, ctype_json, len) == 0)
        return (kh_header){{ctype_name, sizeof ctype_name - 1}, {ctype_json, len}};
    return (kh_header){KH_STR_LIT("Content-Type"), {value, len}};
}

static int header_ok(const kh_header *h)
{
    if (h->name.ptr == ctype_name)
        return 1; /* the engine's own (kh_stream_content_type) */
    if (h->name.len == 0)
        return 0;
    const unsigned char *p = (const unsigned char *)h->name.ptr;
    for (size_t i = 0; i < h->name.len; i++)
        if (!tchar[p[i]])
            return 0;
    return value_ok((const unsigned char *)h->value.ptr, h->value.len);
}

/* The security fields every TLS response carries unless the handler set its own. Then its value
 * goes out unchanged and alone: a UA processes only the first Strict-Transport-Security field
 * (RFC 6797 §8.1), and testssl rates two as a MEDIUM misconfiguration. HSTS belongs to secure
 * transports only (§7.2: not sent over plain HTTP, §8.1: ignored there), and on cleartext the
 * engine adds nothing, so those responses stay as they were, byte for byte. No includeSubDomains
 * by default: the engine cannot know that every subdomain serves HTTPS. nosniff stops a browser
 * from running a text/plain or JSON body as a script (Django sends it by default too). Decided
 * here, once, for every protocol: the sinks just encode what they get. */
/* The head with the headers the engine adds, each unless h already has that field:
 * X-Request-Id (kh_reqid) as limit request_id_header says (a handler's own X-Request-Id always
 * goes out: it is just one of h): by default (1) when the client sent a sane one of its own,
 * and on every 5xx (a handler error's log line names the id); 2 on every reply; 0 never. The
 * default sends no field the client did not ask for, as nginx, Envoy and lighttpd do: an id made
 * here and sent on every reply cost an h2c hello 1,425 of 12,346 instructions (HPACK
 * Huffman-codes a new value each time) and 15-60% of its server CPU per request, round by round
 * (bench/results/h2-20261202-172932.txt, -172644.txt); an HTTP/1.1 hello 189 of 4,160
 * instructions (callgrind-h1-20261202-1755.txt) and 28 bytes. On a KH_STREAM_F_TLS stream also
 * Strict-Transport-Security (limit hsts_max_age) and X-Content-Type-Options (tls_nosniff), and
 * Alt-Svc when the sink has one to advertise (h1/h2 with --http3: kh_conn_alt_svc). */
static int send_head_extra(kh_stream *s, int status, const kh_header *h, size_t n,
                           int64_t content_length)
{
    const kh_limits *l = s->worker->limits;
    int tls = (s->flags & KH_STREAM_F_TLS) != 0;
    int hsts = tls && l->hsts_max_age != 0, nosniff = tls && l->tls_nosniff != 0;
    unsigned rid_mode = (unsigned)l->request_id_header;
    int rid = rid_mode != 0;
    const char *alt = tls && s->sink->alt_svc ? s->sink->alt_svc(s) : NULL;
    for (size_t i = 0; i < n; i++) {
        if (h[i].name.len == 12 && kh_str_ieq_lower(h[i].name, "x-request-id", 12))
            rid = 0;
        else if (tls && kh_str_ieq_lower(h[i].name, "strict-transport-security", 25))
            hsts = 0;
        else if (tls && kh_str_ieq_lower(h[i].name, "x-content-type-options", 22))
            nosniff = 0;
        else if (alt && kh_str_ieq_lower(h[i].name, "alt-svc", 7))
            alt = NULL;
    }
    if (rid && rid_mode == 1 && status < 500 && kh_reqid_client(s) == NULL)
        rid = 0;
    if (!hsts && !nosniff && !rid && !alt)
        return s->sink->head(s, status, h, n, content_length);
    kh_header local[16];
    kh_header *all = n + 4 <= KH_ARRAY_LEN(local) ? local : kh_xmalloc((n + 4) * sizeof *all);
    if (n)
        memcpy(all, h, n * sizeof *h);
    size_t k = n;
    char age[32], id[KH_REQID_MAX];
    if (rid)
        all[k++] = (kh_header){KH_STR_LIT("X-Request-Id"), {id, kh_reqid(s, id)}};
    if (hsts) {
        int len = snprintf(age, sizeof age, "max-age=%" PRIu64, l->hsts_max_age);
        all[k++] = (kh_header){KH_STR_LIT("Strict-Transport-Security"), {age, (size_t)len}};
    }
    if (nosniff)
        all[k++] = (kh_header){KH_STR_LIT("X-Content-Type-Options"), KH_STR_LIT("nosniff")};
    if (alt)
        all[k++] = (kh_header){KH_STR_LIT("Alt-Svc"), {alt, strlen(alt)}};
    int r = s->sink->head(s, status, all, k, content_length); /* the sink copies what it keeps */
    if (all != local)
        free(all);
    return r;
}

/* A conditional GET/HEAD answered 200: 1 when the validators match (kh_cond.h), so the answer
 * is 304 (send_304). */
static int not_modified(const kh_stream *s, const kh_header *h, size_t n)
{
    kh_str inm = {0}, ims = {0}, etag = {0}, lm = {0};
    const kh_header *f = kh_stream_header(s, "if-none-match", 13);
    if (f)
        inm = f->value;
    if ((f = kh_stream_header(s, "if-modified-since", 17)) != NULL)
        ims = f->value;
    for (size_t i = 0; i < n; i++) {
        if (h[i].name.len == 4 && kh_str_ieq_lower(h[i].name, "etag", 4))
            etag = h[i].value;
        else if (h[i].name.len == 13 && kh_str_ieq_lower(h[i].name, "last-modified", 13))
            lm = h[i].value;
    }
    return kh_cond_not_modified(inm, ims, etag, lm);
}

/* 304 with the fields a 304 keeps; no body follows (send_data drops it). */
static int send_304(kh_stream *s, const kh_header *h, size_t n)
{
    kh_header local[16];
    kh_header *keep = n <= KH_ARRAY_LEN(local) ? local : kh_xmalloc(n * sizeof *keep);
    size_t k = kh_cond_304_headers(h, n, keep);
    s->status = 304; /* the sinks and send_data then send no body */
    int r = send_head_extra(s, 304, keep, k, -1);
    if (keep != local)
        free(keep);
    return r;
}

/* ---- compression (kh_compress.h): the reply path's one hook, taken only with compress=1 ---- */

static kh_str accept_encoding(const kh_stream *s)
{
    const kh_header *f = kh_stream_header(s, "accept-encoding", 15);
    return f ? f->value : (kh_str){NULL, 0};
}

/* h + Vary: Accept-Encoding (+ Content-Encoding when coding) into a new array the caller frees
 * when it is not local. */
static kh_header *with_coding(const kh_header *h, size_t n, int coding, kh_header *local,
                              size_t local_n, size_t *k)
{
    kh_header *all = n + 2 <= local_n ? local : kh_xmalloc((n + 2) * sizeof *all);
    if (n)
        memcpy(all, h, n * sizeof *h);
    *k = n;
    all[(*k)++] = (kh_header){KH_STR_LIT("Vary"), KH_STR_LIT("Accept-Encoding")};
    if (coding) {
        const char *name = kh_compress_name(coding);
        all[(*k)++] = (kh_header){KH_STR_LIT("Content-Encoding"), {name, strlen(name)}};
    }
    return all;
}

/* A streamed (or not yet known) body: the encoder lives on the stream, send_data feeds it. */
static int send_head_compress(kh_stream *s, int status, const kh_header *h, size_t n,
                              int64_t content_length)
{
    const kh_limits *l = s->worker->limits;
    int coding;
    if (!kh_compress_choose(l, status, (s->flags & KH_STREAM_F_HEAD_METHOD) != 0,
                            accept_encoding(s), h, n, content_length, &coding))
        return send_head_extra(s, status, h, n, content_length);
    if (coding && (s->compress = kh_compress_new(coding, l, content_length)) != NULL)
        content_length = -1;
    else
        coding = 0;
    kh_header local[16];
    size_t k;
    kh_header *all = with_coding(h, n, coding, local, KH_ARRAY_LEN(local), &k);
    int r = send_head_extra(s, status, all, k, content_length);
    if (all != local)
        free(all);
    return r;
}

/* Feeds the encoder and sends what it gives; a flush on every write (each res:write / SSE event
 * must be decodable on arrival), the end of the coding with fin. */
static int send_data_compress(kh_stream *s, const char *p, size_t n, int fin)
{
    int r = kh_compress_write(s->compress, p, n, fin);
    size_t len;
    const char *out = kh_compress_out(s->compress, &len);
    if (r != 0) {
        s->sink->reset(s, r);
        return r;
    }
    s->bytes_sent += len;
    if (fin) {
        s->flags |= KH_STREAM_F_ENDED;
        kh_worker_access_log(s->worker, s);
    }
    r = s->sink->data(s, out, len, fin); /* the sink copies */
    kh_compress_consumed(s->compress);
    if (fin) {
        kh_compress_free(s->compress);
        s->compress = NULL;
    }
    return r;
}

/* A whole body: compressed before the head, so it keeps a Content-Length. Sent as it is (with
 * Vary) when the coded form is not smaller. */
static int respond_compress(kh_stream *s, int status, const kh_header *h, size_t n,
                            const char *body, size_t len)
{
    const kh_limits *l = s->worker->limits;
    int coding;
    kh_compress *z = NULL;
    if (!kh_compress_choose(l, status, (s->flags & KH_STREAM_F_HEAD_METHOD) != 0,
                            accept_encoding(s), h, n, (int64_t)len, &coding))
        coding = -1;
    else if (coding && ((z = kh_compress_new(coding, l, (int64_t)len)) == NULL ||
                        kh_compress_write(z, body, len, 1) != 0))
        coding = 0;
    size_t zlen = 0;
    const char *zout = z && coding ? kh_compress_out(z, &zlen) : NULL;
    if (zout && zlen >= len)
        coding = 0;
    kh_header local[16], *all = (kh_header *)h;
    size_t k = n;
    if (coding >= 0)
        all = with_coding(h, n, coding, local, KH_ARRAY_LEN(local), &k);
    if (coding > 0) {
        body = zout;
        len = zlen;
    }
    s->flags |= KH_STREAM_F_CODED;
    int r = kh_stream_send_head(s, status, all, k, (int64_t)len);
    if (r == 0)
        r = kh_stream_send_data(s, body, len, 1);
    if (all != h && all != local)
        free(all);
    kh_compress_free(z);
    return r;
}

int kh_stream_send_head(kh_stream *s, int status, const kh_header *h, size_t n,
                        int64_t content_length)
{
    if (s->proto == NULL)
        return KH_ECLOSED;
    if (s->flags & KH_STREAM_F_HEAD_SENT)
        return KH_EPROTO;
    if (status < 200 || status > 999)
        return KH_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!header_ok(&h[i]))
            return KH_EINVAL;
    s->flags |= KH_STREAM_F_HEAD_SENT;
    s->status = status;
    if (KH_UNLIKELY(s->flags & KH_STREAM_F_COND) && status == 200 && not_modified(s, h, n))
        return send_304(s, h, n);
    if (KH_UNLIKELY(s->worker->limits->compress) && !(s->flags & KH_STREAM_F_CODED))
        return send_head_compress(s, status, h, n, content_length);
    return send_head_extra(s, status, h, n, content_length);
}

int kh_stream_send_data(kh_stream *s, const char *p, size_t n, int fin)
{
    if (s->proto == NULL)
        return KH_ECLOSED;
    if (!(s->flags & KH_STREAM_F_HEAD_SENT) || (s->flags & KH_STREAM_F_ENDED))
        return KH_EPROTO;
    if ((s->flags & KH_STREAM_F_HEAD_METHOD) || s->status == 304)
        n = 0;
    if (n == 0 && !fin)
        return 0;
    if (KH_UNLIKELY(s->compress != NULL))
        return send_data_compress(s, p, n, fin);
    s->bytes_sent += n;
    if (fin) {
        s->flags |= KH_STREAM_F_ENDED;
        kh_worker_access_log(s->worker, s);
    }
    return s->sink->data(s, p, n, fin);
}

int kh_stream_send_file(kh_stream *s, int fd, int64_t off, uint64_t n, int fin)
{
    if (s->proto == NULL)
        return KH_ECLOSED;
    if (!(s->flags & KH_STREAM_F_HEAD_SENT) || (s->flags & KH_STREAM_F_ENDED))
        return KH_EPROTO;
    if ((s->flags & KH_STREAM_F_HEAD_METHOD) || s->status == 304 || n == 0) {
        int r = kh_stream_send_data(s, NULL, 0, fin);
        if (r == 0)
            close(fd);
        return r;
    }
    if (s->sink->file == NULL || s->compress != NULL)
        return UV_ENOTSUP;
    int r = s->sink->file(s, fd, off, n, 0);
    if (r != 0)
        return r;
    s->bytes_sent += n;
    if (fin) {
        s->flags |= KH_STREAM_F_ENDED;
        kh_worker_access_log(s->worker, s);
        return s->sink->data(s, NULL, 0, 1);
    }
    return 0;
}

int kh_stream_cut(kh_stream *s)
{
    if (s->proto == NULL)
        return KH_ECLOSED;
    if (!(s->flags & KH_STREAM_F_ENDED) && (s->flags & KH_STREAM_F_HEAD_SENT)) {
        int r = kh_stream_send_data(s, NULL, 0, 1);
        if (r != 0)
            return r;
    }
    if (s->proto && s->sink->cut)
        s->sink->cut(s);
    return 0;
}

int kh_stream_respond(kh_stream *s, int status, const kh_header *h, size_t n, const char *body,
                      size_t len)
{
    if (KH_UNLIKELY(s->worker->limits->compress) && s->proto && !(s->flags & KH_STREAM_F_HEAD_SENT))
        return respond_compress(s, status, h, n, body, len);
    int r = kh_stream_send_head(s, status, h, n, (int64_t)len);
    if (r != 0)
        return r;
    return kh_stream_send_data(s, body, len, 1);
}

int kh_stream_respond_error(kh_stream *s, int status, const char *text, int close)
{
    if (close)
        s->flags |= KH_STREAM_F_CLOSE;
    if (s->flags & KH_STREAM_F_HEAD_SENT) {
        if (s->proto && !(s->flags & KH_STREAM_F_ENDED))
            s->sink->reset(s, KH_EPROTO);
        return KH_EPROTO;
    }
    char body[256];
    int len = snprintf(body, sizeof body, "%s\n", text);
    kh_header ct = kh_stream_content_type(ctype_text, sizeof ctype_text - 1);
    return kh_stream_respond(s, status, &ct, 1, body, (size_t)len);
}

/* ---- the streaming seam ---- */

void kh_stream_mark_tunnel(kh_stream *s, kh_str proto)
{
    if (proto.len == 0 || proto.len >= KH_TUNNEL_PROTO_MAX)
        return;
    for (size_t i = 0; i < proto.len; i++) {
        char ch = proto.ptr[i];
        s->tunnel_proto[i] = (ch >= 'A' && ch <= 'Z') ? (char)(ch | 0x20) : ch;
    }
    s->tunnel_proto[proto.len] = '\0';
    s->flags |= KH_STREAM_F_TUNNEL_REQ;
}

size_t kh_stream_queued(const kh_stream *s)
{
    if (s->proto == NULL || s->sink->queued == NULL)
        return 0;
    return s->sink->queued((kh_stream *)s);
}

static size_t low_water(const kh_stream *s)
{
    return s->worker->limits->stream_high_water / 2;
}

int kh_stream_want_drain(kh_stream *s)
{
    if (s->proto == NULL)
        return KH_ECLOSED;
    if (kh_stream_queued(s) <= low_water(s)) {
        s->flags &= ~KH_STREAM_F_WANT_DRAIN;
        return 1;
    }
    s->flags |= KH_STREAM_F_WANT_DRAIN;
    return 0;
}

void kh_stream_on_drain(kh_stream *s)
{
    if (!(s->flags & KH_STREAM_F_WANT_DRAIN) || s->proto == NULL)
        return;
    if (kh_stream_queued(s) > low_water(s))
        return;
    s->flags &= ~KH_STREAM_F_WANT_DRAIN;
    kh_worker *w = s->worker;
    if ((s->flags & KH_STREAM_F_APP) && w->cfg->app->on_drain && !app_gone(s)) {
        kh_stream_retain(s); /* the app may end the stream from its callback */
        w->cfg->app->on_drain(stream_app(s), s); /* the stream's own instance (hot reload) */
        kh_stream_release(s);
    }
}

int kh_stream_body_stream(kh_stream *s)
{
    if (s->flags & KH_STREAM_F_BODY_STREAM)
        return 0;
    if (s->body_state != KH_BODY_READING || s->proto == NULL)
        return KH_EPROTO;
    s->flags |= KH_STREAM_F_BODY_STREAM;
    s->body_limit = UINT64_MAX; /* the window bounds memory; the app counts if it wants to */
    return 0;
}

int kh_stream_allow_large_body(kh_stream *s)
{
    if (s->body_state != KH_BODY_TOO_LARGE || s->path_error)
        return 0;
    kh_route_match m;
    m.num_params = 0;
    kh_worker *w = s->worker;
    if (kh_router_match(w->inst ? w->inst->router : w->router, s->method, s->path, &m) != 0 ||
        !(m.value & KH_ROUTE_BODY_STREAM))
        return 0;
    s->body_state = KH_BODY_READING;
    s->flags |= KH_STREAM_F_BODY_STREAM;
    s->body_limit = UINT64_MAX;
    return 1;
}

void kh_stream_body_consume(kh_stream *s, size_t n)
{
    if (n > s->body.len)
        n = s->body.len;
    if (n == 0)
        return;
    kh_buf_consume(&s->body, n);
    if (s->body.len == 0)
        kh_buf_release(&s->body, &s->worker->bufs);
    if (s->proto && (s->flags & KH_STREAM_F_BODY_STREAM) && s->sink->consumed)
        s->sink->consumed(s, n);
}

int kh_stream_accept_tunnel(kh_stream *s, const kh_header *h, size_t n)
{
    if (s->proto == NULL)
        return KH_ECLOSED;
    if (!(s->flags & KH_STREAM_F_TUNNEL_REQ) || (s->flags & KH_STREAM_F_HEAD_SENT) ||
        s->sink->tunnel == NULL)
        return KH_EPROTO;
    for (size_t i = 0; i < n; i++)
        if (!header_ok(&h[i]))
            return KH_EINVAL;
    s->flags |= KH_STREAM_F_HEAD_SENT | KH_STREAM_F_TUNNEL | KH_STREAM_F_BODY_STREAM;
    s->status = s->version_major == 1 ? 101 : 200;
    s->body_state = KH_BODY_READING;
    s->body_expected = -1;
    s->body_limit = UINT64_MAX;
    return s->sink->tunnel(s, h, n);
}

void kh_stream_hold(kh_stream *s)
{
    if (s->flags & KH_STREAM_F_HELD)
        return;
    s->flags |= KH_STREAM_F_HELD;
    /* keep method and path (the access log line), drop the rest of the head */
    size_t ml = s->method.len, pl = KH_MIN(s->path.len, (size_t)256);
    char *a = kh_xmalloc(ml + pl + 2);
    memcpy(a, s->method.ptr ? s->method.ptr : "", ml);
    a[ml] = '\0';
    memcpy(a + ml + 1, s->path.ptr ? s->path.ptr : "", pl);
    a[ml + 1 + pl] = '\0';
    arena_free(s);
    s->arena = a;
    s->arena_class = ARENA_MALLOC;
    s->method = (kh_str){a, ml};
    s->path = (kh_str){a + ml + 1, pl};
    s->target = s->path;
    s->query = (kh_str){NULL, 0};
    s->authority = (kh_str){NULL, 0};
    s->headers = NULL;
    s->num_headers = 0;
    s->num_params = 0; /* they pointed into the arena */
    if (s->params != s->params_inline)
        free(s->params);
    s->params = s->params_inline;
    if (s->body_state != KH_BODY_READING)
        kh_buf_release(&s->body, &s->worker->bufs);
}

/* RFC 9113 §8.2.2 / RFC 9114 §4.2: connection-specific fields must not appear in HTTP/2 or
 * HTTP/3; content-length is the builder's own. */
static int h2h3_skip_field(kh_str nm)
{
    return kh_str_ieq_lower(nm, "connection", 10) || kh_str_ieq_lower(nm, "keep-alive", 10) ||
           kh_str_ieq_lower(nm, "proxy-connection", 16) ||
           kh_str_ieq_lower(nm, "transfer-encoding", 17) || kh_str_ieq_lower(nm, "upgrade", 7) ||
           kh_str_ieq_lower(nm, "content-length", 14);
}

void kh_stream_head_build(kh_head_buf *b, const kh_stream *s, int status, const kh_header *h,
                          size_t n, int64_t clen)
{
    int has_server = 0, has_date = 0;
    size_t names = 0;
    for (size_t i = 0; i < n; i++) {
        names += h[i].name.len;
        if (kh_str_ieq_lower(h[i].name, "server", 6))
            has_server = 1;
        else if (kh_str_ieq_lower(h[i].name, "date", 4))
            has_date = 1;
    }
    b->f = n + 4 <= KH_HEAD_LOCAL ? b->f_local : kh_xmalloc((n + 4) * sizeof *b->f);
    b->lower = names <= sizeof b->lower_local ? b->lower_local : kh_xmalloc(names);
    size_t k = 0, at = 0;
    size_t stlen = 3;
    if (status >= 100 && status <= 999) { /* always, from the app: no division loop */
        b->st[0] = (char)('0' + status / 100);
        b->st[1] = (char)('0' + status / 10 % 10);
        b->st[2] = (char)('0' + status % 10);
    } else {
        stlen = (size_t)(kh_put_u64(b->st, (uint64_t)(status > 0 ? status : 0)) - b->st);
    }
    b->f[k++] = (kh_header){KH_STR_LIT(":status"), {b->st, stlen}};
    if (!has_server)
        b->f[k++] = (kh_header){KH_STR_LIT("server"), KH_STR_LIT("khamsin")};
    if (!has_date)
        b->f[k++] = (kh_header){KH_STR_LIT("date"), {kh_worker_date(s->worker), 29}};
    for (size_t i = 0; i < n; i++) {
        kh_str nm = h[i].name;
        if (h2h3_skip_field(nm))
            continue;
        /* RFC 9113 §8.2.1, RFC 9114 §4.2: field names are lower case on the wire */
        char *lo = b->lower + at;
        lower_copy(lo, nm.ptr, nm.len);
        at += nm.len;
        b->f[k++] = (kh_header){{lo, nm.len}, h[i].value};
    }
    /* RFC 9110 §15.3.5 / §15.4.5: 204 and 304 have no content */
    int bodyless = status == 204 || status == 304;
    if (!bodyless && clen >= 0) {
        size_t cll = (size_t)(kh_put_u64(b->cl, (uint64_t)clen) - b->cl);
        b->f[k++] = (kh_header){KH_STR_LIT("content-length"), {b->cl, cll}};
    }
    b->no_data = bodyless || clen == 0 || (s->flags & KH_STREAM_F_HEAD_METHOD);
    b->n = k;
}

void kh_stream_head_free(kh_head_buf *b)
{
    if (b->f != b->f_local)
        free(b->f);
    if (b->lower != b->lower_local)
        free(b->lower);
}

const char *kh_status_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 203: return "Non-Authoritative Information";
    case 204: return "No Content";
    case 205: return "Reset Content";
    case 206: return "Partial Content";
    case 300: return "Multiple Choices";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 421: return "Misdirected Request";
    case 422: return "Unprocessable Content";
    case 425: return "Too Early";
    case 426: return "Upgrade Required";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 451: return "Unavailable For Legal Reasons";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "";
    }
}
