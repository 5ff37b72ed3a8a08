/* test_path.c: unit tests for kh_path (TAP): the normal form, each refusal, the byte classes,
 * kh_path_param_ok, and a timing of the fast path against a plain copy (printed, not asserted).
 * Owns:  guarded copies of each input and output buffers sized exactly as kh_path.h promises.
 * In:    -
 * Out:   TAP lines; exit status 0 when every assertion holds.
 * Never: lets an over-read or over-write pass: inputs end where a PROT_NONE page begins, and the
 *        output buffer is exactly len (3 * len for patterns) bytes of heap (ASan). */
#include "kh_path.h"
#include "kh_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Normalises s (guarded copy) into an exact-size heap buffer; *out gets a NUL-terminated copy. */
static ssize_t norm(const char *s, size_t len, unsigned flags, char *res, size_t rescap)
{
    void *base;
    size_t map;
    const char *in = kh_test_guarded_copy(s, len, &base, &map);
    size_t cap = flags & KH_PATH_PATTERN ? len * 3 : len;
    char *out = malloc(cap ? cap : 1);
    ssize_t n = kh_path_normalize(in, len, out, flags);
    if (n >= 0 && (size_t)n < rescap) {
        memcpy(res, out, (size_t)n);
        res[n] = '\0';
    } else if (rescap) {
        res[0] = '\0';
    }
    free(out);
    kh_test_guarded_free(base, map);
    return n;
}

static void ok_path(const char *in, const char *want)
{
    char got[512];
    ssize_t n = norm(in, strlen(in), 0, got, sizeof got);
    kh_ok(n >= 0 && strcmp(got, want) == 0, "%-28s -> %s", in, want);
    if (n < 0 || strcmp(got, want) != 0)
        printf("#   got %zd '%s' (%s)\n", n, got, kh_path_strerror(n));
    /* The normal form is a fixed point. */
    char again[512];
    ssize_t m = norm(got, strlen(got), 0, again, sizeof again);
    if (n >= 0)
        kh_ok(m == n && strcmp(again, got) == 0, "  and %s is already normal", want);
}

static void bad_path(const char *in, size_t len, ssize_t want, const char *why)
{
    char got[512];
    ssize_t n = norm(in, len, 0, got, sizeof got);
    kh_ok(n == want, "%s: %s (%s)", why, kh_path_strerror(want), in);
    if (n != want)
        printf("#   got %zd '%s'\n", n, got);
}

static void test_normal_form(void)
{
    kh_subtest("normal form: dot segments, %2e, slashes, escapes");
    ok_path("/", "/");
    ok_path("/a/b/c", "/a/b/c");
    ok_path("/a/b/", "/a/b/");
    ok_path("/.well-known/x", "/.well-known/x");
    ok_path("/a/.b/..c/...", "/a/.b/..c/...");
    ok_path("/a./b../", "/a./b../");
    /* the payloads of issue 8 */
    ok_path("/admin/../public", "/public");
    ok_path("/admin/%2e%2e/public", "/public");
    ok_path("/admin/%2E%2E/public", "/public");
    ok_path("/admin/.%2e/public", "/public");
    ok_path("/admin/%2e./public", "/public");
    ok_path("/admin/./../public", "/public");
    ok_path("/admin/%2e/../public", "/public");
    /* RFC 3986 §5.2.4 examples and edges */
    ok_path("/a/b/c/./../../g", "/a/g");
    ok_path("/mid/content=5/../6", "/mid/6");
    ok_path("/a/.", "/a/");
    ok_path("/a/..", "/");
    ok_path("/a/b/..", "/a/");
    ok_path("/.", "/");
    ok_path("/./", "/");
    ok_path("/a/./b", "/a/b");
    ok_path("/a%2eb", "/a.b");
    ok_path("/%2e%2e%2e", "/...");
    /* merge_slashes, before dot segments (as nginx) */
    ok_path("//", "/");
    ok_path("///a///b///", "/a/b/");
    ok_path("//admin/x", "/admin/x");
    ok_path("/admin//../x", "/x");
    ok_path("/a/.//../b", "/b");
    /* escapes: unreserved decoded, the rest upper-cased and kept */
    ok_path("/%61dmin", "/admin");
    ok_path("/%7euser/%5F%2D", "/~user/_-");
    ok_path("/a%2fb", "/a%2Fb");
    ok_path("/a%2Fb/..%2F..%2Fetc", "/a%2Fb/..%2F..%2Fetc");
    ok_path("/a%2Fb/c/../d", "/a%2Fb/d"); /* the '..' pops "c" only */
    ok_path("/a%252F/../b", "/b");        /* "%252F" is "%25" then "2F": no encoded '/' */
    ok_path("/a%5cb", "/a%5Cb");
    ok_path("/%25", "/%25");
    ok_path("/%252e%252e", "/%252e%252e"); /* "%25" then raw "2e" */
    ok_path("/caf%c3%a9", "/caf%C3%A9");
    ok_path("/%f0%9f%98%80", "/%F0%9F%98%80");
    ok_path("/a+b/c;d=e,f/@:!$&'()*", "/a+b/c;d=e,f/@:!$&'()*");
    ok_path("/%20/%0a", "/%20/%0A");
    /* non-origin forms pass as they are */
    ok_path("*", "*");
    char got[8];
    kh_is_int(norm("", 0, 0, got, sizeof got), 0, "empty path (CONNECT) stays empty");
}

static void test_refusals(void)
{
    kh_subtest("refusals (400)");
    bad_path("/..", 3, KH_PATH_EROOT, "above the root");
    bad_path("/../a", 5, KH_PATH_EROOT, "above the root");
    bad_path("/a/../..", 8, KH_PATH_EROOT, "above the root, second ..");
    bad_path("/%2e%2e/etc/passwd", 18, KH_PATH_EROOT, "encoded .. above the root");
    bad_path("//..", 4, KH_PATH_EROOT, "merged slashes then ..");
    bad_path("/a/%2e%2E/%2E./x", 16, KH_PATH_EROOT, "mixed-case escapes");
    bad_path("/q%2Fr/../admin/x", 17, KH_PATH_EPOP, ".. pops a segment holding %2F");
    bad_path("/q%2fr/%2e%2e/admin/x", 21, KH_PATH_EPOP, ".. pops a segment holding %2f");
    bad_path("/a/x%5Cy/..", 11, KH_PATH_EPOP, ".. pops a segment holding %5C");
    bad_path("/b%2F/../a", 10, KH_PATH_EPOP, "%2F at the end of the popped segment");
    bad_path("/%zz", 4, KH_PATH_EESCAPE, "non-hex escape");
    bad_path("/a%", 3, KH_PATH_EESCAPE, "truncated escape");
    bad_path("/a%2", 4, KH_PATH_EESCAPE, "truncated escape");
    bad_path("/a%g0", 5, KH_PATH_EESCAPE, "non-hex escape");
    bad_path("/a%00b", 6, KH_PATH_ENUL, "%00");
    bad_path("/%c0%ae%c0%ae/x", 15, KH_PATH_EUTF8, "overlong '.'");
    bad_path("/%e0%80%ae", 10, KH_PATH_EUTF8, "3-byte overlong '.'");
    bad_path("/%c3", 4, KH_PATH_EUTF8, "truncated sequence");
    bad_path("/%c3/%a9", 8, KH_PATH_EUTF8, "sequence cut by '/'");
    bad_path("/%c3a", 5, KH_PATH_EUTF8, "ASCII inside a sequence");
    bad_path("/%ed%a0%80", 10, KH_PATH_EUTF8, "surrogate");
    bad_path("/%f4%90%80%80", 13, KH_PATH_EUTF8, "above U+10FFFF");
    bad_path("/%ff", 4, KH_PATH_EUTF8, "0xFF");
    bad_path("/%80", 4, KH_PATH_EUTF8, "lone continuation");
    bad_path("/a\\..\\b", 7, KH_PATH_EBYTE, "raw backslash");
    bad_path("/a#b", 4, KH_PATH_EBYTE, "raw '#'");
    bad_path("/a b", 4, KH_PATH_EBYTE, "raw space");
    bad_path("/a\0b", 4, KH_PATH_EBYTE, "raw NUL");
    bad_path("/caf\xc3\xa9", 6, KH_PATH_EBYTE, "raw UTF-8");
    bad_path("a/b", 3, KH_PATH_EFORM, "no leading '/'");
    bad_path("http://x/", 9, KH_PATH_EFORM, "absolute form is the h1 parser's to split");
    bad_path("**", 2, KH_PATH_EFORM, "only a lone '*'");

    /* Every byte: plain bytes pass as they are; the others are refused in a request path. */
    int plain_ok = 1, bad_ok = 1;
    for (unsigned b = 0; b < 256; b++) {
        char in[4] = {'/', 'a', (char)b, 'c'}, got[8];
        ssize_t n = norm(in, 4, 0, got, sizeof got);
        int plain = b >= 0x21 && b <= 0x7e && b != '\\' && b != '#' && b != '?' && b != '%';
        if (b == '/')
            plain_ok &= n == 4 && memcmp(got, "/a/c", 4) == 0;
        else if (plain)
            plain_ok &= n == 4 && memcmp(got, in, 4) == 0;
        else if (b == '%')
            bad_ok &= n == KH_PATH_EESCAPE;
        else if (n != KH_PATH_EBYTE) {
            bad_ok = 0;
            printf("#   byte 0x%02x: %zd\n", b, n);
        }
    }
    kh_ok(plain_ok, "every plain byte (0x21-0x7E but \\ # ? %%) passes as it is");
    kh_ok(bad_ok, "every other raw byte is refused");
}

static void ok_pattern(const char *in, const char *want)
{
    char got[512];
    ssize_t n = norm(in, strlen(in), KH_PATH_PATTERN, got, sizeof got);
    kh_ok(n >= 0 && strcmp(got, want) == 0, "pattern %s -> %s", in, want);
    if (n < 0 || strcmp(got, want) != 0)
        printf("#   got %zd '%s'\n", n, got);
}

static void test_patterns(void)
{
    kh_subtest("pattern mode");
    ok_pattern("/users/:id/*rest", "/users/:id/*rest");
    ok_pattern("/caf\xc3\xa9", "/caf%C3%A9");
    ok_pattern("/a b\\c#d?e", "/a%20b%5Cc%23d%3Fe");
    ok_pattern("/%7e/%2f", "/~/%2F");
    ok_pattern("/a/", "/a/");
    char got[64];
    kh_is_int(norm("/a//b", 5, KH_PATH_PATTERN, got, sizeof got), KH_PATH_EEMPTY, "// refused");
    kh_is_int(norm("//a", 3, KH_PATH_PATTERN, got, sizeof got), KH_PATH_EEMPTY, "//a refused");
    kh_is_int(norm("/a/../b", 7, KH_PATH_PATTERN, got, sizeof got), KH_PATH_EDOT, ".. refused");
    kh_is_int(norm("/a/%2e", 6, KH_PATH_PATTERN, got, sizeof got), KH_PATH_EDOT, "%%2e refused");
    kh_is_int(norm("/a/.", 4, KH_PATH_PATTERN, got, sizeof got), KH_PATH_EDOT, ". refused");
    kh_is_int(norm("/a\0", 3, KH_PATH_PATTERN, got, sizeof got), KH_PATH_ENUL, "NUL refused");
    kh_is_int(norm("/\xc0\xae", 3, KH_PATH_PATTERN, got, sizeof got), KH_PATH_EUTF8,
              "overlong refused");
}

static void param(const char *v, int want)
{
    kh_is_int(kh_path_param_ok(v, strlen(v)), want, "param '%s' %s", v, want ? "ok" : "refused");
}

static void test_params(void)
{
    kh_subtest("kh_path_param_ok");
    param("", 1);
    param("abc", 1);
    param("a.b", 1);
    param("...", 1);
    param(".", 1);
    param("..a", 1);
    param("a/b/c", 1);
    param("%2e%2e%2e", 1);
    param("..", 0);
    param("a/..", 0);
    param("../a", 0);
    param("..%2F..%2Fetc", 0);
    param("..%2f", 0);
    param("a%2F..", 0);
    param("..%5Cwin", 0);
    param("a%5c..%5cb", 0);
    param("..\\x", 0);
    param("%2e%2e", 0);
    param("%2E.%2Fx", 0);
    param("x/%2e%2e/y", 0);
    param("%252e%252e", 1); /* double-encoded: decodes once to "%2e%2e", not ".." */
    param("%", 1);
    param("%2", 1);
    param("..%", 1);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* The fast path against memcpy, for the report; the box is shared, so nothing is asserted. */
static void bench(void)
{
    kh_subtest("timing (not asserted)");
    static const char *const paths[] = {"/", "/hello", "/users/12345/posts/67890",
                                        "/static/css/site.min.css", "/a/../b/%2e%2e/c"};
    char out[64];
    volatile size_t sink = 0;
    for (size_t p = 0; p < KH_ARRAY_LEN(paths); p++) {
        size_t len = strlen(paths[p]);
        enum { N = 2000000 };
        double t0 = now_ns();
        for (int i = 0; i < N; i++) {
            memcpy(out, paths[p], len);
            sink += (size_t)out[len - 1];
        }
        double t1 = now_ns();
        for (int i = 0; i < N; i++)
            sink += (size_t)kh_path_normalize(paths[p], len, out, 0);
        double t2 = now_ns();
        printf("#   %-30s memcpy %5.1f ns, kh_path_normalize %5.1f ns\n", paths[p],
               (t1 - t0) / N, (t2 - t1) / N);
    }
    (void)sink;
}

int main(void)
{
    test_normal_form();
    test_refusals();
    test_patterns();
    test_params();
    if (getenv("KH_PATH_BENCH"))
        bench();
    return kh_test_done();
}
