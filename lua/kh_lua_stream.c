/* kh_lua_stream.c: the khamsin.core functions for long-lived streams (issue 10): streamed
 * writes with backpressure, the incremental request body, holding an idle stream, tunnel
 * info, and k.send_to's message to another worker.
 * Owns:  nothing; every function checks its {stream, generation} pair first.
 * In:    calls from lua/khamsin/stream.lua, sse.lua, push.lua (and the WebSocket module).
 * Out:   kh_stream_send_data / want_drain / body_stream / body_consume / hold; yields of
 *        KH_YIELD (KH_WAIT_DRAIN, KH_WAIT_BODY) woken by kh__lua_on_drain / on_body / on_abort;
 *        mailbox messages (KH_MSG_SENDTO).
 * A tunnel (the WebSocket module's use): core.tunnel(s, gen) names the protocol asked for
 * ("websocket") on a request routed by k.route("@websocket", ...); core.respond(s, gen, 0, nil,
 * headers, nil, "tunnel") accepts it (101 on h1, 200 on h2); then body_chunk reads the peer's
 * bytes (false: its end), stream_write(s, gen, bytes, "wait" | "push") writes, stream_finish
 * ends the tunnel. The handler returning does not end it if it called core.defer_hold; once
 * also core.stream_hold'd, the tunnel waits for input with no coroutine (KH_WAIT_TUNNEL): each
 * arrival starts one for the "tunnel" event, which reads with body_chunk(s, gen, true).
 * Never: knows a wire format (chunked, DATA, event-stream framing are the protocols' or Lua's),
 *        waits in a coroutine that does not own the stream. */
#include <malloc.h>
#include <string.h>

#include "kh_asan.h"
#ifdef KH_ASAN
/* libasan's (sanitizer/allocator_interface.h, which GCC 12 does not ship) */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#include "kh_err.h"
#include "kh_lua_copy.h"
#include "kh_lua_internal.h"

#define K_UPVALUE(L) ((kh_lua *)lua_touserdata((L), lua_upvalueindex(1)))

static kh_stream *stream_at(lua_State *L, int idx)
{
    kh_stream *s = lua_touserdata(L, idx);
    if (s == NULL)
        luaL_argerror(L, idx, "not a request");
    if (s->gen != (uint32_t)lua_tointeger(L, idx + 1))
        return NULL;
    return s;
}

static int closed(lua_State *L)
{
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
}

/* The coroutine that owns s and may wait now, or NULL. */
static kh_lua_co *owner(kh_lua *K, kh_stream *s)
{
    kh_lua_co *c = s->app_data;
    if (c == NULL || K->current != c || c->wait != KH_WAIT_NONE || c->aborted)
        return NULL;
    return c;
}

/* write(s, gen, data, mode) -> true | nil, "closed" | nil, "full" (yields while above the mark)
 * mode "wait": the owning coroutine waits (KH_WAIT_DRAIN) while the stream's queue is above
 *   stream_high_water; another coroutine never waits (as "push").
 * mode "push": never waits; when the queue is already past stream_out_cap nothing is written
 *   and "full" is returned (the caller ends the slow consumer). */
static int l_write(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_stream *s = stream_at(L, 1);
    size_t n;
    const char *p = luaL_checklstring(L, 3, &n);
    const char *mode = luaL_optstring(L, 4, "wait");
    if (s == NULL || s->proto == NULL || (s->flags & KH_STREAM_F_ENDED))
        return closed(L);
    int push = strcmp(mode, "push") == 0;
    if (push && kh_stream_queued(s) + n > K->w->limits->stream_out_cap) {
        lua_pushnil(L);
        lua_pushliteral(L, "full");
        return 2;
    }
    int r = kh_stream_send_data(s, p, n, 0);
    if (r != 0)
        return closed(L);
    if (push || kh_stream_queued(s) < K->w->limits->stream_high_water) {
        lua_pushboolean(L, 1);
        return 1;
    }
    kh_lua_co *c = owner(K, s);
    if (c == NULL || kh_stream_want_drain(s) != 0) {
        lua_pushboolean(L, 1); /* not the stream's own coroutine: never waits */
        return 1;
    }
    s->app_wait = KH_WAIT_DRAIN;
    c->wait = KH_WAIT_DRAIN;
    lua_pushlightuserdata(L, KH_YIELD);
    return lua_yield(L, 1);
}

/* finish(s, gen[, cut]) -> true | nil, "closed": ends a streamed response (or tunnel output);
 * cut: a slow consumer's, whose queued bytes the protocol may drop (kh_stream_cut: h2 resets
 * the stream once what the peer's window lets through is out) */
static int l_finish(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s == NULL || s->proto == NULL)
        return closed(L);
    if (lua_toboolean(L, 3)) {
        if (kh_stream_cut(s) != 0)
            return closed(L);
        lua_pushboolean(L, 1);
        return 1;
    }
    if (s->flags & KH_STREAM_F_ENDED) {
        lua_pushboolean(L, 1);
        return 1;
    }
    if (kh_stream_send_data(s, NULL, 0, 1) != 0)
        return closed(L);
    lua_pushboolean(L, 1);
    return 1;
}

/* queued(s, gen) -> bytes queued (0 when closed), open (boolean) */
static int l_queued(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    int open = s && s->proto && !(s->flags & KH_STREAM_F_ENDED);
    lua_pushinteger(L, open ? (lua_Integer)kh_stream_queued(s) : 0);
    lua_pushboolean(L, open);
    return 2;
}

/* body_chunk(s, gen[, nowait]) -> string | false (the end) | nil, "closed" | false, message
 * (misuse) | (yields: true, ask again). The first call switches the body to incremental reading.
 * nowait: nil, "wait" instead of yielding when no byte is there yet (a held tunnel's reader,
 * which ends and is started again by the next input: KH_WAIT_TUNNEL). */
static int l_body_chunk(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_stream *s = stream_at(L, 1);
    if (s == NULL)
        return closed(L);
    if (s->body_state == KH_BODY_READING && s->proto)
        kh_stream_body_stream(s);
    if (s->body.len) {
        size_t n = s->body.len;
        lua_pushlstring(L, s->body.base, n);
        kh_stream_body_consume(s, n);
        kh__lua_gc_paid(K, L, n);
        return 1;
    }
    switch (s->body_state) {
    case KH_BODY_COMPLETE:
        lua_pushboolean(L, 0);
        return 1;
    case KH_BODY_TOO_LARGE:
        lua_pushnil(L);
        lua_pushliteral(L, "too large");
        return 2;
    case KH_BODY_READING: {
        if (s->proto == NULL)
            return closed(L);
        if (lua_toboolean(L, 3)) {
            lua_pushnil(L);
            lua_pushliteral(L, "wait");
            return 2;
        }
        kh_lua_co *c = s->app_data;
        if (c == NULL || K->current != c) {
            lua_pushboolean(L, 0);
            lua_pushliteral(L, "req:body_reader(): the body is read only in its own request's "
                               "handler");
            return 2;
        }
        if (c->wait != KH_WAIT_NONE) {
            lua_pushboolean(L, 0);
            lua_pushliteral(L, "req:body_reader(): this request is already waiting");
            return 2;
        }
        if (c->aborted)
            return closed(L);
        s->app_wait = KH_WAIT_BODY;
        c->wait = KH_WAIT_BODY;
        kh_stream_want_body(s);
        lua_pushlightuserdata(L, KH_YIELD);
        return lua_yield(L, 1);
    }
    default:
        return closed(L);
    }
}

/* hold(s, gen) -> true | nil, "closed": an idle long-lived stream gives its request head's
 * memory back (kh_stream_hold) */
static int l_hold(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s == NULL || s->proto == NULL)
        return closed(L);
    kh_stream_hold(s);
    lua_pushboolean(L, 1);
    return 1;
}

/* compact(s, gen) -> s2, gen2 | true | false | nil, "closed": a held h1 tunnel (a WebSocket
 * between messages) moves into a compact stream (kh_stream_compact): s2, gen2 are its new
 * pair, the old one is stale; the hold registry (core.held) follows it here, its value too,
 * the caller updates its own references. true: it never moves (h2, h3, not a held tunnel);
 * false: not now, a coroutine owns it (try again later). Call it only where no C frame holds
 * the stream (a timer callback, not a handler that a protocol's dispatch runs: h1's dispatch
 * still holds the old pointer when the handler returns). */
static int l_compact(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s == NULL || s->proto == NULL)
        return closed(L);
    if (s->app_data != NULL || s->app_wait != KH_WAIT_TUNNEL) {
        lua_pushboolean(L, 0);
        return 1;
    }
    kh_stream *t = kh_stream_compact(s);
    if (t == s) {
        lua_pushboolean(L, 1);
        return 1;
    }
    kh__lua_defer_moved(L, s, t);
    lua_pushlightuserdata(L, t);
    lua_pushinteger(L, (lua_Integer)t->gen);
    return 2;
}

/* tunnel(s, gen) -> the tunnel protocol asked for ("websocket"), the HTTP major version (1, 2,
 * 3: the handshake differs); or nil */
static int l_tunnel(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    if (s == NULL || !(s->flags & KH_STREAM_F_TUNNEL_REQ))
        return 0;
    lua_pushstring(L, (s->flags & KH_STREAM_F_COMPACT) ? "" : s->tunnel_proto);
    lua_pushinteger(L, s->version_major);
    return 2;
}

/* header(s, gen, lname) -> the value of one request header (lower-case name), or nil: for
 * res:sse's Last-Event-ID without building the whole req.headers table */
static int l_header(lua_State *L)
{
    kh_stream *s = stream_at(L, 1);
    size_t n;
    const char *name = luaL_checklstring(L, 3, &n);
    const kh_header *h = s ? kh_stream_header(s, name, n) : NULL;
    if (h == NULL)
        return 0;
    lua_pushlstring(L, h->value.ptr, h->value.len);
    return 1;
}

/* malloc_in_use() -> bytes the C allocator has handed out and not taken back (glibc mallinfo2:
 * in-use chunks + mmapped blocks; under ASan, whose allocator glibc does not see, the bytes
 * asked for: __sanitizer_get_current_allocated_bytes): for bench/streams.sh, which reports what
 * idle streams hold beside VmRSS (which also counts what the allocator keeps after a burst), and
 * spec/ws_memory_spec.lua */
static int l_malloc_in_use(lua_State *L)
{
#ifdef KH_ASAN
    lua_pushnumber(L, (lua_Number)__sanitizer_get_current_allocated_bytes());
#else
    struct mallinfo2 mi = mallinfo2();
    lua_pushnumber(L, (lua_Number)(mi.uordblks + mi.hblkhd));
#endif
    return 1;
}

/* limits() -> stream_high_water, sse_keepalive_ms, stream_out_cap */
static int l_limits(lua_State *L)
{
    const kh_limits *l = K_UPVALUE(L)->w->limits;
    lua_pushnumber(L, (lua_Number)l->stream_high_water);
    lua_pushnumber(L, (lua_Number)l->sse_keepalive_ms);
    lua_pushnumber(L, (lua_Number)l->stream_out_cap);
    return 3;
}

typedef struct kh_lua_msg {
    kh_chan_msg base;
    size_t len;
    char data[];
} kh_lua_msg;

static void msg_dispose(kh_chan_msg *m)
{
    free(m);
}

/* post_send_to(worker, gen, id, data) -> true | nil, why | false, message: k.send_to for a
 * stream of another worker, or of another instance of this one (gen: the instance whose push
 * registry holds it, which a hot reload may have retired; its mailbox runs the "send_to" event
 * there, kh_worker_inst_find routing by generation) */
static int l_post_send_to(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    int to = (int)luaL_checkinteger(L, 1);
    uint32_t gen = (uint32_t)luaL_checkinteger(L, 2);
    lua_settop(L, 4);
    kh_copybuf b = {NULL, 0, 0, K->w->limits->pool_msg_bytes};
    char err[400];
    if (kh_lua_copy_encode(L, 3, 4, 1, &b, "argument", err, sizeof err) != 0) {
        free(b.p);
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "k.send_to: %s", err);
        return 2;
    }
    kh_lua_msg *m = kh_xmalloc(sizeof *m + b.len);
    m->base.type = KH_MSG_SENDTO;
    m->base.gen = gen;
    m->base.dispose = msg_dispose;
    m->len = b.len;
    memcpy(m->data, b.p, b.len);
    free(b.p);
    int r = kh_worker_post(K->w->cfg, to, &m->base);
    if (r != 0) {
        lua_pushnil(L);
        lua_pushstring(L, r == KH_EINVAL ? "no such worker" : "worker stopped");
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

void kh__lua_open_stream(lua_State *L, kh_lua *K)
{
    static const luaL_Reg fns[] = {
        {"stream_write", l_write},   {"stream_finish", l_finish}, {"stream_queued", l_queued},
        {"body_chunk", l_body_chunk}, {"stream_hold", l_hold},
        {"stream_compact", l_compact},    {"tunnel", l_tunnel},
        {"post_send_to", l_post_send_to}, {"stream_limits", l_limits},
        {"header", l_header},         {"malloc_in_use", l_malloc_in_use},
        {NULL, NULL},
    };
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushlightuserdata(L, K);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
}
