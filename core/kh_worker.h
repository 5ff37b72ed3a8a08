/* kh_worker.h: one worker: its uv loop, listeners, connections, timers and app state, on a
 * thread of its own (kh_worker_start) or on the caller's (kh_worker_load_here, then
 * kh_worker_run_here: main runs worker 0 itself, which saves a thread start at start-up).
 * Owns:  everything it touches (style.md §2): loop, its app instances (kh_app.h: the current one,
 *        and the retired ones still in use after a reload), buffer cache, stream pool, timeout
 *        queues and the variable-deadline heap, the connection registry (kh_wconn: TCP and QUIC
 *        connections alike) and its flush list, the access-log buffer, its outbound connections'
 *        registry (kh_out.h: keep-alive pool, DNS cache; closed when it stops), and with --http3
 *        the HTTP/3 module's endpoint (w->quic, opened and closed through kh_h3_load.c).
 * In:    listening fds and the read-only kh_config from main; a stop request through uv_async;
 *        from the supervisor, an interrupt request passed to the app (kh_worker_interrupt) and
 *        reload requests (kh_worker_reload_all: a worker-level mailbox message).
 * Out:   a load result to main (kh_worker_load_state, kh_worker_wait_ready; and a send of
 *        kh_config.loaded_async); served connections; its watchdog view
 *        (heartbeat stamp, the app slice that runs and its name), atomics the supervisor reads
 *        (kh_worker_watch).
 * Never: shares a mutable byte with another worker. */
#ifndef KH_WORKER_H
#define KH_WORKER_H

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "kh_accept.h"
#include "kh_app.h"
#include "kh_buf.h"
#include "kh_chan.h"
#include "kh_limits.h"
#include "kh_slab.h"
#include "kh_timer.h"

typedef struct kh_conn kh_conn;
typedef struct kh_stream kh_stream;
typedef struct kh_router kh_router;
typedef struct kh_threadpool kh_threadpool;
typedef struct kh_shdict_reg kh_shdict_reg;
typedef struct kh_worker kh_worker;

/* The worker's connection registry: every connection, whatever its transport (a kh_conn on
 * TCP, a QUIC connection of the HTTP/3 module), embeds a kh_wconn. The registry counts them
 * for the `connections` limit, the flush pass (once per loop turn, before poll) calls flush on
 * the dirty ones, and the stop walks call shutdown (graceful stop begins) and close (the grace
 * period is over). A connection leaves with kh_worker_conn_remove once it is freed. */
typedef struct kh_wconn kh_wconn;
typedef struct kh_wconn_vt {
    void (*flush)(kh_wconn *wc);
    void (*shutdown)(kh_wconn *wc); /* finish what is in flight, then close */
    void (*close)(kh_wconn *wc);    /* close now; idempotent */
} kh_wconn_vt;
struct kh_wconn {
    const kh_wconn_vt *vt;
    kh_wconn *prev, *next; /* the registry */
    kh_wconn *flush_next;  /* the flush list, when in_flush */
    uint32_t in_flush;     /* KH_WCONN_FLUSH_* */
};
enum {
    KH_WCONN_FLUSH_NO = 0,   /* not in the flush list */
    KH_WCONN_FLUSH_DUE = 1,  /* in the list: the pass calls flush */
    KH_WCONN_FLUSH_DONE = 2, /* in the list, but flushed since it was put there (kh_worker_flushed):
                              * the pass only takes it out */
};

typedef struct kh_listen_addr {
    char host[64];
    int port;          /* after binding: the real port (0 resolved) */
    int family;        /* AF_INET | AF_INET6 */
    int tls;           /* connections on it speak TLS (kh_config.tls) */
    int *fds;          /* one SO_REUSEPORT socket per worker */
    int *udp_fds;      /* --http3 on a TLS listener: one UDP socket per worker, same port */
    char alt_svc[64];  /* then the Alt-Svc its TCP responses carry (kh_proto_alt_svc), else "" */
} kh_listen_addr;

/* Read-only after start-up; shared by all workers. */
typedef struct kh_config {
    const char *script;
    int workers;
    int dev;
    uint64_t grace_ms;
    int access_log_fd; /* -1: off */
    int access_log_extended; /* --access-log-format extended: + request time and request id */
    kh_limits limits;
    kh_listen_addr *listens;
    int num_listens;
    const kh_app_vt *app;
    /* the explicit, locked channels between threads (design.md §2); made by main */
    kh_worker *all;          /* every worker, for kh_worker_post */
    kh_threadpool *pool;     /* k.blocking */
    kh_shdict_reg *shdicts;  /* k.shared */
    struct kh_tls_ctx *tls; /* certificates and ticket keys for TLS listeners, or NULL */
    /* bumped (by main) before every reload request: pool threads drop what they loaded from
     * the app's files (their cached "module.function" lookups) when it moved */
    _Atomic uint32_t *code_epoch;
    struct kh_h3_ctx *h3;   /* --http3: the HTTP/3 module's context (kh_h3_module.h), or NULL */
    /* main's: each worker sends it once its load has ended, either way (kh_worker_load_state
     * says which), so that main learns of a worker that loads after worker 0 serves; or NULL */
    uv_async_t *loaded_async;
} kh_config;

enum kh_timeout_kind {
    KH_TO_NONE = 0,
    KH_TO_HEADER,
    KH_TO_IDLE,
    KH_TO_BODY,
    KH_TO_WRITE,
    KH_TO_LINGER,
    KH_TO_TLS_HANDSHAKE,
    KH_TO_WRITE_CHECK, /* kh_conn's progress checks of a pending socket write (write_timeout / 4) */
    KH_TO_TUNNEL,      /* an accepted tunnel with no byte either way (tunnel_idle_timeout_ms) */
    KH_TO__COUNT
};

struct kh_worker {
    int id;
    const kh_config *cfg;
    const kh_limits *limits;
    uv_thread_t thread;
    uv_loop_t loop;
    uv_async_t wakeup;
    kh_chan inbox;          /* messages from pool threads and other workers */
    uv_timer_t heartbeat;   /* stamps alive_ms so main.c's watchdog sees a stalled loop */
    /* The watchdog's view (kh_worker_watch): written by this worker, read by the supervisor
     * thread without locks. */
    _Atomic uint64_t alive_ms;       /* uv_hrtime in ms at the last heartbeat */
    _Atomic uint64_t slice_start_ns; /* the app slice that runs now began (uv_hrtime); 0: none */
    _Atomic uint64_t slice_seq;      /* bumped when a slice begins */
    _Atomic(const char *) slice_name; /* what that slice runs ("GET /users/:id", "timer") */
    _Atomic int done;                /* its loop has ended: the watchdog no longer looks at it */
    uint64_t heartbeat_ms;           /* heartbeat period */
    uv_prepare_t flush_prepare;
    uv_timer_t tick;
    uv_timer_t grace;
    kh_accept accept;       /* its listeners and the accept path (kh_accept.c) */

    /* The current app instance (kh_app.h), which new requests go to; router and app are its
     * fields, kept here for code that has no stream (a stream's calls go to s->inst->app). */
    kh_app_inst *inst;
    kh_router *router;
    void *app;
    kh_app_inst *retired;   /* instances replaced by a reload, closed after their last user */
    int retired_idle;       /* some retired instance has no user left: close it (prepare phase) */
    uint32_t last_gen;      /* generation of the newest instance built */
    char *dev_files;        /* under mu: the current instance's loaded files (--dev watch) */

    kh_timeq timeq[KH_TO__COUNT];
    kh_wconn *flush_head;  /* FIFO: the connection that finished first is written first */
    kh_wconn **flush_tail;
    kh_bufcache bufs;
    char *read_slab;
    kh_stream *stream_pool;
    kh_stream *compact_pool; /* compact streams (kh_stream_compact), KH_STREAM_COMPACT_SIZE each */
    /* where kh_conn, kh_stream and compact streams come from (kh_slab.h: no malloc header
     * each); the stream pools above keep what was released, so streams never go back */
    kh_slab conn_slab, stream_slab, compact_slab;
    /* request-head arena blocks released by streams, per size class (kh_stream.c, bounded) */
    void *arena_free[2];
    size_t arena_cached; /* bytes in arena_free */
    uint32_t next_conn_id, next_stream_id;
    uint64_t num_conns;     /* connections in the registry (conns) */

    kh_buf access_log;
    struct kh_out_reg *out_reg; /* outbound sockets: pool, counts, DNS cache (kh_out.c), or NULL */
    char date[40];      /* "Sun, 29 Nov 2026 18:41:02 GMT" */
    char date_line[40]; /* "Date: Sun, 29 Nov 2026 18:41:02 GMT\r\n" (h1's head) */
    char reqid_prefix[32]; /* "<8 hex>-<worker id>-", the made request ids' start (kh_reqid.c) */
    uint8_t reqid_prefix_len; /* 0 until the first made id */
    uint64_t date_sec;

    /* start-up handshake and stop, guarded by the mutex */
    uv_mutex_t mu;
    uv_cond_t cv;
    int ready; /* 0 loading, 1 loaded, -1 failed */
    char load_err[2048];
    int stop_requested;
    int stopping;
    int started;  /* its loop was initialized (kh_worker_join has something to free) */
    int threaded; /* it runs on `thread`, which kh_worker_join joins */
    int loaded;   /* kh_worker_load_here: the app loaded (the loop serves, then closes it) */
    int app_closing; /* under mu: the app state is being closed (no more kh_worker_interrupt) */

    kh_wconn conns;      /* the registry's sentinel (a circular list) */
    kh_dtimeq dtimeq;    /* variable deadlines (kh_worker_dtimer_set), driven by dtick */
    uv_timer_t dtick;
    uint64_t dtick_at;   /* the deadline dtick is armed for; UINT64_MAX: not armed */
    void *quic;          /* the HTTP/3 module's per-worker state (its endpoint), or NULL */
};

/* Starts the thread; the worker loads the app, then reports through kh_worker_wait_ready. */
int kh_worker_start(kh_worker *w, int id, const kh_config *cfg);
/* The same on the calling thread: loads the app and opens the listeners, and returns 0 or -1
 * (message in w->load_err) as kh_worker_wait_ready would. Then kh_worker_run_here runs the
 * worker's loop on this thread until it stops (after a failed load: until it has closed). */
int kh_worker_load_here(kh_worker *w, int id, const kh_config *cfg);
void kh_worker_run_here(kh_worker *w);
/* Blocks until the worker loaded its app; returns 0 or -1 (message in w->load_err). */
int kh_worker_wait_ready(kh_worker *w);
/* Any thread, without blocking: 0 while the worker loads, 1 once it serves, -1 if its load
 * failed (message in w->load_err, complete once this says -1). */
int kh_worker_load_state(kh_worker *w);
/* Asks a worker to stop gracefully (thread-safe). */
void kh_worker_request_stop(kh_worker *w);
/* Joins its thread (if it has one) and frees what the loop left; nothing if it never started. */
void kh_worker_join(kh_worker *w);
/* Only joins its thread (if it has one): the worker's memory stays for the supervisor, which
 * may still read it, until kh_worker_join. */
void kh_worker_join_thread(kh_worker *w);

/* Any thread: posts m to worker `to`'s mailbox (the app's on_message receives it there).
 * Returns 0, or KH_ECLOSED / KH_EINVAL after disposing of m. */
int kh_worker_post(const kh_config *cfg, int to, kh_chan_msg *m);
/* App instances (kh_app.h), on the worker's thread. retain/release count users; a retired
 * instance whose count reaches 0 is closed from the loop's prepare phase (never inside one of
 * its own callbacks). kh_worker_inst_find: the open instance of that generation (0: the
 * current one), or NULL when it has been closed. */
void kh_app_inst_retain(kh_app_inst *in);
void kh_app_inst_release(kh_app_inst *in);
kh_app_inst *kh_worker_inst_find(kh_worker *w, uint32_t gen);

/* Hot reload. Any thread (the supervisor): asks every worker to build a new app instance on its
 * own thread (a worker-level mailbox message). A worker whose load fails keeps its current
 * instance. When the last worker has tried, done(&result, ud) runs on that worker's thread. */
typedef struct kh_reload_result {
    int workers;   /* how many tried */
    int ok;        /* how many now serve a new instance */
    uint32_t gen;  /* the newest generation among them */
    char err[1024]; /* the first failure: "file:line: message" */
} kh_reload_result;
int kh_worker_reload_all(const kh_config *cfg, void (*done)(const kh_reload_result *r, void *ud),
                         void *ud);
/* Any thread: a copy of the files worker w's current instance loaded ("path\n" each; --dev
 * only), malloc'd, or NULL. */
char *kh_worker_loaded_files(kh_worker *w);

/* The watchdog (main.c's supervisor thread) and a stalled worker.
 *
 * A worker stamps alive_ms from a heartbeat timer every heartbeat_ms (at most 100 ms, a quarter
 * of the shortest stall limit), and the app brackets each of its slices (one run of Lua between
 * two waits) with kh_worker_slice_begin/end. The supervisor reads both without locks:
 * kh_worker_watch says how long the loop has not turned, and in what. */
typedef struct kh_worker_stall {
    uint64_t stalled_ms; /* a lower bound: the slice's age, or the heartbeat's lateness */
    uint64_t slice_ms;   /* age of the slice that runs now (0: none) */
    uint64_t slice_seq;  /* its number, for kh_worker_interrupt */
    uint64_t alive_ms;   /* the last heartbeat: it moves again once the loop turns */
    int done;            /* the worker's loop has ended */
    int loading;         /* it still loads the app (not watched: stalled_ms is 0) */
    char what[128];      /* "GET /spin", "timer callback", "" (not in the app: C code) */
} kh_worker_stall;
/* Any thread: fills *st for now_ms (uv_hrtime() / 1e6). The name is copied under the worker's
 * mutex, so it is never read after the app state that owns it was closed. */
void kh_worker_watch(kh_worker *w, uint64_t now_ms, kh_worker_stall *st);
/* Any thread: asks the app to interrupt slice `seq` if it still runs (kh_app_vt.interrupt).
 * Returns 1 if the request was passed on (the app may still be unable to act on it). */
int kh_worker_interrupt(kh_worker *w, uint64_t seq, uint64_t ms);
/* Any thread: the listening socket of listener i (the order of --listen) of this worker. It
 * is main's fd, in the SO_REUSEPORT group at index w->id (main binds and listens in worker
 * order), open from start-up until the worker stops: whatever accepts on it (uv_listen, or a
 * uv_poll_t + accept4) must neither close nor re-create it while the worker serves, so that
 * the supervisor may steer new connections away from a stalled worker (main.c). */
int kh_worker_listener_fd(const kh_worker *w, int i);

/* On the worker's thread, around each slice of app code (the Lua binding's resume). name must
 * stay valid until the app state is closed (worker_close). t0_ns: uv_hrtime() at the start. */
static inline void kh_worker_slice_begin(kh_worker *w, const char *name, uint64_t t0_ns)
{
    atomic_store_explicit(&w->slice_name, name, memory_order_relaxed);
    /* one writer: a plain store, no locked add */
    atomic_store_explicit(&w->slice_seq,
                          atomic_load_explicit(&w->slice_seq, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&w->slice_start_ns, t0_ns ? t0_ns : 1, memory_order_release);
}
static inline void kh_worker_slice_end(kh_worker *w)
{
    atomic_store_explicit(&w->slice_start_ns, 0, memory_order_release);
}
/* On the worker's thread: the number of the slice that runs now (or ran last). */
static inline uint64_t kh_worker_slice_seq(kh_worker *w)
{
    return atomic_load_explicit(&w->slice_seq, memory_order_relaxed);
}

/* On the worker's thread: the current Date header value (refreshed once a second). */
const char *kh_worker_date(kh_worker *w);
/* The same as a whole HTTP/1.1 field line, "Date: <value>\r\n": KH_WORKER_DATE_LINE bytes, no
 * NUL (one fixed-size copy into an h1 head instead of three). */
#define KH_WORKER_DATE_LINE 37
const char *kh_worker_date_line(kh_worker *w);
/* Queues an access-log line for the stream (written once per loop turn). */
void kh_worker_access_log(kh_worker *w, const kh_stream *s);
/* Puts conn on the flush list (flushed once per loop turn, before the loop polls). */
void kh_worker_schedule_flush(kh_worker *w, kh_conn *c);
/* Takes c off the flush list (it is being freed). */
void kh_worker_unschedule_flush(kh_worker *w, kh_conn *c);

/* The connection registry (kh_wconn above). add counts wc in num_conns; remove (when wc is
 * freed) takes it off the flush list too, lets a paused accept path resume, and lets a stopping
 * worker finish once the last connection is gone. */
void kh_worker_conn_add(kh_worker *w, kh_wconn *wc, const kh_wconn_vt *vt);
void kh_worker_conn_remove(kh_worker *w, kh_wconn *wc);
void kh_worker_flush_later(kh_worker *w, kh_wconn *wc);
/* The connection flushes now, outside the pass: if it is in the list, the pass has nothing left
 * to do for it unless it is scheduled again (kh_worker_flush_later) before then. */
static inline void kh_worker_flushed(kh_wconn *wc)
{
    if (wc->in_flush)
        wc->in_flush = KH_WCONN_FLUSH_DONE;
}
/* 1 while a new connection fits under the `connections` limit and the worker is not stopping. */
int kh_worker_conn_room(const kh_worker *w);
/* Variable-deadline timers (kh_dtimer, kh_timer.h): t->cb runs once loop time passes deadline
 * (ms, uv_now's clock), to the millisecond (not the tick of the fixed queues). */
void kh_worker_dtimer_set(kh_worker *w, kh_dtimer *t, uint64_t deadline_ms);
void kh_worker_dtimer_cancel(kh_worker *w, kh_dtimer *t);

#endif
