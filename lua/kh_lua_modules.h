/* kh_lua_modules.h: khamsin's own Lua modules (lua/khamsin.lua and the files in lua/khamsin/) compiled to
 * LuaJIT bytecode at build time (cmake/kh_lua_bytecode.cmake writes kh_lua_bc_modules) and
 * served from package.preload, so a worker's state neither searches package.path nor parses
 * them at start-up. */
#ifndef KH_LUA_MODULES_H
#define KH_LUA_MODULES_H

#include <stddef.h>

#include <lua.h>

typedef struct kh_lua_bc {
    const char *name;          /* "khamsin.request"; NULL ends the table */
    const unsigned char *code; /* `luajit -b -g` output: debug info kept for tracebacks */
    size_t size;
    const char *src;           /* the source it was compiled from */
    long long mtime;           /* that source's mtime at build time, in seconds */
} kh_lua_bc;

/* Generated; empty (just the end) when the build had no luajit or KH_LUA_BYTECODE=OFF. */
extern const kh_lua_bc kh_lua_bc_modules[];

/* Puts each embedded module in package.preload, except when $KHAMSIN_LUA_PATH is set (then
 * every module comes from there). A module whose source was edited since the build (its mtime
 * differs, looked at when it is required) loads from that file: an edit works without a
 * rebuild. */
void kh__lua_modules_preload(lua_State *L);

#endif
