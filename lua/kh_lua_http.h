/* kh_lua_http.h: k.http's raw functions (http_*), set into the core table on top of the stack
 * (kh_lua_http.c). */
#ifndef KH_LUA_HTTP_H
#define KH_LUA_HTTP_H

#include <lua.h>

struct kh_lua;
void kh__lua_open_http(lua_State *L, struct kh_lua *K);

#endif
