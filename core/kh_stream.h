/* kh_stream.h: one request and its response, the same on every protocol.
 * Owns:  the request head (one arena block: method, target, lower-cased headers), the buffered
 *        request body, the route match, the response bookkeeping (status, bytes, flags).
 * In:    protocol events (kh_stream_on_*) from kh_h1 (and later kh_h2, kh_h3); app calls
 *        (kh_stream_send_*) from the app side (the Lua binding).
 * Out:   protocol-neutral sink calls (kh_sink_vt), app events (kh_app_vt), the access log line.
 * Never: knows a wire format, touches a socket, or includes a Lua header.
 *
 * The seam (issue 10), the same for h1, h2 and later h3 (RFC 9220 plugs into the same calls):
 *  - Output backpressure: the sink reports what a stream has queued (sink->queued, bytes of this
 *    stream's response accepted and not yet on the socket). An app that streams (res:write, SSE)
 *    asks kh_stream_want_drain once the queue passes stream_high_water; the protocol calls
 *    kh_stream_on_drain when it may have shrunk (h1: in its flush pass, i.e. after a socket write
 *    completed; h2: after mem_send, never inside an nghttp2 callback), and the app gets
 *    kh_app_vt.on_drain once the queue is at or below half the mark (the low-water mark).
 *  - Incremental request body: kh_stream_body_stream switches a stream whose body is still coming
 *    to a bounded window: body_bytes no longer applies, s->body holds at most about body_window
 *    bytes (h1 stops reading past it; h2 gives the stream's flow-control window back only as the
 *    app consumes, the connection's at once), each arrival calls kh_app_vt.on_body, and the app
 *    takes bytes with kh_stream_body_consume.
 *  - Tunnels (WebSocket on h1 GET + Upgrade, h2 extended CONNECT with :protocol (RFC 8441), h3
 *    RFC 9220 later): the protocol marks such a request KH_STREAM_F_TUNNEL_REQ with the protocol
 *    name in s->tunnel_proto ("websocket"); routing then looks for a route of the tunnel kind
 *    ("@websocket" in kh_router.h), falling back to ordinary routing when there is none (an h1
 *    GET is then served as HTTP/1.1). The app validates the handshake (its own fields, e.g.
 *    Sec-WebSocket-Key, are in the headers) and calls kh_stream_accept_tunnel: 101 on h1, 200 on
 *    h2. From then on inbound bytes arrive as an incremental body with no body_bytes cap, no
 *    body/header timeout (tunnel_idle_timeout_ms instead), the peer's end of input as the body's
 *    end (KH_BODY_COMPLETE), and kh_stream_send_data carries outbound bytes, fin ending the
 *    tunnel (h1 closes the connection, h2 ends the stream). tunnel_idle_timeout_ms is per
 *    tunnel on h2 and h3 (each resets the idle stream alone), per connection on h1.
 *  - File bodies: kh_stream_send_file hands an open file's range to the sink's optional file
 *    operation (h1 cleartext: kh_conn_sendfile, the kernel copies from the page cache, no
 *    read into memory, no thread-pool hop); a protocol that needs the bytes (TLS records, h2
 *    DATA frames, h3, compression) says UV_ENOTSUP and the app reads and sends data.
 *  - A slow consumer (k.send_to past stream_out_cap) is ended with kh_stream_cut: fin, then
 *    the protocol drops what the peer has not taken and frees the stream (sink cut: h2).
 *  - Memory of an idle tunnel (issue 10 item 8): a held h1 tunnel (F_TUNNEL | F_HELD, no
 *    coroutine: a WebSocket between messages) moves with kh_stream_compact into a compact
 *    stream: the same struct cut after the first word of proto_area (KH_STREAM_COMPACT_SIZE,
 *    216 B, plus 16 B for the access log's method and path: 232 B from the worker's compact
 *    slab, kh_slab.h), instead of the whole kh_stream (464 B). The fields are ordered for it:
 *    what a tunnel uses first (hooks, refs, flags, the log's method and path, peer, body window
 *    buffer, byte counts, app state, h1's flags in proto_area[0]), the request's part (target,
 *    query, authority, headers, params, tunnel_proto) after proto_area. Every kh_stream_*
 *    function and sink call a tunnel makes works on either; the readers of the request's part
 *    check KH_STREAM_F_COMPACT (kh_stream_header, kh_stream_target, the Lua accessors). The
 *    pool link shares start_ms's word (a released stream keeps only its generation). Was 248
 *    + 16 B in a 272-byte malloc chunk (bench/README.md "Memory per idle WebSocket"). h1 moves
 *    its pointer (sink moved); h2 and h3 streams never move (nghttp2 and nghttp3 hold them),
 *    so their tunnels keep the whole stream.
 *
 * Lifetime: streams come from a per-worker pool (compact ones from a pool of their own), whose
 * objects come from the worker's slabs (kh_slab.h), and are never handed back while the worker
 * runs, so a stale {pointer, generation} pair held
 * by Lua can always be checked safely (style.md "Buffers": h2o's DATA_PTR reset, done by
 * generation). A stream holds one ref for its protocol and one while the app holds it; the last
 * kh_stream_release recycles it and bumps gen. */
#ifndef KH_STREAM_H
#define KH_STREAM_H

#include <stddef.h>
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
    /* Bytes of this stream's response accepted and not yet written to the socket (h1: the
     * connection's out queue, one stream at a time; h2: the stream's bytes nghttp2 has not
     * taken yet). */
    size_t (*queued)(kh_stream *s);
    /* The app took n bytes of an incremental body out of s->body (kh_stream_body_consume):
     * h1 reads again once below the window, h2 gives n bytes of the stream's window back. */
    void (*consumed)(kh_stream *s, size_t n);
    /* Accepts a tunnel request (KH_STREAM_F_TUNNEL_REQ): h1 sends 101 Switching Protocols with
     * Connection: Upgrade, Upgrade: <s->tunnel_proto> and h; h2 sends a 200 with h and no
     * content-length. Then both carry raw bytes both ways (see the file comment). */
    int (*tunnel)(kh_stream *s, const kh_header *h, size_t n);
    /* Optional: queues n bytes of the open file fd from offset off as body (kh_stream_send_file)
     * and takes fd (closes it when sent or when the connection goes); fin as for data. Returns
     * UV_ENOTSUP, fd still the caller's, where the protocol needs the bytes themselves (TLS,
     * chunked framing): the caller reads and sends data instead. h1 cleartext: sendfile(2). */
    int (*file)(kh_stream *s, int fd, int64_t off, uint64_t n, int fin);
    /* Optional: the protocol's pointer to s now points to t (kh_stream_compact); NULL: the
     * protocol's streams never move (h2, h3: their maps and nghttp2 / nghttp3 hold them). */
    void (*moved)(kh_stream *s, kh_stream *t);
    /* Optional: the response is ended (fin queued) and its reader too slow (kh_stream_cut):
     * once the flush pass has put out what the peer lets through now, abandon the rest and
     * free the stream (h2: RST_STREAM CANCEL, or NO_ERROR after END_STREAM went out). */
    void (*cut)(kh_stream *s);
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
    KH_STREAM_F_WANT_DRAIN = 1u << 7, /* the app waits for on_drain (kh_stream_want_drain) */
    KH_STREAM_F_BODY_STREAM = 1u << 8, /* the body is read incrementally under body_window */
    KH_STREAM_F_TUNNEL_REQ = 1u << 9, /* the request asks for a tunnel (s->tunnel_proto) */
    KH_STREAM_F_TUNNEL = 1u << 10,    /* the tunnel is accepted: raw bytes both ways */
    KH_STREAM_F_HELD = 1u << 11,      /* an idle long-lived stream (SSE held after its handler):
                                       * its request head arena was released (memory) */
    KH_STREAM_F_COND = 1u << 12,      /* a GET/HEAD with If-None-Match or If-Modified-Since:
                                       * send_head may turn a 200 into 304 (kh_cond.h) */
    KH_STREAM_F_CODED = 1u << 13,     /* compression was decided (kh_stream_respond) */
    KH_STREAM_F_COMPACT = 1u << 14,   /* a compact copy of a held h1 tunnel (kh_stream_compact):
                                       * only KH_STREAM_COMPACT_SIZE bytes exist */
};

/* A route value (kh_router_add) with this bit set belongs to a route whose handler reads the
 * body incrementally (req:body_reader): a declared body over body_bytes is not answered 413 but
 * dispatched, the body switched to incremental reading. The bit is cleared from
 * s->route_value before dispatch (the app's own values stay below it). */
#define KH_ROUTE_BODY_STREAM ((intptr_t)1 << 30)

/* Longest tunnel protocol name kept (RFC 8441 :protocol / Upgrade token), NUL included. */
#define KH_TUNNEL_PROTO_MAX 16

struct kh_stream {
    /* ---- the compact part: all a held h1 tunnel keeps (kh_stream_compact) ---- */
    const kh_sink_vt *sink;
    void *proto;       /* the protocol's owner (the kh_conn on h1); NULL once aborted */
    kh_worker *worker;
    uint32_t gen;
    uint16_t refs;
    uint16_t flags;    /* KH_STREAM_F_* */
    uint32_t id;       /* per worker, for logs */
    int app_wait; /* what the app waits for (its own codes); 0 when running or idle */

    /* request: every kh_str points into arena */
    kh_str method, path; /* (target is in the request's part: kh_stream_target) */
    char *arena;
    uint8_t version_major, version_minor;
    int8_t path_error; /* a KH_PATH_E* code when the path has no normal form (400), else 0 */
    uint8_t arena_class; /* where arena goes back: a class of the worker's cache, or malloc */
    int status;        /* the response's */
    kh_addr peer;
    /* two small fields in the room after peer (8 bytes less per stream than ints of their
     * own: memory per idle WebSocket) */
    uint8_t body_state;     /* enum kh_body_state */
    int16_t route_status;   /* 0 matched; 404 / 405 when route_value is the router's fallback */

    /* request body */
    uint64_t body_received;
    uint64_t body_limit;
    kh_buf body;

    /* routing */
    intptr_t route_value; /* (route_status is beside body_state) */

    /* response */
    struct kh_compress *compress; /* the body's encoder while a streamed reply is compressed */
    uint64_t bytes_sent;
    union {
        uint64_t start_ms;    /* open: when the request began (the access log's time) */
        kh_stream *pool_next; /* released, in a pool: the next one (one word less in a compact
                               * stream; a stale {s, gen} check reads gen only) */
    };

    /* app side (the Lua binding's scheduler) */
    void *app_data;
    void *app_defer; /* non-NULL while a deferred reply (res:defer) holds the stream: the app
                      * then keeps KH_STREAM_F_APP and a ref after its coroutine ended */
    kh_app_inst *inst; /* the app instance it was dispatched to (kh_app.h), retained until the
                        * stream is freed: every later app call for it goes to inst->app */

    /* protocol side, opaque to everyone else (the h1 chunked decoder lives here). A compact
     * stream keeps its first word only (KH_STREAM_COMPACT_SIZE): h1 puts there what a tunnel
     * uses */
    uint64_t proto_area[12];

    /* ---- the request's part: never read on a compact stream ---- */
    kh_str target; /* raw, as received: read it with kh_stream_target */
    kh_str query, authority;
    uint32_t num_headers;
    uint32_t num_params;
    kh_header *headers;
    int64_t body_expected;  /* declared length, or -1 when chunked / unknown */
    /* tunnel request: the protocol asked for, lower case ("websocket"); "" when none */
    char tunnel_proto[KH_TUNNEL_PROTO_MAX];
    kh_route_param *params; /* params_inline, or malloc'd for more than two (freed with s):
                             * an idle long-lived stream keeps no room for 16 (issue 10) */
    kh_route_param params_inline[2]; /* last: kh_stream_open clears what comes before */
};

/* What a compact stream (KH_STREAM_F_COMPACT) has: the fields up to and including the first
 * word of proto_area, then KH_STREAM_COMPACT_INLINE bytes where the method and path of the
 * access log line are kept when they fit (else in a block of their own, s->arena). */
#define KH_STREAM_COMPACT_INLINE 16
#define KH_STREAM_COMPACT_SIZE (offsetof(kh_stream, proto_area) + sizeof(uint64_t))

/* The request target as received; on a held stream its path (kh_stream_hold), which is all a
 * compact one keeps (its target is not copied: 16 bytes less per idle WebSocket). */
static inline kh_str kh_stream_target(const kh_stream *s)
{
    return (s->flags & KH_STREAM_F_COMPACT) ? s->path : s->target;
}

/* Takes a stream from the worker's pool with refs = 1 (the protocol's). */
kh_stream *kh_stream_open(kh_worker *w, const kh_sink_vt *sink, void *proto);
void kh_stream_retain(kh_stream *s);
void kh_stream_release(kh_stream *s);

/* Protocol -> stream. set_head copies everything (names lower-cased, but for major 2: HTTP/2
 * hands them lower case) into one arena block; path
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
 * (kh_compress.h: Content-Encoding and Vary added, each send_data flushed), adds X-Request-Id
 * (kh_reqid.h) as limit request_id_header says (by default: a client's own id echoed, and on
 * every 5xx) and, on a KH_STREAM_F_TLS stream,
 * Strict-Transport-Security (limit hsts_max_age) and X-Content-Type-Options: nosniff (limit
 * tls_nosniff), each unless h already has that field. */
int kh_stream_send_head(kh_stream *s, int status, const kh_header *h, size_t n,
                        int64_t content_length);
int kh_stream_send_data(kh_stream *s, const char *p, size_t n, int fin);
/* Body from a file: n bytes of fd from off, with fin, through the sink's file operation (the
 * kernel copies: sendfile on h1 cleartext). 0: fd is the protocol's now (closed by it);
 * UV_ENOTSUP (no file operation on this protocol or connection, or the body is compressed):
 * nothing was sent and fd is still the caller's, who reads and calls send_data instead; other
 * errors as send_data (fd still the caller's). A HEAD request sends the fin only (fd closed). */
int kh_stream_send_file(kh_stream *s, int fd, int64_t off, uint64_t n, int fin);
/* head + whole body in one go, Content-Length set; HEAD requests get the head only. */
int kh_stream_respond(kh_stream *s, int status, const kh_header *h, size_t n, const char *body,
                      size_t len);
/* A Content-Type field for value: when value is one the engine sends itself (text/plain;
 * charset=utf-8, application/json), the engine's own constant, which send_head knows to be valid
 * and does not scan again; else {Content-Type, value} (checked as any field). */
kh_header kh_stream_content_type(const char *value, size_t len);
/* A short text/plain error reply; sets KH_STREAM_F_CLOSE when close is non-zero. */
int kh_stream_respond_error(kh_stream *s, int status, const char *text, int close);
/* Asks the protocol for the body (100 Continue on h1). */
void kh_stream_want_body(kh_stream *s);
/* Looks up a request header by lower-case name; NULL when absent. */
const kh_header *kh_stream_header(const kh_stream *s, const char *lname, size_t len);

/* ---- the streaming seam (see the file comment) ---- */

/* Marks a tunnel request; proto (e.g. "websocket") is lower-cased and must be shorter than
 * KH_TUNNEL_PROTO_MAX (else the request is not marked). Protocol side, before on_head. */
void kh_stream_mark_tunnel(kh_stream *s, kh_str proto);
/* Bytes of the response queued and not yet on the socket (0 once the protocol is gone). */
size_t kh_stream_queued(const kh_stream *s);
/* Returns 1 when the queue is at or below the low-water mark (stream_high_water / 2): no wait.
 * Else sets KH_STREAM_F_WANT_DRAIN and returns 0: kh_app_vt.on_drain comes once it is (or
 * on_abort, when the peer goes first). KH_ECLOSED when the protocol is gone. */
int kh_stream_want_drain(kh_stream *s);
/* Protocol side: the queue may have shrunk. Calls on_drain when the app waits and the queue is
 * at or below the low-water mark. Never call it inside a protocol library's callback: the app
 * runs from here (it writes again at once). */
void kh_stream_on_drain(kh_stream *s);
/* Switches the request body to incremental reading (see the file comment). Returns 0, or
 * KH_EPROTO when the body is no longer coming (complete, aborted, too large: read s->body or
 * the state instead). Idempotent. */
int kh_stream_body_stream(kh_stream *s);
/* Protocol side, after kh_stream_expect_body said KH_ELIMIT: returns 1 when the route takes
 * bodies incrementally (KH_ROUTE_BODY_STREAM): the body is then READING, incremental, with no
 * body_bytes cap; 0 when the 413 stands. */
int kh_stream_allow_large_body(kh_stream *s);
/* The app has taken the first n bytes of s->body (incremental body only). */
void kh_stream_body_consume(kh_stream *s, size_t n);
/* Accepts a tunnel request: 101 (h1) / 200 (h2) with h, then tunnel mode. KH_EPROTO when the
 * request is not a tunnel request or a head is out, KH_EINVAL for a bad header, KH_ECLOSED. */
int kh_stream_accept_tunnel(kh_stream *s, const kh_header *h, size_t n);
/* Ends a slow consumer's stream (k.send_to past stream_out_cap): fin if not yet ended, then
 * the protocol resets it once what can go out now has (sink cut; without one, the fin alone).
 * KH_ECLOSED when the protocol is gone. */
int kh_stream_cut(kh_stream *s);
/* An idle long-lived stream (an SSE stream held after its handler): frees the request head's
 * arena, keeping only what the access log needs (method and path, truncated to fit in
 * proto-neutral room). Headers, target, query and authority read as empty afterwards. */
void kh_stream_hold(kh_stream *s);

/* A held tunnel (KH_STREAM_F_TUNNEL | KH_STREAM_F_HELD) whose sink can move it (h1: one stream
 * per connection, sink->moved) is copied into a compact stream of KH_STREAM_COMPACT_SIZE bytes
 * (the worker's compact pool, never freed while it runs) with the same refs, hooks and app
 * state, and a fresh generation; s goes back to the stream pool, its generation bumped (every
 * {s, gen} pair is stale: the caller hands the new pair to whoever holds the old one). The
 * request's part (query, authority, headers, params, tunnel_proto) is gone: readers check
 * KH_STREAM_F_COMPACT (kh_stream_header, the Lua accessors); method and path stay. Returns the compact stream, or s
 * when it cannot move. */
kh_stream *kh_stream_compact(kh_stream *s);

/* The worker's cache of request-head arena blocks back to malloc (the worker's end). */
void kh_stream_arena_drain(kh_worker *w);

/* ---- the response head of HTTP/2 and HTTP/3 (one builder for kh_h2 and kh_h3) ---- */

#define KH_HEAD_LOCAL 24 /* fields built without an allocation; more take one */

/* kh_stream_head_build fills f[0..n) in wire order: ":status"; server and date unless h has
 * them; h without the connection-specific fields (RFC 9113 §8.2.2, RFC 9114 §4.2: connection,
 * keep-alive, proxy-connection, transfer-encoding, upgrade; content-length is ours) with names
 * lower-cased; content-length when clen >= 0 and the status allows content (not 204 / 304).
 * no_data: the response has no content (HEAD, 204, 304, length 0). Everything points into b, h
 * or static storage until kh_stream_head_free(b); a name is in b->lower or a static literal
 * (kh_h2 hands the literals to nghttp2 uncopied). Lives on the caller's stack. */
typedef struct kh_head_buf {
    kh_header *f; /* f_local, or malloc'd past KH_HEAD_LOCAL */
    size_t n;
    int no_data;
    char st[8], cl[24];
    char *lower; /* the lower-cased names: lower_local, or malloc'd past it */
    kh_header f_local[KH_HEAD_LOCAL];
    char lower_local[256];
} kh_head_buf;
void kh_stream_head_build(kh_head_buf *b, const kh_stream *s, int status, const kh_header *h,
                          size_t n, int64_t clen);
void kh_stream_head_free(kh_head_buf *b);

/* "Not Found" for 404, etc.; "" for unknown codes. */
const char *kh_status_reason(int status);

#endif
