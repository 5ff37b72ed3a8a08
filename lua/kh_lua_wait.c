/* kh_lua_wait.c: the waits and the cross-thread calls of khamsin.core: sleep, timer/every,
 * blocking (the pool), deferred replies' hold/release, publish and resolve.
 * Owns:  the uv timers it opens (closed with the state), pool jobs until they are submitted,
 *        mailbox messages until they are posted.
 * In:    calls from lua/khamsin*.lua on the worker's thread; timer callbacks; pool results.
 * Out:   yields of KH_YIELD with the coroutine's wait slot filled; wakes through kh__lua_wake;
 *        jobs to the pool; messages to other workers' mailboxes.
 * Never: blocks the loop (a full pool queue is refused at once); resumes a coroutine itself. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kh_err.h"
#include "kh_log.h"
#include "kh_lua_copy.h"
#include "kh_lua_internal.h"

#define K_UPVALUE(L) ((kh_lua *)lua_touserdata((L), lua_upvalueindex(1)))
#define TIMER_MT "khamsin.timer"

enum { TIMER_SLEEP = 1, TIMER_USER = 2 };

struct kh_lua_timer {
    uv_timer_t h;
    kh_lua *K;
    int kind;
    kh_lua_co *co;      /* TIMER_SLEEP: who sleeps */
    int fn_ref;         /* TIMER_USER: the callback */
    int internal;       /* TIMER_USER: the engine's own (a deferred reply's timeout): it goes on
                         * after a reload retired the state; the app's (k.timer, k.every) stop */
    kh_lua_timer **box; /* TIMER_USER: the Lua handle's pointer to us, NULL once collected */
    kh_lua_timer *prev, *next;
};

typedef struct kh_lua_msg {
    kh_chan_msg base;
    size_t len;
    char data[];
} kh_lua_msg;

/* "misuse", message: the Lua wrapper raises it at the app's line (errors.raise). A lua_error
 * raised here would name the wrapper's line in lua/khamsin.lua instead. */
static int misuse(lua_State *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lua_pushliteral(L, "misuse");
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    return 2;
}

/* The coroutine that may wait now, or NULL with "misuse", message pushed (2 values). */
static kh_lua_co *current(lua_State *L, kh_lua *K, const char *what)
{
    if (K->current == NULL) {
        misuse(L,
               "%s can only be called from a handler, a timer or a subscriber callback "
               "(not while the script loads)",
               what);
        return NULL;
    }
    if (K->current->wait != KH_WAIT_NONE) {
        misuse(L, "%s: this coroutine is already waiting", what);
        return NULL;
    }
    return K->current;
}

/* ---- timers ---- */

static void timer_free_cb(uv_handle_t *h)
{
    free(h->data);
}

static void timer_close(kh_lua_timer *t)
{
    kh_lua *K = t->K;
    if (t->prev)
        t->prev->next = t->next;
    else
        K->timers = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->prev = t->next = NULL;
    if (t->fn_ref != LUA_NOREF) {
        luaL_unref(K->L, LUA_REGISTRYINDEX, t->fn_ref);
        t->fn_ref = LUA_NOREF;
    }
    if (t->box) {
        *t->box = NULL;
        t->box = NULL;
    }
    uv_timer_stop(&t->h);
    uv_close((uv_handle_t *)&t->h, timer_free_cb);
}

void kh__lua_close_timers(kh_lua *K)
{
    while (K->timers)
        timer_close(K->timers);
}

void kh__lua_retire_timers(kh_lua *K)
{
    kh_lua_timer *t = K->timers;
    while (t) {
        kh_lua_timer *next = t->next;
        if (t->kind == TIMER_USER && !t->internal)
            timer_close(t);
        t = next;
    }
}

static kh_lua_timer *timer_open(kh_lua *K, int kind)
{
    kh_lua_timer *t = kh_xcalloc(1, sizeof *t);
    t->K = K;
    t->kind = kind;
    t->fn_ref = LUA_NOREF;
    uv_timer_init(&K->w->loop, &t->h);
    t->h.data = t;
    /* app timers never keep a stopping worker alive: its connections do, while they last */
    uv_unref((uv_handle_t *)&t->h);
    t->next = K->timers;
    if (K->timers)
        K->timers->prev = t;
    K->timers = t;
    return t;
}

static uint64_t seconds_to_ms(lua_State *L, int idx)
{
    double s = luaL_checknumber(L, idx);
    if (!(s >= 0) || s > 1e9)
        luaL_argerror(L, idx, "seconds must be a number from 0 to 1e9");
    return (uint64_t)ceil(s * 1000.0);
}

static void sleep_cb(uv_timer_t *h)
{
    kh_lua_timer *t = h->data;
    kh_lua *K = t->K;
    kh_lua_co *c = t->co;
    c->timer = NULL;
    c->wait = KH_WAIT_NONE;
    timer_close(t);
    lua_pushboolean(c->co, 1);
    kh__lua_wake(K, c, 1);
}

/* sleep(seconds) -> true | "aborted", reason | "misuse", message (yields) */
static int l_sleep(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    uint64_t ms = seconds_to_ms(L, 1);
    kh_lua_co *c = current(L, K, "k.sleep");
    if (c == NULL)
        return 2;
    if (c->aborted) {
        lua_pushliteral(L, "aborted");
        lua_pushliteral(L, "closed");
        return 2;
    }
    kh_lua_timer *t = timer_open(K, TIMER_SLEEP);
    t->co = c;
    c->timer = t;
    c->wait = KH_WAIT_SLEEP;
    uv_timer_start(&t->h, sleep_cb, ms, 0);
    lua_pushlightuserdata(L, KH_YIELD);
    return lua_yield(L, 1);
}

static void user_timer_cb(uv_timer_t *h)
{
    kh_lua_timer *t = h->data;
    kh_lua *K = t->K;
    lua_rawgeti(K->L, LUA_REGISTRYINDEX, t->fn_ref);
    if (uv_timer_get_repeat(&t->h) == 0)
        timer_close(t); /* one-shot: done before its callback runs */
    kh__lua_spawn_event(K, "timer", 1);
}

/* timer(delay_s, repeat_s, fn, internal) -> handle with :cancel() (internal: the engine's own,
 * which a reload does not stop) */
static int l_timer(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    uint64_t delay = seconds_to_ms(L, 1);
    uint64_t repeat = lua_isnoneornil(L, 2) ? 0 : seconds_to_ms(L, 2);
    luaL_checktype(L, 3, LUA_TFUNCTION);
    if (!lua_isnoneornil(L, 2) && repeat == 0)
        return luaL_argerror(L, 2, "k.every needs an interval above 0");
    kh_lua_timer **box = lua_newuserdata(L, sizeof *box);
    *box = NULL;
    luaL_getmetatable(L, TIMER_MT);
    lua_setmetatable(L, -2);
    kh_lua_timer *t = timer_open(K, TIMER_USER);
    lua_pushvalue(L, 3);
    t->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    t->box = box;
    t->internal = lua_toboolean(L, 4);
    *box = t;
    uv_timer_start(&t->h, user_timer_cb, delay, repeat);
    return 1;
}

static int l_timer_cancel(lua_State *L)
{
    kh_lua_timer **box = luaL_checkudata(L, 1, TIMER_MT);
    if (*box == NULL) {
        lua_pushboolean(L, 0);
        return 1;
    }
    timer_close(*box);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_timer_pending(lua_State *L)
{
    kh_lua_timer **box = luaL_checkudata(L, 1, TIMER_MT);
    lua_pushboolean(L, *box != NULL);
    return 1;
}

static int l_timer_gc(lua_State *L)
{
    /* the handle was dropped: the timer goes on (k.every keeps running) but forgets the box */
    kh_lua_timer **box = luaL_checkudata(L, 1, TIMER_MT);
    if (*box)
        (*box)->box = NULL;
    return 0;
}

/* ---- the pool ---- */

static void job_free(kh_lua_job *j)
{
    free(j->in);
    free(j->out);
    free(j);
}

static void job_dispose(kh_chan_msg *m)
{
    job_free((kh_lua_job *)m);
}

void kh__lua_job_done(kh_lua *K, kh_lua_job *j)
{
    kh_lua_co *c = j->co;
    if (atomic_load(&j->base.abandoned) || c == NULL || c->job != j) {
        job_free(j); /* the client left: the result is dropped (lua-nginx-module's is_abort) */
        return;
    }
    c->job = NULL;
    c->wait = KH_WAIT_NONE;
    lua_State *co = c->co;
    int n;
    if (j->status == 0) {
        lua_pushboolean(co, 1);
        int r = kh_lua_copy_decode(co, j->out, j->out_len);
        if (r < 0) {
            lua_settop(co, 0);
            lua_pushliteral(co, "error");
            lua_pushliteral(co, "k.blocking: the pool's results could not be decoded");
            n = 2;
        } else {
            n = 1 + r;
        }
    } else {
        lua_pushliteral(co, "error");
        lua_pushlstring(co, j->out ? j->out : "", j->out ? j->out_len : 0);
        n = 2;
    }
    job_free(j);
    kh__lua_wake(K, c, n);
}

/* blocking(kind, code, ...) -> true, results... | "busy", why | "aborted", why | "error", msg
 * | "misuse", message */
static int l_blocking(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    luaL_checkstring(L, 1);
    luaL_checkstring(L, 2);
    kh_lua_co *c = current(L, K, "k.blocking");
    if (c == NULL)
        return 2;
    if (c->aborted) {
        lua_pushliteral(L, "aborted");
        lua_pushliteral(L, "closed");
        return 2;
    }
    kh_copybuf b = {NULL, 0, 0, K->w->limits->pool_msg_bytes};
    char err[400];
    /* kind and code stand for the user's fn (argument 1): the first value after it is
     * "argument 2", as the user counts */
    if (kh_lua_copy_encode(L, 1, lua_gettop(L), 0, &b, "argument", err, sizeof err) != 0) {
        free(b.p);
        return misuse(L, "k.blocking: %s", err);
    }
    kh_lua_job *j = kh_xcalloc(1, sizeof *j);
    j->base.msg.type = KH_MSG_JOB;
    j->base.msg.gen = K->inst->gen; /* its result comes back to this instance */
    j->base.msg.dispose = job_dispose;
    j->base.run = kh__lua_pool_run;
    j->base.reply_to = &K->w->inbox;
    atomic_init(&j->base.abandoned, 0);
    j->in = b.p;
    j->in_len = b.len;
    j->max = K->w->limits->pool_msg_bytes;
    j->co = c;
    int r = kh_threadpool_submit(K->w->cfg->pool, &j->base);
    if (r != 0) {
        job_free(j);
        lua_pushliteral(L, "busy");
        lua_pushstring(L, r == KH_EFULL     ? "the pool queue is full"
                          : r == KH_ECLOSED ? "the pool is stopping"
                                            : "the pool threads cannot start");
        return 2;
    }
    c->job = j;
    c->wait = KH_WAIT_POOL;
    lua_pushlightuserdata(L, KH_YIELD);
    return lua_yield(L, 1);
}

void kh__lua_wait_cleanup(kh_lua *K, kh_lua_co *c)
{
    switch (c->wait) {
    case KH_WAIT_SLEEP:
        if (c->timer) {
            c->timer->co = NULL;
            timer_close(c->timer);
            c->timer = NULL;
        }
        break;
    case KH_WAIT_POOL:
        if (c->job) {
            /* the job may be running: its result is dropped when it comes back */
            atomic_store(&c->job->base.abandoned, 1);
            c->job->co = NULL;
            c->job = NULL;
        }
        break;
    case KH_WAIT_BODY:
    case KH_WAIT_DRAIN:
        if (c->s) {
            c->s->app_wait = KH_WAIT_NONE;
            c->s->flags &= ~KH_STREAM_F_WANT_DRAIN;
        }
        break;
    case KH_WAIT_FS:
        kh__lua_fs_abandon(c);
        break;
    case KH_WAIT_SOCKET:
        kh__lua_socket_abort(K, c);
        break;
    case KH_WAIT_H2:
        kh__lua_http_abort(K, c);
        break;
    default:
        break;
    }
    c->wait = KH_WAIT_NONE;
    (void)K;
}

/* ---- deferred replies ---- */

/* The streams this state holds by defer_hold, in a registry table (lightuserdata -> true, or
 * the Lua object that holds it: core.held), so that closing the state (the worker stops, or a
 * retired instance ends) drops their holds even when the abort event that would have dropped
 * them never got to run. */
static char defer_key;

static void push_defers(lua_State *L)
{
    lua_pushlightuserdata(L, &defer_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushlightuserdata(L, &defer_key);
        lua_pushvalue(L, -2);
        lua_rawset(L, LUA_REGISTRYINDEX);
    }
}

/* held() -> the table of held streams: lightuserdata -> true, or the object that holds it
 * (khamsin.stream.held: an SSE stream or a ws object puts itself there in place of true, so
 * a held stream costs one entry of one table) */
static int l_held(lua_State *L)
{
    push_defers(L);
    return 1;
}

static void defer_track(lua_State *L, kh_stream *s, int on)
{
    push_defers(L);
    lua_pushlightuserdata(L, s);
    if (on)
        lua_pushboolean(L, 1);
    else
        lua_pushnil(L);
    lua_rawset(L, -3);
    lua_pop(L, 1);
}

void kh__lua_defer_moved(lua_State *L, kh_stream *s, kh_stream *t)
{
    if (t->app_defer == NULL)
        return;
    push_defers(L);
    lua_pushlightuserdata(L, t);
    lua_pushlightuserdata(L, s);
    lua_rawget(L, -3); /* the value moves too: true, or the object that holds it */
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_rawset(L, -3);
    lua_pushlightuserdata(L, s);
    lua_pushnil(L);
    lua_rawset(L, -3);
    lua_pop(L, 1);
}

void kh__lua_close_defers(kh_lua *K)
{
    lua_State *L = K->L;
    lua_pushlightuserdata(L, &defer_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        kh_stream *s = lua_touserdata(L, -2);
        lua_pop(L, 1);
        if (s && s->app_defer == K) {
            s->app_defer = NULL;
            if (s->app_data == NULL)
                s->flags &= ~KH_STREAM_F_APP;
            kh_stream_release(s); /* the hold's ref; the connection still has its own */
        }
    }
    lua_pop(L, 1);
}

/* defer_hold(s, gen) -> true | nil, "closed": the stream stays open after the handler returns */
static int l_defer_hold(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    kh_stream *s = lua_touserdata(L, 1);
    if (s == NULL || s->gen != (uint32_t)lua_tointeger(L, 2) || s->proto == NULL ||
        (s->flags & KH_STREAM_F_ENDED) || !(s->flags & KH_STREAM_F_APP)) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    if (s->app_defer)
        return luaL_error(L, "res:defer() was already called for this request");
    s->app_defer = K;
    kh_stream_retain(s);
    defer_track(L, s, 1);
    lua_pushboolean(L, 1);
    return 1;
}

/* defer_release(s, gen): drops the deferred reply's hold (after its answer, timeout or abort) */
static int l_defer_release(lua_State *L)
{
    kh_stream *s = lua_touserdata(L, 1);
    if (s == NULL || s->gen != (uint32_t)lua_tointeger(L, 2) || s->app_defer == NULL) {
        lua_pushboolean(L, 0);
        return 1;
    }
    s->app_defer = NULL;
    defer_track(L, s, 0);
    if (s->app_data == NULL) {
        /* no coroutine runs for it any more: the app is done with the stream */
        s->flags &= ~KH_STREAM_F_APP;
        if (s->proto && !(s->flags & KH_STREAM_F_ENDED))
            kh_stream_respond_error(s, 500, "Internal Server Error", 0);
    }
    kh_stream_release(s);
    lua_pushboolean(L, 1);
    return 1;
}

/* gen() -> this instance's generation (1 at start-up, +1 per reload) */
static int l_gen(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)K_UPVALUE(L)->inst->gen);
    return 1;
}

static int l_defer_timeout(lua_State *L)
{
    lua_pushnumber(L, (double)K_UPVALUE(L)->w->limits->defer_timeout_ms / 1000.0);
    return 1;
}

/* ---- messages to workers ---- */

static void msg_dispose(kh_chan_msg *m)
{
    free(m);
}

static kh_lua_msg *msg_new(int type, uint32_t gen, const char *p, size_t n)
{
    kh_lua_msg *m = kh_xmalloc(sizeof *m + n);
    m->base.type = type;
    m->base.gen = gen;
    m->base.dispose = msg_dispose;
    m->len = n;
    memcpy(m->data, p, n);
    return m;
}

/* publish(topic, value): to every worker, this one included (through its own mailbox, so the
 * subscribers run after this slice, never inside it). Returns the number of workers, or nil,
 * message for a value that cannot be copied (k.publish raises it at the app's line). */
static int l_publish(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    luaL_checkstring(L, 1);
    lua_settop(L, 2);
    kh_copybuf b = {NULL, 0, 0, K->w->limits->pool_msg_bytes};
    char err[400];
    if (kh_lua_copy_encode(L, 1, 2, 1, &b, "argument", err, sizeof err) != 0) {
        free(b.p);
        lua_pushnil(L);
        lua_pushfstring(L, "k.publish: %s", err);
        return 2;
    }
    const kh_config *cfg = K->w->cfg;
    int sent = 0;
    for (int i = 0; i < cfg->workers; i++)
        if (kh_worker_post(cfg, i, &msg_new(KH_MSG_PUBLISH, 0, b.p, b.len)->base) == 0)
            sent++;
    free(b.p);
    lua_pushinteger(L, sent);
    return 1;
}

/* post_resolve(worker, gen, id, status, body, headers) -> true | nil, why | false, message (a
 * value that cannot be copied: k.resolve raises it at the app's line). gen: the app instance
 * of that worker which holds the deferred reply (this worker's own other instance too). */
static int l_post_resolve(lua_State *L)
{
    kh_lua *K = K_UPVALUE(L);
    int to = (int)luaL_checkinteger(L, 1);
    uint32_t gen = (uint32_t)luaL_checkinteger(L, 2);
    lua_settop(L, 6);
    kh_copybuf b = {NULL, 0, 0, K->w->limits->pool_msg_bytes};
    char err[400];
    if (kh_lua_copy_encode(L, 3, 6, 1, &b, "argument", err, sizeof err) != 0) {
        free(b.p);
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "k.resolve: %s", err);
        return 2;
    }
    int r = kh_worker_post(K->w->cfg, to, &msg_new(KH_MSG_RESOLVE, gen, b.p, b.len)->base);
    free(b.p);
    if (r != 0) {
        lua_pushnil(L);
        lua_pushstring(L, r == KH_EINVAL ? "no such worker" : "worker stopped");
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

void kh__lua_open_wait(lua_State *L, kh_lua *K)
{
    static const luaL_Reg fns[] = {
        {"sleep", l_sleep},
        {"timer", l_timer},
        {"blocking", l_blocking},
        {"defer_hold", l_defer_hold},
        {"defer_release", l_defer_release},
        {"held", l_held},
        {"defer_timeout", l_defer_timeout},
        {"gen", l_gen},
        {"publish", l_publish},
        {"post_resolve", l_post_resolve},
        {NULL, NULL},
    };
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushlightuserdata(L, K);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
    if (luaL_newmetatable(L, TIMER_MT)) {
        lua_newtable(L);
        lua_pushcfunction(L, l_timer_cancel);
        lua_setfield(L, -2, "cancel");
        lua_pushcfunction(L, l_timer_pending);
        lua_setfield(L, -2, "pending");
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_timer_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
}
