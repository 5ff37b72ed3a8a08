/* kh_path.c: the request path the router matches (see kh_path.h for the normal form).
 * Owns:  two 256-byte class tables.
 * In:    raw paths (h1 origin/absolute-form path, h2 :path before '?'), route patterns, params.
 * Out:   normalised paths or KH_PATH_E* codes; a yes/no on param values.
 * Never: allocates, calls into libuv or Lua, decodes a reserved character into the path.
 *
 * Why: behind a proxy that normalises for its own rules (nginx `location`) and forwards the raw
 * URI (proxy_pass without a URI part), the two must see the same path, or "/admin/../public"
 * is "/public" to the proxy and a match for the splat route under "/admin/" to us. So we do what nginx does on Unix, and
 * refuse (400) where a quiet guess could differ:
 * - "%2e" in any position is '.', so ".%2E" and "%2e%2e" are ".." (nginx decodes them too).
 *   Every unreserved escape is decoded ("/%61dmin" is "/admin" to nginx as well).
 * - "%2F" and "%5C" stay encoded: they are part of a segment, never a separator, so no route
 *   literal matches across them. nginx decodes "%2F" to '/' for `location`, which can only
 *   see *more* segments and dot segments than we do; the one way that could matter, a param or
 *   splat that holds "..%2F.." which nginx resolved and we did not, is closed by
 *   kh_path_param_ok: the router answers 400 when a captured value would decode to a ".."
 *   segment (and kh_router_add refuses such a literal). The value reaches Lua decoded
 *   (req.params), with '/' in it. The other way round, "/q%2Fr/../admin/x" is "/q/admin/x" to
 *   nginx, whose ".." removes only "r"; removing "q%2Fr" whole would give "/admin/x", so a ".."
 *   that would remove a segment holding "%2F" (or "%5C") is 400 (KH_PATH_EPOP). With both
 *   rules, whenever we route, nginx's path is ours with some segments split further, none of
 *   the pieces "..": if ours starts with "/admin/", so does nginx's.
 * - "//" is merged before dot segments are removed, as nginx does with merge_slashes on (its
 *   default): "/admin//../x" is "/x" to both (RFC 3986 alone would give "/admin/x"). With
 *   merge_slashes off nginx's `location /admin/` does not see "//admin/"; we do: keep it on.
 * - '\' raw is refused: not a URI character, a separator to Windows and to WHATWG parsers,
 *   ordinary to nginx on Unix; no answer is safe, so 400. '#' raw (only h2 can send it) too.
 * - ".." above the root is 400, as in nginx (RFC 3986 would clamp it to "/").
 * - "%00" is 400; so are decoded bytes that are not UTF-8 (an overlong "%C0%AE" is not '.':
 *   it is refused, never decoded). Other escapes of control bytes stay encoded.
 * - The asterisk form ("*", OPTIONS only) and the empty path (CONNECT) pass as they are and
 *   match no route; an absolute-form target's path (h1 parser) is normalised like any other.
 * The query is not touched (req.query stays raw; req.args decodes it as a form).
 *
 * Cost: the fast path (no '%', no "//", no "/.", plain bytes) copies and checks in one loop,
 * one automaton step per byte; it replaces the plain copy kh_stream_set_head made of the path.
 * callgrind, gcc -O2, instructions per call: "/" 26 (the copy: 25), "/hello" 74 (65), a 24-byte
 * path 254 (209). The slow path is one pass that never writes ahead of what it read. */
#include "kh_path.h"

#include <stdint.h>
#include <string.h>

/* cls: 0 a plain byte, copied as it is; C_SLASH '/'; C_PCT '%'; C_BAD refused in a request
 * path (encoded in a pattern). Plain: 0x21-0x7E but for '%', '/', '\', '#' and '?'. */
enum { C_PLAIN = 0, C_SLASH = 1, C_PCT = 2, C_BAD = 3 };

/* clang-format off */
static const uint8_t cls[256] = {
    /* 0x00 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0x10 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0x20 */ 3, 0, 0, 3, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
    /* 0x30 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3,
    /* 0x40 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 0x50 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0,
    /* 0x60 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 0x70 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3,
    /* 0x80 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0x90 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0xA0 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0xB0 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0xC0 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0xD0 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0xE0 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* 0xF0 */ 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
};
/* clang-format on */

/* clang-format off */
/* The fast path's automaton, indexed by state << 8 | byte: state 0 (inside a segment), 1 (just
 * after a '/'), 2 (leave for the slow path). From state 1 a '/' or a '.' leaves: "//" must be
 * merged and "/." may start a dot segment (or only "/.well-known": the slow path sorts it out).
 * A '%' or a byte of class C_BAD leaves from either state. Generated from cls. */
static const uint8_t fast[512] = {
    /* elsewhere 0x00 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0x10 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0x20 */ 2, 0, 0, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
    /* elsewhere 0x30 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    /* elsewhere 0x40 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* elsewhere 0x50 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0,
    /* elsewhere 0x60 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* elsewhere 0x70 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    /* elsewhere 0x80 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0x90 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0xA0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0xB0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0xC0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0xD0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0xE0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* elsewhere 0xF0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0x00 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0x10 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0x20 */ 2, 0, 0, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2,
    /* after '/' 0x30 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    /* after '/' 0x40 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* after '/' 0x50 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0,
    /* after '/' 0x60 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* after '/' 0x70 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    /* after '/' 0x80 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0x90 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0xA0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0xB0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0xC0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0xD0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0xE0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* after '/' 0xF0 */ 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
};
/* clang-format on */

/* RFC 3986 §2.3 unreserved: ALPHA / DIGIT / "-" / "." / "_" / "~" */
static int unreserved(unsigned c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '.' || c == '_' || c == '~';
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static const char hexu[] = "0123456789ABCDEF";

/* UTF-8 (RFC 3629) one byte at a time: need = continuation bytes still due, [lo, hi] the range
 * of the next one (narrower after E0, ED, F0, F4: no overlong form, surrogate or > U+10FFFF). */
typedef struct utf8 {
    uint8_t need, lo, hi;
} utf8;

static int utf8_feed(utf8 *u, unsigned b)
{
    if (u->need == 0) {
        if (b < 0x80)
            return 0;
        u->lo = 0x80;
        u->hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF)
            u->need = 1;
        else if (b == 0xE0)
            u->need = 2, u->lo = 0xA0;
        else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
            u->need = 2;
        else if (b == 0xED)
            u->need = 2, u->hi = 0x9F;
        else if (b == 0xF0)
            u->need = 3, u->lo = 0x90;
        else if (b >= 0xF1 && b <= 0xF3)
            u->need = 3;
        else if (b == 0xF4)
            u->need = 3, u->hi = 0x8F;
        else
            return -1; /* 0x80-0xC1 (continuation, overlong lead), 0xF5-0xFF */
        return 0;
    }
    if (b < u->lo || b > u->hi)
        return -1;
    u->need--;
    u->lo = 0x80;
    u->hi = 0xBF;
    return 0;
}

__attribute__((noinline)) static ssize_t slow(const unsigned char *in, size_t len, char *out,
                                              unsigned flags)
{
    int pattern = (flags & KH_PATH_PATTERN) != 0;
    utf8 u = {0, 0x80, 0xBF};
    size_t i = 1, o = 1;
    out[0] = '/';
    for (;;) {
        size_t start = o;
        while (i < len && in[i] != '/') {
            unsigned c = in[i];
            if (c == '%') {
                int h, l;
                if (len - i < 3 || (h = hexval(in[i + 1])) < 0 || (l = hexval(in[i + 2])) < 0)
                    return KH_PATH_EESCAPE;
                unsigned v = (unsigned)(h << 4 | l);
                if (v == 0)
                    return KH_PATH_ENUL;
                if (utf8_feed(&u, v))
                    return KH_PATH_EUTF8;
                if (unreserved(v)) {
                    out[o++] = (char)v;
                } else {
                    out[o++] = '%';
                    out[o++] = hexu[v >> 4];
                    out[o++] = hexu[v & 15];
                }
                i += 3;
                continue;
            }
            if (cls[c] == C_BAD && !pattern)
                return KH_PATH_EBYTE;
            if (utf8_feed(&u, c))
                return KH_PATH_EUTF8;
            if (cls[c] == C_BAD) {
                if (c == 0)
                    return KH_PATH_ENUL;
                out[o++] = '%';
                out[o++] = hexu[c >> 4];
                out[o++] = hexu[c & 15];
            } else {
                out[o++] = (char)c;
            }
            i++;
        }
        int last = i >= len;
        if (!last) {
            if (u.need) /* a multi-byte sequence cut by a '/' */
                return KH_PATH_EUTF8;
            i++;
        }
        size_t n = o - start;
        if (n == 0) {
            if (pattern && !last)
                return KH_PATH_EEMPTY;
            /* else merged: out already ends with '/' */
        } else if (out[start] == '.' && (n == 1 || (n == 2 && out[start + 1] == '.'))) {
            if (pattern)
                return KH_PATH_EDOT;
            o = start;
            if (n == 2) {
                if (start == 1)
                    return KH_PATH_EROOT;
                o = start - 1; /* the '/' that ended the previous segment */
                while (out[o - 1] != '/') {
                    o--;
                    /* escapes are upper-case by now: "%2F" or "%5C" in what is removed */
                    if (out[o] == '%' && o + 2 < start &&
                        ((out[o + 1] == '2' && out[o + 2] == 'F') ||
                         (out[o + 1] == '5' && out[o + 2] == 'C')))
                        return KH_PATH_EPOP;
                }
            }
        } else if (!last) {
            out[o++] = '/';
        }
        if (last)
            break;
    }
    if (u.need)
        return KH_PATH_EUTF8;
    return (ssize_t)o;
}

ssize_t kh_path_normalize(const char *in, size_t len, char *out, unsigned flags)
{
    const unsigned char *p = (const unsigned char *)in;
    if (len == 0 || (len == 1 && p[0] == '*')) {
        if (len)
            out[0] = '*';
        return (ssize_t)len;
    }
    if (p[0] != '/')
        return KH_PATH_EFORM;
    /* Copy while checking: the caller copied the path anyway, so a clean path costs one table
     * lookup per byte more than that copy. */
    unsigned char *o = (unsigned char *)out;
    unsigned st = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned c = p[i];
        o[i] = (unsigned char)c;
        st = fast[st << 8 | c];
        if (KH_UNLIKELY(st > 1))
            return slow(p, len, out, flags);
    }
    return (ssize_t)len;
}

const char *kh_path_strerror(ssize_t code)
{
    switch (code) {
    case KH_PATH_EESCAPE: return "invalid %-escape in the path";
    case KH_PATH_ENUL: return "%00 in the path";
    case KH_PATH_EUTF8: return "the path is not UTF-8";
    case KH_PATH_EBYTE: return "invalid byte in the path";
    case KH_PATH_EROOT: return "the path climbs above the root";
    case KH_PATH_EFORM: return "the path does not start with '/'";
    case KH_PATH_EDOT: return "a '.' or '..' segment";
    case KH_PATH_EEMPTY: return "an empty segment ('//')";
    case KH_PATH_EPOP: return "'..' after a segment with an encoded '/' or '\\'";
    default: return code >= 0 ? "ok" : "invalid path";
    }
}

int kh_path_param_ok(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    int dots = 0; /* '.' seen in the current piece; -1 once it holds anything else */
    for (size_t i = 0; i <= n; i++) {
        unsigned c = i < n ? p[i] : '/';
        if (c == '%' && n - i >= 3 && hexval(p[i + 1]) >= 0 && hexval(p[i + 2]) >= 0) {
            c = (unsigned)(hexval(p[i + 1]) << 4 | hexval(p[i + 2]));
            i += 2;
        }
        if (c == '/' || c == '\\') {
            if (dots == 2)
                return 0;
            dots = 0;
        } else if (c == '.' && dots >= 0) {
            dots = dots < 2 ? dots + 1 : -1;
        } else {
            dots = -1;
        }
    }
    return 1;
}
