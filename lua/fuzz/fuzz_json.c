/* fuzz_json.c: libFuzzer target for k.json's codec (lua/kh_lua_json.c), in a Lua state of its
 * own. It lives under lua/ because it includes lua.h (core/ never does); its corpus and
 * regressions are with the others, core/fuzz/{corpus,regress}/json.
 * Owns:  one lua_State for the process (collected every 256 inputs, closed at exit).
 * In:    any bytes, decoded with max_depth 64.
 * Out:   a trap on any broken property:
 *        - a failed decode returns nil, a message and a path that starts with '$';
 *        - a decoded value encodes, unless it holds an infinite number ("1e999");
 *        - that encoding decodes again, and encodes to a text of the same length (object keys
 *          may come out in another order, nothing else may change). */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kh_lua_json.h"

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static lua_State *L;
static unsigned runs;

static void close_state(void)
{
    lua_close(L); /* frees the codec's buffer (a userdata's __gc): LeakSanitizer stays quiet */
}

/* fn(arg, 64) from the table at index 1 -> leaves 3 results */
static void call(const char *fn, int arg)
{
    lua_getfield(L, 1, fn);
    lua_pushvalue(L, arg);
    lua_pushinteger(L, 64);
    lua_call(L, 2, 3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (L == NULL) {
        L = luaL_newstate();
        CHECK(L != NULL);
        lua_newtable(L);
        kh__lua_open_json(L);
        lua_setglobal(L, "J");
        atexit(close_state);
    }
    lua_settop(L, 0);
    lua_getglobal(L, "J");                          /* 1 */
    lua_pushlstring(L, (const char *)data, size);   /* 2 */
    call("json_decode", 2);                         /* 3, 4, 5 */
    if (lua_isnil(L, 3)) {
        CHECK(lua_type(L, 4) == LUA_TSTRING && lua_type(L, 5) == LUA_TSTRING);
        CHECK(lua_tostring(L, 5)[0] == '$');
    } else {
        call("json_encode", 3);                     /* 6, 7, 8 */
        if (lua_isnil(L, 6)) {
            CHECK(lua_type(L, 7) == LUA_TSTRING);
            CHECK(strstr(lua_tostring(L, 7), "infinite") != NULL);
        } else {
            call("json_decode", 6);                 /* 9, 10, 11 */
            CHECK(!lua_isnil(L, 9));
            call("json_encode", 9);                 /* 12, 13, 14 */
            CHECK(lua_type(L, 12) == LUA_TSTRING);
            CHECK(lua_objlen(L, 12) == lua_objlen(L, 6));
        }
    }
    lua_settop(L, 0);
    if (++runs % 256 == 0)
        lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
}
