/* kh_app.h: the only way core calls up into the application layer (the Lua binding).
 * Core knows no more of Lua than this table. All calls happen on the worker's own thread, except
 * `interrupt`.
 * Streams (issue 10): dispatch gives every routed request, tunnel requests too (the stream has
 * KH_STREAM_F_TUNNEL_REQ and s->tunnel_proto; s->route_value is the tunnel-kind route). The app
 * answers with kh_stream_respond / send_head + send_data (streamed, watching kh_stream_queued
 * and kh_stream_want_drain -> on_drain), reads the body whole (on_body once) or incrementally
 * (kh_stream_body_stream: on_body per arrival, kh_stream_body_consume), and turns a tunnel
 * request into a tunnel with kh_stream_accept_tunnel (kh_stream.h has the whole seam). */
#ifndef KH_APP_H
#define KH_APP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kh_worker kh_worker;
typedef struct kh_stream kh_stream;
typedef struct kh_router kh_router;
typedef struct kh_chan_msg kh_chan_msg;
typedef struct kh_config kh_config;

typedef struct kh_app_vt {
    /* Builds the worker's app state and fills its router. Returns 0, or -1 with a message in
     * err (for a script: "file:line: message"). */
    int (*worker_init)(kh_worker *w, kh_router *router, void **app, char *err, size_t errlen);
    void (*worker_close)(void *app);
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
