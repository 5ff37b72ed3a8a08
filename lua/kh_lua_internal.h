/* kh_lua_internal.h: shared between the binding's files (state, scheduler, waits, pool, copy).
 * Owns:  struct kh_lua, one per app instance (kh_app.h: a worker has one, plus the retired ones
 *        a reload left in use), and struct kh_lua_co, one per running coroutine (a request's
 *        handler, or a timer / message callback with no stream), which names its kh_lua. A live
 *        coroutine is a user of its instance (kh_app_inst_retain), so a retired state is never
 *        closed under it; the ready list and "inside a slice" are per thread (one worker may
 *        run slices of two instances, never nested). */
#ifndef KH_LUA_INTERNAL_H
#define KH_LUA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "kh_chan.h"
#include "kh_router.h"
#include "kh_stream.h"
#include "kh_threadpool.h"
#include "kh_worker.h"

/* What a yielded coroutine waits for: its single wait slot (style.md §4). */
enum { KH_WAIT_NONE = 0, KH_WAIT_BODY = 1, KH_WAIT_SLEEP = 2, KH_WAIT_POOL = 3, KH_WAIT_FS = 4,
       KH_WAIT_SOCKET = 5, KH_WAIT_DRAIN = 6,
       /* s->app_wait only, never a coroutine's: a held tunnel (a WebSocket between messages)
        * with no coroutine; its next input spawns one (kh__lua_on_body, "tunnel" event) */
       KH_WAIT_TUNNEL = 7, KH_WAIT_H2 = 8 };

/* Mailbox message types (kh_chan_msg.type). */
enum { KH_MSG_JOB = 1, KH_MSG_PUBLISH = 2, KH_MSG_RESOLVE = 3, KH_MSG_SENDTO = 4 };

typedef struct kh_lua_timer kh_lua_timer;
typedef struct kh_lua_job kh_lua_job;
typedef struct kh_lua_fsreq kh_lua_fsreq;

struct kh_lua_job {
    kh_job base;          /* first: travels as a mailbox message */
    struct kh_lua_co *co; /* NULL once abandoned */
    char *in;             /* encoded by kh_lua_copy: kind, code, arguments */
    size_t in_len;
    char *out;            /* encoded results, or an error message */
    size_t out_len;
    int status;           /* 0 ok, 1 the function raised (out: message with the pool's traceback) */
    size_t max;           /* pool_msg_bytes */
};

typedef struct kh_lua kh_lua;

typedef struct kh_lua_co {
    kh_lua *K;           /* the instance whose state the coroutine lives in */
    lua_State *co;
    int ref;             /* registry ref anchoring co */
    kh_stream *s;        /* NULL for a timer / message callback */
    struct kh_lua_co *next_free;
    struct kh_lua_co *ready_next; /* on K's ready list (woken inside a slice) */
    struct kh_lua_co *live_prev, *live_next; /* K's list of coroutines in use */
    int ready_nargs;
    int wait;            /* KH_WAIT_* */
    int aborted;         /* the request is over: every later wait fails at once */
    kh_lua_timer *timer; /* KH_WAIT_SLEEP */
    kh_lua_job *job;     /* KH_WAIT_POOL */
    kh_lua_fsreq *fs;    /* KH_WAIT_FS (kh_lua_fs.c) */
    struct lsock *sock;  /* KH_WAIT_SOCKET (kh_lua_socket.c) */
    struct kh_out_h2 *h2; /* KH_WAIT_H2: the shared h2 connection and the stream (kh_lua_http.c) */
    int32_t h2_id;
    const char *what;    /* for the slow-slice log when there is no stream: "timer", ... */
} kh_lua_co;

/* The interrupt's state, one per worker thread, shared by that worker's instances (the
 * supervisor reaches it through the current one, under the worker's mutex). */
typedef struct kh_lua_irq {
    int refs;                 /* instances pointing at it (worker thread only) */
    pthread_t tid;            /* the worker's thread, where the interrupt signal goes */
    _Atomic int tid_set;
    _Atomic int want;         /* an interrupt was asked (the supervisor sets, the worker clears) */
    _Atomic uint64_t seq;     /* for that slice (kh_worker_slice_seq) */
    _Atomic uint64_t ms;      /* which had run that long */
    _Atomic int persist;      /* the second interrupt of one slice: raise until it ends */
} kh_lua_irq;

struct kh_lua {
    lua_State *L;
    kh_worker *w;
    kh_app_inst *inst;   /* core's record of this instance: generation, users */
    kh_router *router;
    int retired;         /* a reload replaced it: no new timers fire, no publish reaches it */
    char *files;         /* --dev: the files it loaded ("path\n" each) */
    int run_ref;         /* khamsin's request runner: run(handler, stream, gen) */
    int event_ref;       /* khamsin's event runner: _event(kind, ...) in a coroutine of its own */
    kh_lua_co *free_cos;
    size_t num_free;
    kh_lua_co live;      /* sentinel of the in-use list */
    kh_lua_co *current;  /* the coroutine whose slice runs now, or NULL */
    kh_lua_timer *timers; /* every open timer, closed with the state */
    char *sh_buf;         /* k.shared get: a value is copied here, then pushed */
    size_t sh_cap;
    int dev;
    /* kh_lua_sched.c: slice names for the watchdog, the handler_interrupt_ms hook */
    const char **route_names; /* route ref -> "GET /users/:id" (Lua strings of the routes table) */
    size_t route_names_len;
    kh_lua_irq *irq;          /* the worker thread's */
    int gc_live_kb;           /* kh__lua_gc_paid: the Lua heap after the last cycle it saw end */
};

/* The sentinel every engine wait yields, so a user coroutine wrapper can pass it upward. */
extern char kh__lua_yield_sentinel;
/* Registry key of the table route ref -> "METHOD pattern" (for logs). */
extern char kh__lua_routes_key;
#define KH_YIELD ((void *)&kh__lua_yield_sentinel)

/* kh_lua_state.c: after C pushed a string of n bytes (a request body, a body chunk), the
 * collector's work for it: LuaJIT paces by allocation checks, not bytes (see there). */
void kh__lua_gc_paid(kh_lua *K, lua_State *L, size_t n);
/* Registers the `khamsin.core` C module in L (package.preload). */
void kh__lua_open_core(lua_State *L, kh_lua *K);
/* Adds the wait functions (sleep, timer, blocking, defer, publish, resolve) to the core table
 * on top of the stack. */
void kh__lua_open_wait(lua_State *L, kh_lua *K);
/* Adds k.shared's functions to the core table on top of the stack. */
void kh__lua_open_shared(lua_State *L, kh_lua *K);
/* kh_lua_socket.c: k.socket's raw functions (socket_*) into the core table on top of the
 * stack; the abort of a socket wait (closes the socket). */
void kh__lua_open_socket(lua_State *L, kh_lua *K);
void kh__lua_socket_abort(kh_lua *K, kh_lua_co *c);
/* The kh_out of a connected socket at idx, taken from it (the socket reads as closed from then
 * on), for k.http's shared HTTP/2 connections; NULL when it has none or a coroutine waits on it. */
struct kh_out *kh__lua_socket_detach(lua_State *L, int idx);
/* kh_lua_http.c: the abort of a wait on a shared h2 stream (the stream alone is reset). */
void kh__lua_http_abort(kh_lua *K, kh_lua_co *c);
/* kh_lua_sign.c: core.sign, core.unsign (k.sign, k.unsign) */
void kh__lua_open_sign(lua_State *L);
/* kh_lua_ws.c: the WebSocket codec, frames and handshake helpers (ws_* on the core table) */
void kh__lua_open_ws(lua_State *L, kh_lua *K);
/* kh_lua_multipart.c: core.mp_new (req:multipart's parser), core.limit */
void kh__lua_open_multipart(lua_State *L, kh_lua *K);
/* kh_lua_fs.c: core.fs_stat, fs_realpath, fs_read (libuv fs, yielding); abandon on abort */
void kh__lua_open_fs(lua_State *L, kh_lua *K);
void kh__lua_fs_abandon(kh_lua_co *c);

/* A coroutine for a stream (NULL: a callback of its own), in the live list. */
kh_lua_co *kh__lua_co_new(kh_lua *K, kh_stream *s);
/* One Lua slice; the only caller of lua_resume. Use kh__lua_wake. */
void kh__lua_resume(kh_lua *K, kh_lua_co *c, int nargs);
/* Resumes c with nargs values on its stack (for a fresh coroutine: the function, then nargs
 * arguments). Inside a slice it goes on the ready list instead, drained when the slice ends,
 * so lua_resume calls never nest. */
void kh__lua_wake(kh_lua *K, kh_lua_co *c, int nargs);
/* The coroutine whose slice runs now on this thread (of any instance), or NULL outside a slice. */
kh_lua_co *kh__lua_running(void);
/* Runs khamsin's _event(kind, ...) in a new coroutine; the nargs values after kind are taken
 * from the top of K->L's stack. */
void kh__lua_spawn_event(kh_lua *K, const char *what, int nargs);
/* Cancels what c waits for (timer, pool job); the caller resumes it. */
void kh__lua_wait_cleanup(kh_lua *K, kh_lua_co *c);
/* Closes every open timer (worker close). */
void kh__lua_close_timers(kh_lua *K);
/* A reload retired K: closes the app's own timers (k.timer, k.every), not the engine's (a
 * sleeping coroutine's, a deferred reply's timeout). */
void kh__lua_retire_timers(kh_lua *K);
/* kh_lua_sched.c: the worker thread's interrupt state (made by its first instance), and its
 * release when an instance closes (which also forgets K as the signal handler's target). */
kh_lua_irq *kh__lua_irq_get(void);
void kh__lua_irq_put(kh_lua *K);
void kh__lua_timer_fire_sleep(kh_lua *K, kh_lua_co *c);
/* A pool job came back (mailbox). */
void kh__lua_job_done(kh_lua *K, kh_lua_job *j);

void kh__lua_dispatch(void *app, kh_stream *s);
void kh__lua_on_body(void *app, kh_stream *s);
void kh__lua_on_abort(void *app, kh_stream *s);
void kh__lua_on_drain(void *app, kh_stream *s);
/* kh_lua_stream.c: res:write / finish, incremental body, SSE pieces, send_to (core table on top) */
void kh__lua_open_stream(lua_State *L, kh_lua *K);
void kh__lua_on_message(void *app, kh_chan_msg *m);
/* Any thread (the supervisor): kh_app_vt.interrupt. */
void kh__lua_interrupt(void *app, uint64_t seq, uint64_t ms);
void kh__lua_close_cos(kh_lua *K);
/* kh_lua_wait.c: drops the holds of deferred replies / held streams when the state closes */
void kh__lua_close_defers(kh_lua *K);
/* The hold registry follows a stream that moved (kh_stream_compact: s -> t). */
void kh__lua_defer_moved(lua_State *L, kh_stream *s, kh_stream *t);
/* package.path for a state: the app's directory, then khamsin's modules. */
void kh__lua_set_path(lua_State *L, const char *script);

/* Pool threads (kh_lua_pool.c). */
void kh__lua_pool_run(kh_job *job, void *state);
void *kh__lua_pool_init(const kh_config *cfg, int index);
void kh__lua_pool_close(void *state);

#endif
