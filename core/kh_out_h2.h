/* kh_out_h2.h: one HTTP/2 client connection shared by every request of a worker to an origin:
 * the requests are streams of one kh_h2c session over one kh_out, each waited on by its own
 * caller (a parked coroutine) with its own timeout. kh_out allows one operation at a time; this
 * object is the single owner of that connection's operations: it keeps one read pending and, when
 * the session has frames to send, cancels the read (which keeps a kh_out usable), writes, then
 * reads again. kh_out itself knows nothing of it.
 * Owns:  the kh_h2c session, the kh_out once attached (closed on failure, idle expiry or free),
 *        the waiters (one per waiting stream: callback, uv_timer_t for its timeout), the idle
 *        timer. Whoever holds the handle (lua/kh_lua_http.c's userdata) frees it.
 * In:    submits (through kh_out_h2_session + kh_h2c_submit*, then kh_out_h2_flush), waits,
 *        forgets, socket completions, timers.
 * Out:   a waiter's callback once, with 0 (what it waits for happened, or the stream failed:
 *        read kh_h2c_info) or KH_ETIMEDOUT; callbacks run from libuv callbacks or from a
 *        kh_out_h2_* call that did I/O (never for the stream the caller is waiting on at that
 *        moment, since a caller that calls is not waiting).
 * Never: lets one stream's timeout, cancel or body reader touch another stream: a stream that
 *        times out or whose caller left is forgotten (RST_STREAM CANCEL) alone; only a
 *        connection failure (read/write error, EOF, protocol error, GOAWAY) ends every stream it
 *        affects, each with its precise reason.
 *
 *   h = kh_out_h2_new(w, &lim, io_timeout_ms, idle_ms)   unattached: submits queue in nghttp2
 *   kh_out_h2_attach(h, o)        o (connected, h2 negotiated) is h's from now; I/O starts
 *   kh_out_h2_fail(h, why)        the connect failed: every stream fails with `why`
 *   rc = kh_out_h2_wait(h, id, what, low, timeout_ms, cb, arg)  1: already so; 0: parked
 *   kh_out_h2_unwait(h, id)       the waiter left: no callback
 *   kh_out_h2_forget(h, id)       done with the stream (RST_STREAM CANCEL if still open);
 *                                 kh_out_h2_forget_later: the same, sent from the next loop turn
 *   kh_out_h2_flush(h)            send what the session has (after submit, write, take)
 *   kh_out_h2_free(h)             closes the connection; no waiter may be parked */
#ifndef KH_OUT_H2_H
#define KH_OUT_H2_H

#include <stddef.h>
#include <stdint.h>

#include "kh_h2_client.h"

typedef struct kh_worker kh_worker;
typedef struct kh_out kh_out;
typedef struct kh_out_h2 kh_out_h2;

/* What a wait is for. Every kind also ends when the stream fails or the connection does. */
enum {
    KH_OUT_H2_HEAD = 1,  /* the final response head */
    KH_OUT_H2_BODY = 2,  /* body bytes to take, or the end of the body */
    KH_OUT_H2_DRAIN = 3, /* the request body not yet sent is at most `low` bytes (or the
                          * response ended: the server wants no more) */
};

typedef void (*kh_out_h2_cb)(kh_out_h2 *h, int32_t id, int status, void *arg);

kh_out_h2 *kh_out_h2_new(kh_worker *w, const kh_h2c_limits *lim, uint64_t io_timeout_ms,
                         uint64_t idle_ms);
void kh_out_h2_attach(kh_out_h2 *h, kh_out *o);
void kh_out_h2_fail(kh_out_h2 *h, const char *why);
kh_h2c *kh_out_h2_session(kh_out_h2 *h);
void kh_out_h2_flush(kh_out_h2 *h);
int kh_out_h2_wait(kh_out_h2 *h, int32_t id, int what, size_t low, uint64_t timeout_ms,
                   kh_out_h2_cb cb, void *arg);
void kh_out_h2_unwait(kh_out_h2 *h, int32_t id);
void kh_out_h2_forget(kh_out_h2 *h, int32_t id);
/* The same, for a caller that must not see other waiters called back meanwhile (the abort of
 * a waiting coroutine): the RST_STREAM goes out from the loop's next turn. */
void kh_out_h2_forget_later(kh_out_h2 *h, int32_t id);
void kh_out_h2_free(kh_out_h2 *h);

/* 1 while h takes new streams: not failed, no GOAWAY, under the server's
 * SETTINGS_MAX_CONCURRENT_STREAMS (before they arrive: nghttp2's default of 100). */
int kh_out_h2_can_submit(kh_out_h2 *h);
/* 1 when h is of no more use (failed, closed, or GOAWAY with nothing open). */
int kh_out_h2_dead(kh_out_h2 *h);
int kh_out_h2_attached(const kh_out_h2 *h);
/* Why the connection failed ("" if it has not): the reason a stream cut by it gets. */
const char *kh_out_h2_error(const kh_out_h2 *h);

#endif
