/* kh_lua.h: the Lua binding as core sees it: one kh_app_vt. Everything else about Lua stays in
 * lua/ (the layering test enforces it). */
#ifndef KH_LUA_H
#define KH_LUA_H

#include "kh_app.h"

extern const kh_app_vt kh_lua_app;

#endif
