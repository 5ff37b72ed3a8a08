/* kh_stream.h: one request and its response, the same on every protocol.
 * Owns:  the request head (one arena block: method, target, lower-cased headers), the buffered
 *        request body, the route match, the response bookkeeping (status, bytes, flags).
 * In:    protocol events (kh_stream_on_*) from kh_h1 (and later kh_h2, kh_h3); app calls
 *        (kh_stream_send_*) from the app side (the Lua binding).
 * Out:   protocol-neutral sink calls (kh_sink_vt), app events (kh_app_vt), the access log line.
 * Never: knows a wire format, touches a socket, or includes a Lua header.
 *
 * Lifetime: streams come from a per-worker pool and are never handed back to malloc while the
 * worker runs, so a stale {pointer, generation} pair held by Lua can always be checked safely
 * (style.md "Buffers": h2o's DATA_PTR reset, done by generation). A stream holds one ref for its
 * protocol and one while the app holds it; the last kh_stream_release recycles it and bumps gen. */
#ifndef KH_STREAM_H
#define KH_STREAM_H

#include <stdint.h>

#include "kh_buf.h"
#include "kh_common.h"
#include "kh_router.h"

typedef struct kh_app_inst kh_app_inst;

typedef struct kh_stream kh_stream;
typedef struct kh_worker kh_worker;

typedef struct kh_header {
    kh_str name; /* lower case in requests; as given in responses */
    kh_str value;
} kh_header;

/* A peer address, compact (an idle connection keeps one). */
typedef struct kh_addr {
    uint8_t family; /* 0 unknown, 4, 6 */
    uint8_t bytes[16];
    uint16_t port;
} kh_addr;

/* Formats "1.2.3.4" or "::1"; returns the length. buf needs 46 bytes. */
size_t kh_addr_format(const kh_addr *a, char *buf, size_t cap);

/* The response side of a protocol. Every function may be called only while the stream has a
 * protocol (s->proto != NULL); kh_stream_send_* check that and return KH_ECLOSED otherwise. */
typedef struct kh_sink_vt {
    const char *name; /* "h1" */
    /* Encodes and queues the response head. content_length is -1 when the body is streamed.
     * The protocol adds Date, Server and its own framing headers; it copies what it keeps. */
    int (*head)(kh_stream *s, int status, const kh_header *h, size_t n, int64_t content_length);
    /* Queues body bytes (copied before return); fin ends the response. For HEAD requests the
     * stream does not call data with bytes, only with fin. */
    int (*data)(kh_stream *s, const char *p, size_t n, int fin);
    /* The app waits for the request body: send 100 Continue if the client expects it. */
    void (*want_body)(kh_stream *s);
    /* Abandons the response after an error that came too late for a clean status. */
    void (*reset)(kh_stream *s, int err);
    /* Optional: the Alt-Svc value to advertise on this stream's responses (h3 on TCP), or NULL. */
    const char *(*alt_svc)(const kh_stream *s);
} kh_sink_vt;

enum kh_body_state {
    KH_BODY_READING = 0, /* more request body to come */
    KH_BODY_COMPLETE,    /* all of it is in s->body */
    KH_BODY_TOO_LARGE,   /* it passed body_bytes; 413 was answered */
    KH_BODY_ABORTED,     /* the peer went away or broke framing before the end */
};

enum {
    KH_STREAM_F_HEAD_SENT = 1u << 0,
    KH_STREAM_F_ENDED = 1u << 1,      /* the response is complete */
    KH_STREAM_F_ABORTED = 1u << 2,    /* the protocol side is gone */
    KH_STREAM_F_HEAD_METHOD = 1u << 3, /* a HEAD request: no body bytes go out */
    KH_STREAM_F_CLOSE = 1u << 4,      /* the connection must close after this response */
    KH_STREAM_F_APP = 1u << 5,        /* dispatched to the app, which holds a ref */
    KH_STREAM_F_TLS = 1u << 6,        /* the connection is secure (h1/h2 over TLS; h3): set by the
                                       * protocol, read by kh_stream_send_head (HSTS, nosniff) */
    KH_STREAM_F_COND = 1u << 12,      /* a GET/HEAD with If-None-Match or If-Modified-Since:
                                       * send_head may turn a 200 into 304 (kh_cond.h) */
    KH_STREAM_F_CODED = 1u << 13,     /* compression was decided (kh_stream_respond) */
};

struct kh_stream {
    const kh_sink_vt *sink;
    void *proto;       /* the protocol's owner (the kh_conn on h1); NULL once aborted */
    kh_worker *worker;
    kh_stream *pool_next;
    uint32_t gen;
    uint16_t refs;
    uint16_t flags;    /* KH_STREAM_F_* */
    uint32_t id;       /* per worker, for logs */

    /* request: every kh_str points into arena */
    kh_str method, target, path, query, authority;
    uint8_t version_major, version_minor;
    int8_t path_error; /* a KH_PATH_E* code when the path has no normal form (400), else 0 */
    uint32_t num_headers;
    kh_header *headers;
    char *arena;
    kh_addr peer;
    const char *scheme; /* "http" | "https" */

    /* request body */
    int body_state;         /* enum kh_body_state */
    int64_t body_expected;  /* declared length, or -1 when chunked / unknown */
    uint64_t body_received;
    uint64_t body_limit;
    kh_buf body;

    /* routing */
    intptr_t route_value;
    int route_status; /* 0 matched; 404 / 405 when route_value is the router's fallback */
    uint32_t num_params;
    kh_route_param params[KH_ROUTER_MAX_PARAMS];

    /* response */
    struct kh_compress *compress; /* the body's encoder while a streamed reply is compressed */
    int status;
    uint64_t bytes_sent;
    uint64_t start_ms;

    /* app side (the Lua binding's scheduler) */
    void *app_data;
    int app_wait; /* what the app waits for (its own codes); 0 when running or idle */
    void *app_defer; /* non-NULL while a deferred reply (res:defer) holds the stream: the app
                      * then keeps KH_STREAM_F_APP and a ref after its coroutine ended */
    kh_app_inst *inst; /* the app instance it was dispatched to (kh_app.h), retained until the
                        * stream is freed: every later app call for it goes to inst->app */

    /* protocol side, opaque to everyone else (the h1 chunked decoder lives here) */
    uint64_t proto_area[12];
};

/* Takes a stream from the worker's pool with refs = 1 (the protocol's). */
kh_stream *kh_stream_open(kh_worker *w, const kh_sink_vt *sink, void *proto);
void kh_stream_retain(kh_stream *s);
void kh_stream_release(kh_stream *s);

/* Protocol -> stream. set_head copies everything (names lower-cased) into one arena block; path
 * goes in as kh_path_normalize's normal form (target stays raw), or path_error is set. */
void kh_stream_set_head(kh_stream *s, kh_str method, kh_str target, kh_str path, kh_str query,
                        kh_str authority, int major, int minor, const kh_header *h, size_t n);
/* Declares the body length (-1 unknown). Returns KH_ELIMIT when it is already over the limit. */
int kh_stream_expect_body(kh_stream *s, int64_t length);
/* Appends request body bytes. Returns 0, or KH_ELIMIT once body_bytes is passed. */
int kh_stream_on_body(kh_stream *s, const char *p, size_t n);
void kh_stream_on_body_end(kh_stream *s);
/* The body cannot complete (bad framing, body timeout): answers status with close when no head
 * is out yet (else resets), and tells an app waiting for the body. */
void kh_stream_on_body_error(kh_stream *s, int status, const char *reason);
/* The head (and any body bytes already at hand) is in: answers 413 / 404 / 405 itself, or
 * dispatches to the app (404 / 405 too, with route_status set, when the router has a fallback
 * value: kh_router_set_fallback). The response may be complete when this returns. */
void kh_stream_on_head(kh_stream *s);
/* The protocol side is gone (connection lost, reset, bad framing): the app is told, the
 * protocol's ref is dropped, and s->proto cleared. */
void kh_stream_on_reset(kh_stream *s, int err);

/* App -> protocol. All return 0 or a negative code (KH_ECLOSED when the peer is gone, KH_EINVAL
 * for a header name or value that could split the response, KH_EPROTO when out of order).
 * send_head answers 304 instead of a 200 to a GET/HEAD whose If-None-Match / If-Modified-Since
 * the response's ETag / Last-Modified satisfy (RFC 9110 §13.2.2; kh_cond.h; the body is then
 * dropped), compresses the body when the compress limit is on and the response qualifies
 * (kh_compress.h: Content-Encoding and Vary added, each send_data flushed), adds X-Request-Id (kh_reqid.h) to every response and, on a KH_STREAM_F_TLS stream,
 * Strict-Transport-Security (limit hsts_max_age) and X-Content-Type-Options: nosniff (limit
 * tls_nosniff), each unless h already has that field. */
int kh_stream_send_head(kh_stream *s, int status, const kh_header *h, size_t n,
                        int64_t content_length);
int kh_stream_send_data(kh_stream *s, const char *p, size_t n, int fin);
/* head + whole body in one go, Content-Length set; HEAD requests get the head only. */
int kh_stream_respond(kh_stream *s, int status, const kh_header *h, size_t n, const char *body,
                      size_t len);
/* A short text/plain error reply; sets KH_STREAM_F_CLOSE when close is non-zero. */
int kh_stream_respond_error(kh_stream *s, int status, const char *text, int close);
/* Asks the protocol for the body (100 Continue on h1). */
void kh_stream_want_body(kh_stream *s);
/* Looks up a request header by lower-case name; NULL when absent. */
const kh_header *kh_stream_header(const kh_stream *s, const char *lname, size_t len);

/* "Not Found" for 404, etc.; "" for unknown codes. */
const char *kh_status_reason(int status);

#endif
