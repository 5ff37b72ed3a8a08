/* kh_lua_internal.h: shared between the binding's files (state, scheduler, core functions).
 * Owns:  struct kh_lua, one per worker, and struct kh_lua_co, one per running request. */
#ifndef KH_LUA_INTERNAL_H
#define KH_LUA_INTERNAL_H

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "kh_router.h"
#include "kh_stream.h"
#include "kh_worker.h"

/* What a yielded coroutine waits for (kh_stream.app_wait). */
enum { KH_WAIT_NONE = 0, KH_WAIT_BODY = 1 };

typedef struct kh_lua_co {
    lua_State *co;
    int ref;             /* registry ref anchoring co */
    kh_stream *s;
    struct kh_lua_co *next_free;
} kh_lua_co;

typedef struct kh_lua {
    lua_State *L;
    kh_worker *w;
    kh_router *router;
    int run_ref;         /* khamsin's request runner: run(handler, stream, gen) */
    kh_lua_co *free_cos;
    size_t num_free;
    int dev;
} kh_lua;

/* The sentinel every engine wait yields, so a user coroutine wrapper can pass it upward. */
extern char kh__lua_yield_sentinel;
#define KH_YIELD ((void *)&kh__lua_yield_sentinel)

/* Registers the `khamsin.core` C module in L (package.preload). */
void kh__lua_open_core(lua_State *L, kh_lua *K);
/* Resumes c with nargs values on its stack; the only caller of lua_resume. */
void kh__lua_resume(kh_lua *K, kh_lua_co *c, int nargs);

void kh__lua_dispatch(void *app, kh_stream *s);
void kh__lua_on_body(void *app, kh_stream *s);
void kh__lua_on_abort(void *app, kh_stream *s);
void kh__lua_close_cos(kh_lua *K);

#endif
