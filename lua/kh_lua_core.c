/* kh_lua_core.c: the `khamsin.core` C functions the Lua modules are built on.
 * Owns:  nothing; every function checks its {stream, generation} pair first.
 * In:    calls from lua/khamsin*.lua on the worker's thread.
 * Out:   routes into the router; responses through kh_stream; waits that yield KH_YIELD.
 *        Two FFI exports for the hot path (style.md §4), which the JIT compiles into the
 *        request's trace: kh_lua_respond_fast (the runner's reply, with a few string-valued
 *        headers at most) and kh_lua_req_str (req.method, req.path); neither calls into Lua.
 * Never: knows a wire format or a protocol; keeps a pointer to a Lua string past the call. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_err.h"
#include "kh_log.h"
#include "kh_lua_internal.h"
#include "kh_lua_json.h"
#include "kh_lua_http.h"
#include "kh_reqid.h"

#define K_UPVALUE(L) ((kh_lua *)lua_touserdata((L), lua_upvalueindex(1)))

/* The stream named by (lightuserdata, gen) at idx, or NULL when it has ended. */
static kh_stream *stream_at(lua_State *L, int idx)
{
    kh_stream *s = lua_touserdata(L, idx);
    if (s == NULL)
        luaL_argerror(L, idx, "not a request");
    if (s->gen != (uint32_t)lua_tointeger(L, idx + 1))
        return NULL;
    return s;
}

static int l_route(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    size_t mlen, plen;
    const char *method = luaL_checklstring(L, 1, &mlen);
    const char *pattern = luaL_checklstring(L, 2, &plen);
    luaL_checktype(L, 3, LUA_TFUNCTION);
    lua_pushvalue(L, 3);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    const char *err = NULL;
    /* 4th argument true: the handler reads the body incrementally (req:body_reader), so a
     * declared body over body_bytes is dispatched, not answered 413 (KH_ROUTE_BODY_STREAM) */
    intptr_t value = ref;
    if (lua_toboolean(L, 4))
        value |= KH_ROUTE_BODY_STREAM;
    if (kh_router_add(K->router, method, mlen, pattern, plen, value, &err) != 0) {
        luaL_unref(L, LUA_REGISTRYINDEX, ref);
        lua_pushnil(L);
        lua_pushfstring(L, "route %s %s: %s", method, pattern, err ? err : "invalid");
        return 2;
    }
    /* the route's name for the slow-slice log: routes[ref] = "GET /users/:id" */
    lua_pushlightuserdata(L, &kh__lua_routes_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushlightuserdata(L, &kh__lua_routes_key);
        lua_pushvalue(L, -2);
        lua_rawset(L, LUA_REGISTRYINDEX);
    }
    lua_pushfstring(L, "%s %s", method, pattern);
    lua_rawseti(L, -2, ref);
    lua_pop(L, 1);
    lua_pushboolean(L, 1);
    lua_pushinteger(L, ref); /* khamsin.lua keeps ref -> pattern for req.route */
    return 2;
}

/* fallback(fn): requests no route answers (404, 405) go to fn through the app (middleware,
 * error handlers) instead of the engine's own reply. Set once, while the script loads. */
static int l_fallback(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_pushvalue(L, 1);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    kh_router_set_fallback(K->router, ref);
    return 0;
}

/* route_of(s, gen) -> route ref | nil, route status (0 | 404 | 405), Allow (405 only) */
static int l_route_of(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_stream *s = stream_at(L, 1);
    if (s == NULL || !(s->flags & KH_STREAM_F_APP))
        return 0;
    if (s->route_status == 0) {
        lua_pushinteger(L, (lua_Integer)s->route_value);
        lua_pushinteger(L, 0);
        return 2;
    }
    lua_pushnil(L);
    lua_pushinteger(L, s->route_status);
    if (s->route_status != 405)
        return 2;
    kh_route_match m; /* matched again: the Allow list is only kept on the stack at dispatch */
    kh_router_match(K->router, s->method, s->path, &m);
    lua_pushstring(L, m.status == 405 && m.allow ? m.allow : "");
    return 3;
}

/* false, message: a misuse the Lua side raises at the app's line (errors.raise), never a
 * lua_error from here (a C frame's message would name khamsin's Lua line, not the app's) */
static int misuse(lua_State *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lua_pushboolean(L, 0);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    return 2;
}

/* RFC 9110 §5.6.2 token characters */
static int is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static const char *pushed(lua_State *L, kh_str str)
{
    lua_pushlstring(L, str.ptr, str.len);
    return lua_tostring(L, -1);
}

/* Names the first header the engine refused (kh_stream_send_head said KH_EINVAL). */
static int bad_header(lua_State *L, const kh_header *h, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = (const unsigned char *)h[i].name.ptr;
        int name_ok = h[i].name.len > 0;
        for (size_t j = 0; j < h[i].name.len && name_ok; j++)
            name_ok = is_tchar(p[j]);
        if (!name_ok)
            return misuse(L, "response header name '%s' is not a token (RFC 9110 §5.6.2: "
                             "letters, digits and !#$%%&'*+-.^_`|~ only)",
                          pushed(L, h[i].name));
        p = (const unsigned char *)h[i].value.ptr;
        for (size_t j = 0; j < h[i].value.len; j++)
            if ((p[j] < 0x20 && p[j] != '\t') || p[j] == 0x7f)
                return misuse(L, "response header '%s': the value has a control character "
                                 "(byte %d at %d; CR, LF and NUL could split the response)",
                              pushed(L, h[i].name), (int)p[j],
                              (int)j + 1);
    }
    return misuse(L, "invalid response header");
}

/* respond(s, gen, status, body, headers|nil, default_content_type|nil[, "stream" | "tunnel"
 *         [, content_length]]) (content_length: "stream" only, the bytes the writes will send)
 * -> true | nil, "closed" | false, message (a header name or value refused, a second answer) */
static int l_respond(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    int status = (int)luaL_checkinteger(L, 3);
    size_t blen = 0;
    const char *body = lua_isnoneornil(L, 4) ? "" : luaL_checklstring(L, 4, &blen);
    const char *ctype = lua_tostring(L, 6);
    if (s == NULL || s->proto == NULL) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    const char *mode = lua_tostring(L, 7);
    int tunnel = mode && strcmp(mode, "tunnel") == 0; /* the status is the protocol's: 101 / 200 */
    if (!tunnel && (status < 200 || status > 999))
        return misuse(L, "invalid status %d (expected 200 to 999)", status);
    kh_header stack_hdrs[32];
    kh_header *h = stack_hdrs;
    size_t n = 0, cap = 32;
    int has_ctype = 0;
    if (lua_istable(L, 5)) {
        /* Strings found in the tables stay anchored by them; numbers turned into strings and a
         * grown header array are anchored in this table until the reply is out. */
        lua_newtable(L);
        int anchor = lua_gettop(L), nanchor = 0;
        lua_pushnil(L);
        while (lua_next(L, 5) != 0) {
            if (lua_type(L, -2) != LUA_TSTRING)
                return misuse(L, "response header names are strings, got a %s key",
                              luaL_typename(L, -2));
            size_t nl;
            const char *name = lua_tolstring(L, -2, &nl);
            int vt = lua_type(L, -1);
            int count = vt == LUA_TTABLE ? (int)lua_objlen(L, -1) : 1;
            if (vt == LUA_TBOOLEAN && !lua_toboolean(L, -1))
                count = 0; /* false removes a header */
            else if (vt != LUA_TTABLE && vt != LUA_TSTRING && vt != LUA_TNUMBER)
                return misuse(L, "response header '%s': the value is a %s (a value is a "
                                 "string, a number, a list of them, or false to remove it)",
                              name, luaL_typename(L, -1));
            for (int i = 1; i <= count; i++) {
                if (vt == LUA_TTABLE)
                    lua_rawgeti(L, -1, i);
                else
                    lua_pushvalue(L, -1);
                int et = lua_type(L, -1);
                if (et != LUA_TSTRING && et != LUA_TNUMBER)
                    return misuse(L, "response header '%s': item %d of the list is a %s (a "
                                     "value is a string or a number)",
                                  name, i, luaL_typename(L, -1));
                size_t vl;
                const char *val = lua_tolstring(L, -1, &vl);
                lua_rawseti(L, anchor, ++nanchor);
                if (n == cap) {
                    cap *= 2;
                    kh_header *bigger = lua_newuserdata(L, cap * sizeof *bigger);
                    memcpy(bigger, h, n * sizeof *h);
                    h = bigger;
                    lua_rawseti(L, anchor, ++nanchor);
                }
                h[n].name = (kh_str){name, nl};
                h[n].value = (kh_str){val, vl};
                if (kh_str_ieq_lower(h[n].name, "content-type", 12))
                    has_ctype = 1;
                n++;
            }
            lua_pop(L, 1);
        }
    }
    if (ctype && !has_ctype) {
        if (n == cap) {
            kh_header *bigger = lua_newuserdata(L, (cap + 1) * sizeof *bigger);
            memcpy(bigger, h, n * sizeof *h);
            h = bigger;
        }
        h[n].name = KH_STR_LIT("Content-Type");
        h[n].value = (kh_str){ctype, strlen(ctype)};
        n++;
    }
    /* 7th argument (issue 10): "stream" sends the head only, the body to follow in pieces
     * (res:write, SSE; no Content-Length); "tunnel" accepts a tunnel request (101 / 200) */
    int r;
    if (mode && strcmp(mode, "stream") == 0)
        r = kh_stream_send_head(s, status, h, n,
                                lua_isnumber(L, 8) ? (int64_t)lua_tonumber(L, 8) : -1);
    else if (tunnel)
        r = kh_stream_accept_tunnel(s, h, n);
    else
        r = kh_stream_respond(s, status, h, n, body, blen);
    if (r == KH_EINVAL)
        return bad_header(L, h, n);
    if (r == KH_EPROTO)
        return misuse(L, "the response was already sent");
    if (r != 0) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* FFI accessor (style.md §4) for req.method and req.path (which: 0, 1): the string's bytes and
 * length, or NULL when the request is over (gen). p is the stream's address as the runner got it
 * from kh__lua_dispatch (req._p); streams stay in the worker's pool, so the gen check is safe
 * on a stale one, as stream_at's is. Against core.head (a lua_CFunction that makes all eight
 * head fields, the peer address formatted, and ends the trace): see bench/callgrind.sh APP=
 * in the commit that added it. */
KH_EXPORT const char *kh_lua_req_str(uintptr_t p, uint32_t gen, int which, size_t *len)
{
    const kh_stream *s = (const kh_stream *)p;
    if (s == NULL || s->gen != gen)
        return NULL;
    kh_str v = which == 0 ? s->method : s->path;
    *len = v.len;
    return v.ptr ? v.ptr : "";
}

/* (kh_lua_hdr: one name/value pair as pointers and lengths, below and in response.lua's cdef) */
typedef struct kh_lua_hdr {
    const char *name;
    size_t nlen;
    const char *value;
    size_t vlen;
} kh_lua_hdr;

/* FFI accessor (style.md §4) for req.headers: the request's header fields in arrival order, as
 * they are in the stream (names lower-cased, repeats not joined: request.lua builds the table,
 * as core.headers does, without leaving the JIT trace that core.headers, a lua_CFunction, ended).
 * Fills out[0 .. min(n, max) - 1] with pointers into the stream's arena, valid while the stream
 * lives; the caller copies them (ffi.string) before any Lua code that could end the request.
 * Returns n, the number of fields (n > max: call again with room for n), or 0 when the request
 * is over (gen) or the stream is compact (a held tunnel's: its headers are gone, as l_headers).
 * p and gen as kh_lua_req_str. */
KH_EXPORT int kh_lua_req_headers(uintptr_t p, uint32_t gen, kh_lua_hdr *out, int max)
{
    const kh_stream *s = (const kh_stream *)p;
    if (s == NULL || s->gen != gen || (s->flags & KH_STREAM_F_COMPACT))
        return 0;
    uint32_t n = s->num_headers;
    for (uint32_t i = 0; i < n && i < (uint32_t)max; i++) {
        const kh_header *h = &s->headers[i];
        out[i] = (kh_lua_hdr){h->name.ptr, h->name.len, h->value.ptr ? h->value.ptr : "",
                              h->value.len};
    }
    return (int)n;
}

/* The FFI path of response.finish (style.md §4): the runner's own reply whose headers are all
 * string-valued (res.headers and the handler's, up to KH_LUA_FAST_HDRS: the hello-world shape
 * and a handler that sets a header or two), called from a JIT trace without leaving it, where
 * core.respond (a lua_CFunction) ends the trace (a stitch) and the rest of the request
 * (finish's returns up through the runner's xpcall) then ran in the interpreter: LuaJIT cannot
 * record the return to the frames below a stitch ("NYI: return to lower frame"). The stream is
 * the running coroutine's (its lightuserdata cannot be passed: the JIT does not convert one to
 * a pointer, "NYI: unsupported C type conversion"), so only the runner calls this, for the res
 * it made for that stream; gen checks it is still that request. core.respond stays the path for
 * everything else, and says why a reply is refused.
 * hs: nh name/value pairs (response.lua's kh_lua_hdr array), pointers into Lua strings that its
 * header table anchors for the call; ctype (the default Content-Type) goes after them unless
 * one of them is a Content-Type.
 * Returns 0 (sent), 2 (the stream is gone: core.respond's nil, "closed"), or 1: not taken (no
 * running request, a deferred reply, a status or a header refused, a second answer): the
 * caller then calls core.respond, which answers or explains.
 * Never calls into Lua, as an FFI function must not: with no deferred-reply registry on the
 * stream, what the sink may call back synchronously (kh_stream_on_reset -> kh__lua_on_abort)
 * only flags the running coroutine; no string pointer is kept past the call (the sinks copy, as
 * for core.respond). */
#define KH_LUA_FAST_HDRS 8
KH_EXPORT int kh_lua_respond_fast(uint32_t gen, int status, const char *body, size_t blen,
                                  const char *ctype, size_t ctlen, const kh_lua_hdr *hs, int nh)
{
    kh_lua_co *c = kh__lua_running();
    kh_stream *s = c ? c->s : NULL;
    if (s == NULL || nh < 0 || nh > KH_LUA_FAST_HDRS)
        return 1;
    if (s->gen != gen || s->proto == NULL)
        return 2;
    if (s->app_defer != NULL || (s->flags & KH_STREAM_F_HEAD_SENT) || status < 200 ||
        status > 999)
        return 1;
    kh_header h[KH_LUA_FAST_HDRS + 1];
    size_t n = 0;
    for (int i = 0; i < nh; i++, n++) {
        h[n].name = (kh_str){hs[i].name, hs[i].nlen};
        h[n].value = (kh_str){hs[i].value, hs[i].vlen};
        if (ctype && kh_str_ieq_lower(h[n].name, "content-type", 12))
            ctype = NULL; /* the handler's own */
    }
    if (ctype)
        h[n++] = kh_stream_content_type(ctype, ctlen); /* the runner's TEXT or JSON */
    int r = kh_stream_respond(s, status, h, n, body ? body : "", blen);
    if (r == KH_EINVAL)
        return 1; /* refused before anything was sent (kh_stream_send_head's checks) */
    return r == 0 ? 0 : 2;
}

/* body(s, gen) -> string | nil, "too large" | nil, "closed"; yields while the body comes in */
static int l_body(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s == NULL) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    switch (s->body_state) {
    case KH_BODY_COMPLETE:
        lua_pushlstring(L, s->body.base ? s->body.base : "", s->body.len);
        kh__lua_gc_paid(K_UPVALUE(L), L, s->body.len);
        return 1;
    case KH_BODY_TOO_LARGE:
        lua_pushnil(L);
        lua_pushliteral(L, "too large");
        return 2;
    case KH_BODY_READING: {
        if (s->proto == NULL)
            break;
        kh_lua *K = K_UPVALUE(L);
        kh_lua_co *c = s->app_data;
        if (c == NULL || K->current != c)
            return misuse(L, "req:body() waits only in its own request's handler");
        if (c->wait != KH_WAIT_NONE)
            return misuse(L, "req:body(): this request is already waiting");
        s->app_wait = KH_WAIT_BODY;
        c->wait = KH_WAIT_BODY;
        kh_stream_want_body(s);
        lua_pushlightuserdata(L, KH_YIELD);
        return lua_yield(L, 1);
    }
    default:
        break;
    }
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
}

/* head(s, gen) -> method, path, query|nil, target, authority, "1.1", remote_addr, scheme
 * (scheme: "https" when the connection is TLS, else "http"; the client's :scheme is not taken) */
static int l_head(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s == NULL)
        return 0;
    lua_pushlstring(L, s->method.ptr, s->method.len);
    lua_pushlstring(L, s->path.ptr, s->path.len);
    int compact = (s->flags & KH_STREAM_F_COMPACT) != 0; /* no query, no authority */
    if (!compact && s->query.ptr)
        lua_pushlstring(L, s->query.ptr, s->query.len);
    else
        lua_pushnil(L);
    kh_str target = kh_stream_target(s);
    lua_pushlstring(L, target.ptr, target.len);
    if (compact)
        lua_pushliteral(L, "");
    else
        lua_pushlstring(L, s->authority.ptr ? s->authority.ptr : "", s->authority.len);
    lua_pushfstring(L, "%d.%d", s->version_major, s->version_minor);
    char addr[64];
    size_t n = kh_addr_format(&s->peer, addr, sizeof addr);
    lua_pushlstring(L, addr, n);
    if (s->flags & KH_STREAM_F_TLS)
        lua_pushliteral(L, "https");
    else
        lua_pushliteral(L, "http");
    return 8;
}

/* request_id(s, gen) -> the request's id (kh_reqid.h) | nil when the stream is gone */
static int l_request_id(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s == NULL)
        return 0;
    char id[KH_REQID_MAX];
    lua_pushlstring(L, id, kh_reqid(s, id));
    return 1;
}

/* app_dir() -> the absolute directory of the app script (its relative one if realpath fails) */
static int l_app_dir(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    const char *script = K->w->cfg->script;
    char *real = realpath(script, NULL);
    const char *p = real ? real : script;
    const char *slash = strrchr(p, '/');
    if (slash == NULL)
        lua_pushliteral(L, ".");
    else if (slash == p)
        lua_pushliteral(L, "/");
    else
        lua_pushlstring(L, p, (size_t)(slash - p));
    free(real);
    return 1;
}

/* headers(s, gen) -> { name = value } with lower-case names; repeats joined with ", " (cookie:
 * with "; ", as HTTP/2 rejoins it, RFC 9113 §8.2.3) */
static int l_headers(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s && (s->flags & KH_STREAM_F_COMPACT))
        s = NULL; /* a compact stream has no headers (kh_stream_compact) */
    lua_createtable(L, 0, s ? (int)s->num_headers : 0);
    if (s == NULL)
        return 1;
    for (uint32_t i = 0; i < s->num_headers; i++) {
        kh_header *h = &s->headers[i];
        lua_pushlstring(L, h->name.ptr, h->name.len);
        lua_pushvalue(L, -1);
        lua_rawget(L, -3);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_pushlstring(L, h->value.ptr, h->value.len);
        } else {
            /* RFC 9110 §5.3: a repeated field is the comma-joined list */
            if (kh_str_eq(h->name, "cookie", 6))
                lua_pushliteral(L, "; ");
            else
                lua_pushliteral(L, ", ");
            lua_pushlstring(L, h->value.ptr, h->value.len);
            lua_concat(L, 3);
        }
        lua_rawset(L, -3);
    }
    return 1;
}

/* params(s, gen) -> { name = raw value } */
static int l_params(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s && (s->flags & KH_STREAM_F_COMPACT))
        s = NULL; /* nor params */
    lua_createtable(L, 0, s ? (int)s->num_params : 0);
    if (s == NULL)
        return 1;
    for (uint32_t i = 0; i < s->num_params; i++) {
        lua_pushlstring(L, s->params[i].name.ptr, s->params[i].name.len);
        lua_pushlstring(L, s->params[i].value.ptr, s->params[i].value.len);
        lua_rawset(L, -3);
    }
    return 1;
}

static int l_log(lua_State *L)
{
    int level = (int)luaL_checkinteger(L, 1);
    const char *msg = luaL_checkstring(L, 2);
    if (level < KH_LOG_ERROR)
        level = KH_LOG_ERROR;
    if (level > KH_LOG_DEBUG)
        level = KH_LOG_DEBUG;
    /* from a request's handler: the line names the request (kh_reqid.h) */
    kh_lua_co *c = K_UPVALUE(L)->current;
    if (c && c->s && c->s->proto) {
        char id[KH_REQID_MAX];
        size_t n = kh_reqid(c->s, id);
        KH_LOG(level, "request %.*s: %s", (int)n, id, msg);
    } else {
        KH_LOG(level, "%s", msg);
    }
    return 0;
}

static int l_worker_id(lua_State *L)
{
    lua_pushinteger(L, K_UPVALUE(L)->w->id);
    return 1;
}

static int l_workers(lua_State *L)
{
    lua_pushinteger(L, K_UPVALUE(L)->w->cfg->workers);
    return 1;
}

/* loading() -> true while the script loads (no handler, timer or callback runs) */
static int l_loading(lua_State *L)
{
    lua_pushboolean(L, K_UPVALUE(L)->current == NULL);
    return 1;
}

/* reason(status) -> "Not Found" | "" */
static int l_reason(lua_State *L)
{
    lua_pushstring(L, kh_status_reason((int)luaL_checkinteger(L, 1)));
    return 1;
}

static int l_now(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    lua_pushnumber(L, (double)uv_now(&K->w->loop) / 1000.0);
    return 1;
}

/* The core table's size: 125 fields today (its functions and those every kh__lua_open_* adds).
 * Made at that size, it is never rehashed while it fills: grown from empty it was rehashed 8
 * times, ~45,000 of the ~120,000 instructions of its making, at every state's start. More
 * fields than this only cost one rehash. */
#define KH_CORE_FIELDS 128

/* The groups no request of a plain app touches (the HTTP client, sockets, WebSocket, shared
 * dictionaries, streams, multipart, files): their functions are added on the first read of a
 * field the table does not have (its __index, then dropped), i.e. when a module that uses
 * them (khamsin.http, .socket, .websocket, .shared, .stream, .sse, .static, .multipart, ...)
 * captures its first one. ~85,000 instructions and ~60 closures off every state's start
 * (bench/startup.sh PARTS=ir); each group's metatables (sockets, files, codecs) are made with
 * it, before any of its objects can exist. */
static int open_rest(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    lua_settop(L, 2); /* (core, key) */
    lua_pushnil(L);
    lua_setmetatable(L, 1);
    lua_pushvalue(L, 1);
    kh__lua_open_shared(L, K);
    kh__lua_open_socket(L, K);
    kh__lua_open_http(L, K);
    kh__lua_open_stream(L, K);
    kh__lua_open_multipart(L, K);
    kh__lua_open_fs(L, K);
    kh__lua_open_ws(L, K); /* WebSocket codec (kh_lua_ws.c) */
    lua_pop(L, 1);
    lua_rawget(L, 1); /* the key asked for, nil if no group has it either */
    return 1;
}

static int open_core(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"route", l_route},     {"respond", l_respond},     {"body", l_body},
        {"head", l_head},       {"headers", l_headers},     {"params", l_params},
        {"log", l_log},         {"worker_id", l_worker_id}, {"workers", l_workers},
        {"now", l_now},         {"reason", l_reason},       {"loading", l_loading},
        {"request_id", l_request_id}, {"app_dir", l_app_dir},
        {"fallback", l_fallback}, {"route_of", l_route_of},
        {NULL, NULL},
    };
    lua_createtable(L, 0, KH_CORE_FIELDS);
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushvalue(L, lua_upvalueindex(1));
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
    kh_lua *K = K_UPVALUE(L);
    kh__lua_open_wait(L, K);
    kh__lua_open_json(L);
    kh__lua_open_sign(L);
    lua_pushboolean(L, K->dev);
    lua_setfield(L, -2, "dev");
    lua_pushlightuserdata(L, KH_YIELD);
    lua_setfield(L, -2, "YIELD");
    lua_createtable(L, 0, 1);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushcclosure(L, open_rest, 1);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    return 1;
}

void kh__lua_open_core(lua_State *L, kh_lua *K)
{
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushlightuserdata(L, K);
    lua_pushcclosure(L, open_core, 1);
    lua_setfield(L, -2, "khamsin.core");
    lua_pop(L, 2);
}
