/* kh_lua_http.c: the C half of k.http (lua/khamsin/http.lua is the other): Lua handles on the
 * sans-io HTTP client codecs of core (kh_h1_client, kh_h2_client, kh_http_decode). No I/O here:
 * http.lua moves the bytes over k.socket (kh_out), so connects, TLS, pooling, timeouts and the
 * abort of a waiting request are the socket's.
 * Owns:  userdata "khamsin.http.h1" (a kh_h1c reader and the bytes it has not consumed),
 *        "khamsin.http.h2" (a kh_h2c session), "khamsin.http.dec" (a kh_hd decoder); each freed
 *        by __gc.
 * In:    calls from http.lua on the worker's thread.
 * Out:   Lua values (heads as tables, body bytes as strings); errors as nil, reason.
 * Never: yields, blocks, or knows the wire format itself (every byte is parsed by core). */
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "kh_h1_client.h"
#include "kh_h2_client.h"
#include "kh_http_decode.h"
#include "kh_lua_http.h"
#include "kh_lua_internal.h"

#define H1_MT "khamsin.http.h1"
#define H2_MT "khamsin.http.h2"
#define DEC_MT "khamsin.http.dec"

/* ---- fields from Lua: a flat array {name1, value1, name2, value2, ...} ---- */

/* Uses `small` when the fields fit (the usual case: no malloc per request); else an array the
 * caller frees (when the result is not `small`). */
#define FIELDS_SMALL 32
static kh_h1_field *fields_from(lua_State *L, int idx, size_t *n, kh_h1_field *small)
{
    size_t len = lua_objlen(L, idx);
    *n = len / 2;
    kh_h1_field *f = *n <= FIELDS_SMALL ? small : kh_xmalloc(*n * sizeof(*f));
    for (size_t i = 0; i < *n; i++) {
        lua_rawgeti(L, idx, (int)(2 * i + 1));
        lua_rawgeti(L, idx, (int)(2 * i + 2));
        f[i].name.ptr = lua_tolstring(L, -2, &f[i].name.len);
        f[i].value.ptr = lua_tolstring(L, -1, &f[i].value.len);
        lua_pop(L, 2); /* the strings stay alive: the table holds them */
        if (f[i].name.ptr == NULL || f[i].value.ptr == NULL) {
            f[i].name = KH_STR_LIT("");
            f[i].value = KH_STR_LIT("");
        }
    }
    return f;
}

static void fields_free(kh_h1_field *f, kh_h1_field *small)
{
    if (f != small)
        free(f);
}

static kh_str arg_str(lua_State *L, int idx)
{
    kh_str s;
    s.ptr = luaL_checklstring(L, idx, &s.len);
    return s;
}

/* http_h1_request(method, target, host, fields, body_len) -> bytes | nil, reason */
static int l_h1_request(lua_State *L)
{
    kh_str method = arg_str(L, 1), target = arg_str(L, 2), host = arg_str(L, 3);
    luaL_checktype(L, 4, LUA_TTABLE);
    int64_t body_len = (int64_t)luaL_optnumber(L, 5, -1);
    size_t n;
    kh_h1_field small_f[FIELDS_SMALL];
    kh_h1_field *f = fields_from(L, 4, &n, small_f);
    const char *bad;
    char small[2048];
    ssize_t need = kh_h1c_write_request(small, sizeof(small), method, target, host, f, n,
                                        body_len, &bad);
    if (need == KH_H1C_EREQ) {
        fields_free(f, small_f);
        lua_pushnil(L);
        lua_pushfstring(L, "invalid request: bad %s", bad);
        return 2;
    }
    if ((size_t)need <= sizeof(small)) {
        lua_pushlstring(L, small, (size_t)need);
    } else {
        char *big = kh_xmalloc((size_t)need);
        kh_h1c_write_request(big, (size_t)need, method, target, host, f, n, body_len, &bad);
        lua_pushlstring(L, big, (size_t)need);
        free(big);
    }
    fields_free(f, small_f);
    return 1;
}

/* ---- HTTP/1.1 response reader ---- */

typedef struct lh1 {
    kh_h1c r;
    kh_h1_field *fields;
    char *buf;
    size_t len, cap;
    int failed;
} lh1;

/* The reader at 1; its metatable is upvalue 1 of the h1 functions (a pointer compare rather
 * than luaL_checkudata's registry lookup by name on every call). */
static lh1 *check_h1(lua_State *L)
{
    void *p = lua_touserdata(L, 1);
    if (p != NULL && lua_getmetatable(L, 1)) {
        int same = lua_rawequal(L, -1, lua_upvalueindex(1));
        lua_pop(L, 1);
        if (same)
            return p;
    }
    return luaL_checkudata(L, 1, H1_MT);
}

/* http_h1_reader(head_request, header_bytes, header_fields, body_bytes) -> reader */
static int l_h1_reader(lua_State *L)
{
    int head_req = lua_toboolean(L, 1);
    kh_h1c_limits lim = {(size_t)luaL_checknumber(L, 2), (size_t)luaL_checknumber(L, 3),
                         (uint64_t)luaL_checknumber(L, 4)};
    lh1 *h = lua_newuserdata(L, sizeof(*h));
    memset(h, 0, sizeof(*h));
    h->fields = kh_xmalloc((lim.header_fields ? lim.header_fields : 1) * sizeof(kh_h1_field));
    kh_h1c_init(&h->r, &lim, h->fields, head_req);
    luaL_getmetatable(L, H1_MT);
    lua_setmetatable(L, -2);
    return 1;
}

/* Pushes {name = value} with lower-case names, repeated names joined with ", " (the form
 * k.http's res.headers has) and leaves it on the stack. */
static void push_fields_map(lua_State *L, const kh_h1_field *f, size_t n)
{
    char lname[256];
    lua_createtable(L, 0, (int)n);
    for (size_t i = 0; i < n; i++) {
        size_t len = f[i].name.len;
        const char *name = f[i].name.ptr;
        if (len <= sizeof(lname)) {
            for (size_t k = 0; k < len; k++) {
                char c = name[k];
                lname[k] = (c >= 'A' && c <= 'Z') ? (char)(c | 0x20) : c;
            }
            name = lname;
        }
        lua_pushlstring(L, name, len);
        lua_pushvalue(L, -1);
        lua_rawget(L, -3);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_pushlstring(L, f[i].value.ptr ? f[i].value.ptr : "", f[i].value.len);
        } else {
            lua_pushliteral(L, ", ");
            lua_pushlstring(L, f[i].value.ptr ? f[i].value.ptr : "", f[i].value.len);
            lua_concat(L, 3);
        }
        lua_rawset(L, -3);
    }
}

/* http_h1_feed(reader, data) -> status|nil, body, done, err|nil, reusable, leftover, headers,
 * reason, minor: the head's values (status first; nil until the head came, and after) as
 * separate results rather than a table: one table less per response.
 * Takes every event the bytes so far allow: the head (once), all the body bytes, the end.
 * What it could not consume yet stays in the reader's buffer. */
static int l_h1_feed(lua_State *L)
{
    lh1 *h = check_h1(L);
    size_t dn;
    const char *data = luaL_optlstring(L, 2, "", &dn);
    lua_settop(L, 2);
    luaL_checkstack(L, 24, "http_h1_feed");
    if (h->failed) {
        lua_pushnil(L);
        lua_pushliteral(L, "");
        lua_pushboolean(L, 0);
        lua_pushliteral(L, "reader used after an error");
        return 4;
    }
    /* copied: a chunked body is decoded in place, and a Lua string is not ours to change */
    if (h->len + dn > h->cap) {
        size_t c = h->cap ? h->cap : 4096;
        while (c < h->len + dn)
            c *= 2;
        h->buf = kh_xrealloc(h->buf, c);
        h->cap = c;
    }
    if (dn)
        memcpy(h->buf + h->len, data, dn);
    h->len += dn;
    char *p = h->buf;
    size_t plen = h->len;

    int done = 0, have_head = 0;
    kh_str one = {NULL, 0}; /* the body when it comes in one slice (no luaL_Buffer then) */
    int nslices = 0;
    luaL_Buffer b;
    size_t off = 0;
    const char *err = NULL;
    for (;;) {
        int ev;
        kh_str d;
        ssize_t n = kh_h1c_feed(&h->r, p + off, plen - off, &ev, &d);
        if (n < 0) {
            err = kh_h1c_error_reason((int)n);
            h->failed = 1;
            break;
        }
        if (ev == KH_H1C_HEAD) {
            /* pushed now, at 3 and 4: the fields point into p, which the end may move (a
             * head comes before any body byte, so no luaL_Buffer is open yet) */
            have_head = 1;
            push_fields_map(L, h->r.head.fields, h->r.head.num_fields);
            lua_pushlstring(L, h->r.head.reason.ptr ? h->r.head.reason.ptr : "",
                            h->r.head.reason.len);
        } else if (ev == KH_H1C_DATA && d.len > 0) {
            if (nslices == 0) {
                one = d;
            } else {
                if (nslices == 1) {
                    luaL_buffinit(L, &b);
                    luaL_addlstring(&b, one.ptr, one.len);
                }
                luaL_addlstring(&b, d.ptr, d.len);
            }
            nslices++;
        }
        off += (size_t)n;
        if (ev == KH_H1C_DONE) {
            done = 1;
            break;
        }
        if (ev == KH_H1C_NEED_MORE && n == 0)
            break;
    }
    /* the body first (its slices point into p), then keep what is left */
    if (nslices > 1)
        luaL_pushresult(&b);
    else
        lua_pushlstring(L, one.ptr ? one.ptr : "", one.len);
    int body_idx = lua_gettop(L);
    size_t left = plen - off;
    memmove(h->buf, h->buf + off, left);
    h->len = left;
    if (have_head && !err)
        lua_pushinteger(L, h->r.head.status);
    else
        lua_pushnil(L);
    lua_pushvalue(L, body_idx);
    lua_pushboolean(L, done);
    if (err)
        lua_pushstring(L, err);
    else
        lua_pushnil(L);
    lua_pushboolean(L, done && h->r.reusable);
    lua_pushinteger(L, (lua_Integer)h->len);
    if (!have_head || err)
        return 6;
    lua_pushvalue(L, 3);
    lua_pushvalue(L, 4);
    lua_pushinteger(L, h->r.head.minor_version);
    return 9;
}

/* http_h1_reset(reader, head_request, body_bytes): ready for another response (readers are reused) */
static int l_h1_reset(lua_State *L)
{
    lh1 *h = check_h1(L);
    kh_h1c_limits lim = h->r.lim;
    lim.body_bytes = (uint64_t)luaL_optnumber(L, 3, (lua_Number)lim.body_bytes);
    kh_h1c_init(&h->r, &lim, h->fields, lua_toboolean(L, 2));
    h->len = 0;
    h->failed = 0;
    if (h->cap > 65536) { /* a big response grew it: do not keep that around */
        free(h->buf);
        h->buf = NULL;
        h->cap = 0;
    }
    return 0;
}

/* http_h1_eof(reader) -> true | nil, reason */
static int l_h1_eof(lua_State *L)
{
    lh1 *h = check_h1(L);
    int e = kh_h1c_eof(&h->r);
    if (e == KH_H1C_DONE) {
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushnil(L);
    lua_pushstring(L, kh_h1c_error_reason(e));
    return 2;
}

/* http_h1_started(reader) -> boolean: a byte of the response arrived */
static int l_h1_started(lua_State *L)
{
    lua_pushboolean(L, kh_h1c_started(&check_h1(L)->r));
    return 1;
}

static int l_h1_gc(lua_State *L)
{
    lh1 *h = luaL_checkudata(L, 1, H1_MT);
    free(h->buf);
    free(h->fields);
    h->buf = NULL;
    h->fields = NULL;
    return 0;
}

/* ---- Content-Encoding decoder ---- */

typedef struct ldec {
    kh_hd *d;
} ldec;

/* http_decoder(content_encoding, max_bytes) -> decoder | false (identity) | nil (unknown) */
static int l_decoder(lua_State *L)
{
    size_t n;
    const char *v = luaL_checklstring(L, 1, &n);
    uint64_t max = (uint64_t)luaL_checknumber(L, 2);
    int kind = kh_hd_kind_of(v, n);
    if (kind < 0) {
        lua_pushnil(L);
        return 1;
    }
    if (kind == KH_HD_NONE) {
        lua_pushboolean(L, 0);
        return 1;
    }
    ldec *d = lua_newuserdata(L, sizeof(*d));
    d->d = kh_hd_new(kind, max);
    luaL_getmetatable(L, DEC_MT);
    lua_setmetatable(L, -2);
    return 1;
}

static void dec_out(void *arg, const char *p, size_t n)
{
    luaL_addlstring((luaL_Buffer *)arg, p, n);
}

/* http_decode(decoder, data) -> decoded | nil, reason */
static int l_decode(lua_State *L)
{
    ldec *d = luaL_checkudata(L, 1, DEC_MT);
    size_t n;
    const char *in = luaL_checklstring(L, 2, &n);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    int e = kh_hd_feed(d->d, in, n, dec_out, &b);
    luaL_pushresult(&b);
    if (e) {
        lua_pushnil(L);
        lua_pushstring(L, kh_hd_error_reason(e));
        return 2;
    }
    return 1;
}

/* http_decode_finish(decoder) -> true | nil, reason */
static int l_decode_finish(lua_State *L)
{
    ldec *d = luaL_checkudata(L, 1, DEC_MT);
    int e = kh_hd_finish(d->d);
    if (e) {
        lua_pushnil(L);
        lua_pushstring(L, kh_hd_error_reason(e));
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static int l_dec_gc(lua_State *L)
{
    ldec *d = luaL_checkudata(L, 1, DEC_MT);
    kh_hd_free(d->d);
    d->d = NULL;
    return 0;
}

/* ---- HTTP/2 session ---- */

typedef struct lh2 {
    kh_h2c *s;
} lh2;

static kh_h2c *check_h2(lua_State *L)
{
    lh2 *h = luaL_checkudata(L, 1, H2_MT);
    if (h->s == NULL)
        luaL_error(L, "http2 session used after close");
    return h->s;
}

/* http_h2_new(stream_window, conn_window, header_bytes, header_fields, body_bytes) -> session */
static int l_h2_new(lua_State *L)
{
    kh_h2c_limits lim = {(uint32_t)luaL_checknumber(L, 1), (uint32_t)luaL_checknumber(L, 2),
                         (size_t)luaL_checknumber(L, 3), (size_t)luaL_checknumber(L, 4),
                         (uint64_t)luaL_checknumber(L, 5)};
    lh2 *h = lua_newuserdata(L, sizeof(*h));
    h->s = kh_h2c_new(&lim);
    luaL_getmetatable(L, H2_MT);
    lua_setmetatable(L, -2);
    return 1;
}

/* http_h2_submit(s, method, scheme, authority, path, fields, body|nil) -> id | nil, reason */
static int l_h2_submit(lua_State *L)
{
    kh_h2c *s = check_h2(L);
    kh_str m = arg_str(L, 2), sc = arg_str(L, 3), au = arg_str(L, 4), pa = arg_str(L, 5);
    luaL_checktype(L, 6, LUA_TTABLE);
    size_t bl = 0;
    const char *body = lua_isnoneornil(L, 7) ? NULL : luaL_checklstring(L, 7, &bl);
    size_t n;
    kh_h1_field small_f[FIELDS_SMALL];
    kh_h1_field *f = fields_from(L, 6, &n, small_f);
    int32_t id = kh_h2c_submit(s, m, sc, au, pa, f, n, body, bl);
    fields_free(f, small_f);
    if (id < 0) {
        lua_pushnil(L);
        lua_pushstring(L, kh_h2c_error_reason(id));
        return 2;
    }
    lua_pushinteger(L, id);
    return 1;
}

/* http_h2_recv(s, data) -> true | nil, reason */
static int l_h2_recv(lua_State *L)
{
    kh_h2c *s = check_h2(L);
    size_t n;
    const char *p = luaL_checklstring(L, 2, &n);
    int e = kh_h2c_recv(s, (const uint8_t *)p, n);
    if (e) {
        lua_pushnil(L);
        lua_pushstring(L, kh_h2c_error_reason(e));
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* http_h2_send(s) -> bytes to write ("" when none) */
static int l_h2_send(lua_State *L)
{
    kh_h2c *s = check_h2(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    const uint8_t *p;
    ssize_t n;
    while ((n = kh_h2c_send(s, &p)) > 0)
        luaL_addlstring(&b, (const char *)p, (size_t)n);
    luaL_pushresult(&b);
    return 1;
}

/* http_h2_eof(s): the connection closed */
static int l_h2_eof(lua_State *L)
{
    kh_h2c_eof(check_h2(L));
    return 0;
}

/* http_h2_info(s, id) -> status (0: no final head yet), done, err|nil, fields|nil, buffered */
static int l_h2_info(lua_State *L)
{
    kh_h2c *s = check_h2(L);
    int32_t id = (int32_t)luaL_checkinteger(L, 2);
    kh_h2c_info i;
    kh_h2c_info_get(s, id, &i);
    lua_pushinteger(L, i.status);
    lua_pushboolean(L, i.done);
    if (i.err)
        lua_pushstring(L, kh_h2c_error_reason(i.err));
    else if (!i.known)
        lua_pushliteral(L, "unknown stream");
    else
        lua_pushnil(L);
    if (i.status && lua_toboolean(L, 3)) {
        lua_createtable(L, (int)i.num_fields * 2, 0);
        for (size_t k = 0; k < i.num_fields; k++) {
            kh_str nm, v;
            if (!kh_h2c_field(s, id, k, &nm, &v))
                break;
            lua_pushlstring(L, nm.ptr, nm.len);
            lua_rawseti(L, -2, (int)(2 * k + 1));
            lua_pushlstring(L, v.ptr ? v.ptr : "", v.len);
            lua_rawseti(L, -2, (int)(2 * k + 2));
        }
    } else {
        lua_pushnil(L);
    }
    lua_pushinteger(L, (lua_Integer)i.body_len);
    return 5;
}

/* http_h2_take(s, id) -> body bytes buffered so far (the window opens again) */
static int l_h2_take(lua_State *L)
{
    kh_h2c *s = check_h2(L);
    const char *p;
    size_t n = kh_h2c_take(s, (int32_t)luaL_checkinteger(L, 2), &p);
    lua_pushlstring(L, n ? p : "", n);
    return 1;
}

static int l_h2_forget(lua_State *L)
{
    kh_h2c_forget(check_h2(L), (int32_t)luaL_checkinteger(L, 2));
    return 0;
}

/* http_h2_state(s) -> can_submit, streams, dead */
static int l_h2_state(lua_State *L)
{
    kh_h2c *s = check_h2(L);
    lua_pushboolean(L, kh_h2c_can_submit(s));
    lua_pushinteger(L, (lua_Integer)kh_h2c_streams(s));
    lua_pushboolean(L, kh_h2c_dead(s));
    return 3;
}

static int l_h2_gc(lua_State *L)
{
    lh2 *h = luaL_checkudata(L, 1, H2_MT);
    kh_h2c_free(h->s);
    h->s = NULL;
    return 0;
}

void kh__lua_open_http(lua_State *L, struct kh_lua *K)
{
    /* the worker's limits are fixed once it runs: k.http's defaults, read once */
    const kh_limits *l = K->w->limits;
    lua_createtable(L, 0, 8);
#define LIM(name)                                                                                  \
    lua_pushnumber(L, (lua_Number)l->name);                                                        \
    lua_setfield(L, -2, #name)
    LIM(http_client_header_bytes);
    LIM(http_client_header_fields);
    LIM(http_client_body_bytes);
    LIM(http_client_timeout_ms);
    LIM(http_client_redirects);
    LIM(socket_keepalive_ms);
    LIM(socket_pool_size);
    LIM(h2_stream_window);
    LIM(h2_conn_window);
#undef LIM
    lua_setfield(L, -2, "http_limits");
    static const struct {
        const char *mt;
        lua_CFunction gc;
    } mts[] = {{H1_MT, l_h1_gc}, {H2_MT, l_h2_gc}, {DEC_MT, l_dec_gc}};
    for (size_t i = 0; i < sizeof(mts) / sizeof(mts[0]); i++) {
        luaL_newmetatable(L, mts[i].mt);
        lua_pushcfunction(L, mts[i].gc);
        lua_setfield(L, -2, "__gc");
        lua_pushliteral(L, "khamsin");
        lua_setfield(L, -2, "__metatable");
        lua_pop(L, 1);
    }
    static const luaL_Reg fns[] = {
        {"http_h1_request", l_h1_request},
        {"http_h1_reader", l_h1_reader},
        {"http_h1_feed", l_h1_feed},
        {"http_h1_eof", l_h1_eof},
        {"http_h1_reset", l_h1_reset},
        {"http_h1_started", l_h1_started},
        {"http_decoder", l_decoder},
        {"http_decode", l_decode},
        {"http_decode_finish", l_decode_finish},
        {"http_h2_new", l_h2_new},
        {"http_h2_submit", l_h2_submit},
        {"http_h2_recv", l_h2_recv},
        {"http_h2_send", l_h2_send},
        {"http_h2_eof", l_h2_eof},
        {"http_h2_info", l_h2_info},
        {"http_h2_take", l_h2_take},
        {"http_h2_forget", l_h2_forget},
        {"http_h2_state", l_h2_state},
        {NULL, NULL},
    };
    luaL_getmetatable(L, H1_MT);
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushvalue(L, -1); /* upvalue 1: the h1 reader's metatable (check_h1) */
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -3, f->name);
    }
    lua_pop(L, 1);
}
