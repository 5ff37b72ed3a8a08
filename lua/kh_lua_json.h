/* kh_lua_json.h: k.json's codec (kh_lua_json.c); needs only the Lua headers, so the fuzz target
 * lua/fuzz/fuzz_json.c builds it alone. */
#ifndef KH_LUA_JSON_H
#define KH_LUA_JSON_H

#include <lua.h>

/* Sets json_encode, json_decode, json_array, json_is_array and json_null on the table on top. */
void kh__lua_open_json(lua_State *L);

#endif
