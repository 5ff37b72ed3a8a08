/* kh_lua_multipart.c: core.mp_new, the Lua face of core/kh_multipart (req:multipart's parser),
 * and core.limit (the few limits the Lua side of forms and uploads reads).
 * Owns:  one userdata per parser: the kh_multipart and its header buffer, freed by the GC.
 * In:    mp_new(boundary, max_parts, max_header_bytes, max_part_bytes, max_total_bytes);
 *        p:next(chunk, off) called by lua/khamsin/multipart.lua with each chunk of the body.
 * Out:   one event per call: off, "header", name, value | off, "headers_end" | off, "data", bytes
 *        | off, "part_end" | off, "done" | off, "more" | off, "error", reason. off is 0-based, the
 *        position after what the event consumed; the caller calls again from there.
 * Never: yields, keeps a chunk, or knows where the chunks come from (today the buffered body,
 *        later req:body_reader()). */
#include <stdlib.h>
#include <string.h>

#include "kh_lua_internal.h"
#include "kh_multipart.h"

#define MP_MT "khamsin.multipart"

typedef struct lmp {
    kh_multipart p;
    char hbuf[]; /* max_header_bytes */
} lmp;

static uint64_t arg_u64(lua_State *L, int i)
{
    lua_Number n = luaL_checknumber(L, i);
    if (!(n >= 1) || n > 1099511627776.0)
        luaL_argerror(L, i, "a limit must be a number from 1 to 2^40");
    return (uint64_t)n;
}

/* mp_new(boundary, max_parts, max_header_bytes, max_part_bytes, max_total_bytes)
 * -> parser | nil, reason (a bad boundary) */
static int l_mp_new(lua_State *L)
{
    size_t blen;
    const char *b = luaL_checklstring(L, 1, &blen);
    kh_mp_limits lim = {arg_u64(L, 2), arg_u64(L, 3), arg_u64(L, 4), arg_u64(L, 5)};
    if (lim.max_header_bytes > (1u << 20))
        luaL_argerror(L, 3, "max_header_bytes is at most 1 MiB");
    lmp *m = lua_newuserdata(L, sizeof *m + (size_t)lim.max_header_bytes);
    if (kh_mp_init(&m->p, b, blen, m->hbuf, &lim) != 0) {
        lua_pushnil(L);
        lua_pushstring(L, m->p.error);
        return 2;
    }
    luaL_getmetatable(L, MP_MT);
    lua_setmetatable(L, -2);
    return 1;
}

static int l_next(lua_State *L)
{
    lmp *m = luaL_checkudata(L, 1, MP_MT);
    size_t len;
    const char *in = luaL_optlstring(L, 2, "", &len);
    lua_Number o = luaL_optnumber(L, 3, 0);
    if (!(o >= 0) || o > (lua_Number)len)
        luaL_argerror(L, 3, "offset outside the chunk");
    size_t off = (size_t)o;
    int ev = kh_mp_next(&m->p, in, len, &off);
    lua_pushnumber(L, (lua_Number)off);
    switch (ev) {
    case KH_MP_HEADER:
        lua_pushliteral(L, "header");
        lua_pushlstring(L, m->p.name, m->p.name_len);
        lua_pushlstring(L, m->p.value, m->p.value_len);
        return 4;
    case KH_MP_HEADERS_END:
        lua_pushliteral(L, "headers_end");
        return 2;
    case KH_MP_DATA:
        lua_pushliteral(L, "data");
        lua_pushlstring(L, m->p.data, m->p.len);
        return 3;
    case KH_MP_PART_END:
        lua_pushliteral(L, "part_end");
        return 2;
    case KH_MP_DONE:
        lua_pushliteral(L, "done");
        return 2;
    case KH_MP_NEED_MORE:
        lua_pushliteral(L, "more");
        return 2;
    default:
        lua_pushliteral(L, "error");
        lua_pushstring(L, m->p.error);
        return 3;
    }
}

/* p:finish() -> true | nil, reason */
static int l_finish(lua_State *L)
{
    lmp *m = luaL_checkudata(L, 1, MP_MT);
    if (kh_mp_finish(&m->p) == 0) {
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushnil(L);
    lua_pushstring(L, m->p.error);
    return 2;
}

/* limit(name) -> the worker's value of a limit the forms code reads */
static int l_limit(lua_State *L)
{
    kh_lua *K = lua_touserdata(L, lua_upvalueindex(1));
    const char *n = luaL_checkstring(L, 1);
    const kh_limits *l = K->w->limits;
    uint64_t v;
    if (strcmp(n, "body_bytes") == 0)
        v = l->body_bytes;
    else if (strcmp(n, "form_fields") == 0)
        v = l->form_fields;
    else if (strcmp(n, "multipart_parts") == 0)
        v = l->multipart_parts;
    else if (strcmp(n, "multipart_header_bytes") == 0)
        v = l->multipart_header_bytes;
    else if (strcmp(n, "multipart_part_bytes") == 0)
        v = l->multipart_part_bytes;
    else
        return luaL_argerror(L, 1, "not a limit the forms code reads");
    lua_pushnumber(L, (lua_Number)v);
    return 1;
}

/* Sets mp_new and limit on the core table on top. */
void kh__lua_open_multipart(lua_State *L, kh_lua *K)
{
    if (luaL_newmetatable(L, MP_MT)) {
        lua_newtable(L);
        lua_pushcfunction(L, l_next);
        lua_setfield(L, -2, "next");
        lua_pushcfunction(L, l_finish);
        lua_setfield(L, -2, "finish");
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, l_mp_new);
    lua_setfield(L, -2, "mp_new");
    lua_pushlightuserdata(L, K);
    lua_pushcclosure(L, l_limit, 1);
    lua_setfield(L, -2, "limit");
}
