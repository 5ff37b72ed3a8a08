/* kh_worker.h: one worker: its uv loop, listeners, connections, timers and app state, on a
 * thread of its own (kh_worker_start) or on the caller's (kh_worker_load_here, then
 * kh_worker_run_here: main runs worker 0 itself, which saves a thread start at start-up).
 * Owns:  everything it touches (style.md §2): loop, router, app state, buffer cache, stream pool,
 *        timeout queues, the flush list, the access-log buffer.
 * In:    listening fds and the read-only kh_config from main; a stop request through uv_async.
 * Out:   a load result to main (kh_worker_wait_ready); served connections.
 * Never: shares a mutable byte with another worker. */
#ifndef KH_WORKER_H
#define KH_WORKER_H

#include <stdint.h>
#include <uv.h>

#include "kh_app.h"
#include "kh_buf.h"
#include "kh_chan.h"
#include "kh_limits.h"
#include "kh_timer.h"

typedef struct kh_conn kh_conn;
typedef struct kh_stream kh_stream;
typedef struct kh_router kh_router;
typedef struct kh_threadpool kh_threadpool;
typedef struct kh_shdict_reg kh_shdict_reg;
typedef struct kh_worker kh_worker;

typedef struct kh_listen_addr {
    char host[64];
    int port;          /* after binding: the real port (0 resolved) */
    int family;        /* AF_INET | AF_INET6 */
    int tls;           /* connections on it speak TLS (kh_config.tls) */
    int *fds;          /* one SO_REUSEPORT socket per worker */
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
} kh_config;

enum kh_timeout_kind {
    KH_TO_NONE = 0,
    KH_TO_HEADER,
    KH_TO_IDLE,
    KH_TO_BODY,
    KH_TO_WRITE,
    KH_TO_LINGER,
    KH_TO_TLS_HANDSHAKE,
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
    uv_timer_t heartbeat;   /* bumps beats so main.c's watchdog sees a stalled loop */
    _Atomic uint64_t beats; /* written by this worker, read by the watchdog */
    uv_prepare_t flush_prepare;
    uv_timer_t tick;
    uv_timer_t grace;
    uv_tcp_t *listeners;
    int num_listeners;

    kh_router *router;
    void *app;

    kh_timeq timeq[KH_TO__COUNT];
    kh_conn *flush_head;  /* FIFO: the connection that finished first is written first */
    kh_conn **flush_tail;
    kh_bufcache bufs;
    char *read_slab;
    kh_stream *stream_pool;
    uint32_t next_conn_id, next_stream_id;
    uint64_t num_conns;

    kh_buf access_log;
    char date[40];      /* "Sun, 29 Nov 2026 18:41:02 GMT" */
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
/* Asks a worker to stop gracefully (thread-safe). */
void kh_worker_request_stop(kh_worker *w);
/* Joins its thread (if it has one) and frees what the loop left; nothing if it never started. */
void kh_worker_join(kh_worker *w);

/* Any thread: posts m to worker `to`'s mailbox (the app's on_message receives it there).
 * Returns 0, or KH_ECLOSED / KH_EINVAL after disposing of m. */
int kh_worker_post(const kh_config *cfg, int to, kh_chan_msg *m);
/* Any thread (the watchdog): the worker's heartbeat counter (moves every ~100 ms while its
 * loop turns). */
uint64_t kh_worker_beats(kh_worker *w);

/* On the worker's thread: the current Date header value (refreshed once a second). */
const char *kh_worker_date(kh_worker *w);
/* Queues an access-log line for the stream (written once per loop turn). */
void kh_worker_access_log(kh_worker *w, const kh_stream *s);
/* Puts conn on the flush list (flushed once per loop turn, before the loop polls). */
void kh_worker_schedule_flush(kh_worker *w, kh_conn *c);
/* Takes c off the flush list (it is being freed). */
void kh_worker_unschedule_flush(kh_worker *w, kh_conn *c);

#endif
