/* test_ws.c: the WebSocket codec (kh_ws.c), handshake helpers (kh_ws_handshake.c),
 * permessage-deflate (kh_ws_deflate.c) and SHA-1 (kh_sha1.c): FIPS 180-4 SHA-1 examples, RFC
 * 6455's handshake and frame examples, UTF-8 edge cases split at every byte, and session cases
 * from the Autobahn families (framing, reserved bits and opcodes, fragmentation with control
 * frames between fragments, close codes, limits, pause). Every session input is fed whole and
 * again one byte at a time, and both runs must give the same messages and frames. */
#include "kh_sha1.h"
#include "kh_ws.h"
#include "kh_ws_deflate.h"
#include "kh_ws_handshake.h"
#include "kh_test.h"

#define ARRLEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- a recording peer ---- */

typedef struct rec {
    char msgs[8192]; /* "T:<text>|" or "B:<hex len>|" per message */
    size_t mlen;
    uint8_t sent[8192]; /* server frames, concatenated */
    size_t slen;
    int pongs;
    int pause_every; /* message callback returns 1 */
    z_stream inf;
    int has_inf;
} rec;

/* a session and what its callbacks record into (kh_ws.h: no user pointer per session) */
typedef struct sess {
    kh_ws_conn w;
    void *ud;
} sess;

static int on_message(kh_ws_conn *ws, int binary, const uint8_t *p, size_t n)
{
    void *ud = ((sess *)ws)->ud;
    rec *r = ud;
    if (binary)
        r->mlen += (size_t)snprintf(r->msgs + r->mlen, sizeof r->msgs - r->mlen, "B:%zu|", n);
    else
        r->mlen += (size_t)snprintf(r->msgs + r->mlen, sizeof r->msgs - r->mlen, "T:%.*s|",
                                    (int)(n > 200 ? 200 : n), (const char *)p);
    return r->pause_every;
}

static void on_send(kh_ws_conn *ws, const uint8_t *h, size_t hl, const uint8_t *p, size_t n)
{
    void *ud = ((sess *)ws)->ud;
    rec *r = ud;
    if (r->slen + hl + n > sizeof r->sent)
        return;
    memcpy(r->sent + r->slen, h, hl);
    memcpy(r->sent + r->slen + hl, p, n);
    r->slen += hl + n;
}

static void on_pong(kh_ws_conn *ws, const uint8_t *p, size_t n)
{
    void *ud = ((sess *)ws)->ud;
    (void)p, (void)n;
    ((rec *)ud)->pongs++;
}

static int on_inflate(kh_ws_conn *ws, const uint8_t *in, size_t n, uint64_t max, uint8_t **out,
                      size_t *outlen)
{
    void *ud = ((sess *)ws)->ud;
    rec *r = ud;
    return kh_ws_inflate_msg(&r->inf, in, n, max, out, outlen);
}

#define CBS {on_message, on_send, on_pong, on_inflate}

/* a client frame, masked with a fixed key */
static size_t cframe(uint8_t *out, int b0, const void *payload, size_t n)
{
    static const uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
    size_t k = 0;
    out[k++] = (uint8_t)b0;
    if (n < 126)
        out[k++] = (uint8_t)(0x80 | n);
    else if (n <= 0xffff) {
        out[k++] = 0x80 | 126;
        out[k++] = (uint8_t)(n >> 8);
        out[k++] = (uint8_t)n;
    } else {
        out[k++] = 0x80 | 127;
        for (int i = 0; i < 8; i++)
            out[k++] = (uint8_t)((uint64_t)n >> (56 - 8 * i));
    }
    memcpy(out + k, key, 4);
    k += 4;
    for (size_t i = 0; i < n; i++)
        out[k + i] = ((const uint8_t *)payload)[i] ^ key[i & 3];
    return k + n;
}

typedef struct result {
    int rc;
    unsigned code;
    rec r;
} result;

static void run(result *res, const uint8_t *in, size_t n, int bytewise, uint64_t max_msg,
                uint64_t max_frame, int deflate, int pause)
{
    static uint8_t buf[1 << 20];
    memset(res, 0, sizeof *res);
    res->r.pause_every = pause;
    if (deflate) {
        kh_ws_inflater_init(&res->r.inf);
        res->r.has_inf = 1;
    }
    kh_ws_cfg cfg = {CBS, max_msg, max_frame};
    sess ss = {.ud = &res->r};
    kh_ws_conn_init(&ss.w, &cfg, deflate);
    kh_ws_conn *w = &ss.w;
    memcpy(buf, in, n);
    size_t pos = 0;
    int rc = KH_WS_OK;
    while (pos < n) {
        size_t len = bytewise ? 1 : n - pos, used = 0;
        rc = kh_ws_conn_feed(w, buf + pos, len, &used);
        if (rc == KH_WS_CLOSED)
            break;
        if (rc == KH_WS_PAUSED && !bytewise)
            res->r.mlen += (size_t)snprintf(res->r.msgs + res->r.mlen, 16, "P|");
        pos += used;
    }
    res->rc = rc;
    res->code = w->close_code;
    kh_ws_conn_free(w);
    if (deflate)
        inflateEnd(&res->r.inf);
}

/* feeds in whole and byte by byte; both must agree; checks messages, final rc and close code */
static void check(const char *name, const uint8_t *in, size_t n, const char *want_msgs, int want_rc,
                  unsigned want_code, uint64_t max_msg, int deflate)
{
    static result a, b;
    run(&a, in, n, 0, max_msg, max_msg, deflate, 0);
    run(&b, in, n, 1, max_msg, max_msg, deflate, 0);
    kh_is_str(a.r.msgs, a.r.mlen, want_msgs, "%s: messages", name);
    kh_is_int(a.rc, want_rc, "%s: result", name);
    if (want_rc == KH_WS_CLOSED)
        kh_is_int(a.code, want_code, "%s: close code", name);
    kh_ok(a.r.mlen == b.r.mlen && memcmp(a.r.msgs, b.r.msgs, a.r.mlen) == 0 && a.rc == b.rc &&
              a.code == b.code && a.r.slen == b.r.slen && memcmp(a.r.sent, b.r.sent, a.r.slen) == 0,
          "%s: byte at a time gives the same", name);
}

/* the close frame the server sent last: its code, or 0 (none), or -1 (no close frame) */
static int sent_close_code(const rec *r)
{
    size_t i = 0;
    int code = -1;
    while (i + 2 <= r->slen) {
        uint8_t op = r->sent[i] & 0x0f;
        size_t len = r->sent[i + 1] & 0x7f, k = 2;
        if (len == 126) {
            len = (size_t)r->sent[i + 2] << 8 | r->sent[i + 3];
            k = 4;
        }
        if (op == KH_WS_OP_CLOSE)
            code = len >= 2 ? r->sent[i + k] << 8 | r->sent[i + k + 1] : 0;
        i += k + len;
    }
    return code;
}

/* kh_is_str over an array (the macro tests its pointer for NULL, which an array never is) */
static void is_str(const char *got, size_t n, const char *want, const char *what)
{
    kh_is_str(got, n, want, "%s", what);
}

static void hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static void test_sha1(void)
{
    kh_subtest("sha1");
    uint8_t d[20];
    char h[41];
    kh_sha1("abc", 3, d);
    hex(d, 20, h);
    is_str(h, 40, "a9993e364706816aba3e25717850c26c9cd0d89d", "sha1 abc");
    kh_sha1("", 0, d);
    hex(d, 20, h);
    is_str(h, 40, "da39a3ee5e6b4b0d3255bfef95601890afd80709", "sha1 empty");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    kh_sha1(m, strlen(m), d);
    hex(d, 20, h);
    is_str(h, 40, "84983e441c3bd26ebaae4aa1f95129e5e54670f1", "sha1 448 bits");
    kh_sha1_ctx c;
    kh_sha1_init(&c);
    char a[1000];
    memset(a, 'a', sizeof a);
    for (int i = 0; i < 1000; i++)
        kh_sha1_update(&c, a, i == 999 ? 1000 : 1000); /* a million 'a' in 1000-byte steps */
    kh_sha1_final(&c, d);
    hex(d, 20, h);
    is_str(h, 40, "34aa973cd4c4daa4f61eeb2bdbad27316534016f", "sha1 million a");
}

static void test_handshake(void)
{
    kh_subtest("handshake");
    char acc[KH_WS_ACCEPT_LEN];
    kh_ws_accept("dGhlIHNhbXBsZSBub25jZQ==", 24, acc);
    is_str(acc, sizeof acc, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", "RFC 6455 §1.3 accept");
    kh_ok(kh_ws_key_ok("dGhlIHNhbXBsZSBub25jZQ==", 24), "key ok");
    kh_ok(!kh_ws_key_ok("dGhlIHNhbXBsZSBub25jZQ=", 23), "short key");
    kh_ok(!kh_ws_key_ok("dGhlIHNhbXBsZSBub25jZR==", 24), "key not 16 bytes");
    kh_ok(!kh_ws_key_ok("dGhlIHNhbXBsZSBub25j*Q==", 24), "key bad char");
    kh_ok(kh_ws_version_ok(" 13", 3), "version 13");
    kh_ok(!kh_ws_version_ok("8", 1) && !kh_ws_version_ok("13, 8", 5), "version 8 refused");
    kh_ok(kh_ws_has_token("keep-alive, Upgrade", 19, "upgrade"), "token in list");
    kh_ok(!kh_ws_has_token("keep-alive, Upgrades", 20, "upgrade"), "token prefix only");
    kh_ok(kh_ws_has_token("WebSocket", 9, "websocket"), "token case");
}

static void utf8_case(const char *name, const char *s, size_t n, int want_ok)
{
    /* whole, then split at every position */
    uint32_t st = 0;
    int ok = kh_ws_utf8(&st, (const uint8_t *)s, n) == 0 && st == 0;
    int same = 1;
    for (size_t cut = 0; cut <= n; cut++) {
        uint32_t s2 = 0;
        int o2 = kh_ws_utf8(&s2, (const uint8_t *)s, cut) == 0 &&
                 kh_ws_utf8(&s2, (const uint8_t *)s + cut, n - cut) == 0 && s2 == 0;
        same &= o2 == ok;
    }
    kh_is_int(ok, want_ok, "utf8 %s", name);
    kh_ok(same, "utf8 %s split anywhere", name);
}

static void test_utf8(void)
{
    kh_subtest("utf8");
    utf8_case("ascii", "Hello, world, 0123456789", 24, 1);
    utf8_case("kosme", "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5", 11, 1);
    utf8_case("U+10FFFF", "\xf4\x8f\xbf\xbf", 4, 1);
    utf8_case("U+110000", "\xf4\x90\x80\x80", 4, 0);
    utf8_case("F5", "\xf5\x80\x80\x80", 4, 0);
    utf8_case("overlong /", "\xc0\xaf", 2, 0);
    utf8_case("overlong E0", "\xe0\x80\xaf", 3, 0);
    utf8_case("overlong F0", "\xf0\x80\x80\xaf", 4, 0);
    utf8_case("surrogate", "\xed\xa0\x80", 3, 0);
    utf8_case("U+D7FF", "\xed\x9f\xbf", 3, 1);
    utf8_case("lone continuation", "a\x80z", 3, 0);
    utf8_case("truncated", "\xe2\x82", 2, 0);
    utf8_case("FE", "\xfe", 1, 0);
    utf8_case("long ascii then bad", "aaaaaaaaaaaaaaaaaaaaaaa\xff", 24, 0);
}

static void test_frames(void)
{
    kh_subtest("frames");
    /* RFC 6455 §5.7: a masked "Hello" */
    uint8_t hello[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    kh_ws_parser p;
    kh_ws_parser_init(&p, 0);
    kh_ws_chunk c;
    size_t used;
    int r = kh_ws_parse(&p, 1000, hello, sizeof hello, &used, &c);
    kh_is_int(r, 1, "hello parsed");
    kh_is_str((const char *)c.data, c.len, "Hello", "hello unmasked");
    kh_ok(c.fin && c.frame_first && c.frame_end && c.opcode == 1 && used == sizeof hello,
          "hello flags");
    uint8_t h[KH_WS_HDR_MAX];
    kh_is_int(kh_ws_frame_header(h, 1, 1, 0, 5), 2, "header 5");
    kh_ok(h[0] == 0x81 && h[1] == 5, "header bytes 5");
    kh_is_int(kh_ws_frame_header(h, 2, 1, 0, 256), 4, "header 256");
    kh_ok(h[0] == 0x82 && h[1] == 126 && h[2] == 1 && h[3] == 0, "header bytes 256");
    kh_is_int(kh_ws_frame_header(h, 2, 0, 1, 65536), 10, "header 64k");
    kh_ok(h[0] == 0x42 && h[1] == 127 && h[7] == 1 && h[9] == 0, "header bytes 64k");
    kh_ok(kh_ws_close_code_ok(1000) && kh_ws_close_code_ok(1011) && kh_ws_close_code_ok(3000) &&
              kh_ws_close_code_ok(4999),
          "valid close codes");
    kh_ok(!kh_ws_close_code_ok(999) && !kh_ws_close_code_ok(1004) && !kh_ws_close_code_ok(1005) &&
              !kh_ws_close_code_ok(1006) && !kh_ws_close_code_ok(1015) &&
              !kh_ws_close_code_ok(1016) && !kh_ws_close_code_ok(2999) &&
              !kh_ws_close_code_ok(5000),
          "invalid close codes");
}

static void test_session(void)
{
    kh_subtest("session");
    static uint8_t in[300000];
    size_t n;
    static result res;
    uint64_t M = 100000;

    n = cframe(in, 0x81, "Hello", 5);
    check("text", in, n, "T:Hello|", KH_WS_OK, 0, M, 0);
    n = cframe(in, 0x82, "\x00\x01\x02", 3);
    check("binary", in, n, "B:3|", KH_WS_OK, 0, M, 0);
    n = cframe(in, 0x81, "", 0);
    check("empty text", in, n, "T:|", KH_WS_OK, 0, M, 0);

    /* fragmentation with a ping between fragments */
    n = cframe(in, 0x01, "frag", 4);
    n += cframe(in + n, 0x89, "pp", 2);
    n += cframe(in + n, 0x00, "men", 3);
    n += cframe(in + n, 0x80, "ted", 3);
    check("fragments + ping", in, n, "T:fragmented|", KH_WS_OK, 0, M, 0);
    run(&res, in, n, 0, M, M, 0, 0);
    kh_ok(res.r.slen == 4 && res.r.sent[0] == 0x8a && res.r.sent[1] == 2 &&
              memcmp(res.r.sent + 2, "pp", 2) == 0,
          "pong echoes the ping payload");
    n = cframe(in, 0x8a, "x", 1);
    run(&res, in, n, 0, M, M, 0, 0);
    kh_ok(res.r.pongs == 1 && res.r.slen == 0, "unsolicited pong is ignored");

    /* UTF-8 split across fragments */
    n = cframe(in, 0x01, "\xce", 1);
    n += cframe(in + n, 0x80, "\xba", 1);
    check("utf8 across fragments", in, n, "T:\xce\xba|", KH_WS_OK, 0, M, 0);
    n = cframe(in, 0x01, "\xce", 1);
    n += cframe(in + n, 0x80, "a", 1);
    check("bad utf8 across fragments", in, n, "", KH_WS_CLOSED, 1007, M, 0);
    /* fail fast: the first fragment already is invalid; the rest never comes */
    n = cframe(in, 0x01, "ab\xc0\xaf", 4);
    check("fail fast", in, n, "", KH_WS_CLOSED, 1007, M, 0);
    n = cframe(in, 0x81, "\xed\xa0\x80", 3);
    check("surrogate text", in, n, "", KH_WS_CLOSED, 1007, M, 0);
    n = cframe(in, 0x81, "\xe2\x82", 2);
    check("truncated text", in, n, "", KH_WS_CLOSED, 1007, M, 0);
    n = cframe(in, 0x82, "\xff", 1);
    check("binary is not utf8", in, n, "B:1|", KH_WS_OK, 0, M, 0);

    /* reserved bits and opcodes */
    n = cframe(in, 0x81 | 0x20, "x", 1);
    check("rsv2", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    n = cframe(in, 0x81 | 0x40, "x", 1);
    check("rsv1 without deflate", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    n = cframe(in, 0x83, "x", 1);
    check("opcode 3", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    n = cframe(in, 0x8b, "x", 1);
    check("opcode 0xB", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    n = cframe(in, 0x81, "ok", 2);
    n += cframe(in + n, 0x87, "x", 1);
    check("message then opcode 7", in, n, "T:ok|", KH_WS_CLOSED, 1002, M, 0);

    /* framing */
    in[0] = 0x81, in[1] = 0x01, in[2] = 'x';
    check("unmasked", in, 3, "", KH_WS_CLOSED, 1002, M, 0);
    n = cframe(in, 0x09, "x", 1);
    check("fragmented ping", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    static char big[70000];
    memset(big, 'a', sizeof big);
    n = cframe(in, 0x89, big, 126);
    check("ping 126", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    n = cframe(in, 0x89, big, 125);
    check("ping 125", in, n, "", KH_WS_OK, 0, M, 0);
    n = cframe(in, 0x80, "x", 1);
    check("continuation first", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    n = cframe(in, 0x01, "a", 1);
    n += cframe(in + n, 0x81, "b", 1);
    check("text inside a message", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    uint8_t nonmin[] = {0x81, 0xfe, 0x00, 0x05, 1, 2, 3, 4, 'a', 'b', 'c', 'd', 'e'};
    check("non-minimal length", nonmin, sizeof nonmin, "", KH_WS_CLOSED, 1002, M, 0);
    n = cframe(in, 0x82, big, 65536 + 10);
    check("64-bit length", in, n, "B:65546|", KH_WS_OK, 0, M, 0);

    /* limits */
    n = cframe(in, 0x82, big, 2000);
    check("frame too big", in, n, "", KH_WS_CLOSED, 1009, 1000, 0);
    n = cframe(in, 0x02, big, 600);
    n += cframe(in + n, 0x80, big, 600);
    run(&res, in, n, 0, 1000, 1000, 0, 0);
    kh_ok(res.rc == KH_WS_CLOSED && res.code == 1009 && sent_close_code(&res.r) == 1009,
          "message too big: 1009");

    /* close handshake */
    n = cframe(in, 0x88, "\x03\xe8" "bye", 5);
    run(&res, in, n, 0, M, M, 0, 0);
    kh_ok(res.rc == KH_WS_CLOSED && res.code == 1000 && sent_close_code(&res.r) == 1000,
          "close 1000 echoed");
    n = cframe(in, 0x88, "", 0);
    run(&res, in, n, 0, M, M, 0, 0);
    kh_ok(res.rc == KH_WS_CLOSED && res.code == 1005 && sent_close_code(&res.r) == 0,
          "empty close: empty close back, code 1005");
    n = cframe(in, 0x88, "\x03", 1);
    check("close 1 byte", in, n, "", KH_WS_CLOSED, 1002, M, 0);
    static const unsigned bad_codes[] = {0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000};
    for (size_t i = 0; i < ARRLEN(bad_codes); i++) {
        uint8_t cc[2] = {(uint8_t)(bad_codes[i] >> 8), (uint8_t)bad_codes[i]};
        n = cframe(in, 0x88, cc, 2);
        run(&res, in, n, 0, M, M, 0, 0);
        kh_ok(res.code == 1002 && sent_close_code(&res.r) == 1002, "close code %u: 1002",
              bad_codes[i]);
    }
    static const unsigned good_codes[] = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999};
    for (size_t i = 0; i < ARRLEN(good_codes); i++) {
        uint8_t cc[2] = {(uint8_t)(good_codes[i] >> 8), (uint8_t)good_codes[i]};
        n = cframe(in, 0x88, cc, 2);
        run(&res, in, n, 0, M, M, 0, 0);
        kh_ok(res.code == good_codes[i] && sent_close_code(&res.r) == (int)good_codes[i],
              "close code %u echoed", good_codes[i]);
    }
    n = cframe(in, 0x88, "\x03\xe8\xce", 3);
    check("close reason bad utf8", in, n, "", KH_WS_CLOSED, 1007, M, 0);
    n = cframe(in, 0x88, "\x03\xe8", 2);
    n += cframe(in + n, 0x81, "after", 5);
    check("data after close ignored", in, n, "", KH_WS_CLOSED, 1000, M, 0);

    /* our close first: data dropped until the peer's close */
    {
        rec r;
        memset(&r, 0, sizeof r);
        kh_ws_cfg cfg = {CBS, M, M};
        sess ss = {.ud = &r};
        kh_ws_conn_init(&ss.w, &cfg, 0);
        kh_ws_conn *w = &ss.w;
        kh_ws_conn_close(w, 4000, "going", 5);
        kh_ok(sent_close_code(&r) == 4000 && r.slen == 2 + 2 + 5, "our close frame");
        n = cframe(in, 0x81, "late", 4);
        n += cframe(in + n, 0x88, "\x0f\xa0", 2);
        size_t used;
        int rc = kh_ws_conn_feed(w, in, n, &used);
        kh_ok(rc == KH_WS_CLOSED && r.mlen == 0 && w->close_code == 4000 && r.slen == 9,
              "peer's close completes ours, no second close frame, late data dropped");
        kh_ws_conn_free(w);
    }

    /* pause after each message: consumed stops at the message's end */
    n = cframe(in, 0x81, "one", 3);
    size_t first = n;
    n += cframe(in + n, 0x81, "two", 3);
    {
        rec r;
        memset(&r, 0, sizeof r);
        r.pause_every = 1;
        kh_ws_cfg cfg = {CBS, M, M};
        sess ss = {.ud = &r};
        kh_ws_conn_init(&ss.w, &cfg, 0);
        kh_ws_conn *w = &ss.w;
        size_t used;
        int rc = kh_ws_conn_feed(w, in, n, &used);
        kh_ok(rc == KH_WS_PAUSED && used == first, "paused after the first message");
        rc = kh_ws_conn_feed(w, in + used, n - used, &used);
        kh_ok(rc == KH_WS_PAUSED && used == n - first, "then the second");
        kh_is_str(r.msgs, r.mlen, "T:one|T:two|", "both delivered in order");
        kh_ws_conn_free(w);
    }
}

static void test_deflate(void)
{
    kh_subtest("permessage-deflate");
    kh_ws_pmd pmd;
    char resp[256];
    size_t rl;
    rl = kh_ws_pmd_negotiate("permessage-deflate; client_max_window_bits", 42, &pmd, resp, sizeof resp);
    is_str(resp, rl, "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
              "offer accepted, no context takeover both ways");
    const char *o2 = "x-webkit-deflate-frame, permessage-deflate; server_max_window_bits=10";
    rl = kh_ws_pmd_negotiate(o2, strlen(o2), &pmd, resp, sizeof resp);
    kh_ok(rl > 0 && pmd.server_max_window_bits == 10 && strstr(resp, "server_max_window_bits=10"),
          "second offer, server window 10");
    const char *o3 = "permessage-deflate; server_max_window_bits=8";
    kh_is_int(kh_ws_pmd_negotiate(o3, strlen(o3), &pmd, resp, sizeof resp), 0, "window 8 declined");
    const char *o4 = "permessage-deflate; foo";
    kh_is_int(kh_ws_pmd_negotiate(o4, strlen(o4), &pmd, resp, sizeof resp), 0, "unknown param declined");
    const char *o5 = "permessage-deflate; client_no_context_takeover; client_no_context_takeover";
    kh_is_int(kh_ws_pmd_negotiate(o5, strlen(o5), &pmd, resp, sizeof resp), 0, "duplicate declined");
    const char *o6 = "permessage-deflate; client_max_window_bits=\"12\"";
    kh_ok(kh_ws_pmd_negotiate(o6, strlen(o6), &pmd, resp, sizeof resp) > 0, "quoted value");
    const char *o7 = "permessage-deflate; client_max_window_bits=16";
    kh_is_int(kh_ws_pmd_negotiate(o7, strlen(o7), &pmd, resp, sizeof resp), 0, "window 16 declined");

    z_stream d;
    kh_ws_deflater_init(&d, 15);
    static char text[50000];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = "hello websocket "[i % 16];
    uint8_t *z;
    size_t zl;
    kh_ok(kh_ws_deflate_msg(&d, (const uint8_t *)text, sizeof text, &z, &zl) == 0 && zl < 1000,
          "deflated 50000 bytes to %zu", zl);
    static uint8_t in[200000];
    size_t n = cframe(in, 0xc1, z, zl);
    static result res;
    run(&res, in, n, 0, 100000, 100000, 1, 0);
    kh_ok(res.rc == KH_WS_OK && res.r.mlen == 2 + 200 + 1 && memcmp(res.r.msgs, "T:hello websocket", 17) == 0,
          "compressed text message inflated");
    run(&res, in, n, 1, 100000, 100000, 1, 0);
    kh_ok(res.rc == KH_WS_OK && res.r.mlen == 2 + 200 + 1, "compressed, byte at a time");
    /* fragmented compressed message: RSV1 on the first frame only */
    size_t half = zl / 2;
    n = cframe(in, 0x41, z, half);
    n += cframe(in + n, 0x80, z + half, zl - half);
    run(&res, in, n, 0, 100000, 100000, 1, 0);
    kh_ok(res.rc == KH_WS_OK && res.r.mlen == 2 + 200 + 1, "compressed in two fragments");
    n = cframe(in, 0x41, z, half);
    n += cframe(in + n, 0xc0, z + half, zl - half);
    check("rsv1 on a continuation", in, n, "", KH_WS_CLOSED, 1002, 100000, 1);
    /* the decompressed size is bounded by max_message: a 50000-byte bomb against 10000 */
    n = cframe(in, 0xc1, z, zl);
    run(&res, in, n, 0, 10000, 10000, 1, 0);
    kh_ok(res.rc == KH_WS_CLOSED && res.code == 1009, "inflated past the limit: 1009");
    free(z);
    /* an empty message */
    kh_ok(kh_ws_deflate_msg(&d, (const uint8_t *)"", 0, &z, &zl) == 0 && zl >= 1, "empty deflated");
    n = cframe(in, 0xc1, z, zl);
    run(&res, in, n, 0, 100000, 100000, 1, 0);
    kh_is_str(res.r.msgs, res.r.mlen, "T:|", "empty compressed message");
    free(z);
    /* garbage is 1007 */
    n = cframe(in, 0xc1, "\xff\xff\xff\xff", 4);
    run(&res, in, n, 0, 100000, 100000, 1, 0);
    kh_ok(res.rc == KH_WS_CLOSED && res.code == 1007, "not a deflate stream: 1007");
    /* invalid utf8 inside compressed text */
    kh_ok(kh_ws_deflate_msg(&d, (const uint8_t *)"a\xc0\xaf", 3, &z, &zl) == 0, "deflate bad text");
    n = cframe(in, 0xc1, z, zl);
    check("compressed bad utf8", in, n, "", KH_WS_CLOSED, 1007, 100000, 1);
    free(z);
    deflateEnd(&d);
}

int main(void)
{
    test_sha1();
    test_handshake();
    test_utf8();
    test_frames();
    test_session();
    test_deflate();
    return kh_test_done();
}
