/* kh_lua_ws.c: the khamsin.core functions behind lua/khamsin/websocket.lua: a per-socket codec
 * (core/kh_ws.c) as a userdata, server frames, and the handshake helpers.
 * Owns:  per codec: its kh_ws_conn (message buffer); per Lua state (one per worker): the out
 *        buffer of frames a codec wrote itself outside feed (a close frame), a scratch buffer where
 *        received bytes are unmasked (Lua strings are immutable) and the zlib streams of
 *        permessage-deflate, one inflater and one deflater per window size, shared by every
 *        socket of the worker: with no context takeover each message is inflated or deflated in
 *        one call (kh_ws_deflate.h), so an idle socket keeps no zlib memory.
 * In:    feed(codec, chunk, list, max) from the socket's reader; frame(codec, opcode, data).
 * Out:   messages appended to list as (data, binary) pairs, and the frames the codec wrote
 *        itself (pongs, close replies) as (bytes, 0) pairs in between, in order; frames as Lua
 *        strings (the caller writes them to the tunnel).
 * Never: touches the stream or knows the transport (h1 101 or h2 extended CONNECT are the same
 *        bytes here). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kh_lua_internal.h"
#include "kh_ws.h"
#include "kh_ws_deflate.h"
#include "kh_ws_handshake.h"

#define ZCTX_MT "khamsin.ws.zctx"
#define CODEC_MT "khamsin.ws.codec"

typedef struct zctx {
    kh_ws_cfg cfg; /* first: every codec's w.cfg points here, so it leads to its worker's zctx */
    uint8_t *scratch;
    size_t scap;
    z_stream inf;
    int has_inf;
    z_stream def[16]; /* by window bits, 9..15 */
    uint8_t has_def[16];
    /* during one feed (never nested: the codec's callbacks run no Lua code) */
    lua_State *L;
    int list, count, max;
    /* frames a codec wrote outside feed (ws:close), taken at once by push_out */
    uint8_t *out;
    size_t olen, ocap;
} zctx;

/* per socket: the ws object itself (lua/khamsin/websocket.lua), a userdata whose metatable is
 * CODEC_MT (shared by every socket; websocket.lua puts its methods on it) and whose
 * environment is the route's table (handlers, subprotocols: shared by the route's sockets).
 * It is all an idle WebSocket keeps in the Lua heap besides its slot in khamsin.push: no
 * table, no string (ws.id is formatted from pn when read). The feed and out state is the
 * worker's, in zctx. */
typedef struct codec {
    kh_ws_conn w;   /* first: the codec's callbacks get &w */
    void *s;        /* the stream, handed back as a lightuserdata for core.stream_* */
    uint32_t gen;   /* its generation */
    uint16_t code;  /* the close code the close handler gets; 0 while unknown */
    uint8_t bits;   /* permessage-deflate: our window (9..15), 0 when not negotiated */
    uint8_t flags;  /* websocket.lua's state bits (done, closing, ended, end pending) */
    uint8_t proto;  /* the subprotocol: its index in the route's list, 0 for none */
    uint32_t magic; /* CODEC_MAGIC (to_codec); in what was padding */
    double pn;      /* its number in khamsin.push (ws.id), 0 before it registered */
} codec;

#define CODEC_MAGIC 0x6b687773u /* "khws" */
/* 112 bytes, 160 in the Lua heap with LuaJIT's 48-byte GCudata header (was 160, 208 with it:
 * kh_ws_conn kept its limits, callbacks and a user pointer, the codec its worker's zctx, now
 * all one kh_ws_cfg pointer; bench/README.md "Memory per idle WebSocket") */
_Static_assert(sizeof(codec) == 112, "the ws object stays 112 bytes");

/* the worker's zctx of a session (w.cfg is its first member) */
static zctx *zctx_of(kh_ws_conn *w)
{
    return (zctx *)(void *)(uintptr_t)w->cfg;
}

static int zctx_gc(lua_State *L)
{
    zctx *z = luaL_checkudata(L, 1, ZCTX_MT);
    free(z->scratch);
    z->scratch = NULL;
    free(z->out);
    z->out = NULL;
    z->olen = z->ocap = 0;
    if (z->has_inf)
        inflateEnd(&z->inf);
    z->has_inf = 0;
    for (int i = 0; i < 16; i++)
        if (z->has_def[i]) {
            deflateEnd(&z->def[i]);
            z->has_def[i] = 0;
        }
    return 0;
}

static int on_message(kh_ws_conn *w, int binary, const uint8_t *p, size_t n)
{
    zctx *c = zctx_of(w);
    lua_State *L = c->L;
    int k = (int)lua_objlen(L, c->list);
    lua_pushlstring(L, (const char *)p, n);
    lua_rawseti(L, c->list, k + 1);
    lua_pushboolean(L, binary);
    lua_rawseti(L, c->list, k + 2);
    return ++c->count >= c->max;
}

static void out_append(zctx *c, const uint8_t *p, size_t n)
{
    if (c->olen + n > c->ocap) {
        size_t cap = c->ocap ? c->ocap * 2 : 256;
        while (cap < c->olen + n)
            cap *= 2;
        uint8_t *o = realloc(c->out, cap);
        if (!o)
            return; /* the frame is lost; the socket is broken anyway */
        c->out = o;
        c->ocap = cap;
    }
    memcpy(c->out + c->olen, p, n);
    c->olen += n;
}

/* A frame the codec wrote (pong, close): during feed it goes into the list between the messages,
 * so the reader writes it in order (a close reply after the echo of the message before it);
 * outside feed (ws:close) into the out buffer. */
static void on_send(kh_ws_conn *w, const uint8_t *h, size_t hl, const uint8_t *p, size_t n)
{
    zctx *c = zctx_of(w);
    if (c->L) {
        lua_State *L = c->L;
        int k = (int)lua_objlen(L, c->list);
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        luaL_addlstring(&b, (const char *)h, hl);
        luaL_addlstring(&b, (const char *)p, n);
        luaL_pushresult(&b);
        lua_rawseti(L, c->list, k + 1);
        lua_pushinteger(L, 0);
        lua_rawseti(L, c->list, k + 2);
        return;
    }
    out_append(c, h, hl);
    if (n)
        out_append(c, p, n);
}

static int on_inflate(kh_ws_conn *w, const uint8_t *in, size_t n, uint64_t max, uint8_t **out,
                      size_t *outlen)
{
    zctx *z = zctx_of(w);
    if (!z->has_inf) {
        if (kh_ws_inflater_init(&z->inf) != 0)
            return KH_WS_CLOSE_INTERNAL;
        z->has_inf = 1;
    }
    return kh_ws_inflate_msg(&z->inf, in, n, max, out, outlen);
}

static const kh_ws_cbs CBS = {on_message, on_send, NULL, on_inflate};

/* The ws object at index 1, told from any other userdata by its size and a magic word (these
 * run several times per message: luaL_checkudata would intern the metatable's name each time,
 * and a metatable comparison costs as much again). */
static codec *to_codec(lua_State *L)
{
    codec *c = lua_touserdata(L, 1);
    if (c == NULL || lua_objlen(L, 1) != sizeof *c || c->magic != CODEC_MAGIC)
        luaL_typerror(L, 1, "websocket");
    return c;
}

static zctx *get_zctx(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

/* codec(deflate_bits, s, gen, env, proto) -> the ws object. Its limits (ws_message_bytes,
 * ws_frame_bytes) are the worker's, in the kh_ws_cfg every codec of the worker shares. */
static int l_codec(lua_State *L)
{
    int bits = (int)luaL_optinteger(L, 1, 0);
    luaL_checktype(L, 4, LUA_TTABLE);
    codec *c = lua_newuserdata(L, sizeof *c);
    memset(c, 0, sizeof *c);
    zctx *z = get_zctx(L);
    if (z->cfg.max_message == 0) { /* the first codec: the limits are set once per worker */
        const kh_limits *l = ((kh_lua *)lua_touserdata(L, lua_upvalueindex(2)))->w->limits;
        z->cfg.max_message = l->ws_message_bytes;
        z->cfg.max_frame = l->ws_frame_bytes;
    }
    c->bits = bits >= 9 && bits <= 15 ? (uint8_t)bits : 0;
    c->s = lua_touserdata(L, 2);
    c->gen = (uint32_t)lua_tointeger(L, 3);
    c->proto = (uint8_t)luaL_optinteger(L, 5, 0);
    c->magic = CODEC_MAGIC;
    kh_ws_conn_init(&c->w, &z->cfg, c->bits != 0);
    luaL_getmetatable(L, CODEC_MT);
    lua_setmetatable(L, -2);
    lua_pushvalue(L, 4);
    lua_setfenv(L, -2);
    return 1;
}

/* st(ws) -> s, gen, flags */
static int l_st(lua_State *L)
{
    codec *c = to_codec(L);
    lua_pushlightuserdata(L, c->s);
    lua_pushinteger(L, (lua_Integer)c->gen);
    lua_pushinteger(L, c->flags);
    return 3;
}

/* move(ws, s, gen): its stream moved (core.stream_hold: a compact stream) */
static int l_move(lua_State *L)
{
    codec *c = to_codec(L);
    c->s = lua_touserdata(L, 2);
    c->gen = (uint32_t)luaL_checkinteger(L, 3);
    return 0;
}

/* flags_at() -> the offset of the state bits in the ws object (websocket.lua reads them with
 * the FFI: no C call per check) */
static int l_flags_at(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)offsetof(codec, flags));
    return 1;
}

/* flag(ws, bits) -> flags: sets bits (never cleared) */
static int l_flag(lua_State *L)
{
    codec *c = to_codec(L);
    c->flags |= (uint8_t)luaL_checkinteger(L, 2);
    lua_pushinteger(L, c->flags);
    return 1;
}

/* code(ws[, code]) -> code (0 while unknown): sets it when given */
static int l_code(lua_State *L)
{
    codec *c = to_codec(L);
    if (!lua_isnoneornil(L, 2))
        c->code = (uint16_t)luaL_checkinteger(L, 2);
    lua_pushinteger(L, c->code);
    return 1;
}

/* pn(ws[, pn]) -> pn: its number in khamsin.push */
static int l_pn(lua_State *L)
{
    codec *c = to_codec(L);
    if (!lua_isnoneornil(L, 2))
        c->pn = luaL_checknumber(L, 2);
    lua_pushnumber(L, c->pn);
    return 1;
}

/* env(ws) -> the route's table, the subprotocol's index (0: none) */
static int l_env(lua_State *L)
{
    codec *c = to_codec(L);
    lua_getfenv(L, 1);
    lua_pushinteger(L, c->proto);
    return 2;
}

/* meta() -> the ws objects' metatable (websocket.lua adds __index and the methods) */
static int l_meta(lua_State *L)
{
    luaL_getmetatable(L, CODEC_MT);
    return 1;
}

static int codec_gc(lua_State *L)
{
    codec *c = to_codec(L);
    kh_ws_conn_free(&c->w);
    return 0;
}

static void push_out(lua_State *L, zctx *c)
{
    if (c->olen)
        lua_pushlstring(L, (const char *)c->out, c->olen);
    else
        lua_pushnil(L);
    c->olen = 0;
    if (c->ocap > 4096) { /* a burst of pongs: give the memory back */
        free(c->out);
        c->out = NULL;
        c->ocap = 0;
    }
}

/* feed(codec, chunk, list, max) -> status ("ok"|"paused"|"closed"), used, nil, code; list gets
 * (message, binary) and (frame, 0) pairs; it pauses after max messages */
static int l_feed(lua_State *L)
{
    codec *c = to_codec(L);
    size_t n;
    const char *p = luaL_checklstring(L, 2, &n);
    luaL_checktype(L, 3, LUA_TTABLE);
    int max = (int)luaL_optinteger(L, 4, 1 << 30);
    zctx *z = get_zctx(L);
    if (n > z->scap) {
        uint8_t *b = realloc(z->scratch, n);
        if (!b)
            return luaL_error(L, "out of memory");
        z->scratch = b;
        z->scap = n;
    }
    memcpy(z->scratch, p, n); /* unmasked in place */
    z->L = L;
    z->list = 3;
    z->count = 0;
    z->max = max < 1 ? 1 : max;
    size_t used = 0;
    int r = kh_ws_conn_feed(&c->w, z->scratch, n, &used);
    z->L = NULL;
    if (z->scap > 65536) { /* keep a big frame's scratch no longer than this call */
        free(z->scratch);
        z->scratch = NULL;
        z->scap = 0;
    }
    lua_pushstring(L, r == KH_WS_OK ? "ok" : r == KH_WS_PAUSED ? "paused" : "closed");
    lua_pushinteger(L, (lua_Integer)used);
    push_out(L, z);
    lua_pushinteger(L, c->w.close_code);
    return 4;
}

/* frame(codec, opcode, data) -> the bytes of one server frame (data messages compressed when
 * permessage-deflate was negotiated) */
static int l_frame(lua_State *L)
{
    codec *c = to_codec(L);
    int op = (int)luaL_checkinteger(L, 2);
    size_t n;
    const char *p = luaL_checklstring(L, 3, &n);
    uint8_t hdr[KH_WS_HDR_MAX];
    uint8_t *z = NULL;
    size_t zl = 0;
    int rsv1 = 0;
    if (c->bits && (op == KH_WS_OP_TEXT || op == KH_WS_OP_BINARY)) {
        zctx *x = zctx_of(&c->w);
        if (!x->has_def[c->bits]) {
            if (kh_ws_deflater_init(&x->def[c->bits], c->bits) != 0)
                return luaL_error(L, "zlib: deflateInit failed");
            x->has_def[c->bits] = 1;
        }
        if (kh_ws_deflate_msg(&x->def[c->bits], (const uint8_t *)p, n, &z, &zl) != 0)
            return luaL_error(L, "zlib: deflate failed");
        p = (const char *)z;
        n = zl;
        rsv1 = 1;
    }
    size_t hl = kh_ws_frame_header(hdr, op, 1, rsv1, n);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addlstring(&b, (const char *)hdr, hl);
    luaL_addlstring(&b, p, n);
    free(z);
    luaL_pushresult(&b);
    return 1;
}

/* close(codec, code, reason) -> the close frame, or nil when one was already sent */
static int l_close(lua_State *L)
{
    codec *c = to_codec(L);
    unsigned code = (unsigned)luaL_optinteger(L, 2, 0);
    size_t n = 0;
    const char *r = luaL_optlstring(L, 3, "", &n);
    kh_ws_conn_close(&c->w, code, r, n);
    push_out(L, zctx_of(&c->w));
    return 1;
}

/* state(codec) -> close_sent, closed, close_code */
static int l_state(lua_State *L)
{
    codec *c = to_codec(L);
    lua_pushboolean(L, c->w.close_sent);
    lua_pushboolean(L, c->w.closed);
    lua_pushinteger(L, c->w.close_code);
    return 3;
}

static int l_accept(lua_State *L)
{
    size_t n;
    const char *key = luaL_checklstring(L, 1, &n);
    if (!kh_ws_key_ok(key, n)) {
        lua_pushnil(L);
        return 1;
    }
    char out[KH_WS_ACCEPT_LEN];
    kh_ws_accept(key, n, out);
    lua_pushlstring(L, out, sizeof out);
    return 1;
}

static int l_version_ok(lua_State *L)
{
    size_t n;
    const char *v = luaL_checklstring(L, 1, &n);
    lua_pushboolean(L, kh_ws_version_ok(v, n));
    return 1;
}

static int l_has_token(lua_State *L)
{
    size_t n;
    const char *v = luaL_checklstring(L, 1, &n);
    lua_pushboolean(L, kh_ws_has_token(v, n, luaL_checkstring(L, 2)));
    return 1;
}

/* pmd(offer) -> response extension, server window bits | nil */
static int l_pmd(lua_State *L)
{
    size_t n;
    const char *v = luaL_checklstring(L, 1, &n);
    kh_ws_pmd pmd;
    char resp[160];
    size_t rl = kh_ws_pmd_negotiate(v, n, &pmd, resp, sizeof resp);
    if (!rl) {
        lua_pushnil(L);
        return 1;
    }
    lua_pushlstring(L, resp, rl);
    lua_pushinteger(L, pmd.server_max_window_bits);
    return 2;
}

static int l_close_code_ok(lua_State *L)
{
    lua_Integer c = luaL_checkinteger(L, 1);
    lua_pushboolean(L, c > 0 && c < 65536 && kh_ws_close_code_ok((unsigned)c));
    return 1;
}

/* ws_limits() -> {message_bytes, frame_bytes, queue, deflate, close_timeout (s)} */
static int l_limits(lua_State *L)
{
    const kh_limits *l = ((kh_lua *)lua_touserdata(L, lua_upvalueindex(2)))->w->limits;
    lua_createtable(L, 0, 5);
    lua_pushnumber(L, (lua_Number)l->ws_message_bytes);
    lua_setfield(L, -2, "message_bytes");
    lua_pushnumber(L, (lua_Number)l->ws_frame_bytes);
    lua_setfield(L, -2, "frame_bytes");
    lua_pushnumber(L, (lua_Number)l->ws_queue);
    lua_setfield(L, -2, "queue");
    lua_pushboolean(L, l->ws_deflate != 0);
    lua_setfield(L, -2, "deflate");
    lua_pushnumber(L, (lua_Number)l->ws_close_timeout_ms / 1000.0);
    lua_setfield(L, -2, "close_timeout");
    return 1;
}

/* Sets the ws_* functions on the table on top. */
void kh__lua_open_ws(lua_State *L, kh_lua *K)
{
    static const luaL_Reg fns[] = {
        {"ws_codec", l_codec},       {"ws_feed", l_feed},           {"ws_frame", l_frame},
        {"ws_close", l_close},       {"ws_state", l_state},         {"ws_accept", l_accept},
        {"ws_version_ok", l_version_ok}, {"ws_has_token", l_has_token}, {"ws_pmd", l_pmd},
        {"ws_close_code_ok", l_close_code_ok}, {"ws_limits", l_limits}, {"ws_st", l_st},
        {"ws_flag", l_flag}, {"ws_code", l_code}, {"ws_pn", l_pn}, {"ws_env", l_env},
        {"ws_meta", l_meta}, {"ws_move", l_move}, {"ws_flags_at", l_flags_at}, {NULL, NULL},
    };
    if (luaL_newmetatable(L, CODEC_MT)) {
        lua_pushcfunction(L, codec_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    if (luaL_newmetatable(L, ZCTX_MT)) {
        lua_pushcfunction(L, zctx_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    zctx *z = lua_newuserdata(L, sizeof *z);
    memset(z, 0, sizeof *z);
    z->cfg.cb = CBS;
    luaL_getmetatable(L, ZCTX_MT);
    lua_setmetatable(L, -2);
    int zi = lua_gettop(L);
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushvalue(L, zi);
        lua_pushlightuserdata(L, K);
        lua_pushcclosure(L, f->func, 2);
        lua_setfield(L, zi - 1, f->name);
    }
    lua_pop(L, 1);
}
