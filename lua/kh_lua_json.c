/* kh_lua_json.c: k.json.encode / k.json.decode, our own JSON codec (RFC 8259) in C.
 * Why ours and not Debian's lua-cjson 2.1.0: that one has no way to mark an empty table as an
 * array (OpenResty's fork has `array_mt`, Debian's does not), escapes '/' as "\/", and its
 * errors say neither where nor which value. A codec of our own is as fast (bench figures in the
 * README's JSON section) and needs no fork.
 * Owns:  the array marker (a metatable, shared by every table marked or decoded as an array) and
 *        one growable output buffer per Lua state (a userdata upvalue; encode is not reentrant:
 *        it runs no Lua code, no metamethods).
 * In:    json_encode(value, max_depth) -> string | nil, message, path
 *        json_decode(string, max_depth) -> value | nil, message, path
 *        json_array(t) -> t marked as an array; json_null: the null value (a NULL lightuserdata,
 *        the same value as lua-cjson's cjson.null).
 * Encode: a table with the array marker is an array of t[1]..t[#t] (nil holes as null; other
 *        keys ignored). Another table is an array when its keys are exactly 1..n (n >= 1) or
 *        nearly so (holes as null while n <= 2 * count or n <= 10, as cjson does); else an
 *        object, number keys written as strings. An empty unmarked table is {}. Strings are
 *        written as they are, bytes >= 0x80 included; '"', '\' and control bytes are escaped, '/'
 *        is not. Numbers: integers below 2^53 as integers, others with up to 17 significant
 *        digits (the shortest of %.15g/%.17g that reads back the same); NaN and infinities are
 *        refused.
 * Decode: strict RFC 8259 (no comments, no trailing commas, no control bytes in strings, no
 *        lone surrogates); arrays come back with the array marker (so [] encodes back as []),
 *        null as json_null; a repeated object key: the last one wins.
 * Errors: the message, and the path of the offending value as Lua indexes it: $.items[3].name
 *        (indexes from 1), $["a b"] for keys that are not identifiers; a path longer than about
 *        300 bytes keeps its innermost part ($[...].a.a). */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "kh_lua_json.h"

#define JSON_PATH_MAX 300

typedef struct jbuf {
    char *p;
    size_t len, cap;
} jbuf;

typedef struct jctx {
    lua_State *L;
    jbuf *b;
    int depth, max_depth;
    int failed;
    char msg[160];
    char trail[JSON_PATH_MAX + 64]; /* path components, innermost first, '\1'-separated */
    size_t tlen;
    int truncated;
} jctx;

#define ARRAY_MT lua_upvalueindex(1)
#define BUF_UD lua_upvalueindex(2)

static int buf_grow(jbuf *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + more)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_gc(lua_State *L)
{
    jbuf *b = lua_touserdata(L, 1);
    free(b->p);
    b->p = NULL;
    b->cap = b->len = 0;
    return 0;
}

/* Keeps a big buffer only while it is in use. */
static void buf_reset(jbuf *b)
{
    b->len = 0;
    if (b->cap > (1u << 20)) {
        free(b->p);
        b->p = NULL;
        b->cap = 0;
    }
}

static int fail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(jctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    c->failed = 1;
    return -1;
}

static int is_ident(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
            return 0;
    return 1;
}

/* Adds one path component (the child's key in its parent) as the error unwinds. */
static void trail_add(jctx *c, const char *comp, size_t n)
{
    if (c->truncated)
        return;
    if (c->tlen + n + 1 > JSON_PATH_MAX) {
        c->truncated = 1;
        return;
    }
    memcpy(c->trail + c->tlen, comp, n);
    c->tlen += n;
    c->trail[c->tlen++] = '\1';
}

static void trail_index(jctx *c, lua_Integer i)
{
    char comp[32];
    int n = snprintf(comp, sizeof comp, "[%lld]", (long long)i);
    trail_add(c, comp, (size_t)n);
}

static void trail_key(jctx *c, const char *k, size_t kl)
{
    char comp[96];
    int n;
    if (is_ident(k, kl) && kl < 80) {
        n = snprintf(comp, sizeof comp, ".%.*s", (int)kl, k);
    } else {
        /* ["key"], the key shortened and its odd bytes shown as ? */
        char safe[48];
        size_t m = kl < 40 ? kl : 40;
        for (size_t i = 0; i < m; i++) {
            unsigned char ch = (unsigned char)k[i];
            safe[i] = (ch < 0x20 || ch >= 0x7f || ch == '"' || ch == '\\') ? '?' : (char)ch;
        }
        n = snprintf(comp, sizeof comp, "[\"%.*s%s\"]", (int)m, safe, kl > m ? "..." : "");
    }
    trail_add(c, comp, (size_t)n);
}

/* Pushes "$.a[2].b" from the trail (innermost first). */
static void push_path(lua_State *L, jctx *c)
{
    luaL_Buffer lb;
    luaL_buffinit(L, &lb);
    luaL_addchar(&lb, '$');
    if (c->truncated)
        luaL_addstring(&lb, "[...]");
    size_t end = c->tlen;
    while (end > 0) {
        size_t start = end - 1; /* end - 1 is the '\1' closing this component */
        while (start > 0 && c->trail[start - 1] != '\1')
            start--;
        luaL_addlstring(&lb, c->trail + start, end - 1 - start);
        end = start;
    }
    luaL_pushresult(&lb);
}

/* ---- encode ---- */

static const char esc_class[256] = {
    /* 0: as is; 1: \uXXXX; other: the letter after '\' */
    1,   1,   1,   1,   1,   1,   1,   1,   'b', 't', 'n', 1,   'f', 'r', 1,   1,
    1,   1,   1,   1,   1,   1,   1,   1,   1,   1,   1,   1,   1,   1,   1,   1,
    0,   0,   '"', 0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,
    0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,
    0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,
    0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   '\\',
};

static int put_string(jctx *c, const char *s, size_t n)
{
    jbuf *b = c->b;
    if (buf_grow(b, n + 2))
        return fail(c, "out of memory");
    b->p[b->len++] = '"';
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        char e = esc_class[(unsigned char)s[i]];
        if (e == 0)
            continue;
        size_t lit = i - run;
        if (buf_grow(b, lit + 6 + (n - i) + 1))
            return fail(c, "out of memory");
        memcpy(b->p + b->len, s + run, lit);
        b->len += lit;
        if (e == 1) {
            static const char hex[] = "0123456789abcdef";
            unsigned char ch = (unsigned char)s[i];
            memcpy(b->p + b->len, "\\u00", 4);
            b->p[b->len + 4] = hex[ch >> 4];
            b->p[b->len + 5] = hex[ch & 15];
            b->len += 6;
        } else {
            b->p[b->len++] = '\\';
            b->p[b->len++] = e;
        }
        run = i + 1;
    }
    size_t lit = n - run;
    if (buf_grow(b, lit + 1))
        return fail(c, "out of memory");
    memcpy(b->p + b->len, s + run, lit);
    b->len += lit;
    b->p[b->len++] = '"';
    return 0;
}

static int put_number(jctx *c, lua_Number d)
{
    jbuf *b = c->b;
    if (buf_grow(b, 32))
        return fail(c, "out of memory");
    if (d == floor(d) && d > -9007199254740992.0 && d < 9007199254740992.0) {
        char tmp[24];
        int64_t v = (int64_t)d;
        uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
        int n = 0;
        do {
            tmp[n++] = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (v < 0)
            b->p[b->len++] = '-';
        while (n)
            b->p[b->len++] = tmp[--n];
        return 0;
    }
    if (!isfinite(d))
        return fail(c, "%s cannot be sent as JSON", isnan(d) ? "NaN" : "an infinite number");
    int n = snprintf(b->p + b->len, 32, "%.15g", d);
    if (strtod(b->p + b->len, NULL) != d)
        n = snprintf(b->p + b->len, 32, "%.17g", d);
    b->len += (size_t)n;
    return 0;
}

static int put_lit(jctx *c, const char *s, size_t n)
{
    if (buf_grow(c->b, n))
        return fail(c, "out of memory");
    memcpy(c->b->p + c->b->len, s, n);
    c->b->len += n;
    return 0;
}

static int encode_value(jctx *c, int idx);

/* t[1..n] at idx, nil as null */
static int encode_array(jctx *c, int idx, lua_Integer n)
{
    lua_State *L = c->L;
    if (put_lit(c, "[", 1))
        return -1;
    for (lua_Integer i = 1; i <= n; i++) {
        if (i > 1 && put_lit(c, ",", 1))
            return -1;
        lua_rawgeti(L, idx, (int)i);
        int r = encode_value(c, lua_gettop(L));
        lua_pop(L, 1);
        if (r) {
            trail_index(c, i);
            return -1;
        }
    }
    return put_lit(c, "]", 1);
}

static int encode_table(jctx *c, int idx)
{
    lua_State *L = c->L;
    if (c->depth >= c->max_depth)
        return fail(c, "nested deeper than %d levels (a table that contains itself?)",
                    c->max_depth);
    if (!lua_checkstack(L, 6))
        return fail(c, "out of Lua stack");
    c->depth++;
    int r;
    if (lua_getmetatable(L, idx)) {
        int marked = lua_rawequal(L, -1, ARRAY_MT);
        lua_pop(L, 1);
        if (marked) {
            r = encode_array(c, idx, (lua_Integer)lua_objlen(L, idx));
            c->depth--;
            return r;
        }
    }
    /* Array or object? */
    lua_Integer count = 0, max = 0;
    int object = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        lua_Number k;
        if (lua_type(L, -1) == LUA_TNUMBER && (k = lua_tonumber(L, -1)) >= 1 && k == floor(k) &&
            k < 9007199254740992.0) {
            count++;
            if ((lua_Integer)k > max)
                max = (lua_Integer)k;
        } else {
            object = 1;
            lua_pop(L, 1);
            break;
        }
    }
    if (!object && count > 0) {
        if (max > count && max > 10 && max > 2 * count) {
            c->depth--;
            return fail(c, "a sparse array (%lld values, the last at [%lld]): mark it with "
                           "k.json.array(t) to send its holes as null",
                        (long long)count, (long long)max);
        }
        r = encode_array(c, idx, max);
        c->depth--;
        return r;
    }
    if (put_lit(c, "{", 1))
        return -1;
    int first = 1;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (!first && put_lit(c, ",", 1))
            return -1;
        first = 0;
        int kt = lua_type(L, -2);
        if (kt == LUA_TSTRING) {
            size_t kl;
            const char *k = lua_tolstring(L, -2, &kl);
            if (put_string(c, k, kl))
                return -1;
        } else if (kt == LUA_TNUMBER) {
            /* written as a string: "1", "2.5" */
            if (put_lit(c, "\"", 1) || put_number(c, lua_tonumber(L, -2)) || put_lit(c, "\"", 1)) {
                lua_pop(L, 2);
                return -1;
            }
        } else {
            lua_pop(L, 2);
            return fail(c, "a table with a %s key (JSON object keys are strings)",
                        lua_typename(L, kt));
        }
        if (put_lit(c, ":", 1) || encode_value(c, lua_gettop(L))) {
            if (kt == LUA_TSTRING) {
                size_t kl;
                const char *k = lua_tolstring(L, -2, &kl);
                trail_key(c, k, kl);
            } else {
                char comp[40];
                int n = snprintf(comp, sizeof comp, "[%.17g]", lua_tonumber(L, -2));
                trail_add(c, comp, (size_t)n);
            }
            lua_pop(L, 2);
            return -1;
        }
        lua_pop(L, 1);
    }
    c->depth--;
    return put_lit(c, "}", 1);
}

static int encode_value(jctx *c, int idx)
{
    lua_State *L = c->L;
    switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        return put_string(c, s, n);
    }
    case LUA_TNUMBER:
        return put_number(c, lua_tonumber(L, idx));
    case LUA_TBOOLEAN:
        return lua_toboolean(L, idx) ? put_lit(c, "true", 4) : put_lit(c, "false", 5);
    case LUA_TNIL:
        return put_lit(c, "null", 4);
    case LUA_TTABLE:
        return encode_table(c, idx);
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) == NULL)
            return put_lit(c, "null", 4);
        return fail(c, "a lightuserdata cannot be sent as JSON (k.json.null is the null value)");
    default:
        return fail(c, "a %s cannot be sent as JSON", luaL_typename(L, idx));
    }
}

static int check_depth(lua_State *L, int idx)
{
    lua_Number d = luaL_optnumber(L, idx, 1000);
    if (!(d >= 1 && d <= 1000)) /* the C stack: one recursion per level */
        luaL_argerror(L, idx, "max_depth must be from 1 to 1000");
    return (int)d;
}

static int l_encode(lua_State *L)
{
    jctx c;
    memset(&c, 0, sizeof c);
    c.L = L;
    c.b = lua_touserdata(L, BUF_UD);
    c.max_depth = check_depth(L, 2);
    lua_settop(L, 2);
    c.b->len = 0;
    if (encode_value(&c, 1)) {
        buf_reset(c.b);
        lua_pushnil(L);
        lua_pushstring(L, c.msg);
        push_path(L, &c);
        return 3;
    }
    lua_pushlstring(L, c.b->p, c.b->len);
    buf_reset(c.b);
    return 1;
}

/* ---- decode ---- */

typedef struct jdec {
    jctx c;
    const char *s, *p, *end;
} jdec;

static void skip_ws(jdec *d)
{
    while (d->p < d->end && (*d->p == ' ' || *d->p == '\n' || *d->p == '\r' || *d->p == '\t'))
        d->p++;
}

static int dfail(jdec *d, const char *what)
{
    if (d->p >= d->end)
        return fail(&d->c, "%s at the end of the input (byte %zu)", what, (size_t)(d->p - d->s) + 1);
    unsigned char ch = (unsigned char)*d->p;
    if (ch > 0x20 && ch < 0x7f)
        return fail(&d->c, "%s at byte %zu ('%c')", what, (size_t)(d->p - d->s) + 1, ch);
    return fail(&d->c, "%s at byte %zu (byte 0x%02x)", what, (size_t)(d->p - d->s) + 1, ch);
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9')
            v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F')
            v |= (unsigned)(ch - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* At the opening '"': pushes the string. */
static int decode_string(jdec *d)
{
    const char *start = ++d->p;
    const char *p = start;
    while (p < d->end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
        p++;
    if (p < d->end && *p == '"') {
        lua_pushlstring(d->c.L, start, (size_t)(p - start));
        d->p = p + 1;
        return 0;
    }
    jbuf *b = d->c.b;
    b->len = 0;
    if (buf_grow(b, (size_t)(p - start) + 16))
        return fail(&d->c, "out of memory");
    memcpy(b->p, start, (size_t)(p - start));
    b->len = (size_t)(p - start);
    for (;;) {
        if (p >= d->end) {
            d->p = p;
            return dfail(d, "an unterminated string");
        }
        unsigned char ch = (unsigned char)*p;
        if (ch == '"')
            break;
        if (ch < 0x20) {
            d->p = p;
            return dfail(d, "a control byte inside a string (escape it)");
        }
        if (buf_grow(b, 8))
            return fail(&d->c, "out of memory");
        if (ch != '\\') {
            b->p[b->len++] = (char)ch;
            p++;
            continue;
        }
        if (p + 1 >= d->end) {
            d->p = p + 1;
            return dfail(d, "an unterminated string");
        }
        char e = p[1];
        p += 2;
        switch (e) {
        case '"': b->p[b->len++] = '"'; break;
        case '\\': b->p[b->len++] = '\\'; break;
        case '/': b->p[b->len++] = '/'; break;
        case 'b': b->p[b->len++] = '\b'; break;
        case 'f': b->p[b->len++] = '\f'; break;
        case 'n': b->p[b->len++] = '\n'; break;
        case 'r': b->p[b->len++] = '\r'; break;
        case 't': b->p[b->len++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (d->end - p < 4 || hex4(p, &cp)) {
                d->p = p - 2;
                return dfail(d, "an invalid \\u escape");
            }
            p += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                d->p = p - 6;
                return dfail(d, "a lone low surrogate in a \\u escape");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (d->end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff) {
                    d->p = p - 6;
                    return dfail(d, "a high surrogate without its low half in a \\u escape");
                }
                p += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            b->len += utf8_put(b->p + b->len, cp);
            break;
        }
        default:
            d->p = p - 2;
            return dfail(d, "an invalid escape");
        }
    }
    lua_pushlstring(d->c.L, b->p, b->len);
    d->p = p + 1;
    return 0;
}

static int decode_number(jdec *d)
{
    const char *p = d->p, *start = p;
    int neg = 0;
    if (p < d->end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= d->end || !isdigit((unsigned char)*p)) {
        d->p = p;
        return dfail(d, "a malformed number");
    }
    int64_t iv = 0;
    int digits = 0;
    if (*p == '0') {
        p++;
        digits = 1;
    } else {
        while (p < d->end && isdigit((unsigned char)*p)) {
            if (digits < 18)
                iv = iv * 10 + (*p - '0');
            digits++;
            p++;
        }
    }
    int simple = 1;
    if (p < d->end && *p == '.') {
        simple = 0;
        p++;
        if (p >= d->end || !isdigit((unsigned char)*p)) {
            d->p = p;
            return dfail(d, "a malformed number (a digit must follow '.')");
        }
        while (p < d->end && isdigit((unsigned char)*p))
            p++;
    }
    if (p < d->end && (*p == 'e' || *p == 'E')) {
        simple = 0;
        p++;
        if (p < d->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= d->end || !isdigit((unsigned char)*p)) {
            d->p = p;
            return dfail(d, "a malformed number (a digit must follow the exponent)");
        }
        while (p < d->end && isdigit((unsigned char)*p))
            p++;
    }
    d->p = p;
    if (simple && digits <= 15) {
        lua_pushnumber(d->c.L, (lua_Number)(neg ? -iv : iv));
        return 0;
    }
    char tmp[64];
    size_t n = (size_t)(p - start);
    char *copy = n < sizeof tmp ? tmp : malloc(n + 1);
    if (copy == NULL)
        return fail(&d->c, "out of memory");
    memcpy(copy, start, n);
    copy[n] = 0;
    double v = strtod(copy, NULL);
    if (copy != tmp)
        free(copy);
    lua_pushnumber(d->c.L, v);
    return 0;
}

static int decode_value(jdec *d);

static int enter(jdec *d)
{
    if (d->c.depth >= d->c.max_depth)
        return dfail(d, d->c.max_depth == 1 ? "nesting (the limit is 1 level)" : "nesting too deep");
    if (!lua_checkstack(d->c.L, 6))
        return fail(&d->c, "out of Lua stack");
    d->c.depth++;
    return 0;
}

static int decode_array(jdec *d)
{
    lua_State *L = d->c.L;
    if (enter(d))
        return -1;
    d->p++;
    lua_newtable(L);
    lua_pushvalue(L, ARRAY_MT);
    lua_setmetatable(L, -2);
    skip_ws(d);
    if (d->p < d->end && *d->p == ']') {
        d->p++;
        d->c.depth--;
        return 0;
    }
    for (int i = 1;; i++) {
        if (decode_value(d)) {
            trail_index(&d->c, i);
            return -1;
        }
        lua_rawseti(L, -2, i);
        skip_ws(d);
        if (d->p < d->end && *d->p == ',') {
            d->p++;
            continue;
        }
        if (d->p < d->end && *d->p == ']') {
            d->p++;
            d->c.depth--;
            return 0;
        }
        trail_index(&d->c, i + 1);
        return dfail(d, "expected ',' or ']'");
    }
}

static int decode_object(jdec *d)
{
    lua_State *L = d->c.L;
    if (enter(d))
        return -1;
    d->p++;
    lua_newtable(L);
    skip_ws(d);
    if (d->p < d->end && *d->p == '}') {
        d->p++;
        d->c.depth--;
        return 0;
    }
    for (;;) {
        skip_ws(d);
        if (d->p >= d->end || *d->p != '"')
            return dfail(d, "expected a string key");
        if (decode_string(d))
            return -1;
        int kidx = lua_gettop(L);
        skip_ws(d);
        if (d->p >= d->end || *d->p != ':') {
            size_t kl;
            const char *k = lua_tolstring(L, -1, &kl);
            trail_key(&d->c, k, kl);
            return dfail(d, "expected ':' after the key");
        }
        d->p++;
        if (decode_value(d)) {
            size_t kl;
            const char *k = lua_tolstring(L, kidx, &kl);
            trail_key(&d->c, k, kl);
            return -1;
        }
        lua_rawset(L, -3);
        skip_ws(d);
        if (d->p < d->end && *d->p == ',') {
            d->p++;
            continue;
        }
        if (d->p < d->end && *d->p == '}') {
            d->p++;
            d->c.depth--;
            return 0;
        }
        return dfail(d, "expected ',' or '}'");
    }
}

static int literal(jdec *d, const char *word, size_t n)
{
    if ((size_t)(d->end - d->p) < n || memcmp(d->p, word, n) != 0)
        return dfail(d, "expected a value");
    d->p += n;
    return 0;
}

static int decode_value(jdec *d)
{
    lua_State *L = d->c.L;
    skip_ws(d);
    if (d->p >= d->end)
        return dfail(d, "expected a value");
    switch (*d->p) {
    case '{':
        return decode_object(d);
    case '[':
        return decode_array(d);
    case '"':
        return decode_string(d);
    case 't':
        if (literal(d, "true", 4))
            return -1;
        lua_pushboolean(L, 1);
        return 0;
    case 'f':
        if (literal(d, "false", 5))
            return -1;
        lua_pushboolean(L, 0);
        return 0;
    case 'n':
        if (literal(d, "null", 4))
            return -1;
        lua_pushlightuserdata(L, NULL);
        return 0;
    default:
        if (*d->p == '-' || isdigit((unsigned char)*d->p))
            return decode_number(d);
        return dfail(d, "expected a value");
    }
}

static int l_decode(lua_State *L)
{
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    jdec d;
    memset(&d, 0, sizeof d);
    d.c.L = L;
    d.c.b = lua_touserdata(L, BUF_UD);
    d.c.max_depth = check_depth(L, 2);
    d.s = d.p = s;
    d.end = s + n;
    lua_settop(L, 2);
    int r = decode_value(&d);
    if (r == 0) {
        skip_ws(&d);
        if (d.p < d.end) {
            r = dfail(&d, "more data after the value");
        }
    }
    buf_reset(d.c.b);
    if (r) {
        lua_settop(L, 2);
        lua_pushnil(L);
        lua_pushstring(L, d.c.msg);
        push_path(L, &d.c);
        return 3;
    }
    return 1;
}

/* array(t) -> t, marked as an array; false, message when t has another metatable */
static int l_array(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    if (lua_getmetatable(L, 1)) {
        if (!lua_rawequal(L, -1, ARRAY_MT)) {
            lua_pushboolean(L, 0);
            lua_pushliteral(L, "the table already has a metatable");
            return 2;
        }
        lua_pop(L, 1);
    } else {
        lua_pushvalue(L, ARRAY_MT);
        lua_setmetatable(L, 1);
    }
    lua_settop(L, 1);
    return 1;
}

/* is_array(t) -> true when t carries the array marker */
static int l_is_array(lua_State *L)
{
    int r = 0;
    if (lua_type(L, 1) == LUA_TTABLE && lua_getmetatable(L, 1))
        r = lua_rawequal(L, -1, ARRAY_MT);
    lua_pushboolean(L, r);
    return 1;
}

void kh__lua_open_json(lua_State *L)
{
    lua_newtable(L); /* the array marker */
    lua_pushliteral(L, "array");
    lua_setfield(L, -2, "__name");
    jbuf *b = lua_newuserdata(L, sizeof *b);
    memset(b, 0, sizeof *b);
    lua_newtable(L);
    lua_pushcfunction(L, buf_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    static const luaL_Reg fns[] = {
        {"json_encode", l_encode}, {"json_decode", l_decode}, {"json_array", l_array},
        {"json_is_array", l_is_array}, {NULL, NULL},
    };
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushvalue(L, -2);
        lua_pushvalue(L, -2);
        lua_pushcclosure(L, f->func, 2);
        lua_setfield(L, -4, f->name);
    }
    lua_pop(L, 2);
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "json_null");
}
