/* kh_lua_copy.c: see kh_lua_copy.h. Format: one tag byte per value; 'n' nil, 't' / 'f'
 * booleans, 'd' a double (8 bytes), 's' a string (u32 length + bytes), 'T' a table (u32 pair
 * count, then key, value, ...). A value count (u32) leads. Tables nest at most 64 deep. */
#include "kh_lua_copy.h"

#include <lauxlib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct enc {
    lua_State *L;
    kh_copybuf *b;
    int seen; /* stack index of the table of tables being encoded (cycle check) */
    char *err;
    size_t errlen;
    char path[256];
} enc;

static int put(enc *e, const void *p, size_t n)
{
    kh_copybuf *b = e->b;
    if (b->len + n > b->max) {
        snprintf(e->err, e->errlen,
                 "%s: too large to copy (more than %zu bytes; see the "
                 "pool_msg_bytes limit)",
                 e->path, b->max);
        return -1;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            snprintf(e->err, e->errlen, "%s: out of memory", e->path);
            return -1;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static int put_u32(enc *e, uint32_t v)
{
    return put(e, &v, 4);
}

static int encode_value(enc *e, int idx, int depth);

static void path_push(enc *e, int key_idx, size_t *saved)
{
    lua_State *L = e->L;
    *saved = strlen(e->path);
    size_t room = sizeof e->path - *saved;
    if (lua_type(L, key_idx) == LUA_TSTRING)
        snprintf(e->path + *saved, room, ".%s", lua_tostring(L, key_idx));
    else if (lua_type(L, key_idx) == LUA_TNUMBER)
        snprintf(e->path + *saved, room, "[%g]", lua_tonumber(L, key_idx));
    else
        snprintf(e->path + *saved, room, "[%s]", lua_typename(L, lua_type(L, key_idx)));
}

static int encode_table(enc *e, int idx, int depth)
{
    lua_State *L = e->L;
    if (depth >= MAX_DEPTH) {
        snprintf(e->err, e->errlen, "%s: tables nested more than %d deep", e->path, MAX_DEPTH);
        return -1;
    }
    if (!lua_checkstack(L, 6)) {
        snprintf(e->err, e->errlen, "%s: Lua stack exhausted", e->path);
        return -1;
    }
    lua_pushvalue(L, idx);
    lua_rawget(L, e->seen);
    int cycle = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (cycle) {
        snprintf(e->err, e->errlen, "%s: cannot copy a table that contains itself (a cycle)",
                 e->path);
        return -1;
    }
    lua_pushvalue(L, idx);
    lua_pushboolean(L, 1);
    lua_rawset(L, e->seen);
    if (put(e, "T", 1) != 0)
        return -1;
    size_t count_at = e->b->len;
    if (put_u32(e, 0) != 0)
        return -1;
    uint32_t count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        int k = lua_gettop(L) - 1, v = lua_gettop(L);
        size_t saved;
        path_push(e, k, &saved);
        if (encode_value(e, k, depth + 1) != 0 || encode_value(e, v, depth + 1) != 0) {
            lua_pop(L, 2);
            return -1;
        }
        e->path[saved] = '\0';
        count++;
        lua_pop(L, 1);
    }
    memcpy(e->b->p + count_at, &count, 4);
    lua_pushvalue(L, idx);
    lua_pushnil(L);
    lua_rawset(L, e->seen);
    return 0;
}

static int encode_value(enc *e, int idx, int depth)
{
    lua_State *L = e->L;
    switch (lua_type(L, idx)) {
    case LUA_TNIL:
        return put(e, "n", 1);
    case LUA_TBOOLEAN:
        return put(e, lua_toboolean(L, idx) ? "t" : "f", 1);
    case LUA_TNUMBER: {
        double d = lua_tonumber(L, idx);
        if (put(e, "d", 1) != 0)
            return -1;
        return put(e, &d, 8);
    }
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        if (n > UINT32_MAX) {
            snprintf(e->err, e->errlen, "%s: string too long", e->path);
            return -1;
        }
        if (put(e, "s", 1) != 0 || put_u32(e, (uint32_t)n) != 0)
            return -1;
        return put(e, s, n);
    }
    case LUA_TTABLE:
        return encode_table(e, idx < 0 ? lua_gettop(L) + idx + 1 : idx, depth);
    default:
        snprintf(e->err, e->errlen,
                 "%s: cannot copy a %s (only nil, booleans, numbers, strings and tables of them)",
                 e->path, lua_typename(L, lua_type(L, idx)));
        return -1;
    }
}

int kh_lua_copy_encode(lua_State *L, int first, int last, int number, kh_copybuf *b,
                       const char *what, char *err, size_t errlen)
{
    enc e = {L, b, 0, err, errlen, {0}};
    if (!lua_checkstack(L, 4)) {
        snprintf(err, errlen, "Lua stack exhausted");
        return -1;
    }
    uint32_t n = last >= first ? (uint32_t)(last - first + 1) : 0;
    if (put_u32(&e, n) != 0)
        return -1;
    lua_newtable(L);
    e.seen = lua_gettop(L);
    int r = 0;
    for (int i = first; i <= last && r == 0; i++) {
        snprintf(e.path, sizeof e.path, "%s %d", what, number + (i - first));
        r = encode_value(&e, i, 0);
    }
    lua_settop(L, e.seen - 1);
    return r;
}

typedef struct dec {
    lua_State *L;
    const char *p, *end;
} dec;

static int get(dec *d, void *out, size_t n)
{
    if ((size_t)(d->end - d->p) < n)
        return -1;
    memcpy(out, d->p, n);
    d->p += n;
    return 0;
}

static int decode_value(dec *d, int depth)
{
    lua_State *L = d->L;
    char tag;
    if (depth > MAX_DEPTH || !lua_checkstack(L, 4) || get(d, &tag, 1) != 0)
        return -1;
    switch (tag) {
    case 'n':
        lua_pushnil(L);
        return 0;
    case 't':
    case 'f':
        lua_pushboolean(L, tag == 't');
        return 0;
    case 'd': {
        double v;
        if (get(d, &v, 8) != 0)
            return -1;
        lua_pushnumber(L, v);
        return 0;
    }
    case 's': {
        uint32_t n;
        if (get(d, &n, 4) != 0 || (size_t)(d->end - d->p) < n)
            return -1;
        lua_pushlstring(L, d->p, n);
        d->p += n;
        return 0;
    }
    case 'T': {
        uint32_t n;
        if (get(d, &n, 4) != 0)
            return -1;
        lua_createtable(L, 0, n < 1024 ? (int)n : 1024);
        for (uint32_t i = 0; i < n; i++) {
            if (decode_value(d, depth + 1) != 0 || decode_value(d, depth + 1) != 0)
                return -1;
            if (lua_isnil(L, -2)) {
                lua_pop(L, 2);
                continue;
            }
            lua_rawset(L, -3);
        }
        return 0;
    }
    default:
        return -1;
    }
}

int kh_lua_copy_decode(lua_State *L, const char *p, size_t n)
{
    dec d = {L, p, p + n};
    int base = lua_gettop(L);
    uint32_t count;
    if (get(&d, &count, 4) != 0 || !lua_checkstack(L, (int)(count < 8000 ? count + 8 : 8008)))
        return -1;
    for (uint32_t i = 0; i < count; i++) {
        if (decode_value(&d, 0) != 0) {
            lua_settop(L, base);
            return -1;
        }
    }
    return (int)count;
}
