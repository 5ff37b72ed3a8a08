/* kh_lua_socket.c: the C half of k.socket (lua/khamsin/socket.lua is the other): a TCP socket
 * object whose waits yield the coroutine, over core's kh_out.
 * Owns:  the socket userdata ("khamsin.socket"): its kh_out (closed by close, __gc, or when the
 *        coroutine waiting on it is aborted) and its timeouts.
 * In:    calls from khamsin/socket.lua on the worker's thread; kh_out completions.
 * Out:   results pushed on the waiting coroutine, which is woken through kh__lua_wake; every
 *        raw function answers true, results... (luasocket's values: 1 | nil, err, partial) or
 *        "aborted", why | "misuse", message, which socket.lua turns into returns or errors.
 * Never: knows a wire format beyond luasocket's receive patterns (line, n bytes, all); blocks;
 *        resumes a coroutine itself. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_err.h"
#include "kh_log.h"
#include "kh_lua_internal.h"
#include "kh_dns.h"
#include "kh_out.h"

#define SOCK_MT "khamsin.socket"
#define K_UPVALUE(L) ((kh_lua *)lua_touserdata((L), lua_upvalueindex(1)))

enum { T_CONNECT = 0, T_SEND = 1, T_READ = 2 };
enum { W_CONNECT = 1, W_TLS, W_SEND, W_RECEIVE, W_RESOLVE, W_SELECT };

struct lsel;

typedef struct lsock {
    kh_lua *K;
    kh_out *o;
    kh_lua_co *co;     /* the coroutine waiting on it, or NULL */
    int waiting;       /* W_*: what it waits for */
    uint64_t tmo[3];   /* ms, or KH_OUT_NO_TIMEOUT */
    /* receive */
    int mode;
    int strip_cr;      /* luasocket's "*l" ignores every CR */
    int peek;          /* select(): say there is input, consume nothing */
    size_t n;
    /* send */
    lua_Integer send_start; /* luasocket's i: the index the bytes were counted from */
    int closed;        /* close() was called: every call answers "closed" */
    int prefix_ref;    /* receive's prefix while it waits */
    kh_dns_req *dreq;  /* k.socket.resolve's lookup (a socket object that never connects) */
    struct lsel *sel;  /* W_SELECT: the select this socket takes part in */
} lsock;

/* A select() waiting on several sockets: a read of "at least one byte, consume nothing" runs on
 * each (every kh_out has its own operation slot and timer), the first to end (input, EOF, an
 * error or the timeout) ends them all. The coroutine's c->sock is the first socket. */
typedef struct lsel {
    kh_lua_co *co;
    int n;
    lsock *s[];
} lsel;

static int misuse(lua_State *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lua_pushliteral(L, "misuse");
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    return 2;
}

/* The socket at 1. Its metatable is upvalue 2 of every function here: a pointer compare, where
 * luaL_checkudata would look the name up in the registry (interning it) on every call. */
static lsock *check(lua_State *L)
{
    void *p = lua_touserdata(L, 1);
    if (p != NULL && lua_getmetatable(L, 1)) {
        int same = lua_rawequal(L, -1, lua_upvalueindex(2));
        lua_pop(L, 1);
        if (same)
            return p;
    }
    return luaL_checkudata(L, 1, SOCK_MT); /* raises luaL's "bad argument" error */
}

static int fail(lua_State *L, const char *err)
{
    lua_pushboolean(L, 1);
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 3;
}

/* The coroutine that may wait now, or NULL with 2 values pushed ("misuse" or "aborted"). */
static kh_lua_co *current(lua_State *L, kh_lua *K, const char *what)
{
    if (K->current == NULL) {
        misuse(L, "%s: sockets wait, which only a handler, a timer or a subscriber callback "
                  "can do (not the script while it loads)", what);
        return NULL;
    }
    if (K->current->wait != KH_WAIT_NONE) {
        misuse(L, "%s: this coroutine is already waiting", what);
        return NULL;
    }
    if (K->current->aborted) {
        lua_pushliteral(L, "aborted");
        lua_pushliteral(L, "closed");
        return NULL;
    }
    return K->current;
}

static int park(lua_State *L, lsock *s, kh_lua_co *c, int what)
{
    s->co = c;
    s->waiting = what;
    c->sock = s;
    c->wait = KH_WAIT_SOCKET;
    lua_pushlightuserdata(L, KH_YIELD);
    return lua_yield(L, 1);
}

static void sock_close(lsock *s)
{
    if (s->o) {
        kh_out_cancel(s->o);
        kh_out_close(s->o);
        s->o = NULL;
    }
}

/* Error paths close the socket, except a read timeout (kh_out.h). The message is copied
 * first: it may live in the kh_out. */
static const char *error_close(lsock *s, int status, int is_read)
{
    static char buf[300];
    snprintf(buf, sizeof buf, "%s", kh_out_strerror(status, s->o));
    if (status != KH_ETIMEDOUT || !is_read)
        sock_close(s);
    return buf;
}

/* ---- receive results ---- */

/* Pushes `len` bytes of p (without CRs for "*l"), after the waiting prefix. */
static void push_bytes(lua_State *co, lsock *s, const char *p, size_t len)
{
    luaL_Buffer b;
    luaL_buffinit(co, &b);
    if (s->prefix_ref != LUA_NOREF) {
        lua_rawgeti(co, LUA_REGISTRYINDEX, s->prefix_ref);
        luaL_addvalue(&b);
    }
    if (s->strip_cr) {
        size_t i = 0;
        while (i < len) {
            const char *cr = memchr(p + i, '\r', len - i);
            size_t run = cr ? (size_t)(cr - (p + i)) : len - i;
            luaL_addlstring(&b, p + i, run);
            i += run + (cr ? 1 : 0);
        }
    } else {
        luaL_addlstring(&b, p, len);
    }
    luaL_pushresult(&b);
}

static void drop_prefix(lsock *s)
{
    if (s->prefix_ref != LUA_NOREF) {
        luaL_unref(s->K->L, LUA_REGISTRYINDEX, s->prefix_ref);
        s->prefix_ref = LUA_NOREF;
    }
}

/* The read is satisfied: push the data and consume it. Returns the number of values. */
static int push_received(lua_State *co, lsock *s)
{
    size_t len, ready = kh_out_ready(s->o);
    const char *p = kh_out_data(s->o, &len);
    size_t take = ready;
    if (s->mode == KH_OUT_READ_LINE && take > 0)
        take--; /* the LF */
    lua_pushboolean(co, 1);
    if (s->peek) {
        lua_pushboolean(co, 1);
        drop_prefix(s);
        return 2;
    }
    push_bytes(co, s, p, take);
    kh_out_consume(s->o, ready);
    drop_prefix(s);
    return 2;
}

/* The read failed: nil, err, partial (all that was buffered, consumed). */
static int push_partial(lua_State *co, lsock *s, int status)
{
    size_t len = 0;
    const char *p = s->o && !s->peek ? kh_out_data(s->o, &len) : "";
    lua_pushboolean(co, 1);
    lua_pushnil(co);
    /* the partial first: error_close may free the buffer */
    push_bytes(co, s, p, len);
    if (s->o)
        kh_out_consume(s->o, len);
    drop_prefix(s);
    lua_pushstring(co, error_close(s, status, 1));
    lua_insert(co, -2);
    return 4;
}

/* ---- completion ---- */

static void sel_end(lsel *sel);

/* A select's read ended on one of its sockets: the select ends ("ready", or "timeout"). */
static void sel_cb(kh_out *o, int status, void *arg)
{
    (void)o;
    lsock *s = arg;
    lsel *sel = s->sel;
    kh_lua_co *c = sel->co;
    kh_lua *K = s->K;
    sel_end(sel);
    c->sock = NULL;
    c->wait = KH_WAIT_NONE;
    lua_State *co = c->co;
    lua_pushboolean(co, 1);
    if (status == KH_ETIMEDOUT)
        lua_pushliteral(co, "timeout");
    else
        lua_pushliteral(co, "ready");
    kh__lua_wake(K, c, 2);
}

static void done_cb(kh_out *o, int status, void *arg)
{
    lsock *s = arg;
    kh_lua_co *c = s->co;
    if (s->waiting == W_CONNECT)
        s->o = o; /* a connection handed over from the pool replaces the waiter */
    if (c == NULL)
        return;
    int what = s->waiting;
    s->co = NULL;
    s->waiting = 0;
    c->sock = NULL;
    c->wait = KH_WAIT_NONE;
    lua_State *co = c->co;
    int n;
    switch (what) {
    case W_CONNECT:
    case W_TLS:
        if (status == 0) {
            lua_pushboolean(co, 1);
            lua_pushinteger(co, 1);
            n = 2;
        } else {
            lua_pushboolean(co, 1);
            lua_pushnil(co);
            lua_pushstring(co, error_close(s, status, 0));
            n = 3;
        }
        break;
    case W_SEND:
        lua_pushboolean(co, 1);
        if (status == 0) {
            lua_pushinteger(co, s->send_start - 1 + (lua_Integer)kh_out_written(s->o));
            n = 2;
        } else {
            lua_Integer last = s->send_start - 1 + (lua_Integer)kh_out_written(s->o);
            lua_pushnil(co);
            lua_pushstring(co, error_close(s, status, 0));
            lua_pushinteger(co, last);
            n = 4;
        }
        break;
    default: /* W_RECEIVE */
        n = status == 0 ? push_received(co, s) : push_partial(co, s, status);
        break;
    }
    kh__lua_wake(s->K, c, n);
}

/* The waiting coroutine's request is over (kh__lua_wait_cleanup): the wait ends and, as the
 * client that left will never read the answer, the socket closes. */
void kh__lua_socket_abort(kh_lua *K, kh_lua_co *c)
{
    (void)K;
    lsock *s = c->sock;
    c->sock = NULL;
    if (s == NULL)
        return;
    if (s->waiting == W_SELECT) {
        /* the reads end; the sockets stay open (the coroutine's stack holds them until the
         * collector closes them) */
        sel_end(s->sel);
        return;
    }
    s->co = NULL;
    s->waiting = 0;
    if (s->dreq) {
        kh_dns_cancel(s->dreq);
        s->dreq = NULL;
    }
    drop_prefix(s);
    sock_close(s);
}

static void push_addrs(lua_State *L, const struct sockaddr_storage *a, int n)
{
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        char ip[64];
        if (a[i].ss_family == AF_INET)
            uv_ip4_name((const struct sockaddr_in *)&a[i], ip, sizeof ip);
        else
            uv_ip6_name((const struct sockaddr_in6 *)&a[i], ip, sizeof ip);
        lua_pushstring(L, ip);
        lua_rawseti(L, -2, i + 1);
    }
}

static void resolve_cb(void *arg, int status, const struct sockaddr_storage *addrs, int n)
{
    lsock *s = arg;
    s->dreq = NULL;
    kh_lua_co *c = s->co;
    if (c == NULL)
        return;
    s->co = NULL;
    s->waiting = 0;
    c->sock = NULL;
    c->wait = KH_WAIT_NONE;
    lua_State *co = c->co;
    lua_pushboolean(co, 1);
    if (status < 0) {
        lua_pushnil(co);
        lua_pushstring(co, kh_out_strerror(status, NULL));
        kh__lua_wake(s->K, c, 3);
        return;
    }
    push_addrs(co, addrs, n);
    kh__lua_wake(s->K, c, 2);
}

/* resolve(host) -> true, {ip...} | true, nil, err (yields unless cached or literal) */
static int l_resolve(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    const char *host = luaL_checkstring(L, 1);
    kh_lua_co *c = current(L, K, "k.socket.resolve");
    if (c == NULL)
        return 2;
    lsock *s = lua_newuserdata(L, sizeof *s); /* on this coroutine's stack while it waits */
    memset(s, 0, sizeof *s);
    s->K = K;
    s->prefix_ref = LUA_NOREF;
    luaL_getmetatable(L, SOCK_MT);
    lua_setmetatable(L, -2);
    struct sockaddr_storage addrs[KH_DNS_MAX_ADDRS];
    int n = kh_out_resolve(K->w, host, addrs, resolve_cb, s, &s->dreq);
    if (n < 0)
        return fail(L, kh_out_strerror(n, NULL));
    if (n > 0) {
        lua_pushboolean(L, 1);
        push_addrs(L, addrs, n);
        return 2;
    }
    return park(L, s, c, W_RESOLVE);
}

/* tls_preload(cafile | nil, verify) -> true | nil, err (at load time too: it does not wait) */
static int l_tls_preload(lua_State *L)
{
    const char *ca = luaL_optstring(L, 1, NULL);
    int verify = lua_isnoneornil(L, 2) ? 1 : lua_toboolean(L, 2);
    char err[512];
    if (kh_out_tls_preload(verify, ca, err, sizeof err) != 0) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static int l_gettime(lua_State *L)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    lua_pushnumber(L, (double)tv.tv_sec + (double)tv.tv_usec / 1e6);
    return 1;
}

/* ---- functions ---- */

static uint64_t limit_or(kh_lua *K, int which)
{
    const kh_limits *l = K->w->limits;
    return which == T_CONNECT ? l->socket_connect_timeout_ms
           : which == T_SEND  ? l->socket_send_timeout_ms
                              : l->socket_read_timeout_ms;
}

/* new() -> socket | "misuse", message */
static int l_new(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    if (K->current == NULL)
        return misuse(L, "k.socket.tcp(): sockets are made in a handler, a timer or a "
                         "subscriber callback, not while the script loads (every worker loads "
                         "it; connect in k.timer(0, fn) for start-up work)");
    lsock *s = lua_newuserdata(L, sizeof *s);
    memset(s, 0, sizeof *s);
    s->K = K;
    s->prefix_ref = LUA_NOREF;
    for (int i = 0; i < 3; i++)
        s->tmo[i] = limit_or(K, i);
    luaL_getmetatable(L, SOCK_MT);
    lua_setmetatable(L, -2);
    lua_pushboolean(L, 1);
    lua_insert(L, -2);
    return 2;
}

static void opt_string(lua_State *L, int t, const char *k, char *out, size_t len)
{
    lua_getfield(L, t, k);
    const char *v = lua_tostring(L, -1);
    snprintf(out, len, "%s", v ? v : "");
    lua_pop(L, 1);
}

static int opt_bool(lua_State *L, int t, const char *k, int def)
{
    lua_getfield(L, t, k);
    int v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* Reads {server_name=, verify=, cafile=, alpn=} at index t into the buffers. */
typedef struct tls_bufs {
    char sni[256], ca[256], alpn[128];
    kh_out_tls_opts o;
} tls_bufs;

static void read_tls(lua_State *L, int t, tls_bufs *b)
{
    opt_string(L, t, "server_name", b->sni, sizeof b->sni);
    opt_string(L, t, "cafile", b->ca, sizeof b->ca);
    opt_string(L, t, "alpn", b->alpn, sizeof b->alpn); /* socket.lua joins a list with ',' */
    b->o.server_name = b->sni[0] ? b->sni : NULL;
    b->o.ca_file = b->ca[0] ? b->ca : NULL;
    b->o.alpn = b->alpn[0] ? b->alpn : NULL;
    b->o.verify = opt_bool(L, t, "verify", 1);
}

/* connect(sock, host, port, opts) -> true, 1 | true, nil, err (yields) */
static int l_connect(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    lsock *s = check(L);
    const char *host = luaL_checkstring(L, 2);
    int port = (int)luaL_checkinteger(L, 3);
    kh_lua_co *c = current(L, K, "sock:connect");
    if (c == NULL)
        return 2;
    if (s->o)
        return fail(L, "already connected");
    if (s->co)
        return misuse(L, "sock:connect: another coroutine waits on this socket");
    tls_bufs tb;
    char pool[256] = "";
    kh_out_target t = {.host = host, .port = port, .timeout_ms = s->tmo[T_CONNECT]};
    if (lua_istable(L, 4)) {
        opt_string(L, 4, "pool", pool, sizeof pool);
        t.pool = pool[0] ? pool : NULL;
        t.deny_private = opt_bool(L, 4, "deny_private", 0);
        lua_getfield(L, 4, "pool_size");
        t.pool_size = (int)lua_tointeger(L, -1);
        lua_getfield(L, 4, "backlog");
        t.backlog = (int)lua_tointeger(L, -1);
        lua_pop(L, 2);
        lua_getfield(L, 4, "tls");
        if (lua_istable(L, -1)) {
            read_tls(L, lua_gettop(L), &tb);
            t.tls = &tb.o;
        }
        lua_pop(L, 1);
    }
    int rc;
    char why[512] = "";
    t.err = why;
    t.errlen = sizeof why;
    kh_out *o = kh_out_connect(K->w, &t, done_cb, s, &rc);
    if (o == NULL)
        return fail(L, why[0] ? why : kh_out_strerror(rc, NULL));
    s->o = o;
    if (rc == 1) {
        lua_pushboolean(L, 1);
        lua_pushinteger(L, 1);
        return 2;
    }
    return park(L, s, c, W_CONNECT);
}

/* tls(sock, opts) -> true, 1 | true, nil, err (yields) */
static int l_tls(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    lsock *s = check(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    kh_lua_co *c = current(L, K, "sock:tls");
    if (c == NULL)
        return 2;
    if (s->co)
        return misuse(L, "sock:tls: another coroutine waits on this socket");
    if (s->o == NULL)
        return fail(L, "closed");
    tls_bufs tb;
    read_tls(L, 2, &tb);
    int rc = kh_out_tls(s->o, &tb.o, s->tmo[T_CONNECT], done_cb, s);
    if (rc == 1) {
        lua_pushboolean(L, 1);
        lua_pushinteger(L, 1);
        return 2;
    }
    if (rc < 0)
        return fail(L, error_close(s, rc, 0));
    return park(L, s, c, W_TLS);
}

/* send(sock, data, i, j) -> true, last | true, nil, err, last (yields) */
static int l_send(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    lsock *s = check(L);
    size_t len;
    const char *p = luaL_checklstring(L, 2, &len);
    lua_Integer i = luaL_optinteger(L, 3, 1), j = luaL_optinteger(L, 4, -1);
    /* luasocket's string.sub rules for i and j */
    if (i < 0)
        i = (lua_Integer)len + i + 1;
    if (j < 0)
        j = (lua_Integer)len + j + 1;
    if (i < 1)
        i = 1;
    if (j > (lua_Integer)len)
        j = (lua_Integer)len;
    kh_lua_co *c = current(L, K, "sock:send");
    if (c == NULL)
        return 2;
    if (s->co)
        return misuse(L, "sock:send: another coroutine waits on this socket");
    if (s->o == NULL) {
        lua_pushboolean(L, 1);
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        lua_pushinteger(L, i - 1);
        return 4;
    }
    size_t n = j >= i ? (size_t)(j - i + 1) : 0;
    s->send_start = i;
    int rc = kh_out_write(s->o, p + i - 1, n, s->tmo[T_SEND], done_cb, s);
    if (rc == 1) {
        lua_pushboolean(L, 1);
        lua_pushinteger(L, i - 1 + (lua_Integer)n);
        return 2;
    }
    if (rc < 0) {
        lua_pushboolean(L, 1);
        lua_pushnil(L);
        lua_pushstring(L, error_close(s, rc, 0));
        lua_pushinteger(L, i - 1);
        return 4;
    }
    return park(L, s, c, W_SEND);
}

/* receive(sock, mode, n, prefix) -> true, data | true, nil, err, partial (yields)
 * mode: "l" line, "a" all, "n" n bytes, "s" some (what is there, at least 1 byte, at most n
 * when n > 0), "p" peek (true once there is input; nothing consumed) */
static int l_receive(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    lsock *s = check(L);
    const char *m = luaL_checkstring(L, 2);
    lua_Integer n = luaL_optinteger(L, 3, 0);
    kh_lua_co *c = current(L, K, "sock:receive");
    if (c == NULL)
        return 2;
    if (s->co)
        return misuse(L, "sock:receive: another coroutine waits on this socket");
    if (s->o == NULL) {
        lua_pushboolean(L, 1);
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        lua_pushliteral(L, "");
        return 4;
    }
    s->mode = m[0] == 'l' ? KH_OUT_READ_LINE
              : m[0] == 'a' ? KH_OUT_READ_ALL
              : (m[0] == 's' || m[0] == 'p') ? KH_OUT_READ_SOME
                            : KH_OUT_READ_N;
    s->peek = m[0] == 'p';
    s->strip_cr = s->mode == KH_OUT_READ_LINE;
    s->n = n > 0 ? (size_t)n : 0;
    drop_prefix(s);
    if (lua_type(L, 4) == LUA_TSTRING) {
        lua_pushvalue(L, 4);
        s->prefix_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    int rc = kh_out_read(s->o, s->mode, s->n, s->tmo[T_READ], done_cb, s);
    if (rc == 1)
        return push_received(L, s);
    if (rc < 0)
        return push_partial(L, s, rc);
    return park(L, s, c, W_RECEIVE);
}

/* readable(sock) -> nil (closed: select skips it) | true (input here, or the peer closed: a
 * receive answers at once) | false */
static int l_readable(lua_State *L)
{
    lsock *s = check(L);
    if (s->o == NULL) {
        lua_pushnil(L);
        return 1;
    }
    size_t len;
    kh_out_data(s->o, &len);
    lua_pushboolean(L, len > 0 || kh_out_input_ended(s->o));
    return 1;
}

/* Ends the reads of a select (all but the one whose callback runs now are cancelled) and frees
 * it. */
static void sel_end(lsel *sel)
{
    for (int i = 0; i < sel->n; i++) {
        lsock *s = sel->s[i];
        if (s->o)
            kh_out_cancel(s->o);
        s->sel = NULL;
        s->co = NULL;
        s->waiting = 0;
    }
    free(sel);
}

/* select(timeout_s, sock...) -> true, "ready" | true, "timeout" (yields until input, EOF or an
 * error on one of the sockets, or the timeout; < 0: none). Consumes nothing. The sockets are
 * open, not waited on by another coroutine, with nothing buffered (socket.lua checks first). */
static int l_select(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    double tv = luaL_checknumber(L, 1);
    int n = lua_gettop(L) - 1;
    kh_lua_co *c = current(L, K, "socket.select");
    if (c == NULL)
        return 2;
    if (n < 1)
        return misuse(L, "socket.select: no socket to wait on");
    for (int i = 0; i < n; i++) {
        lsock *s = luaL_checkudata(L, 2 + i, SOCK_MT);
        if (s->co)
            return misuse(L, "socket.select: another coroutine waits on socket %d", i + 1);
        if (s->o == NULL)
            return misuse(L, "socket.select: socket %d is closed", i + 1);
        for (int j = 0; j < i; j++)
            if (lua_touserdata(L, 2 + j) == s)
                return misuse(L, "socket.select: socket %d is there twice", i + 1);
    }
    uint64_t tmo = tv < 0 ? KH_OUT_NO_TIMEOUT : (uint64_t)ceil(tv * 1000.0);
    lsel *sel = kh_xmalloc(sizeof *sel + (size_t)n * sizeof(lsock *));
    sel->co = c;
    sel->n = 0;
    for (int i = 0; i < n; i++) {
        lsock *s = lua_touserdata(L, 2 + i);
        int rc = kh_out_read(s->o, KH_OUT_READ_SOME, 0, tmo, sel_cb, s);
        if (rc != 0) {
            /* input or an end already (1, or an error code): ready now, nothing to wait for */
            sel_end(sel);
            lua_pushboolean(L, 1);
            lua_pushliteral(L, "ready");
            return 2;
        }
        s->sel = sel;
        s->co = c;
        s->waiting = W_SELECT;
        sel->s[sel->n++] = s;
    }
    lsock *first = sel->s[0];
    c->sock = first;
    c->wait = KH_WAIT_SOCKET;
    lua_pushlightuserdata(L, KH_YIELD);
    return lua_yield(L, 1);
}

/* settimeouts(sock, connect, send, read): seconds each, nil keeps, < 0 none */
static int l_settimeouts(lua_State *L)
{
    lsock *s = check(L);
    for (int i = 0; i < 3; i++) {
        if (lua_isnoneornil(L, 2 + i))
            continue;
        double v = luaL_checknumber(L, 2 + i);
        s->tmo[i] = v < 0 ? KH_OUT_NO_TIMEOUT : (uint64_t)ceil(v * 1000.0);
    }
    return 0;
}

/* setkeepalive(sock, idle_s | nil, size | nil) -> 1 | nil, err */
static int l_setkeepalive(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    lsock *s = check(L);
    if (s->o == NULL) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    if (s->co) {
        lua_pushnil(L);
        lua_pushliteral(L, "busy: a coroutine waits on this socket");
        return 2;
    }
    uint64_t idle = lua_isnoneornil(L, 2) ? K->w->limits->socket_keepalive_ms
                                          : (uint64_t)ceil(luaL_checknumber(L, 2) * 1000.0);
    int size = lua_isnoneornil(L, 3) ? (int)K->w->limits->socket_pool_size
                                     : (int)luaL_checkinteger(L, 3);
    kh_out *o = s->o;
    int rc = kh_out_keepalive(o, idle, size);
    if (rc < 0) {
        /* OpenResty's rule: a connection that cannot be pooled is closed, with the reason */
        char why[300];
        snprintf(why, sizeof why, "%s", kh_out_strerror(rc, o));
        sock_close(s);
        s->closed = 1;
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    s->o = NULL; /* the pool's now */
    s->closed = 1;
    lua_pushinteger(L, 1);
    return 1;
}

static int l_close(lua_State *L)
{
    lsock *s = check(L);
    if (s->co) {
        lua_pushnil(L);
        lua_pushliteral(L, "busy: a coroutine waits on this socket");
        return 2;
    }
    sock_close(s);
    s->closed = 1;
    drop_prefix(s);
    lua_pushinteger(L, 1);
    return 1;
}

static int l_shutdown(lua_State *L)
{
    lsock *s = check(L);
    if (s->o == NULL || kh_out_shutdown(s->o) < 0) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    lua_pushinteger(L, 1);
    return 1;
}

static int l_getpeername(lua_State *L)
{
    lsock *s = check(L);
    char ip[64];
    int port;
    if (s->o == NULL || kh_out_peer(s->o, ip, sizeof ip, &port) < 0) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    lua_pushstring(L, ip);
    lua_pushinteger(L, port);
    lua_pushstring(L, strchr(ip, ':') ? "inet6" : "inet");
    return 3;
}

static int l_setoption(lua_State *L)
{
    lsock *s = check(L);
    const char *name = luaL_checkstring(L, 2);
    if (s->o == NULL) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    int r = kh_out_setopt(s->o, name, lua_toboolean(L, 3));
    if (r == UV_EINVAL) {
        lua_pushnil(L);
        lua_pushfstring(L, "unsupported option '%s'", name);
        return 2;
    }
    if (r < 0) {
        lua_pushnil(L);
        lua_pushstring(L, uv_strerror(r));
        return 2;
    }
    lua_pushinteger(L, 1);
    return 1;
}

/* info(sock) -> {connected=, reused=, tls=, alpn=, buffered=, read_timeout=} */
static int l_info(lua_State *L)
{
    lsock *s = check(L);
    lua_createtable(L, 0, 6);
    size_t buffered = 0;
    if (s->o)
        kh_out_data(s->o, &buffered);
    lua_pushnumber(L, (double)buffered);
    lua_setfield(L, -2, "buffered");
    lua_pushnumber(L, s->tmo[T_READ] == KH_OUT_NO_TIMEOUT ? -1.0 : (double)s->tmo[T_READ] / 1000.0);
    lua_setfield(L, -2, "read_timeout");
    lua_pushboolean(L, s->o != NULL);
    lua_setfield(L, -2, "connected");
    lua_pushinteger(L, s->o ? kh_out_reused(s->o) : 0);
    lua_setfield(L, -2, "reused");
    lua_pushboolean(L, s->o && kh_out_is_tls(s->o));
    lua_setfield(L, -2, "tls");
    lua_pushstring(L, s->o ? kh_out_alpn(s->o) : "");
    lua_setfield(L, -2, "alpn");
    return 1;
}

/* reused(sock) -> times from the pool (0: new or closed), negotiated ALPN ("" when none): what
 * k.http asks of every connection, without info()'s table */
static int l_reused(lua_State *L)
{
    lsock *s = check(L);
    lua_pushinteger(L, s->o ? kh_out_reused(s->o) : 0);
    lua_pushstring(L, s->o ? kh_out_alpn(s->o) : "");
    return 2;
}

static int l_gc(lua_State *L)
{
    lsock *s = luaL_checkudata(L, 1, SOCK_MT);
    /* a waiting socket is on its coroutine's stack, so it is never collected while it waits */
    if (s->dreq) {
        kh_dns_cancel(s->dreq);
        s->dreq = NULL;
    }
    sock_close(s);
    drop_prefix(s);
    return 0;
}

kh_out *kh__lua_socket_detach(lua_State *L, int idx)
{
    lsock *s = luaL_checkudata(L, idx, SOCK_MT);
    if (s->o == NULL || s->co)
        return NULL;
    kh_out *o = s->o;
    s->o = NULL;
    s->closed = 1;
    return o;
}

static int l_stats(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_out_stats st;
    kh_out_stats_get(K->w, &st);
    lua_createtable(L, 0, 9);
#define F(name)                                                                                    \
    lua_pushnumber(L, (double)st.name);                                                            \
    lua_setfield(L, -2, #name);
    F(open)
    F(idle)
    F(connects)
    F(reuses)
    F(evicted)
    F(dns_hits)
    F(dns_lookups)
    F(max_open)
    F(max_idle)
#undef F
    return 1;
}

void kh__lua_open_socket(lua_State *L, kh_lua *K)
{
    static const luaL_Reg fns[] = {
        {"socket_new", l_new},
        {"socket_connect", l_connect},
        {"socket_tls", l_tls},
        {"socket_send", l_send},
        {"socket_receive", l_receive},
        {"socket_settimeouts", l_settimeouts},
        {"socket_setkeepalive", l_setkeepalive},
        {"socket_close", l_close},
        {"socket_shutdown", l_shutdown},
        {"socket_getpeername", l_getpeername},
        {"socket_setoption", l_setoption},
        {"socket_info", l_info},
        {"socket_reused", l_reused},
        {"socket_readable", l_readable},
        {"socket_select", l_select},
        {"socket_stats", l_stats},
        {"socket_resolve", l_resolve},
        {"socket_gettime", l_gettime},
        {"socket_tls_preload", l_tls_preload},
        {NULL, NULL},
    };
    if (luaL_newmetatable(L, SOCK_MT)) {
        lua_pushcfunction(L, l_gc);
        lua_setfield(L, -2, "__gc");
    }
    int mt = lua_gettop(L);
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushlightuserdata(L, K);
        lua_pushvalue(L, mt);
        lua_pushcclosure(L, f->func, 2);
        lua_setfield(L, -3, f->name);
    }
    lua_pop(L, 1);
}
