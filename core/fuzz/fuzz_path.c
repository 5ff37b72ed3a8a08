/* fuzz_path.c: libFuzzer target for kh_path (kh_path_normalize, kh_path_param_ok).
 * Owns:  exact-size heap copies of the input and exact-size output buffers (ASan sees any read
 *        past len or write past the promised bound).
 * In:    data[0] bit 0: pattern mode (KH_PATH_PATTERN); data[1..] the path.
 * Out:   a trap on any broken property:
 *        - kh_path_normalize agrees with a reference written differently (segments split first,
 *          then a stack for dot segments, UTF-8 checked by decoding code points; a ".." may not
 *          pop a segment holding "%2F" or "%5C"): both refuse, or both accept with the same
 *          bytes;
 *        - an accepted result fits the bound (len; 3 * len in pattern mode), is a fixed point,
 *          and has no "//", no "." or ".." segment, no escape of an unreserved byte, no
 *          lower-case hex digit in an escape;
 *        - kh_path_param_ok, on each segment and on each suffix starting at a segment (what a
 *          :param or *splat can capture), agrees with a reference that decodes "%2F", "%5C" and
 *          "%2E" and splits on '/' and '\'.
 * Never: keeps state between inputs. */
#include "kh_path.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static int hexv(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int is_unreserved(unsigned c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '.' || c == '_' || c == '~';
}

static int raw_plain(unsigned c)
{
    return c >= 0x21 && c <= 0x7e && c != '\\' && c != '#' && c != '?' && c != '%' && c != '/';
}

/* Decoded bytes are UTF-8: decode each code point and check its range and shortest form. */
static int ref_utf8(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i], len, cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0)
            len = 2, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            len = 3, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            len = 4, cp = c & 0x07;
        else
            return 0;
        if (n - i < len)
            return 0;
        for (unsigned k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i + k] & 0x3F);
        }
        static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

typedef struct seg {
    size_t off, len; /* into the transformed text */
} seg;

/* Returns the normal form's length in out, or -1. */
static ssize_t ref_normalize(const unsigned char *in, size_t len, char *out, int pattern)
{
    if (len == 0)
        return 0;
    if (len == 1 && in[0] == '*') {
        out[0] = '*';
        return 1;
    }
    if (in[0] != '/')
        return -1;
    /* 1. every segment transformed, and the decoded byte stream for the UTF-8 check */
    char *text = malloc(len * 3 + 1);
    unsigned char *dec = malloc(len + 1);
    seg *segs = malloc(sizeof(seg) * (len + 1));
    size_t t = 0, d = 0, ns = 0, i = 1;
    ssize_t rc = -1;
    segs[0].off = 0;
    while (i <= len) {
        if (i == len || in[i] == '/') {
            segs[ns].len = t - segs[ns].off;
            ns++;
            segs[ns].off = t;
            if (i < len)
                dec[d++] = '/';
            i++;
            continue;
        }
        unsigned c = in[i];
        if (c == '%') {
            if (len - i < 3 || hexv(in[i + 1]) < 0 || hexv(in[i + 2]) < 0)
                goto out;
            unsigned v = (unsigned)(hexv(in[i + 1]) * 16 + hexv(in[i + 2]));
            if (v == 0)
                goto out;
            dec[d++] = (unsigned char)v;
            if (is_unreserved(v)) {
                text[t++] = (char)v;
            } else {
                text[t++] = '%';
                text[t++] = "0123456789ABCDEF"[v / 16];
                text[t++] = "0123456789ABCDEF"[v % 16];
            }
            i += 3;
            continue;
        }
        if (!raw_plain(c) && (!pattern || c == 0))
            goto out;
        dec[d++] = (unsigned char)c;
        if (raw_plain(c)) {
            text[t++] = (char)c;
        } else {
            text[t++] = '%';
            text[t++] = "0123456789ABCDEF"[c / 16];
            text[t++] = "0123456789ABCDEF"[c % 16];
        }
        i++;
    }
    if (!ref_utf8(dec, d))
        goto out;
    /* 2. a stack of kept segments */
    size_t *stack = malloc(sizeof(size_t) * (ns + 1)), sp = 0;
    int trailing = 0;
    for (size_t k = 0; k < ns; k++) {
        const char *s = text + segs[k].off;
        size_t n = segs[k].len;
        int last = k + 1 == ns;
        int dot = n == 1 && s[0] == '.', dotdot = n == 2 && s[0] == '.' && s[1] == '.';
        if (pattern && ((n == 0 && !last) || dot || dotdot)) {
            free(stack);
            goto out;
        }
        if (n == 0 || dot) {
            trailing = last;
        } else if (dotdot) {
            if (sp == 0) {
                free(stack);
                goto out;
            }
            sp--;
            const char *top = text + segs[stack[sp]].off;
            size_t tl = segs[stack[sp]].len;
            for (size_t j = 0; j + 3 <= tl; j++)
                if (top[j] == '%' && ((top[j + 1] == '2' && top[j + 2] == 'F') ||
                                      (top[j + 1] == '5' && top[j + 2] == 'C'))) {
                    free(stack);
                    goto out;
                }
            trailing = last;
        } else {
            stack[sp++] = k;
            trailing = 0;
        }
    }
    size_t o = 0;
    out[o++] = '/';
    for (size_t k = 0; k < sp; k++) {
        if (k)
            out[o++] = '/';
        memcpy(out + o, text + segs[stack[k]].off, segs[stack[k]].len);
        o += segs[stack[k]].len;
    }
    if (trailing && sp)
        out[o++] = '/';
    free(stack);
    rc = (ssize_t)o;
out:
    free(text);
    free(dec);
    free(segs);
    return rc;
}

/* Decodes %2F %5C %2E (any case), splits on '/' and '\': is a piece ".."? */
static int ref_param_ok(const char *p, size_t n)
{
    char *d = malloc(n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '%' && n - i >= 3 && hexv((unsigned char)p[i + 1]) >= 0 &&
            hexv((unsigned char)p[i + 2]) >= 0) {
            int v = hexv((unsigned char)p[i + 1]) * 16 + hexv((unsigned char)p[i + 2]);
            if (v == '/' || v == '\\' || v == '.') {
                d[m++] = (char)v;
                i += 2;
                continue;
            }
            d[m++] = 'x'; /* any other decoded byte is not '.' nor a separator */
            i += 2;
            continue;
        }
        d[m++] = p[i];
    }
    int ok = 1;
    size_t start = 0;
    for (size_t i = 0; i <= m; i++) {
        if (i == m || d[i] == '/' || d[i] == '\\') {
            if (i - start == 2 && d[start] == '.' && d[start + 1] == '.')
                ok = 0;
            start = i + 1;
        }
    }
    free(d);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned flags = (data[0] & 1) ? KH_PATH_PATTERN : 0;
    size_t len = size - 1;
    char *in = malloc(len ? len : 1);
    memcpy(in, data + 1, len);
    size_t cap = flags ? len * 3 : len;
    char *out = malloc(cap ? cap : 1);
    char *ref = malloc(len * 3 + 1);

    ssize_t n = kh_path_normalize(in, len, out, flags);
    ssize_t rn = ref_normalize((const unsigned char *)in, len, ref, flags != 0);
    CHECK((n >= 0) == (rn >= 0));
    if (n >= 0) {
        CHECK((size_t)n <= cap && n == rn && memcmp(out, ref, (size_t)n) == 0);
        /* the normal form's own properties */
        for (ssize_t i = 0; i < n; i++) {
            if (out[i] == '%') {
                CHECK(n - i >= 3);
                int h = hexv((unsigned char)out[i + 1]), l = hexv((unsigned char)out[i + 2]);
                CHECK(h >= 0 && l >= 0 && !(out[i + 1] >= 'a') && !(out[i + 2] >= 'a'));
                CHECK(!is_unreserved((unsigned)(h * 16 + l)) && h * 16 + l != 0);
            }
            if (out[i] == '/' && i + 1 < n)
                CHECK(out[i + 1] != '/');
            if (out[i] == '/') {
                size_t rest = (size_t)(n - i - 1);
                const char *s = out + i + 1;
                size_t sl = 0;
                while (sl < rest && s[sl] != '/')
                    sl++;
                CHECK(!(sl == 1 && s[0] == '.') && !(sl == 2 && s[0] == '.' && s[1] == '.'));
                /* a segment (a :param) and everything from it (a *splat) */
                CHECK(kh_path_param_ok(s, sl) == ref_param_ok(s, sl));
                CHECK(kh_path_param_ok(s, rest) == ref_param_ok(s, rest));
            }
        }
        /* a fixed point (in request mode; a pattern's normal form is a valid request path too,
         * unless it encoded bytes a request may not hold, which it never leaves raw) */
        char *again = malloc(n ? (size_t)n : 1);
        ssize_t m = kh_path_normalize(out, (size_t)n, again, 0);
        CHECK(m == n && memcmp(again, out, (size_t)n) == 0);
        free(again);
    }
    /* kh_path_param_ok on the raw input too: it must hold for any bytes */
    CHECK(kh_path_param_ok(in, len) == ref_param_ok(in, len));
    free(in);
    free(out);
    free(ref);
    return 0;
}
