/* kh_lua_sched.c: a coroutine per request (lua-nginx-module's discipline, style.md §4).
 * Owns:  the worker's free list of finished coroutines and the resume/finish path.
 * In:    dispatch / on_body / on_abort from core.
 * Out:   lua_resume (only kh__lua_resume calls it); stream refs released when a coroutine ends;
 *        500 replies for errors that escape the Lua runner.
 * Never: nests lua_resume calls: every resume starts from a libuv callback. */
#include <stdio.h>
#include <string.h>

#include "kh_err.h"
#include "kh_log.h"
#include "kh_lua_internal.h"

char kh__lua_yield_sentinel;

static kh_lua_co *get_co(kh_lua *K)
{
    kh_lua_co *c = K->free_cos;
    if (c) {
        K->free_cos = c->next_free;
        K->num_free--;
        return c;
    }
    c = kh_xcalloc(1, sizeof *c);
    c->co = lua_newthread(K->L);
    c->ref = luaL_ref(K->L, LUA_REGISTRYINDEX);
    return c;
}

static void drop_co(kh_lua *K, kh_lua_co *c)
{
    luaL_unref(K->L, LUA_REGISTRYINDEX, c->ref);
    free(c);
}

static void put_co(kh_lua *K, kh_lua_co *c, int clean)
{
    if (!clean) {
        /* luajit2's lua_resetthread makes an errored thread reusable; dropping it is simpler
         * and errors are rare */
        drop_co(K, c);
        return;
    }
    lua_settop(c->co, 0);
    if (K->num_free >= K->w->limits->lua_coroutine_cache) {
        drop_co(K, c);
        return;
    }
    c->next_free = K->free_cos;
    K->free_cos = c;
    K->num_free++;
}

void kh__lua_close_cos(kh_lua *K)
{
    while (K->free_cos) {
        kh_lua_co *c = K->free_cos;
        K->free_cos = c->next_free;
        free(c);
    }
}

static void finish(kh_lua *K, kh_lua_co *c, int clean)
{
    kh_stream *s = c->s;
    c->s = NULL;
    if (s) {
        s->app_data = NULL;
        s->app_wait = KH_WAIT_NONE;
        s->flags &= ~KH_STREAM_F_APP;
        if (s->proto && !(s->flags & KH_STREAM_F_ENDED)) {
            /* the runner always answers; reaching this means it failed before it could */
            kh_stream_respond_error(s, 500, "Internal Server Error", 0);
        }
        kh_stream_release(s);
    }
    put_co(K, c, clean);
}

void kh__lua_resume(kh_lua *K, kh_lua_co *c, int nargs)
{
    lua_State *co = c->co;
    int st = lua_resume(co, nargs);
    if (st == LUA_YIELD) {
        if (lua_gettop(co) >= 1 && lua_touserdata(co, -1) == KH_YIELD && c->s &&
            c->s->app_wait != KH_WAIT_NONE) {
            lua_settop(co, 0);
            return; /* parked until its event comes */
        }
        KH_LOG_ERROR("%.*s %.*s: the handler yielded outside a khamsin wait (coroutine.yield "
                     "at the top level of a handler is not allowed)",
                     c->s ? (int)c->s->method.len : 0, c->s ? c->s->method.ptr : "",
                     c->s ? (int)c->s->path.len : 0, c->s ? c->s->path.ptr : "");
        finish(K, c, 0);
        return;
    }
    if (st != 0) {
        const char *msg = lua_tostring(co, -1);
        luaL_traceback(K->L, co, msg ? msg : "(error object is not a string)", 0);
        KH_LOG_ERROR("request failed in khamsin's runner: %s", lua_tostring(K->L, -1));
        lua_pop(K->L, 1);
        finish(K, c, 0);
        return;
    }
    finish(K, c, 1);
}

void kh__lua_dispatch(void *app, kh_stream *s)
{
    kh_lua *K = app;
    kh_lua_co *c = get_co(K);
    c->s = s;
    s->app_data = c;
    lua_State *co = c->co;
    lua_rawgeti(co, LUA_REGISTRYINDEX, K->run_ref);
    lua_rawgeti(co, LUA_REGISTRYINDEX, (int)s->route_value);
    lua_pushlightuserdata(co, s);
    lua_pushinteger(co, (lua_Integer)s->gen);
    kh__lua_resume(K, c, 3);
}

void kh__lua_on_body(void *app, kh_stream *s)
{
    kh_lua *K = app;
    kh_lua_co *c = s->app_data;
    if (c == NULL || s->app_wait != KH_WAIT_BODY)
        return;
    s->app_wait = KH_WAIT_NONE;
    lua_State *co = c->co;
    int n;
    switch (s->body_state) {
    case KH_BODY_COMPLETE:
        lua_pushlstring(co, s->body.base ? s->body.base : "", s->body.len);
        n = 1;
        break;
    case KH_BODY_TOO_LARGE:
        lua_pushnil(co);
        lua_pushliteral(co, "too large");
        n = 2;
        break;
    default:
        lua_pushnil(co);
        lua_pushliteral(co, "closed");
        n = 2;
        break;
    }
    kh__lua_resume(K, c, n);
}

void kh__lua_on_abort(void *app, kh_stream *s)
{
    kh_lua *K = app;
    kh_lua_co *c = s->app_data;
    if (c == NULL || s->app_wait == KH_WAIT_NONE)
        return; /* running now: its next send or wait sees the stream closed */
    s->app_wait = KH_WAIT_NONE;
    lua_pushnil(c->co);
    lua_pushliteral(c->co, "closed");
    kh__lua_resume(K, c, 2);
}
