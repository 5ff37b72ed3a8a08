/* test_h2_fields.c: kh_h2_fields, the RFC 9113 §8 checks of a request's fields that replace
 * nghttp2's HTTP messaging: each rule with a field that breaks it and one that does not, the
 * head-end rules (CONNECT, extended CONNECT, OPTIONS *), content-length, trailers, RFC 9218
 * priority; and the word-at-a-time name and value scans against a byte-by-byte reference, every
 * byte value at every position of names and values of 1 to 24 bytes, each ending on a guard
 * page (an over-read faults). */
#include <string.h>

#include "kh_h2_fields.h"
#include "kh_test.h"

typedef struct {
    const char *n, *v;
} nv;

/* Runs a head (trailer 0) or trailer section of fields; the index of the first refused one, or -1
 * if all pass. */
static int run(kh_h2_fields *f, int trailer, const nv *l, size_t n)
{
    kh_h2_fields_begin(f, trailer);
    for (size_t i = 0; i < n; i++)
        if (kh_h2_fields_check(f, (const uint8_t *)l[i].n, strlen(l[i].n), (const uint8_t *)l[i].v,
                               strlen(l[i].v)) != 0)
            return (int)i;
    return -1;
}

/* A GET with one more field (x): -1 if the head is accepted whole, else where it failed (the
 * field's index, or 99 at the head's end). */
static int get_with(const char *name, const char *value)
{
    kh_h2_fields f;
    nv l[] = {{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {":authority", "a.test"},
              {name, value}};
    int r = run(&f, 0, l, 5);
    if (r >= 0)
        return r;
    return kh_h2_fields_request_end(&f, 1) == 0 ? -1 : 99;
}

/* A head of these fields only: -1 accepted, else the failing index or 99 at the end. */
static int head(const nv *l, size_t n, int end_stream)
{
    kh_h2_fields f;
    int r = run(&f, 0, l, n);
    if (r >= 0)
        return r;
    return kh_h2_fields_request_end(&f, end_stream) == 0 ? -1 : 99;
}
#define HEAD(end, ...) head((const nv[]){__VA_ARGS__}, sizeof((const nv[]){__VA_ARGS__}) / sizeof(nv), end)

static int ref_name(const uint8_t *p, size_t n)
{
    static const char ok[] = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz";
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] == 0 || !strchr(ok, p[i]))
            return 0;
    return 1;
}

static int ref_value(const uint8_t *p, size_t n)
{
    if (n && (p[0] == ' ' || p[0] == '\t' || p[n - 1] == ' ' || p[n - 1] == '\t'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f)
            return 0;
    return 1;
}

/* Every byte at every position of an otherwise valid name (and value) of each length. */
static void scans(void)
{
    int bad_name = 0, bad_value = 0, cases = 0;
    for (size_t len = 1; len <= 24; len++) {
        uint8_t buf[24];
        void *base;
        size_t ml;
        uint8_t *p = (uint8_t *)kh_test_guarded_copy(buf, len, &base, &ml); /* one page each */
        for (size_t pos = 0; pos < len; pos++) {
            for (int b = 0; b < 256; b++) {
                for (size_t i = 0; i < len; i++)
                    p[i] = (uint8_t)("x-abcdefghijklmnopqrstuvwz"[i % 26]);
                p[pos] = (uint8_t)b;
                kh_h2_fields f;
                kh_h2_fields_begin(&f, 0);
                /* a name, with a plain value (one byte changed in "x-abc..." never makes a name
                 * the switch knows; ':' first makes a pseudo-header, not compared) */
                int got = kh_h2_fields_check(&f, p, len, (const uint8_t *)"v", 1) == 0;
                if (got != ref_name(p, len) && p[0] != ':')
                    bad_name++;
                kh_h2_fields_begin(&f, 0);
                got = kh_h2_fields_check(&f, (const uint8_t *)"x-v", 3, p, len) == 0;
                if (got != ref_value(p, len))
                    bad_value++;
                cases++;
            }
        }
        kh_test_guarded_free(base, ml);
    }
    kh_is_int(bad_name, 0, "names: word scan == byte reference (%d cases)", cases);
    kh_is_int(bad_value, 0, "values: word scan == byte reference (%d cases)", cases);
}

int main(void)
{
    kh_subtest("field names");
    kh_is_int(get_with("user-agent", "t/1"), -1, "a usual field");
    kh_is_int(get_with("x-*", "a"), -1, "'*' is tchar (RFC 9110 §5.6.2)");
    kh_is_int(get_with("X-Upper", "a"), 4, "upper case");
    kh_is_int(get_with("x-abcdefghiJ", "a"), 4, "upper case past the first word");
    kh_is_int(get_with("x bad", "a"), 4, "a space");
    kh_is_int(get_with("x:bad", "a"), 4, "a colon");
    kh_is_int(get_with("x-\x80", "a"), 4, "a byte over 0x7f");
    kh_is_int(get_with("", "a"), 4, "empty");

    kh_subtest("field values");
    kh_is_int(get_with("x-a", ""), -1, "empty");
    kh_is_int(get_with("x-a", "a\tb \x80\xff"), -1, "HTAB, SP and obs-text inside");
    kh_is_int(get_with("x-a", "a\nb"), 4, "LF");
    kh_is_int(get_with("x-a", "a\rb"), 4, "CR");
    kh_is_int(get_with("x-a", "0123456789abcde\x01"), 4, "a control byte in the second word");
    kh_is_int(get_with("x-a", "a\x7f"), 4, "DEL");
    kh_is_int(get_with("x-a", " a"), 4, "leading SP");
    kh_is_int(get_with("x-a", "a\t"), 4, "trailing HTAB");
    {
        kh_h2_fields f;
        kh_h2_fields_begin(&f, 0);
        kh_is_int(kh_h2_fields_check(&f, (const uint8_t *)"x-a", 3, (const uint8_t *)"a\0b", 3), -1,
                  "NUL");
    }

    kh_subtest("connection-specific fields (§8.2.2)");
    kh_is_int(get_with("connection", "close"), 4, "connection");
    kh_is_int(get_with("keep-alive", "5"), 4, "keep-alive");
    kh_is_int(get_with("proxy-connection", "close"), 4, "proxy-connection");
    kh_is_int(get_with("transfer-encoding", "chunked"), 4, "transfer-encoding");
    kh_is_int(get_with("upgrade", "websocket"), 4, "upgrade");
    kh_is_int(get_with("te", "trailers"), -1, "te: trailers");
    kh_is_int(get_with("te", "TRAILERS"), -1, "te: TRAILERS (case-insensitive)");
    kh_is_int(get_with("te", "gzip"), 4, "te: gzip");
    kh_is_int(get_with("connections", "a"), -1, "a name that only starts like one");

    kh_subtest("pseudo-headers");
    kh_is_int(HEAD(1, {":method", "GET"}, {":scheme", "https"}, {":path", "/a?b"}, {":authority", "h:1"}), -1,
              "a whole GET");
    kh_is_int(HEAD(1, {":method", "GET"}, {":scheme", "https"}, {":path", "/"}, {"host", "h"}), -1,
              "host for :authority");
    kh_is_int(HEAD(1, {":method", "GET"}, {":scheme", "http"}, {":path", "/"}), 99, "no authority at all");
    kh_is_int(HEAD(1, {":scheme", "http"}, {":path", "/"}, {":authority", "h"}), 99, "no :method");
    kh_is_int(HEAD(1, {":method", "GET"}, {":path", "/"}, {":authority", "h"}), 99, "no :scheme");
    kh_is_int(HEAD(1, {":method", "GET"}, {":scheme", "http"}, {":authority", "h"}), 99, "no :path");
    kh_is_int(HEAD(1, {":method", "GET"}, {":method", "GET"}), 1, "duplicate :method");
    kh_is_int(HEAD(1, {":authority", "h"}, {":authority", "h"}), 1, "duplicate :authority");
    kh_is_int(HEAD(1, {"host", "h"}, {"host", "h"}), 1, "duplicate host");
    kh_is_int(HEAD(1, {":method", "GET"}, {"x-a", "b"}, {":path", "/"}), 2, "pseudo after regular");
    kh_is_int(HEAD(1, {":status", "200"}), 0, ":status");
    kh_is_int(HEAD(1, {":foo", "a"}), 0, "unknown pseudo-header");
    kh_is_int(HEAD(1, {":", "a"}), 0, "':' alone");
    kh_is_int(HEAD(1, {":Method", "GET"}), 0, "upper-case pseudo-header");
    kh_is_int(HEAD(1, {":method", ""}), 0, "empty :method");
    kh_is_int(HEAD(1, {":method", "G T"}), 0, ":method not a token");
    kh_is_int(HEAD(1, {":path", ""}), 0, "empty :path");
    kh_is_int(HEAD(1, {":path", "/a b"}), 0, "SP in :path");
    kh_is_int(HEAD(1, {":path", "/0123456789\x7f"}), 0, "DEL in :path's second word");
    kh_is_int(HEAD(1, {":authority", ""}), 0, "empty :authority");
    kh_is_int(HEAD(1, {":authority", "u@h"}), 0, ":authority with userinfo");
    kh_is_int(HEAD(1, {":authority", "h:99999"}), 0, ":authority port over 65535");
    kh_is_int(HEAD(1, {"host", ""}), 0, "empty host");
    kh_is_int(HEAD(1, {"host", "h h"}), 0, "host with SP");
    kh_is_int(HEAD(1, {":scheme", "1http"}), 0, ":scheme not starting with a letter");
    kh_is_int(HEAD(1, {":scheme", "ht tp"}), 0, ":scheme with SP");
    kh_is_int(HEAD(1, {":method", "GET"}, {":scheme", "HTTPS"}, {":path", "x"}, {":authority", "h"}), 99,
              "https (any case) needs a :path starting with /");
    kh_is_int(HEAD(1, {":method", "GET"}, {":scheme", "coap+tcp"}, {":path", "x"}, {":authority", "h"}), -1,
              "another scheme: any :path");
    kh_is_int(HEAD(1, {":method", "OPTIONS"}, {":scheme", "http"}, {":path", "*"}, {":authority", "h"}), -1,
              "OPTIONS *");
    kh_is_int(HEAD(1, {":method", "GET"}, {":scheme", "http"}, {":path", "*"}, {":authority", "h"}), 99,
              "GET *");

    kh_subtest("CONNECT (§8.5, RFC 8441)");
    kh_is_int(HEAD(0, {":method", "CONNECT"}, {":authority", "h:443"}), -1, "CONNECT");
    kh_is_int(HEAD(0, {":method", "CONNECT"}), 99, "CONNECT without :authority");
    kh_is_int(HEAD(0, {":method", "CONNECT"}, {":authority", "h:443"}, {":path", "/"}), 99, "CONNECT with :path");
    kh_is_int(HEAD(0, {":method", "CONNECT"}, {":authority", "h:443"}, {":scheme", "http"}), 99,
              "CONNECT with :scheme");
    kh_is_int(HEAD(0, {":method", "CONNECT"}, {":protocol", "websocket"}, {":scheme", "https"}, {":path", "/ws"},
                   {":authority", "h"}),
              -1, "extended CONNECT");
    kh_is_int(HEAD(0, {":method", "CONNECT"}, {":protocol", "websocket"}, {":scheme", "https"}, {":path", "/ws"},
                   {"host", "h"}),
              99, "extended CONNECT with host, no :authority");
    kh_is_int(HEAD(0, {":method", "GET"}, {":protocol", "websocket"}, {":scheme", "https"}, {":path", "/ws"},
                   {":authority", "h"}),
              99, ":protocol on GET");
    kh_is_int(HEAD(0, {":method", "CONNECT"}, {":protocol", ""}), 1, "empty :protocol");
    {
        kh_h2_fields f;
        nv l[] = {{":method", "CONNECT"}, {":authority", "h:1"}, {"content-length", "5"}};
        kh_is_int(run(&f, 0, l, 3), -1, "CONNECT with content-length: fields");
        kh_is_int(kh_h2_fields_request_end(&f, 0), 0, "... accepted");
        kh_is_int((int)f.clen, -1, "... and its length is not a body's");
    }

    kh_subtest("content-length (§8.1.1)");
    {
        kh_h2_fields f;
        nv l[] = {{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {":authority", "h"},
                  {"content-length", "9223372036854775807"}};
        kh_is_int(run(&f, 0, l, 5), -1, "INT64_MAX");
        kh_ok(f.clen == INT64_MAX, "... is the length");
        kh_is_int(kh_h2_fields_request_end(&f, 1), -1, "... with END_STREAM on the head: refused");
        kh_is_int(kh_h2_fields_request_end(&f, 0), 0, "... without: accepted");
    }
    kh_is_int(get_with("content-length", "9223372036854775808"), 4, "INT64_MAX + 1");
    kh_is_int(get_with("content-length", ""), 4, "empty");
    kh_is_int(get_with("content-length", "1,1"), 4, "a list");
    kh_is_int(get_with("content-length", "+1"), 4, "a sign");
    kh_is_int(get_with("content-length", "0"), -1, "0 with END_STREAM");
    kh_is_int(HEAD(1, {"content-length", "1"}, {"content-length", "1"}), 1, "twice, same value");

    kh_subtest("trailers");
    {
        kh_h2_fields f;
        nv ok[] = {{"x-checksum", "abc"}};
        nv pseudo[] = {{":method", "GET"}};
        nv conn[] = {{"connection", "close"}};
        kh_is_int(run(&f, 1, ok, 1), -1, "a regular field");
        kh_is_int(run(&f, 1, pseudo, 1), 0, "a pseudo-header");
        kh_is_int(run(&f, 1, conn, 1), 0, "connection");
        kh_h2_fields_begin(&f, 1);
        f.clen = 4; /* the head's, as kh_h2.c sets it */
        kh_is_int(kh_h2_fields_check(&f, (const uint8_t *)"content-length", 14, (const uint8_t *)"4", 1), -1,
                  "content-length after the head's");
    }

    kh_subtest("priority (RFC 9218)");
    {
        uint8_t u = 3, i = 0;
        kh_is_int(kh_h2_fields_priority((const uint8_t *)"u=0, i", 6, &u, &i), 0, "u=0, i");
        kh_ok(u == 0 && i == 1, "... urgency 0, incremental");
        u = 3, i = 1;
        kh_is_int(kh_h2_fields_priority((const uint8_t *)"i=?0,u=7;x=\"a\\\"b\", foo=bar", 26, &u, &i), 0,
                  "i=?0, u=7 with a parameter and an unknown member");
        kh_ok(u == 7 && i == 0, "... urgency 7, not incremental");
        u = 3;
        kh_is_int(kh_h2_fields_priority((const uint8_t *)"u=9", 3, &u, &i), 0, "u=9: parses");
        kh_is_int(u, 3, "... and is ignored");
        kh_is_int(kh_h2_fields_priority((const uint8_t *)"u=1,", 4, &u, &i), -1, "a trailing comma");
        kh_is_int(kh_h2_fields_priority((const uint8_t *)"U=1", 3, &u, &i), -1, "an upper-case key");
        kh_is_int(kh_h2_fields_priority((const uint8_t *)"u=\"1", 4, &u, &i), -1, "an unclosed string");
        kh_h2_fields f;
        nv l[] = {{":method", "GET"}, {"priority", "u=1"}, {"priority", "u=2, i"}};
        kh_is_int(run(&f, 0, l, 3), -1, "two priority fields");
        kh_ok((f.flags & KH_H2F_PRIORITY) && f.urgency == 2 && f.incremental == 1, "... the last one counts");
        nv bad[] = {{":method", "GET"}, {"priority", "u=1"}, {"priority", "u=(1)"}};
        kh_is_int(run(&f, 0, bad, 3), -1, "one that does not parse: the request still goes");
        kh_ok(!(f.flags & KH_H2F_PRIORITY), "... and no priority is applied");
    }

    kh_subtest("scans");
    scans();
    return kh_test_done();
}
