/* kh_lua_shared.c: k.shared(name), the binding of kh_shdict.
 * Owns:  nothing: dicts belong to the process registry (main); values are copied in and out.
 * In:    calls from lua/khamsin/shared.lua.
 * Out:   Lua values (nil, booleans, numbers, strings).
 * Never: keeps a pointer into a dict past a call, or holds its lock while Lua runs. */
#include <stdio.h>
#include <string.h>

#include "kh_err.h"
#include "kh_lua_internal.h"
#include "kh_shdict.h"

#define K_UPVALUE(L) ((kh_lua *)lua_touserdata((L), lua_upvalueindex(1)))

static kh_shdict *dict_at(lua_State *L)
{
    kh_shdict *d = lua_touserdata(L, 1);
    if (d == NULL)
        luaL_argerror(L, 1, "not a shared dict");
    return d;
}

static uint64_t ttl_at(lua_State *L, int idx)
{
    if (lua_isnoneornil(L, idx))
        return 0;
    double t = luaL_checknumber(L, idx);
    if (!(t >= 0) || t > 1e9)
        luaL_argerror(L, idx, "ttl must be seconds from 0 (none) to 1e9");
    return (uint64_t)(t * 1000.0 + 0.5);
}

/* shdict_declare(name, bytes) -> dict | nil, message (declared before with another size) */
static int l_declare(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    const char *name = luaL_checkstring(L, 1);
    double bytes = luaL_checknumber(L, 2);
    if (!(bytes >= KH_SHDICT_MIN_BYTES) || bytes > 1099511627776.0)
        return luaL_argerror(L, 2, "size must be bytes from 4096 to 1 TiB");
    char err[256];
    kh_shdict *d = kh_shdict_declare(K->w->cfg->shdicts, name, (size_t)bytes, err, sizeof err);
    if (d == NULL) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    lua_pushlightuserdata(L, d);
    return 1;
}

static int l_find(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_shdict *d = kh_shdict_find(K->w->cfg->shdicts, luaL_checkstring(L, 1));
    if (d == NULL)
        return 0;
    lua_pushlightuserdata(L, d);
    return 1;
}

static int l_get(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_shdict *d = dict_at(L);
    size_t kl;
    const char *key = luaL_checklstring(L, 2, &kl);
    kh_shdict_value v;
    if (kh_shdict_get(d, key, kl, &v, &K->sh_buf, &K->sh_cap) != 0) {
        lua_pushnil(L);
        return 1;
    }
    switch (v.type) {
    case KH_SHDICT_BOOL:
        lua_pushboolean(L, v.num != 0);
        break;
    case KH_SHDICT_NUMBER:
        lua_pushnumber(L, v.num);
        break;
    case KH_SHDICT_STRING:
        lua_pushlstring(L, v.str, v.len);
        break;
    default:
        lua_pushnil(L);
    }
    return 1;
}

/* set(d, key, value, ttl, mode) -> true | false, "exists" | false, "not found" | nil,
 * "no memory"; plus evictions. mode: 0 set, 1 add, 2 replace (kh_shdict.h). */
static int l_set(lua_State *L)
{
    kh_shdict *d = dict_at(L);
    size_t kl;
    const char *key = luaL_checklstring(L, 2, &kl);
    kh_shdict_value v = {KH_SHDICT_NIL, 0, NULL, 0};
    switch (lua_type(L, 3)) {
    case LUA_TNIL:
    case LUA_TNONE:
        break;
    case LUA_TBOOLEAN:
        v.type = KH_SHDICT_BOOL;
        v.num = lua_toboolean(L, 3);
        break;
    case LUA_TNUMBER:
        v.type = KH_SHDICT_NUMBER;
        v.num = lua_tonumber(L, 3);
        break;
    case LUA_TSTRING:
        v.type = KH_SHDICT_STRING;
        v.str = lua_tolstring(L, 3, &v.len);
        break;
    default:
        return luaL_argerror(L, 3, "shared dict values are strings, numbers, booleans or nil");
    }
    uint64_t ttl = ttl_at(L, 4);
    int evicted = 0;
    int r = kh_shdict_set(d, key, kl, &v, ttl, (int)luaL_optinteger(L, 5, KH_SHDICT_SET), &evicted);
    if (r == KH_SHDICT_EXISTS || r == KH_SHDICT_NOT_FOUND) {
        lua_pushboolean(L, 0);
        if (r == KH_SHDICT_EXISTS)
            lua_pushliteral(L, "exists");
        else
            lua_pushliteral(L, "not found");
        return 2;
    }
    if (r != 0) {
        lua_pushnil(L);
        lua_pushliteral(L, "no memory");
        return 2;
    }
    lua_pushboolean(L, 1);
    lua_pushnil(L);
    lua_pushinteger(L, evicted);
    return 3;
}

/* incr(d, key, delta, init, ttl) -> new value | nil, "not found" | "not a number" | "no memory" */
static int l_incr(lua_State *L)
{
    kh_shdict *d = dict_at(L);
    size_t kl;
    const char *key = luaL_checklstring(L, 2, &kl);
    double delta = luaL_optnumber(L, 3, 1);
    int has_init = !lua_isnoneornil(L, 4);
    double init = has_init ? luaL_checknumber(L, 4) : 0;
    double out = 0;
    int r = kh_shdict_incr(d, key, kl, delta, has_init, init, ttl_at(L, 5), &out);
    if (r == 0) {
        lua_pushnumber(L, out);
        return 1;
    }
    lua_pushnil(L);
    lua_pushstring(L, r == KH_SHDICT_NOT_FOUND    ? "not found"
                      : r == KH_SHDICT_NOT_NUMBER ? "not a number"
                                                  : "no memory");
    return 2;
}

static int l_delete(lua_State *L)
{
    kh_shdict *d = dict_at(L);
    size_t kl;
    const char *key = luaL_checklstring(L, 2, &kl);
    lua_pushboolean(L, kh_shdict_delete(d, key, kl) == 0);
    return 1;
}

/* ttl(d, key) -> seconds left (0: never expires) | nil, "not found" */
static int l_ttl(lua_State *L)
{
    kh_shdict *d = dict_at(L);
    size_t kl;
    const char *key = luaL_checklstring(L, 2, &kl);
    uint64_t left;
    if (kh_shdict_ttl(d, key, kl, &left) != 0) {
        lua_pushnil(L);
        lua_pushliteral(L, "not found");
        return 2;
    }
    lua_pushnumber(L, (double)left / 1000.0);
    return 1;
}

/* expire(d, key, ttl) -> true | false, "not found" */
static int l_expire(lua_State *L)
{
    kh_shdict *d = dict_at(L);
    size_t kl;
    const char *key = luaL_checklstring(L, 2, &kl);
    if (kh_shdict_expire(d, key, kl, ttl_at(L, 3)) != 0) {
        lua_pushboolean(L, 0);
        lua_pushliteral(L, "not found");
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* keys(d, max) -> { key, ... } (max 0: all), most recently used first */
static int l_keys(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_shdict *d = dict_at(L);
    lua_Number max = luaL_optnumber(L, 2, 1024);
    if (!(max >= 0) || max > 1e9)
        return luaL_argerror(L, 2, "max must be from 0 (all) to 1e9");
    size_t len;
    size_t n = kh_shdict_keys(d, (size_t)max, &K->sh_buf, &K->sh_cap, &len);
    lua_createtable(L, n < 1u << 26 ? (int)n : 0, 0);
    size_t o = 0;
    for (size_t i = 1; i <= n; i++) {
        uint32_t kl;
        memcpy(&kl, K->sh_buf + o, sizeof kl);
        lua_pushlstring(L, K->sh_buf + o + sizeof kl, kl);
        lua_rawseti(L, -2, (int)i);
        o += sizeof kl + kl;
    }
    return 1;
}

static int l_flush(lua_State *L)
{
    kh_shdict_flush_all(dict_at(L));
    return 0;
}

static int l_stats(lua_State *L)
{
    kh_shdict *d = dict_at(L);
    lua_pushinteger(L, (lua_Integer)kh_shdict_count(d));
    lua_pushinteger(L, (lua_Integer)kh_shdict_used(d));
    lua_pushinteger(L, (lua_Integer)kh_shdict_capacity(d));
    return 3;
}

void kh__lua_open_shared(lua_State *L, kh_lua *K)
{
    static const luaL_Reg fns[] = {
        {"shdict_declare", l_declare}, {"shdict_find", l_find},   {"shdict_get", l_get},
        {"shdict_set", l_set},         {"shdict_incr", l_incr},   {"shdict_delete", l_delete},
        {"shdict_flush", l_flush},     {"shdict_stats", l_stats}, {"shdict_ttl", l_ttl},
        {"shdict_expire", l_expire},   {"shdict_keys", l_keys},   {NULL, NULL},
    };
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushlightuserdata(L, K);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
}
