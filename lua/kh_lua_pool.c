/* kh_lua_pool.c: a pool thread's own lua_State and the running of one k.blocking job in it.
 * Owns:  one lua_State per pool thread (made and closed on that thread) and its cache of
 *        loaded functions (bytecode or "module.function" -> function). A reload (cfg->code_epoch
 *        moved) makes the state anew before the next job: the app's modules are required again
 *        from their files and no cached "module.function" outlives the code it came from.
 * In:    jobs from kh_threadpool (encoded by kh_lua_copy: kind, code, arguments).
 * Out:   the job's results (encoded) or its error with the pool's traceback.
 * Never: sees a worker's state or a stream; a job's error never escapes the pcall. */
#include <stdio.h>
#include <string.h>

#include "kh_log.h"
#include "kh_lua_copy.h"
#include "kh_lua_internal.h"

typedef struct pool_state {
    const kh_config *cfg;
    uint32_t epoch;    /* cfg->code_epoch when L was made */
    lua_State *L;
    int cache_ref; /* table: code string -> function */
    int cache_size;
} pool_state;

static int traceback(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL)
        msg = "(error object is not a string)";
    luaL_traceback(L, L, msg, 1);
    return 1;
}

static int state_open(pool_state *ps)
{
    ps->epoch = ps->cfg->code_epoch ? atomic_load(ps->cfg->code_epoch) : 0;
    ps->L = luaL_newstate();
    if (ps->L == NULL)
        return -1;
    luaL_openlibs(ps->L);
    kh__lua_set_path(ps->L, ps->cfg->script);
    lua_newtable(ps->L);
    ps->cache_ref = luaL_ref(ps->L, LUA_REGISTRYINDEX);
    ps->cache_size = 0;
    return 0;
}

void *kh__lua_pool_init(const kh_config *cfg, int index)
{
    (void)index;
    pool_state *ps = kh_xcalloc(1, sizeof *ps);
    ps->cfg = cfg;
    if (state_open(ps) != 0) {
        free(ps);
        return NULL;
    }
    return ps;
}

void kh__lua_pool_close(void *state)
{
    pool_state *ps = state;
    if (ps == NULL)
        return;
    if (ps->L)
        lua_close(ps->L);
    free(ps);
}

static void set_error(struct kh_lua_job *j, const char *msg, size_t len)
{
    j->status = 1;
    j->out = kh_xmalloc(len + 1);
    memcpy(j->out, msg, len);
    j->out[len] = '\0';
    j->out_len = len;
}

/* Pushes the function for (kind, code) at stack 1, 2: bytecode loaded once and cached; a name
 * "mod.fn" (or "mod.sub.fn") required once and cached. Returns 0, or -1 with a message pushed. */
static int load_fn(pool_state *ps, lua_State *L)
{
    size_t klen, clen;
    const char *kind = lua_tolstring(L, 1, &klen);
    const char *code = lua_tolstring(L, 2, &clen);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ps->cache_ref);
    lua_pushvalue(L, 2);
    lua_rawget(L, -2);
    if (lua_isfunction(L, -1)) {
        lua_remove(L, -2);
        return 0;
    }
    lua_pop(L, 1);
    if (ps->cache_size > 1000) { /* a bounded cache: start over */
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawseti(L, LUA_REGISTRYINDEX, ps->cache_ref);
        ps->cache_size = 0;
    }
    if (kind && strcmp(kind, "b") == 0) {
        if (luaL_loadbuffer(L, code, clen, "=k.blocking") != 0)
            return -1;
    } else {
        const char *dot = strrchr(code, '.');
        if (dot == NULL || dot == code || dot[1] == '\0') {
            lua_pushfstring(L, "'%s' is not \"module.function\"", code);
            return -1;
        }
        lua_getglobal(L, "require");
        lua_pushlstring(L, code, (size_t)(dot - code));
        if (lua_pcall(L, 1, 1, 0) != 0)
            return -1;
        if (!lua_istable(L, -1)) {
            lua_pushfstring(L, "module '%s' did not return a table",
                            lua_tostring(L, -2) ? code : code);
            return -1;
        }
        lua_getfield(L, -1, dot + 1);
        if (!lua_isfunction(L, -1)) {
            lua_pushfstring(L, "'%s' is not a function", code);
            return -1;
        }
        lua_remove(L, -2);
    }
    lua_pushvalue(L, 2);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4);
    ps->cache_size++;
    lua_remove(L, -2);
    return 0;
}

void kh__lua_pool_run(kh_job *job, void *state)
{
    struct kh_lua_job *j = (struct kh_lua_job *)job;
    pool_state *ps = state;
    if (ps == NULL) {
        const char *m = "k.blocking: the pool thread has no Lua state";
        set_error(j, m, strlen(m));
        return;
    }
    if (ps->cfg->code_epoch && atomic_load(ps->cfg->code_epoch) != ps->epoch) {
        /* a reload: what this state required may be stale */
        if (ps->L)
            lua_close(ps->L);
        ps->L = NULL;
        if (state_open(ps) != 0)
            ps->L = NULL;
    }
    if (ps->L == NULL) {
        const char *m = "k.blocking: the pool thread has no Lua state";
        set_error(j, m, strlen(m));
        return;
    }
    lua_State *L = ps->L;
    lua_settop(L, 0);
    int n = kh_lua_copy_decode(L, j->in, j->in_len);
    if (n < 2) {
        const char *m = "k.blocking: the job could not be decoded";
        set_error(j, m, strlen(m));
        lua_settop(L, 0);
        return;
    }
    if (load_fn(ps, L) != 0) {
        size_t len;
        const char *m = lua_tolstring(L, -1, &len);
        char buf[600];
        int bl = snprintf(buf, sizeof buf, "k.blocking: cannot load the function: %s", m ? m : "?");
        set_error(j, buf, (size_t)bl < sizeof buf ? (size_t)bl : sizeof buf - 1);
        lua_settop(L, 0);
        return;
    }
    /* stack: kind, code, args..., fn -> tb, fn, args... */
    int nargs = n - 2;
    lua_pushcfunction(L, traceback);
    lua_replace(L, 1); /* 1: traceback */
    lua_replace(L, 2); /* 2: fn; args at 3..n */
    int base = 1;
    if (lua_pcall(L, nargs, LUA_MULTRET, base) != 0) {
        size_t len;
        const char *m = lua_tolstring(L, -1, &len);
        lua_pushfstring(L, "k.blocking: %s", m ? m : "(error object is not a string)");
        m = lua_tolstring(L, -1, &len);
        set_error(j, m, len);
        lua_settop(L, 0);
        return;
    }
    kh_copybuf b = {NULL, 0, 0, j->max};
    char err[400];
    if (kh_lua_copy_encode(L, 2, lua_gettop(L), 1, &b, "result", err, sizeof err) != 0) {
        free(b.p);
        char buf[480];
        int bl = snprintf(buf, sizeof buf, "k.blocking: %s", err);
        set_error(j, buf, (size_t)bl < sizeof buf ? (size_t)bl : sizeof buf - 1);
        lua_settop(L, 0);
        return;
    }
    j->status = 0;
    j->out = b.p;
    j->out_len = b.len;
    lua_settop(L, 0);
}
