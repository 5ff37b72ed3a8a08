/* test_multipart.c: unit tests for kh_multipart (TAP): whole bodies, every two-chunk cut and
 * one-byte chunks giving the same transcript, preamble/epilogue/padding, each refusal and limit,
 * and linear time on inputs full of near-delimiters.
 * Owns:  the transcripts it builds.
 * In:    -
 * Out:   TAP lines; exit status 0 when every assertion holds.
 * Never: feeds a chunk that is not a guarded copy (inputs end where a PROT_NONE page begins). */
#include "kh_multipart.h"
#include "kh_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct out {
    char *p;
    size_t len, cap;
} out;

static void put(out *o, const char *s, size_t n)
{
    if (o->len + n + 1 > o->cap) {
        o->cap = (o->len + n + 1) * 2;
        o->p = realloc(o->p, o->cap);
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = '\0';
}

static void puts_(out *o, const char *s) { put(o, s, strlen(s)); }

static const kh_mp_limits DEF = {100, 1024, 1 << 20, 1 << 24};

/* Runs body through the parser in chunks of `step` bytes (0: cut once at `cut`) and returns the
 * transcript: "H name=value|", "E|" headers end, data bytes as they come between "[" "]" per
 * part, "P|" part end, "Z|" done, "!reason" on error, "F" finished clean. Consecutive DATA
 * events are merged so any cut gives the same text. */
static char *run(const char *boundary, const char *body, size_t blen, size_t cut, size_t step,
                 const kh_mp_limits *lim)
{
    kh_multipart p;
    char *hbuf = malloc(lim->max_header_bytes ? lim->max_header_bytes : 1);
    out o = {0};
    puts_(&o, "");
    if (kh_mp_init(&p, boundary, strlen(boundary), hbuf, lim) != 0) {
        puts_(&o, "!");
        puts_(&o, p.error);
        free(hbuf);
        return o.p;
    }
    size_t pos = 0;
    int in_data = 0, err = 0, first = 1;
    while (pos < blen || first) {
        size_t n = step ? step : (first ? cut : blen - pos);
        first = 0;
        if (n > blen - pos)
            n = blen - pos;
        void *base;
        size_t map;
        const char *chunk = kh_test_guarded_copy(body + pos, n, &base, &map);
        size_t off = 0;
        for (;;) {
            int ev = kh_mp_next(&p, chunk, n, &off);
            if (ev != KH_MP_DATA && ev != KH_MP_NEED_MORE && in_data) {
                puts_(&o, "]");
                in_data = 0;
            }
            if (ev == KH_MP_NEED_MORE)
                break;
            if (ev == KH_MP_ERROR) {
                err = 1;
                break;
            }
            if (ev == KH_MP_HEADER) {
                puts_(&o, "H ");
                put(&o, p.name, p.name_len);
                puts_(&o, "=");
                put(&o, p.value, p.value_len);
                puts_(&o, "|");
            } else if (ev == KH_MP_HEADERS_END) {
                puts_(&o, "E|");
            } else if (ev == KH_MP_DATA) {
                if (!in_data)
                    puts_(&o, "[");
                in_data = 1;
                if (p.len == 0)
                    puts_(&o, "<EMPTY DATA>");
                put(&o, p.data, p.len);
            } else if (ev == KH_MP_PART_END) {
                puts_(&o, "P|");
            } else if (ev == KH_MP_DONE) {
                puts_(&o, "Z|");
            }
            if (off > n)
                puts_(&o, "<OFFSET PAST INPUT>");
        }
        kh_test_guarded_free(base, map);
        pos += n;
        if (err)
            break;
    }
    if (in_data)
        puts_(&o, "]");
    if (!err && kh_mp_finish(&p) == 0) {
        puts_(&o, "F");
    } else {
        /* data before an error depends on the cuts: keep the transcript to the last event */
        char *bar = strrchr(o.p, '|');
        o.len = bar ? (size_t)(bar - o.p) + 1 : 0;
        o.p[o.len] = '\0';
        puts_(&o, "!");
        puts_(&o, p.error);
    }
    free(hbuf);
    return o.p;
}

/* The whole body, then every two-chunk cut, then 1-, 2- and 7-byte steps: all the same. */
static void check(const char *name, const char *boundary, const char *body, const char *want,
                  const kh_mp_limits *lim)
{
    size_t blen = strlen(body);
    char *whole = run(boundary, body, blen, blen, 0, lim);
    kh_is_str(whole, strlen(whole), want, "%s: whole", name);
    int same = 1;
    size_t bad = 0;
    for (size_t cut = 0; cut <= blen && same; cut++) {
        char *t = run(boundary, body, blen, cut, 0, lim);
        if (strcmp(t, want) != 0)
            same = 0, bad = cut;
        free(t);
    }
    kh_ok(same, "%s: every two-chunk cut (first bad: %zu)", name, bad);
    static const size_t steps[] = {1, 2, 7};
    for (size_t i = 0; i < 3; i++) {
        char *t = run(boundary, body, blen, 0, steps[i], lim);
        kh_is_str(t, strlen(t), want, "%s: %zu-byte chunks", name, steps[i]);
        free(t);
    }
    free(whole);
}

int main(void)
{
    kh_subtest("parts");
    check("two fields", "XyZ",
          "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nhello\r\n"
          "--XyZ\r\nContent-Disposition: form-data; name=\"b\"\r\nContent-Type: text/plain\r\n"
          "\r\nwor\rld\r\n--XyZ--\r\n",
          "H Content-Disposition=form-data; name=\"a\"|E|[hello]P|"
          "H Content-Disposition=form-data; name=\"b\"|H Content-Type=text/plain|E|[wor\rld]P|Z|F",
          &DEF);
    check("preamble, padding, epilogue", "b",
          "preamble\r\n--b  \t\r\nX: 1\r\n\r\n\r\n--\r\n--b--ignored\r\n--b\r\n",
          "H X=1|E|[\r\n--]P|Z|F", &DEF);
    /* an empty part has no DATA event, so no "[" */
    check("empty part, no headers", "b", "--b\r\n\r\n\r\n--b--", "E|P|Z|F", &DEF);
    check("near-delimiters in data", "abc",
          "--abc\r\n\r\n\r\n--ab\r\n-\r\r\n--abX\r\n--abc--",
          "E|[\r\n--ab\r\n-\r\r\n--abX]P|Z|F", &DEF);
    check("value trimmed, UTF-8 kept", "q",
          "--q\r\nA:   x y \t\r\nB:\r\nC: caf\xc3\xa9.txt\r\n\r\nd\r\n--q--",
          "H A=x y|H B=|H C=caf\xc3\xa9.txt|E|[d]P|Z|F", &DEF);
    check("delimiter at the body's start only after CRLF", "b",
          "x--b\r\n\r\n\r\n--b\r\n\r\nv\r\n--b--", "E|[v]P|Z|F", &DEF);

    kh_subtest("refusals");
    check("truncated", "b", "--b\r\n\r\nabc", "E|!the multipart body ends before its "
          "close delimiter", &DEF);
    check("no delimiter", "b", "hello", "!the body has no multipart delimiter", &DEF);
    check("empty body", "b", "", "!the body has no multipart delimiter", &DEF);
    check("junk after delimiter", "b", "--b x\r\n", "!a multipart delimiter is followed by "
          "something else than CRLF", &DEF);
    check("single dash", "b", "--b-x", "!a multipart delimiter is followed by a single '-'",
          &DEF);
    check("bare CR after delimiter", "b", "--b\rx", "!a multipart delimiter line ends with a "
          "bare CR", &DEF);
    check("header bare LF", "b", "--b\r\nA: 1\n\r\n", "!a multipart header line ends with a "
          "bare LF", &DEF);
    check("header bare CR", "b", "--b\r\nA: 1\rx\r\n\r\n", "!a multipart header line has a "
          "bare CR", &DEF);
    check("header fold", "b", "--b\r\nA: 1\r\n 2\r\n\r\n", "H A=1|!a multipart header is "
          "folded (obs-fold)", &DEF);
    check("header no colon", "b", "--b\r\nA 1\r\n\r\n", "!a multipart header line is not "
          "'name: value'", &DEF);
    check("header empty name", "b", "--b\r\n: 1\r\n\r\n", "!a multipart header line is not "
          "'name: value'", &DEF);
    check("header control", "b", "--b\r\nA: \x01\r\n\r\n", "!a multipart header value has a "
          "control character", &DEF);

    kh_subtest("limits");
    kh_mp_limits l = DEF;
    l.max_parts = 2;
    check("max_parts", "b", "--b\r\n\r\n\r\n--b\r\n\r\n\r\n--b\r\n\r\n\r\n--b--",
          "E|P|E|P|!too many multipart parts", &l);
    l = DEF;
    l.max_header_bytes = 8;
    check("max_header_bytes", "b", "--b\r\nAB: 12\r\n\r\n\r\n--b--",
          "!a multipart part's header block is too large", &l);
    check("max_header_bytes just fits", "b", "--b\r\nA: 1\r\n\r\n\r\n--b--",
          "H A=1|E|P|Z|F", &l);
    l = DEF;
    l.max_part_bytes = 4;
    check("max_part_bytes", "b", "--b\r\n\r\n12345\r\n--b--",
          "E|!a multipart part is too large", &l);
    check("max_part_bytes exact", "b", "--b\r\n\r\n1234\r\n--b--", "E|[1234]P|Z|F", &l);
    l = DEF;
    l.max_total_bytes = 20;
    check("max_total_bytes", "b", "--b\r\n\r\n1234567890\r\n--b--",
          "E|!the multipart body is too large", &l);

    kh_subtest("boundaries");
    char *t = run("", "x", 1, 1, 0, &DEF);
    kh_is_str(t, strlen(t), "!the multipart boundary must be 1 to 70 characters", "empty");
    free(t);
    t = run("a\rb", "x", 1, 1, 0, &DEF);
    kh_is_str(t, strlen(t), "!the multipart boundary has a character RFC 2046 does not allow",
              "CR in boundary");
    free(t);
    t = run("ab ", "x", 1, 1, 0, &DEF);
    kh_is_str(t, strlen(t), "!the multipart boundary ends with a space", "trailing space");
    free(t);
    char b71[72];
    memset(b71, 'a', 71);
    b71[71] = 0;
    t = run(b71, "x", 1, 1, 0, &DEF);
    kh_is_str(t, strlen(t), "!the multipart boundary must be 1 to 70 characters", "71 chars");
    free(t);

    kh_subtest("linear time");
    {
        /* 8 MiB of near-delimiters for a 70-character boundary: "\r\n--" + 69 matching bytes */
        char bnd[71];
        memset(bnd, 'z', 70);
        bnd[70] = 0;
        size_t n = 8u << 20;
        char *body = malloc(n + 200);
        size_t o = (size_t)sprintf(body, "--%s\r\n\r\n", bnd);
        size_t unit = 4 + 69 + 1;
        while (o + unit < n) {
            memcpy(body + o, "\r\n--", 4);
            memset(body + o + 4, 'z', 69);
            body[o + 73] = 'y';
            o += unit;
        }
        size_t near = o;
        o += (size_t)sprintf(body + o, "\r\n--%s--", bnd);
        kh_mp_limits big = {100, 1024, 1u << 30, 1u << 30};
        kh_multipart p;
        char hbuf[1024];
        kh_mp_init(&p, bnd, 70, hbuf, &big);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        size_t off = 0, data = 0;
        int ev, done = 0;
        while ((ev = kh_mp_next(&p, body, o, &off)) != KH_MP_NEED_MORE && ev != KH_MP_ERROR) {
            if (ev == KH_MP_DATA)
                data += p.len;
            if (ev == KH_MP_DONE)
                done = 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
        kh_ok(done && data == near - (size_t)(6 + 70), "8 MiB of near-delimiters parsed (%zu data)",
              data);
        /* linear: ~74 compares per 74 bytes; a quadratic search would take minutes */
        kh_ok(ms < 2000, "in %.1f ms (limit 2000 under ASan on a loaded box)", ms);
        free(body);
    }
    return kh_test_done();
}
