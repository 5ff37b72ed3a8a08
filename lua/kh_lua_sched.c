/* kh_lua_sched.c: a coroutine per request or callback (lua-nginx-module's discipline, style.md §4).
 * Owns:  the worker's free list of finished coroutines, the list of those in use, the ready list,
 *        the resume/finish path, slice timing.
 * In:    dispatch / on_body / on_abort / on_message from core; wakes from timers and the pool.
 *        A held tunnel (a WebSocket between messages: core.defer_hold + core.stream_hold) keeps
 *        no coroutine: s->app_wait is KH_WAIT_TUNNEL while none runs for it, and on_body then
 *        starts one that owns the stream for the "tunnel" event (tunnel_wake).
 * Out:   lua_resume (only kh__lua_resume calls it); stream refs released when a coroutine ends;
 *        500 replies for errors that escape the Lua runner.
 * Never: nests lua_resume calls: a wake that happens inside a slice (a request that answers or
 *        aborts another one) goes on the ready list, drained once the slice is over. The ready
 *        list and the in-slice flag are per worker thread, not per state: after a reload two
 *        instances (kh_lua) share the thread, and an h2 connection may carry streams of both.
 *        A coroutine retains its instance (kh_app_inst_retain) from kh__lua_co_new to put_co,
 *        so a retired state is never closed while one of its coroutines lives.
 *
 * Watchdog and interrupt (handler_interrupt_ms). Each slice is bracketed with
 * kh_worker_slice_begin/end, named by its route ("GET /spin", a Lua string of the routes table,
 * alive until lua_close) or its kind ("timer callback"), so that the supervisor thread can say
 * what a stalled worker runs. When a slice has run handler_interrupt_ms without yielding, the
 * supervisor calls kh__lua_interrupt, which records the request (slice number, irq_want) and
 * sends KH_IRQ_SIGNAL to the worker's thread; the handler, on that thread, sets a count hook
 * with lua_sethook, which LuaJIT allows from a signal handler ("can be called asynchronously
 * (e.g. during a signal)", lj_dispatch.c; its own lua.c does it on SIGINT): it only stores the
 * hook fields and switches the interpreter's dispatch table to the hook-checking one. Setting
 * it from the supervisor's thread directly would race with the worker's own read-modify-writes
 * of the same global_State fields (entering a hook or a __gc finalizer); on the worker's own
 * thread a handler runs between two of its instructions (at worst it lands inside such a
 * read-modify-write, whose store then undoes the hook: no interrupt this time, the next comes
 * one period later), and the worker blocks the signal around its own lua_sethook calls
 * (irq_clear). The hook runs at the
 * next bytecode the interpreter executes, on the worker's thread, in whichever coroutine runs;
 * it clears itself and raises "handler interrupted after N ms (handler_interrupt_ms=M)" if that
 * slice is still the one it was set for (else it only clears itself). The runner's xpcall turns
 * the error into a 500 with the traceback in the log, as for any handler error. A slice that
 * catches it (pcall) and runs on is interrupted a second time another handler_interrupt_ms
 * later, and then the hook stays until the slice has ended: it raises at every bytecode, so
 * that no pcall can hold it; the error then leaves the runner itself and the 500 is answered
 * from C (kh__lua_resume's error path).
 * What can be interrupted is only what the interpreter runs: LuaJIT runs no hook inside a
 * compiled trace, and a trace that loops never leaves it. Measured with luajit2 2.1-20230119
 * (a thread sets the hook 200 ms into the loop; "no" = still running 1.5 s later):
 *   not interrupted: `while true do end`; `while true do x = x + 1 end`; a loop calling a C
 *     function (os.time, os.clock, io.write, string.len, ("x"):rep): trace stitching compiles
 *     around the call, which no longer goes through the interpreter's dispatch; a loop that
 *     only allocates (`local _ = {}`);
 *   interrupted: any loop in a function under jit.off(fn) (jit.off(fn, true) for the
 *     functions defined inside it too) or after jit.off(); loops whose trace aborts and runs
 *     in the interpreter (in this LuaJIT: pairs(), tostring of a number, a table that is
 *     regrown and replaced in the loop). Which loops the JIT compiles changes with the LuaJIT
 *     version: only jit.off is a promise.
 * C code (a blocking C or FFI call, os.execute) is never interrupted. luaJIT_setmode (flushing
 * traces, turning the JIT off) is not safe from another thread, and the hook itself never runs
 * inside the trace, so nothing more is tried for the compiled case: stall_shed_ms and
 * stall_exit_ms (main.c) are the answer there. The signal is sent only to a worker in a slice
 * past the limit; SA_RESTART restarts most system calls it interrupts, but a Lua handler
 * blocked in one that never restarts (nanosleep, epoll_wait) returns early with EINTR. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_asan.h"

#include "kh_err.h"
#include "kh_log.h"
#include "kh_lua_copy.h"
#include "kh_lua_internal.h"

char kh__lua_yield_sentinel;
char kh__lua_routes_key;

static void live_link(kh_lua *K, kh_lua_co *c)
{
    c->live_next = K->live.live_next;
    c->live_prev = &K->live;
    K->live.live_next->live_prev = c;
    K->live.live_next = c;
}

static void live_unlink(kh_lua_co *c)
{
    c->live_prev->live_next = c->live_next;
    c->live_next->live_prev = c->live_prev;
    c->live_prev = c->live_next = NULL;
}

kh_lua_co *kh__lua_co_new(kh_lua *K, kh_stream *s)
{
    kh_lua_co *c = K->free_cos;
    if (c) {
        K->free_cos = c->next_free;
        K->num_free--;
    } else {
        c = kh_xcalloc(1, sizeof *c);
        c->co = lua_newthread(K->L);
        c->ref = luaL_ref(K->L, LUA_REGISTRYINDEX);
    }
    c->K = K;
    kh_app_inst_retain(K->inst); /* the state stays open while the coroutine lives */
    c->s = s;
    c->wait = KH_WAIT_NONE;
    c->aborted = 0;
    c->timer = NULL;
    c->job = NULL;
    c->fs = NULL;
    c->sock = NULL;
    c->what = NULL;
    c->ready_next = NULL;
    live_link(K, c);
    return c;
}

static void drop_co(kh_lua *K, kh_lua_co *c)
{
    luaL_unref(K->L, LUA_REGISTRYINDEX, c->ref);
    free(c);
}

static void put_co(kh_lua *K, kh_lua_co *c, int clean)
{
    live_unlink(c);
    kh_app_inst_release(K->inst); /* closes a retired state only later, in the prepare phase */
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
    free(K->route_names);
    K->route_names = NULL;
    K->route_names_len = 0;
    while (K->free_cos) {
        kh_lua_co *c = K->free_cos;
        K->free_cos = c->next_free;
        free(c);
    }
    /* coroutines still waiting when the worker stops (a timer callback asleep, a request whose
     * connection outlived the grace period): their Lua threads go with the state */
    while (K->live.live_next != &K->live) {
        kh_lua_co *c = K->live.live_next;
        kh__lua_wait_cleanup(K, c);
        if (c->s) {
            /* the coroutine's ref goes as finish() drops it; the connection (closed after the
             * state) drops the protocol's, and kh_stream_on_reset a deferred reply's hold */
            kh_stream *s = c->s;
            c->s = NULL;
            s->app_data = NULL;
            s->app_wait = KH_WAIT_NONE;
            if (s->app_defer == NULL)
                s->flags &= ~KH_STREAM_F_APP;
            kh_stream_release(s);
        }
        live_unlink(c);
        kh_app_inst_release(K->inst);
        free(c);
    }
}

/* A tunnel the app holds (core.defer_hold + core.stream_hold: a WebSocket after its handshake)
 * waits for input with no coroutine: KH_WAIT_TUNNEL, and kh__lua_on_body starts one. */
static int tunnel_held(const kh_stream *s)
{
    return s->app_defer && (s->flags & (KH_STREAM_F_TUNNEL | KH_STREAM_F_HELD)) ==
                               (KH_STREAM_F_TUNNEL | KH_STREAM_F_HELD);
}

static void finish(kh_lua *K, kh_lua_co *c, int clean)
{
    kh_stream *s = c->s;
    c->s = NULL;
    if (s) {
        s->app_data = NULL;
        s->app_wait = tunnel_held(s) ? KH_WAIT_TUNNEL : KH_WAIT_NONE;
        if (s->app_defer == NULL) {
            s->flags &= ~KH_STREAM_F_APP;
            if (s->proto && !(s->flags & KH_STREAM_F_ENDED)) {
                /* the runner always answers; reaching this means it failed before it could */
                kh_stream_respond_error(s, 500, "Internal Server Error", 0);
            }
        }
        /* a deferred reply keeps F_APP and its own ref: this one is the coroutine's */
        kh_stream_release(s);
    }
    put_co(K, c, clean);
}

static void slice_warn(kh_lua *K, kh_lua_co *c, uint64_t ns)
{
    uint64_t ms = ns / 1000000u;
    uint64_t lim = K->w->limits->slice_warn_ms;
    if (lim == 0 || ms < lim)
        return;
    if (c->s) {
        lua_State *L = K->L;
        int base = lua_gettop(L);
        lua_pushlightuserdata(L, &kh__lua_routes_key);
        lua_rawget(L, LUA_REGISTRYINDEX);
        const char *route = NULL;
        if (lua_istable(L, -1)) {
            lua_rawgeti(L, -1, (int)c->s->route_value);
            route = lua_tostring(L, -1);
        }
        KH_LOG_WARN("slow Lua slice: %.1f ms in %.*s %.*s (route %s; over slice_warn_ms=%llu; "
                    "move blocking work to k.blocking)",
                    (double)ns / 1e6, (int)c->s->method.len, c->s->method.ptr,
                    (int)c->s->path.len, c->s->path.ptr, route ? route : "?",
                    (unsigned long long)lim);
        lua_settop(L, base);
    }
    else
        KH_LOG_WARN("slow Lua slice: %.1f ms in a %s callback (over slice_warn_ms=%llu)",
                    (double)ns / 1e6, c->what ? c->what : "background",
                    (unsigned long long)lim);
}

/* The route's name ("GET /users/:id") for the watchdog: the string of the routes table, cached
 * by ref. The pointer stays valid until lua_close (the table is never emptied). */
static const char *route_name(kh_lua *K, intptr_t ref)
{
    if (ref >= 0 && (size_t)ref < K->route_names_len && K->route_names[ref])
        return K->route_names[ref];
    lua_State *L = K->L;
    int base = lua_gettop(L);
    const char *name = NULL;
    lua_pushlightuserdata(L, &kh__lua_routes_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    if (lua_istable(L, -1)) {
        lua_rawgeti(L, -1, (int)ref);
        if (lua_type(L, -1) == LUA_TSTRING)
            name = lua_tostring(L, -1);
    }
    lua_settop(L, base);
    if (name && ref >= 0 && ref < 65536) {
        if ((size_t)ref >= K->route_names_len) {
            size_t n = (size_t)ref + 16;
            const char **a = realloc(K->route_names, n * sizeof *a);
            if (a == NULL)
                return name;
            memset(a + K->route_names_len, 0, (n - K->route_names_len) * sizeof *a);
            K->route_names = a;
            K->route_names_len = n;
        }
        K->route_names[ref] = name;
    }
    return name ? name : "a request";
}

static const char *slice_name(kh_lua *K, kh_lua_co *c)
{
    if (c->s)
        return route_name(K, c->s->route_value);
    static const struct {
        const char *what, *name;
    } kinds[] = {{"timer", "timer callback"},
                 {"publish", "subscriber callback"},
                 {"resolve", "k.resolve callback"},
                 {"abort", "on_abort callback"},
                 {"send_to", "k.send_to delivery"}, {"tunnel", "WebSocket input"}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (c->what && strcmp(c->what, kinds[i].what) == 0)
            return kinds[i].name;
    return "a Lua callback";
}

/* The instance whose slice runs (or ran last) on this worker thread, for the hook and the
 * signal handler; cleared when that instance closes (kh__lua_irq_put). */
static _Thread_local kh_lua *hook_K;
static _Thread_local kh_lua_irq *thread_irq;

/* Slices never nest, across instances too: a wake inside any slice of this thread waits on the
 * thread's ready list until that slice is over. */
static _Thread_local int in_slice;
static _Thread_local kh_lua_co *ready_head, *ready_tail;

kh_lua_co *kh__lua_running(void)
{
    return in_slice && hook_K ? hook_K->current : NULL;
}

/* The signal that carries an interrupt to the worker's thread: ignored by default, so one that
 * comes before the handler is installed does nothing (Go's runtime preempts with it too). */
#define KH_IRQ_SIGNAL SIGURG

/* On the worker's thread, in a signal handler: the one place the hook is set. LuaJIT's
 * lua_sethook "can be called asynchronously (e.g. during a signal)": it stores the hook fields
 * and switches the dispatch table, allocates nothing and takes no lock. */
static void interrupt_hook(lua_State *L, lua_Debug *ar);
static void irq_handler(int sig)
{
    (void)sig;
    int saved = errno;
    kh_lua *K = hook_K;
    if (K && atomic_load_explicit(&K->irq->want, memory_order_acquire))
        lua_sethook(K->L, interrupt_hook, LUA_MASKCOUNT, 1);
    errno = saved;
}

/* On the worker's thread: clears the hook, with the signal blocked so that its handler cannot
 * run in the middle of this lua_sethook (a pending one runs after, and finds irq_want 0). */
static void irq_clear(kh_lua *K, lua_State *L)
{
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, KH_IRQ_SIGNAL);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    if (K)
        atomic_store_explicit(&K->irq->want, 0, memory_order_relaxed);
    lua_sethook(L, NULL, 0, 0);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* On the worker's thread, at a bytecode of whatever Lua code runs (see the header). */
static void interrupt_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    kh_lua *K = hook_K;
    int fire = K && K->current && atomic_load_explicit(&K->irq->want, memory_order_acquire) &&
               atomic_load_explicit(&K->irq->seq, memory_order_relaxed) ==
                   kh_worker_slice_seq(K->w);
    if (!fire || !atomic_load_explicit(&K->irq->persist, memory_order_relaxed))
        irq_clear(K, L);
    if (!fire)
        return;
    const char *who = K->current->s ? "handler" : slice_name(K, K->current);
#ifdef KH_ASAN
    /* LuaJIT unwinds this frame with _Unwind_RaiseException, which ASan does not see: the
     * redzones of the unwound frames would stay poisoned, and a later frame there (a signal
     * handler's) would be reported. What a noreturn call does, done by hand. */
    __asan_handle_no_return();
#endif
    luaL_error(L, "%s interrupted after %d ms (handler_interrupt_ms=%d)", who,
               (int)atomic_load_explicit(&K->irq->ms, memory_order_relaxed),
               (int)K->w->limits->handler_interrupt_ms);
}

/* The supervisor thread, under the worker's mutex (the app is open). */
void kh__lua_interrupt(void *app, uint64_t seq, uint64_t ms)
{
    static int installed; /* only the supervisor thread gets here */
    kh_lua *K = app;
    kh_lua_irq *q = K->irq; /* the worker thread's: a slice of a retired instance too */
    if (!atomic_load_explicit(&q->tid_set, memory_order_acquire) ||
        kh_worker_slice_seq(K->w) != seq)
        return;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = irq_handler;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(KH_IRQ_SIGNAL, &sa, NULL) != 0)
            return;
        installed = 1;
    }
    /* the second time for one slice: it caught the first error and ran on */
    int persist = atomic_load_explicit(&q->seq, memory_order_relaxed) == seq;
    atomic_store_explicit(&q->persist, persist, memory_order_relaxed);
    atomic_store_explicit(&q->ms, ms, memory_order_relaxed);
    atomic_store_explicit(&q->seq, seq, memory_order_relaxed);
    atomic_store_explicit(&q->want, 1, memory_order_release);
    pthread_kill(q->tid, KH_IRQ_SIGNAL);
}

kh_lua_irq *kh__lua_irq_get(void)
{
    if (thread_irq == NULL)
        thread_irq = kh_xcalloc(1, sizeof *thread_irq);
    thread_irq->refs++;
    return thread_irq;
}

/* On the worker's thread, as K closes (the supervisor no longer reaches it: it is not the
 * current instance, or app_closing is raised). */
void kh__lua_irq_put(kh_lua *K)
{
    kh_lua_irq *q = K->irq;
    if (q == NULL)
        return;
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, KH_IRQ_SIGNAL);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    if (hook_K == K)
        hook_K = NULL;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    K->irq = NULL;
    if (--q->refs == 0) {
        if (thread_irq == q)
            thread_irq = NULL;
        free(q);
    }
}

/* One slice: resumes c with nargs values on its stack. The only caller of lua_resume; only
 * kh__lua_wake calls it, never from inside another slice. */
void kh__lua_resume(kh_lua *K, kh_lua_co *c, int nargs)
{
    lua_State *co = c->co;
    K->current = c;
    in_slice = 1;
    hook_K = K; /* a plain store the signal handler reads on this same thread */
    if (!atomic_load_explicit(&K->irq->tid_set, memory_order_relaxed)) {
        /* the first slice: the interrupt's signal comes to this thread */
        K->irq->tid = pthread_self();
        atomic_store_explicit(&K->irq->tid_set, 1, memory_order_release);
    }
    uint64_t t0 = uv_hrtime();
    kh_worker_slice_begin(K->w, slice_name(K, c), t0);
    int st = lua_resume(co, nargs);
    kh_worker_slice_end(K->w);
    K->current = NULL;
    in_slice = 0;
    if (atomic_load_explicit(&K->irq->want, memory_order_relaxed))
        irq_clear(K, K->L);
    slice_warn(K, c, uv_hrtime() - t0);
    if (st == LUA_YIELD) {
        if (lua_gettop(co) >= 1 && lua_touserdata(co, -1) == KH_YIELD &&
            c->wait != KH_WAIT_NONE) {
            lua_settop(co, 0);
            return; /* parked until its event comes */
        }
        KH_LOG_ERROR("%.*s %.*s: the handler yielded outside a khamsin wait (coroutine.yield "
                     "at the top level of a handler is not allowed)",
                     c->s ? (int)c->s->method.len : 0, c->s ? c->s->method.ptr : "",
                     c->s ? (int)c->s->path.len : 0, c->s ? c->s->path.ptr : "");
        kh__lua_wait_cleanup(K, c);
        finish(K, c, 0);
        return;
    }
    if (st != 0) {
        const char *msg = lua_tostring(co, -1);
        luaL_traceback(K->L, co, msg ? msg : "(error object is not a string)", 0);
        KH_LOG_ERROR("request failed in khamsin's runner: %s", lua_tostring(K->L, -1));
        lua_pop(K->L, 1);
        kh__lua_wait_cleanup(K, c);
        finish(K, c, 0);
        return;
    }
    finish(K, c, 1);
}

void kh__lua_wake(kh_lua *K, kh_lua_co *c, int nargs)
{
    (void)K; /* c->K: the coroutine's own instance */
    if (in_slice) {
        /* inside a slice (of any instance of this worker): after it (lua-nginx-module's posted
         * requests) */
        c->ready_nargs = nargs;
        c->ready_next = NULL;
        if (ready_tail)
            ready_tail->ready_next = c;
        else
            ready_head = c;
        ready_tail = c;
        return;
    }
    kh__lua_resume(c->K, c, nargs);
    while (ready_head) {
        kh_lua_co *r = ready_head;
        ready_head = r->ready_next;
        if (ready_head == NULL)
            ready_tail = NULL;
        r->ready_next = NULL;
        kh__lua_resume(r->K, r, r->ready_nargs);
    }
}

void kh__lua_spawn_event(kh_lua *K, const char *what, int nargs)
{
    lua_State *L = K->L;
    kh_lua_co *c = kh__lua_co_new(K, NULL);
    c->what = what;
    lua_State *co = c->co;
    lua_rawgeti(co, LUA_REGISTRYINDEX, K->event_ref);
    lua_pushstring(co, what);
    lua_xmove(L, co, nargs); /* same state, another thread: the values move, nothing is copied */
    kh__lua_wake(K, c, nargs + 1);
}

void kh__lua_dispatch(void *app, kh_stream *s)
{
    kh_lua *K = app;
    kh_lua_co *c = kh__lua_co_new(K, s);
    s->app_data = c;
    lua_State *co = c->co;
    lua_rawgeti(co, LUA_REGISTRYINDEX, K->run_ref);
    lua_rawgeti(co, LUA_REGISTRYINDEX, (int)s->route_value);
    lua_pushlightuserdata(co, s);
    lua_pushinteger(co, (lua_Integer)s->gen);
    /* the address again, as a number: what the FFI accessors take (kh_lua_req_str), since the
     * JIT does not pass a lightuserdata to a C pointer ("NYI: unsupported C type conversion") */
    lua_pushnumber(co, (lua_Number)(uintptr_t)s);
    kh__lua_wake(K, c, 4);
}

void kh__lua_on_drain(void *app, kh_stream *s)
{
    kh_lua *K = app;
    kh_lua_co *c = s->app_data;
    if (c == NULL || s->app_wait != KH_WAIT_DRAIN || c->wait != KH_WAIT_DRAIN)
        return;
    s->app_wait = KH_WAIT_NONE;
    c->wait = KH_WAIT_NONE;
    lua_pushboolean(c->co, 1);
    kh__lua_wake(K, c, 1);
}

/* Input on a held tunnel that no coroutine reads: a coroutine of its own for the stream (the
 * request's discipline: it owns s, so its writes may wait for drain and its body reads may
 * yield), running the "tunnel" event (khamsin.lua: the held object's _readable). It reads what
 * is there and ends; the next input starts another. An idle socket keeps no coroutine. */
static void tunnel_wake(kh_stream *s)
{
    kh_lua *K = s->app_defer; /* the instance that holds it */
    kh_lua_co *c = kh__lua_co_new(K, s);
    c->what = "tunnel";
    kh_stream_retain(s); /* the coroutine's ref (finish drops it) */
    s->app_data = c;
    s->app_wait = KH_WAIT_NONE;
    lua_State *co = c->co;
    lua_rawgeti(co, LUA_REGISTRYINDEX, K->event_ref);
    lua_pushliteral(co, "tunnel");
    lua_pushlightuserdata(co, s);
    lua_pushinteger(co, (lua_Integer)s->gen);
    kh__lua_wake(K, c, 3);
}

void kh__lua_on_body(void *app, kh_stream *s)
{
    kh_lua_co *c = s->app_data;
    if (c == NULL && s->app_wait == KH_WAIT_TUNNEL && tunnel_held(s)) {
        tunnel_wake(s);
        return;
    }
    if (c == NULL || s->app_wait != KH_WAIT_BODY || c->wait != KH_WAIT_BODY)
        return;
    kh_lua *K = c->K; /* app is s->inst's: the same */
    (void)app;
    s->app_wait = KH_WAIT_NONE;
    c->wait = KH_WAIT_NONE;
    lua_State *co = c->co;
    int n;
    if (s->flags & KH_STREAM_F_BODY_STREAM) {
        /* incremental: the reader looks at s->body again (core.body_chunk) */
        lua_pushboolean(co, 1);
        kh__lua_wake(K, c, 1);
        return;
    }
    switch (s->body_state) {
    case KH_BODY_COMPLETE:
        lua_pushlstring(co, s->body.base ? s->body.base : "", s->body.len);
        kh__lua_gc_paid(K, co, s->body.len); /* on co, as lua_pushlstring's own GC check */
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
    kh__lua_wake(K, c, n);
}

/* The client left (or the engine answered 413/408 while the app still held the stream). The
 * wait slot's cleanup runs first (timer cancelled, pool job abandoned), then the coroutine is
 * resumed with an abort so its pcall cleanups run; a deferred reply hears of it in a callback
 * coroutine (its on_abort functions). */
void kh__lua_on_abort(void *app, kh_stream *s)
{
    kh_lua_co *c = s->app_data;
    /* the stream's own instance (s->inst's app): its deferred reply and coroutine live there */
    kh_lua *K = s->app_defer ? s->app_defer : c ? c->K : app;
    if (s->app_defer) {
        lua_pushlightuserdata(K->L, s);
        kh__lua_spawn_event(K, "abort", 1);
    }
    if (c == NULL)
        return;
    c->aborted = 1;
    if (c->wait == KH_WAIT_NONE)
        return; /* running now: its next send or wait sees the stream closed */
    int body = c->wait == KH_WAIT_BODY || c->wait == KH_WAIT_DRAIN;
    kh__lua_wait_cleanup(K, c);
    if (body) {
        lua_pushnil(c->co);
        lua_pushliteral(c->co, "closed");
    } else {
        lua_pushliteral(c->co, "aborted");
        lua_pushliteral(c->co, "closed");
    }
    kh__lua_wake(K, c, 2);
}

typedef struct kh_lua_msg {
    kh_chan_msg base;
    size_t len;
    char data[];
} kh_lua_msg;

void kh__lua_on_message(void *app, kh_chan_msg *m)
{
    kh_lua *K = app; /* the instance of m->gen (kh_worker routes by generation) */
    if (m->type == KH_MSG_JOB) {
        kh__lua_job_done(K, (kh_lua_job *)m);
        return;
    }
    kh_lua_msg *lm = (kh_lua_msg *)m;
    int type = m->type;
    int base = lua_gettop(K->L);
    int n = kh_lua_copy_decode(K->L, lm->data, lm->len);
    free(lm);
    if (n < 0) {
        KH_LOG_ERROR("a mailbox message could not be decoded");
        lua_settop(K->L, base);
        return;
    }
    if (type == KH_MSG_PUBLISH && K->retired) { /* subscriptions stop at the swap */
        lua_settop(K->L, base);
        return;
    }
    kh__lua_spawn_event(K, type == KH_MSG_PUBLISH  ? "publish"
                           : type == KH_MSG_SENDTO ? "send_to"
                                                   : "resolve",
                        n);
}
