/* kh_lua_http.c: the C half of k.http (lua/khamsin/http.lua is the other): Lua handles on the
 * HTTP client codecs of core (kh_h1_client, kh_h2_client, kh_http_decode) and on its shared
 * HTTP/2 connections (kh_out_h2). HTTP/1.1 bytes move over k.socket (kh_out) in http.lua, so
 * its connects, TLS, pooling, timeouts and aborts are the socket's; an HTTP/2 connection is
 * connected by k.socket too, then handed (http_h2_attach) to a kh_out_h2, which does its I/O
 * for every stream on it while each request's coroutine waits on its own stream.
 * Owns:  userdata "khamsin.http.h1" (a kh_h1c reader and the bytes it has not consumed),
 *        "khamsin.http.h2" (a kh_out_h2 connection), "khamsin.http.dec" (a kh_hd decoder); each
 *        freed by __gc (an h2 connection is on the stack of every coroutine waiting on it, so
 *        it is never collected under a waiter).
 * In:    calls from http.lua on the worker's thread; kh_out_h2 wakes (a stream's event or
 *        timeout) and the abort of a coroutine waiting on a stream (KH_WAIT_H2).
 * Out:   Lua values (an h1 head as separate results of http_h1_feed, an h2 head's fields as a
 *        table, body bytes as strings); errors as nil, reason; http_h2_wait yields like
 *        k.socket's raw functions (true, ... | "aborted", why | "misuse", message).
 *        Every function has two upvalues: 1 the h1 reader's metatable (check_h1 compares
 *        pointers), 2 the worker's kh_lua (K_UPVALUE: http_h2_new, http_h2_wait).
 * Never: blocks, or knows the wire format itself (every byte is parsed by core). */
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "kh_h1_client.h"
#include "kh_h2_client.h"
#include "kh_http_decode.h"
#include "kh_lua_http.h"
#include "kh_lua_internal.h"
#include "kh_out.h"
#include "kh_out_h2.h"

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

/* ---- HTTP/2: a shared connection (core/kh_out_h2.h) ---- */

typedef struct lh2 {
    kh_out_h2 *h;
} lh2;

/* upvalue 2 of every k.http C function (upvalue 1 is the h1 reader's metatable) */
#define K_UPVALUE(L) ((kh_lua *)lua_touserdata((L), lua_upvalueindex(2)))

static kh_out_h2 *check_h2(lua_State *L)
{
    lh2 *h = luaL_checkudata(L, 1, H2_MT);
    if (h->h == NULL)
        luaL_error(L, "http2 connection used after close");
    return h->h;
}

/* An error message for stream id: the session's reason, or for a stream cut by the connection
 * the connection's own ("connection reset by peer", "timeout", the connect error...). */
static void push_stream_err(lua_State *L, kh_out_h2 *h, int err)
{
    const char *why = kh_out_h2_error(h);
    if (err == KH_H2C_ECLOSED && why[0] && strcmp(why, "closed") != 0)
        lua_pushstring(L, why);
    else
        lua_pushstring(L, kh_h2c_error_reason(err));
}

/* http_h2_new(stream_window, conn_window, header_bytes, header_fields, body_bytes,
 *             io_timeout_ms, idle_ms) -> connection (unattached: requests queue in it) */
static int l_h2_new(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_h2c_limits lim = {(uint32_t)luaL_checknumber(L, 1), (uint32_t)luaL_checknumber(L, 2),
                         (size_t)luaL_checknumber(L, 3), (size_t)luaL_checknumber(L, 4),
                         (uint64_t)luaL_checknumber(L, 5)};
    uint64_t io = (uint64_t)luaL_checknumber(L, 6), idle = (uint64_t)luaL_checknumber(L, 7);
    lh2 *h = lua_newuserdata(L, sizeof(*h));
    h->h = kh_out_h2_new(K->w, &lim, io, idle);
    luaL_getmetatable(L, H2_MT);
    lua_setmetatable(L, -2);
    return 1;
}

/* http_h2_attach(conn, sock) -> true | nil, reason: the socket's connection becomes conn's */
static int l_h2_attach(lua_State *L)
{
    kh_out_h2 *h = check_h2(L);
    kh_out *o = kh__lua_socket_detach(L, 2);
    if (o == NULL) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    kh_out_h2_attach(h, o);
    lua_pushboolean(L, 1);
    return 1;
}

/* http_h2_fail(conn, why): the connect failed; every stream queued on conn fails with why */
static int l_h2_fail(lua_State *L)
{
    kh_out_h2_fail(check_h2(L), luaL_checkstring(L, 2));
    return 0;
}

/* http_h2_submit(conn, method, scheme, authority, path, fields, body) -> id | nil, reason
 * body: a string, nil (none), or false (streamed through http_h2_write; arg 8: its
 * Content-Length or nil) */
static int l_h2_submit(lua_State *L)
{
    kh_out_h2 *h = check_h2(L);
    kh_str m = arg_str(L, 2), sc = arg_str(L, 3), au = arg_str(L, 4), pa = arg_str(L, 5);
    luaL_checktype(L, 6, LUA_TTABLE);
    size_t n;
    kh_h1_field small_f[FIELDS_SMALL];
    kh_h1_field *f = fields_from(L, 6, &n, small_f);
    int32_t id;
    if (lua_type(L, 7) == LUA_TBOOLEAN) {
        int64_t cl = lua_isnoneornil(L, 8) ? -1 : (int64_t)luaL_checknumber(L, 8);
        id = kh_h2c_submit_streamed(kh_out_h2_session(h), m, sc, au, pa, f, n, cl);
    } else {
        size_t bl = 0;
        const char *body = lua_isnoneornil(L, 7) ? NULL : luaL_checklstring(L, 7, &bl);
        id = kh_h2c_submit(kh_out_h2_session(h), m, sc, au, pa, f, n, body, bl);
    }
    fields_free(f, small_f);
    if (id < 0) {
        lua_pushnil(L);
        lua_pushstring(L, kh_h2c_error_reason(id));
        return 2;
    }
    kh_out_h2_flush(h);
    lua_pushinteger(L, id);
    return 1;
}

/* http_h2_write(conn, id, bytes, fin) -> unsent | nil, reason: more of a streamed body; unsent
 * is what the flow-control windows hold back so far */
static int l_h2_write(lua_State *L)
{
    kh_out_h2 *h = check_h2(L);
    int32_t id = (int32_t)luaL_checkinteger(L, 2);
    size_t n;
    const char *p = luaL_checklstring(L, 3, &n);
    int rc = kh_h2c_write(kh_out_h2_session(h), id, p, n, lua_toboolean(L, 4));
    if (rc < 0) {
        lua_pushnil(L);
        push_stream_err(L, h, rc == KH_H2C_EPROTO && kh_out_h2_error(h)[0] ? KH_H2C_ECLOSED : rc);
        return 2;
    }
    kh_out_h2_flush(h);
    lua_pushinteger(L, (lua_Integer)kh_h2c_unsent(kh_out_h2_session(h), id));
    return 1;
}

static void h2_wake(kh_out_h2 *h, int32_t id, int status, void *arg)
{
    (void)h;
    (void)id;
    kh_lua_co *c = arg;
    c->wait = KH_WAIT_NONE;
    c->h2 = NULL;
    lua_State *co = c->co;
    lua_pushboolean(co, 1);
    if (status == 0) {
        lua_pushboolean(co, 1);
        kh__lua_wake(c->K, c, 2);
        return;
    }
    lua_pushnil(co);
    lua_pushliteral(co, "timeout");
    kh__lua_wake(c->K, c, 3);
}

/* http_h2_wait(conn, id, what, low, timeout_s|nil) -> true, true | true, nil, "timeout" |
 * "aborted", why | "misuse", message (yields unless it is so already) */
static int l_h2_wait(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_out_h2 *h = check_h2(L);
    int32_t id = (int32_t)luaL_checkinteger(L, 2);
    int what = (int)luaL_checkinteger(L, 3);
    size_t low = (size_t)luaL_checknumber(L, 4);
    uint64_t tmo = KH_OUT_NO_TIMEOUT;
    if (!lua_isnoneornil(L, 5)) {
        double t = luaL_checknumber(L, 5);
        tmo = t <= 0 ? 0 : (uint64_t)(t * 1000 + 0.5);
    }
    kh_lua_co *c = K->current;
    if (c == NULL || c->wait != KH_WAIT_NONE) {
        lua_pushliteral(L, "misuse");
        lua_pushliteral(L, "k.http: waits only in a handler, a timer or a callback");
        return 2;
    }
    if (c->aborted) {
        kh_out_h2_forget(h, id);
        lua_pushliteral(L, "aborted");
        lua_pushliteral(L, "closed");
        return 2;
    }
    if (kh_out_h2_wait(h, id, what, low, tmo, h2_wake, c) == 1) {
        lua_pushboolean(L, 1);
        lua_pushboolean(L, 1);
        return 2;
    }
    c->h2 = h;
    c->h2_id = id;
    c->wait = KH_WAIT_H2;
    lua_pushlightuserdata(L, KH_YIELD);
    return lua_yield(L, 1);
}

/* The waiting coroutine's request is over: its stream alone is reset (CANCEL); the connection
 * and every other stream on it go on. */
void kh__lua_http_abort(kh_lua *K, kh_lua_co *c)
{
    (void)K;
    kh_out_h2 *h = c->h2;
    c->h2 = NULL;
    if (h)
        kh_out_h2_forget_later(h, c->h2_id);
}

/* http_h2_info(conn, id, want_fields) -> status (0: no final head yet), done, err|nil,
 * fields|nil, buffered */
static int l_h2_info(lua_State *L)
{
    kh_out_h2 *h = check_h2(L);
    kh_h2c *s = kh_out_h2_session(h);
    int32_t id = (int32_t)luaL_checkinteger(L, 2);
    kh_h2c_info i;
    kh_h2c_info_get(s, id, &i);
    lua_pushinteger(L, i.status);
    lua_pushboolean(L, i.done);
    if (i.err)
        push_stream_err(L, h, i.err);
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

/* http_h2_take(conn, id) -> body bytes buffered so far (the window opens again: the
 * WINDOW_UPDATE goes out now) */
static int l_h2_take(lua_State *L)
{
    kh_out_h2 *h = check_h2(L);
    const char *p;
    size_t n = kh_h2c_take(kh_out_h2_session(h), (int32_t)luaL_checkinteger(L, 2), &p);
    lua_pushlstring(L, n ? p : "", n);
    if (n)
        kh_out_h2_flush(h);
    return 1;
}

static int l_h2_forget(lua_State *L)
{
    kh_out_h2_forget(check_h2(L), (int32_t)luaL_checkinteger(L, 2));
    return 0;
}

/* http_h2_forget_later(conn, id): the same from a finalizer (a response dropped unread): no
 * callback runs now, the RST_STREAM goes out from the loop; nothing if conn is already closed */
static int l_h2_forget_later(lua_State *L)
{
    lh2 *h = luaL_checkudata(L, 1, H2_MT);
    if (h->h)
        kh_out_h2_forget_later(h->h, (int32_t)luaL_checkinteger(L, 2));
    return 0;
}

/* http_h2_state(conn) -> can_submit, streams, dead, attached */
static int l_h2_state(lua_State *L)
{
    kh_out_h2 *h = check_h2(L);
    lua_pushboolean(L, kh_out_h2_can_submit(h));
    lua_pushinteger(L, (lua_Integer)kh_h2c_streams(kh_out_h2_session(h)));
    lua_pushboolean(L, kh_out_h2_dead(h));
    lua_pushboolean(L, kh_out_h2_attached(h));
    return 4;
}

/* __gc: closes the connection (no coroutine waits on it: each holds it on its stack) */
static int l_h2_gc(lua_State *L)
{
    lh2 *h = luaL_checkudata(L, 1, H2_MT);
    kh_out_h2_free(h->h);
    h->h = NULL;
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
    LIM(socket_send_timeout_ms);
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
        {"http_h2_attach", l_h2_attach},
        {"http_h2_fail", l_h2_fail},
        {"http_h2_submit", l_h2_submit},
        {"http_h2_write", l_h2_write},
        {"http_h2_wait", l_h2_wait},
        {"http_h2_info", l_h2_info},
        {"http_h2_take", l_h2_take},
        {"http_h2_forget", l_h2_forget},
        {"http_h2_forget_later", l_h2_forget_later},
        {"http_h2_state", l_h2_state},
        {NULL, NULL},
    };
    luaL_getmetatable(L, H1_MT);
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushvalue(L, -1);       /* upvalue 1: the h1 reader's metatable (check_h1) */
        lua_pushlightuserdata(L, K); /* upvalue 2: the worker's kh_lua (K_UPVALUE) */
        lua_pushcclosure(L, f->func, 2);
        lua_setfield(L, -3, f->name);
    }
    lua_pop(L, 1);
}
