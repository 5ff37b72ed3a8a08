/* kh_app.h: the only way core calls up into the application layer (the Lua binding).
 * Core knows no more of Lua than this table. All calls happen on the worker's own thread, except
 * `interrupt`.
 * Streams (issue 10): dispatch gives every routed request, tunnel requests too (the stream has
 * KH_STREAM_F_TUNNEL_REQ and s->tunnel_proto; s->route_value is the tunnel-kind route). The app
 * answers with kh_stream_respond / send_head + send_data (streamed, watching kh_stream_queued
 * and kh_stream_want_drain -> on_drain), reads the body whole (on_body once) or incrementally
 * (kh_stream_body_stream: on_body per arrival, kh_stream_body_consume), and turns a tunnel
 * request into a tunnel with kh_stream_accept_tunnel (kh_stream.h has the whole seam).
 * A stream the app holds (between a tunnel's messages: kh_stream_hold, no coroutine) may move:
 * on h1 kh_stream_compact copies a held tunnel into a compact stream with a new {pointer,
 * generation} pair, and the app, which asked for it from a point where no C frame holds the
 * old pointer, updates its own references; every later app call (on_body, on_drain, on_abort)
 * names the compact stream.
 *
 * App instances (hot reload). A worker serves one *current* instance, {app state, router,
 * generation}: kh_app_inst. A reload (--dev file change, SIGHUP) builds a new one on the worker's
 * own thread; new requests go to it; the old one is *retired*: it serves whatever still holds it
 * (a request in flight, a deferred reply, a WebSocket / SSE stream, a timer callback running)
 * and is closed after its last user, never while one of its callbacks runs (kh_worker closes
 * retired instances from its loop's prepare phase, outside any app code).
 *
 * Who records an instance: everything that will call back into the app later. A stream records
 * the instance it was dispatched to (s->inst, retained by kh_stream_on_head, released when the
 * stream is freed): on_body / on_abort, and any later call for that stream (a WebSocket frame,
 * an SSE drain, a socket or HTTP-client completion), go to s->inst->app, never to the worker's
 * current instance. Something that outlives its stream, or has none (a socket, a client request,
 * a timer), keeps its own reference: kh_app_inst_retain(inst) while it may call back,
 * kh_app_inst_release(inst) once it will not (both on the worker's thread). A mailbox message
 * meant for one instance carries its generation (kh_chan_msg.gen; 0: the current instance) and
 * is routed with kh_worker_inst_find. */
#ifndef KH_APP_H
#define KH_APP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kh_worker kh_worker;
typedef struct kh_stream kh_stream;
typedef struct kh_router kh_router;
typedef struct kh_chan_msg kh_chan_msg;
typedef struct kh_config kh_config;
typedef struct kh_app_inst kh_app_inst;

struct kh_app_inst {
    void *app;          /* the app's state (worker_init's); NULL once closed */
    kh_router *router;  /* the routes of that state (route values are its own refs) */
    uint32_t gen;       /* 1 at start-up, +1 per successful reload of this worker */
    uint32_t users;     /* kh_app_inst_retain count; the worker holds one on its current one */
    int retired;        /* a newer instance serves new requests: closed when users reaches 0 */
    int closed;         /* worker_close has run: calls for it are dropped */
    kh_worker *w;
    kh_app_inst *next;  /* the worker's list of retired instances not yet freed */
};

typedef struct kh_app_vt {
    /* Builds an app state and fills inst->router (inst->gen is set; inst->app is not yet).
     * Returns 0, or -1 with a message in err (for a script: "file:line: message"). Called at
     * start-up and for every reload, on the worker's thread. */
    int (*worker_init)(kh_worker *w, kh_app_inst *inst, void **app, char *err, size_t errlen);
    void (*worker_close)(void *app);
    /* A reload replaced this instance: stop what would start new work in it (the app's own
     * timers, k.every, subscriptions); what is in flight goes on. May be NULL. */
    void (*retire)(void *app);
    /* --dev: the files the app loaded ("path\n" each), for the file watch; may be NULL. The
     * string stays valid until worker_close. */
    const char *(*loaded_files)(void *app);
    /* A routed request: s->route_value and s->params are set. The app takes a ref
     * (kh_stream_retain) for as long as it holds the stream. */
    void (*dispatch)(void *app, kh_stream *s);
    /* The body the app waits for is complete (or will never be: s->body_state says). */
    void (*on_body)(void *app, kh_stream *s);
    /* The protocol side of a stream the app holds is gone. */
    void (*on_abort)(void *app, kh_stream *s);
    /* A stream that asked kh_stream_want_drain has its queue at or below the low-water mark
     * (stream_high_water / 2): the app may write again. Called from the protocol's flush pass
     * (never inside a protocol library's callback), once per want_drain. For an incremental
     * body or a tunnel, on_body above is called on each arrival of bytes and at their end
     * (s->body_state says which), while the app waits for them (s->app_wait non-zero). */
    void (*on_drain)(void *app, kh_stream *s);
    /* A message from the worker's mailbox (a pool result, another worker's publish or
     * resolve). The app owns m from now on. Called outside any app code (from the async). */
    void (*on_message)(void *app, kh_chan_msg *m);
    /* Pool threads: each builds its own state on its own thread (may return NULL) and frees it
     * there when the pool stops. Called with the process config (read-only). */
    void *(*pool_thread_init)(const kh_config *cfg, int index);
    void (*pool_thread_close)(void *state);
    /* The one call from another thread (the supervisor, under the worker's mutex, while the
     * app is open): slice `seq` (kh_worker_slice_seq) has run `ms` without yielding; interrupt
     * it if it still runs. It may only set flags (signal-handler style); may be NULL. */
    void (*interrupt)(void *app, uint64_t seq, uint64_t ms);
} kh_app_vt;

#endif
