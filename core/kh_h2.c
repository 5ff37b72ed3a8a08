/* kh_h2.c: HTTP/2 protocol module (RFC 9113) on a kh_conn, over nghttp2's server session.
 * Owns:  the per-connection h2 state (malloc'd, its pointer in c->proto_inline): the nghttp2
 *        session, the list of open streams, the dispatch queue, flood counters, the input
 *        scanner and its rings of closed and skipped stream ids, the fields of the header
 *        block being read; per stream (in the stream's proto_area) the response bytes nghttp2
 *        has not taken yet and its head's bytes until HEADERS is out; the tunnels' idle timer
 *        (a kh_dtimer); per worker thread, the free lists of nghttp2's small blocks.
 * In:    plaintext from kh_conn (on_read -> nghttp2_session_mem_recv); the flush pass (on_flush ->
 *        nghttp2_session_mem_send into c->out, bounded); sink calls from kh_stream.
 * Out:   kh_stream_on_* events; frames into the conn's out buffer. A response head's fields
 *        come from kh_stream_head_build (kh_stream.h, shared with kh_h3: no allocation for a
 *        usual head), copied into nghttp2_nv on the stack.
 * Never: touches the socket, the loop (except uv_now) or Lua. (It does madvise one page of
 *        its own when a connection goes idle: see "nghttp2's memory".)
 *
 * What one request costs (issue 15 item 6; bench/h2.sh PARTS=ir, h2load -c 64 -m 10, callgrind):
 * one read carries ~10 requests and one flush pass answers them with one write (0.1 read and
 * 0.1 write a request), so the cost is per request in nghttp2 and in our callbacks, not in
 * syscalls. Cut here: x-request-id is sent not indexed (h2_head: it had filled the HPACK table,
 * ~5,000 instructions a response), the fields' stream is remembered across a header block
 * (hd_stream: no map lookup per field), the fields go to one per-connection buffer let go at the
 * block's end (h2_conn.hdr), the head's field array is on the stack, the response's names and
 * values go to nghttp2 uncopied (h2_head), a small body sits in a block of the h2 cache
 * (body_append), nghttp2's small blocks come from per-thread free lists with their class in a
 * header (h2_cache_get), frame headers are read in place (scan_recv), and the stream whose DATA
 * went out last is found without a map lookup at its end (rb_stream, HS_PEER_END). Release build,
 * one run with lighttpd (its own h2 and HPACK, Lua 5.4): 15,058 -> 14,550 instructions a request
 * against its 13,210-13,280 (bench/README.md, "What one h2c request costs"). Of ours, ~8,200 were
 * nghttp2's own (HPACK encode ~2,250, of which the X-Request-Id literal's ~1,000; decode ~1,050;
 * the RFC 9113 field checks ~1,150; stream open/close; frame packing), ~1,150 LuaJIT, ~4,500 our
 * C (callbacks here ~1,600, the kh_stream head and reply paths), ~850 libc. Then the RFC 9113 §8
 * checks became ours (nghttp2_option_set_no_http_messaging; kh_h2_fields.c, ~440 in on_header's
 * pass, and the frame-level ones in on_frame_recv / on_data_chunk), the fields' copies were
 * trimmed (store_field inline, names not lowered twice, the fields' block kept for a read):
 * 14,455 -> 13,508 (lighttpd 13,202; with --request-id-header 0, 12,935 -> 11,991).
 *
 * Handlers run outside nghttp2's callbacks where it matters: a stream whose head is complete is
 * queued and dispatched after mem_recv returns, so the DATA frames that came in the same read
 * are already buffered (most handlers find their body complete) and a HEADERS + RST_STREAM pair
 * in one read (rapid reset) never reaches the app.
 *
 * Streams (kh_stream.h's seam): sink queued is the stream's bytes nghttp2 has not taken yet;
 * streams waiting for drain are told at the end of h2_on_flush, after mem_send and outside any
 * nghttp2 callback. An incremental body (or a tunnel) gives the connection's window back as
 * DATA arrives but the stream's only as the app consumes (nghttp2_session_consume_stream), so a
 * stream buffers at most its window (h2_stream_window). SETTINGS_ENABLE_CONNECT_PROTOCOL is
 * sent (RFC 8441): a CONNECT with :protocol is marked a tunnel request; accepted, it answers 200
 * with no content-length and carries DATA both ways. Each tunnel has its own idle time
 * (tunnel_idle_timeout_ms): a stamp of its last byte either way (h2_stream.tun_last) and one
 * kh_dtimer per connection on the worker's deadline heap, armed at the earliest stamp + timeout
 * (no uv_timer, no heap operation per byte); an idle tunnel is reset (CANCEL) alone, the others
 * on the connection go on. kh_stream_cut (a slow consumer past stream_out_cap) resets a stream
 * whose end is queued once the flush pass has sent what the peer's window lets through
 * (CANCEL: the bytes it does not take are dropped and the stream freed at once); one whose
 * END_STREAM went out gets RST_STREAM(NO_ERROR) from on_frame_send (RFC 9113 §8.1).
 *
 * Stream-state checks nghttp2 does not make in our configuration (SETTINGS_NO_RFC7540_PRIORITIES
 * and no closed-stream objects) are ours, made by a frame scanner in front of mem_recv: the
 * scanner finds each frame header in the input and, before one whose check depends on stream
 * state (DATA or HEADERS on an id already used, PRIORITY), hands nghttp2 the bytes up to it, so
 * the check sees the state every earlier frame left (RFC 9113 §5.1, §5.1.1, §5.3.1, §6.3):
 *  - DATA or HEADERS on a stream that ended normally (END_STREAM both ways): GOAWAY STREAM_CLOSED;
 *    on one the peer reset: RST_STREAM(STREAM_CLOSED); on an id skipped when a higher one was
 *    opened (never opened, so never to be): GOAWAY PROTOCOL_ERROR. These come from a small ring
 *    of recently closed ids and a ring of skipped ranges. Any other id at or below the highest
 *    opened one that is not open is one we reset, or one that left the ring: its frames are
 *    ignored, as §5.4.2 asks for the peer's frames in flight after our RST_STREAM.
 *  - PRIORITY (dropped unread by nghttp2 once the setting is out): stream 0 or a dependency on
 *    itself is a PROTOCOL_ERROR, and every PRIORITY frame counts toward h2_flood_frames. */
#include "kh_h2.h"

#include <nghttp2/nghttp2.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kh_err.h"
#include "kh_h1_parse.h"
#include "kh_h2_fields.h"
#include "kh_log.h"

#include "kh_asan.h"

enum {
    H2_SHUTDOWN = 1u << 0,  /* GOAWAY sent for a graceful stop */
    H2_FAILED = 1u << 1,    /* the session is being torn down: input is dropped */
    H2_DEAD = 1u << 2,      /* on_close ran while nghttp2 was on the stack: free on the way out */
    H2_IN_PAUSED = 1u << 3, /* we paused input because the out queue is above the high-water mark */
    H2_CLOSING = 1u << 4,   /* close_after_write was asked */
    H2_PROGRESS = 1u << 5,  /* DATA moved since the timer was last set */
    H2_PEER_EOF = 1u << 6,  /* the peer sent FIN: no WINDOW_UPDATE can come any more */
    H2_CUTS = 1u << 7,      /* some stream is cut (HS_CUT): the flush pass resets it */
};

enum {
    H2_CLOSED_RING = 32, /* recently closed streams remembered (checks of frames on closed ids) */
    H2_GAP_RING = 4,     /* ranges of ids skipped when a higher id was opened */
    H2_CLOSED_PEER_RESET = 1u << 31, /* ring entry flag: the peer reset it (else: ended) */
};

typedef struct h2_conn {
    nghttp2_session *ng;
    kh_conn *c;
    kh_stream *streams;   /* every open stream (doubly linked through h2_stream) */
    kh_stream *pend_head; /* heads complete, not dispatched yet (FIFO; each holds a ref) */
    kh_stream *pend_tail;
    kh_stream *hd_stream; /* the stream of the header block being read (hd_id; 0: none) */
    int32_t hd_id;
    /* the stream whose DATA nghttp2 asked for last (read_body; 0: none): the frame's on_frame_send
     * and the stream's close come right after, and find it without a lookup in nghttp2's map
     * (nghttp2_map_find: ~30 instructions, and a cache miss, each; bench/h2.sh PARTS=ir) */
    int32_t rb_id;
    kh_stream *rb_stream;
    /* the fields of the request header block being read (store_field). Per connection, not per
     * stream: a header block is never interleaved with another frame (RFC 9113 §6.10), and the
     * block is emptied at its end (head_done) and let go once the read that carried it is
     * handled (h2_on_read), so the streams in flight hold none: with one per stream (16 KB
     * blocks of the worker's cache, which keeps 256), 640 streams in flight (h2load -c 64
     * -m 10) went through malloc/free, ~180 of 17,400 instructions a request with the response
     * bodies'; kept for the whole read (~10 heads), not taken and given back per head: ~50 */
    kh_buf hdr;
    /* the RFC 9113 §8 checks of that block's fields (kh_h2_fields.h): ours, not nghttp2's */
    kh_h2_fields fst;
    uint32_t nstreams;
    uint32_t flags;
    int depth;               /* nesting of our calls into nghttp2 */
    uint32_t fail_code;      /* GOAWAY code chosen by a callback */
    uint64_t win_start;      /* start of the current one-second flood window (loop ms) */
    uint32_t nflood, nreset; /* frames counted in that window */
    int32_t max_id;          /* highest stream id the peer opened with HEADERS */
    uint32_t closed[H2_CLOSED_RING]; /* ids that ended or the peer reset (| H2_CLOSED_PEER_RESET) */
    int32_t gap_lo[H2_GAP_RING], gap_hi[H2_GAP_RING]; /* skipped odd ids, never to be opened */
    uint8_t closed_next, gap_next;
    /* the input scanner (see the file comment): where the next frame header starts */
    uint8_t sc_nhd;    /* bytes of the current frame header seen */
    uint8_t sc_npri;   /* bytes of a PRIORITY payload's dependency seen */
    uint8_t sc_hd[9];  /* the frame header being read */
    uint8_t sc_pri[4]; /* the dependency of the PRIORITY frame being read */
    int32_t sc_pri_id; /* its stream, or 0 when the frame's payload is not to be looked at */
    uint32_t sc_skip;  /* bytes of the client preface still to pass (nghttp2 checks them) */
    uint32_t sc_left;  /* payload bytes of the current frame still to pass */
    /* the tunnels' idle timer (the worker's deadline heap, not a uv_timer): armed at the
     * earliest last-activity + tunnel_idle_timeout_ms, moved lazily when it fires */
    kh_dtimer tun_timer;
    void *zpage;         /* nghttp2's stream map table, one page of its own (see h2m_calloc) */
    uint64_t zpage_next; /* loop ms before which it is not given back again */
    int zpage_dirty;     /* a stream opened since it was last given back */
} h2_conn;

enum {
    HS_HEAD_DONE = 1u << 0, /* END_HEADERS seen */
    HS_TOO_LARGE = 1u << 1, /* header list over header_bytes / header_fields: 431 */
    HS_URI_LONG = 1u << 2,  /* :path over target_bytes: 414 */
    HS_PENDING = 1u << 3,   /* on the dispatch queue */
    HS_SUBMITTED = 1u << 4, /* nghttp2_submit_response done */
    HS_NO_DATA = 1u << 5,   /* the response has no content (HEAD, 204, 304, length 0) */
    HS_DEFERRED = 1u << 6,  /* the data provider said DEFERRED: resume on the next bytes */
    HS_FIN = 1u << 7,       /* the response body is complete in buf */
    HS_RST_SENT = 1u << 8,  /* we sent RST_STREAM: the peer's frames in flight are ignored */
    HS_RST_RECV = 1u << 9,  /* the peer sent RST_STREAM */
    HS_CUT = 1u << 10,      /* kh_stream_cut: reset once the flush pass sent what it could */
    HS_SMALL = 1u << 11,    /* buf is a small block from the h2 cache (body_append) */
    HS_PEER_END = 1u << 12, /* END_STREAM received (on_frame_recv): nghttp2 has it half-closed */
    HS_CLEN = 1u << 13,     /* body_expected is the request's content-length: its DATA must match */
    HS_BAD = 1u << 14,      /* malformed: RST_STREAM(PROTOCOL_ERROR) submitted, its DATA dropped */
};

static int drain_streams(h2_conn *h);

typedef struct h2_stream {
    kh_stream *next, *prev;
    kh_stream *pend_next;
    int32_t id;
    uint16_t flags;
    uint16_t nfields;
    uint32_t hbytes; /* header list size as RFC 9113 §6.5.2 counts it (name + value + 32) */
    uint32_t _pad;
    uint64_t rx; /* request body bytes received (kept or dropped) */
    kh_buf buf;  /* the response body not yet framed (HS_SMALL: a block of the h2 cache) */
    size_t off;  /* response bytes of buf already handed to nghttp2 */
    uint64_t tun_last; /* a tunnel: loop ms of its last byte either way (tun_timer) */
    void *hblk; /* the response head's bytes nghttp2 points to until HEADERS is out (h2_head) */
} h2_stream;

_Static_assert(sizeof(h2_conn *) <= sizeof(((kh_conn *)0)->proto_inline), "h2 pointer fits");
_Static_assert(sizeof(h2_stream) <= sizeof(((kh_stream *)0)->proto_area), "h2_stream fits");

static inline h2_conn *H(kh_conn *c)
{
    h2_conn *h;
    memcpy(&h, c->proto_inline, sizeof h); /* proto_inline is uint64_t[]: no type punning */
    return h;
}

static inline void set_H(kh_conn *c, h2_conn *h)
{
    memcpy(c->proto_inline, &h, sizeof h);
}

static inline h2_stream *HS(kh_stream *s)
{
    return (h2_stream *)s->proto_area;
}

static const kh_sink_vt h2_sink;
static void h2_free(h2_conn *h);
static void head_block_free(h2_stream *hs);
static void body_release(h2_conn *h, h2_stream *hs);
static void body_append(h2_conn *h, h2_stream *hs, const char *p, size_t n);
static void on_tunnel_timer(kh_dtimer *t);

/* ---- helpers ---- */

/* Ends the connection with a GOAWAY carrying code (RFC 9113 §5.4.1); the flush pass sends it and
 * closes. Safe inside nghttp2 callbacks. */
static void fail(h2_conn *h, uint32_t code, const char *why)
{
    if (h->flags & H2_FAILED)
        return;
    h->flags |= H2_FAILED;
    h->fail_code = code;
    KH_LOG_DEBUG("c%u h2: %s: GOAWAY %s", h->c->id, why, nghttp2_http2_strerror(code));
    nghttp2_session_terminate_session(h->ng, code);
    kh_worker_schedule_flush(h->c->w, h->c);
}

/* Peer misbehaviour is logged as a WARN at most once a second per worker (style.md "Logging":
 * peer garbage never floods the log). */
static int warn_ok(kh_worker *w)
{
    static _Thread_local uint64_t last;
    uint64_t now = uv_now(&w->loop);
    if (last && now - last < 1000)
        return 0;
    last = now;
    return 1;
}

/* Counts an unproductive frame (PING, SETTINGS, PRIORITY, empty DATA) or a peer reset in a
 * one-second window; past the limit the peer is flooding (CVE-2019-9512/9515/9518, CVE-2023-44487
 * rapid reset): GOAWAY ENHANCE_YOUR_CALM. Returns nonzero once the connection is failing. */
static int count_frame(h2_conn *h, int reset)
{
    kh_conn *c = h->c;
    uint64_t now = uv_now(&c->w->loop);
    if (now - h->win_start >= 1000) {
        h->win_start = now;
        h->nflood = h->nreset = 0;
    }
    if (reset ? ++h->nreset > c->w->limits->h2_peer_resets
              : ++h->nflood > c->w->limits->h2_flood_frames) {
        if (warn_ok(c->w))
            KH_LOG_WARN("c%u h2: %s flood from the peer: closing", c->id,
                        reset ? "RST_STREAM" : "control frame");
        fail(h, NGHTTP2_ENHANCE_YOUR_CALM, reset ? "reset flood" : "control frame flood");
        return 1;
    }
    return 0;
}

/* ---- closed and skipped stream ids ---- */

/* Remembers a stream that closed without our RST_STREAM (frames the peer sends on it later are
 * errors). The ring keeps the last H2_CLOSED_RING; an id that leaves it is treated as unknown,
 * whose frames are ignored: never a false error. */
static void remember_closed(h2_conn *h, int32_t id, int peer_reset)
{
    h->closed[h->closed_next] = (uint32_t)id | (peer_reset ? H2_CLOSED_PEER_RESET : 0);
    h->closed_next = (uint8_t)((h->closed_next + 1) % H2_CLOSED_RING);
}

enum { CLOSED_UNKNOWN, CLOSED_ENDED, CLOSED_PEER_RESET, CLOSED_NEVER_OPENED };

static int closed_kind(const h2_conn *h, int32_t id)
{
    for (int i = 0; i < H2_CLOSED_RING; i++)
        if ((h->closed[i] & ~H2_CLOSED_PEER_RESET) == (uint32_t)id)
            return (h->closed[i] & H2_CLOSED_PEER_RESET) ? CLOSED_PEER_RESET : CLOSED_ENDED;
    for (int i = 0; i < H2_GAP_RING; i++)
        if (h->gap_lo[i] && id >= h->gap_lo[i] && id <= h->gap_hi[i])
            return CLOSED_NEVER_OPENED;
    return CLOSED_UNKNOWN;
}

/* A complete frame header from the scanner, judged with nghttp2's state after every frame before
 * it (the header's last byte is not fed yet). Returns nonzero when the connection is failing. */
static int check_frame(h2_conn *h, uint8_t type, int32_t id, uint32_t len)
{
    if (type == NGHTTP2_PRIORITY) {
        /* nghttp2 drops PRIORITY unread (SETTINGS_NO_RFC7540_PRIORITIES): judge and count it */
        if (count_frame(h, 0))
            return 1;
        if (len == 5 && id == 0) {
            fail(h, NGHTTP2_PROTOCOL_ERROR, "PRIORITY on stream 0");
            return 1;
        }
        h->sc_pri_id = len == 5 ? id : 0; /* a length other than 5: nghttp2's FRAME_SIZE_ERROR */
        h->sc_npri = 0;
        return 0;
    }
    if ((type != NGHTTP2_DATA && type != NGHTTP2_HEADERS) || id == 0 || !(id & 1))
        return 0; /* stream 0 and even ids: nghttp2's PROTOCOL_ERROR */
    if (id > h->max_id) {
        if (type == NGHTTP2_HEADERS) {
            /* RFC 9113 §5.1.1: opening id closes every idle lower id; remember a jump */
            int32_t next = h->max_id ? h->max_id + 2 : 1;
            if (id > next) {
                h->gap_lo[h->gap_next] = next;
                h->gap_hi[h->gap_next] = id - 2;
                h->gap_next = (uint8_t)((h->gap_next + 1) % H2_GAP_RING);
            }
            h->max_id = id;
        }
        return 0; /* a new stream, or DATA on an idle one (nghttp2's PROTOCOL_ERROR) */
    }
    if (nghttp2_session_find_stream(h->ng, id))
        return 0; /* open, or being reset by us: nghttp2 judges */
    switch (closed_kind(h, id)) {
    case CLOSED_ENDED:
        /* §5.1: frames after END_STREAM both ways are a connection error */
        fail(h, NGHTTP2_STREAM_CLOSED, type == NGHTTP2_DATA ? "DATA on a closed stream"
                                                            : "HEADERS on a closed stream");
        return 1;
    case CLOSED_PEER_RESET:
        /* §5.1: after the peer's own RST_STREAM: a stream error (nghttp2 drops the frame) */
        nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_STREAM_CLOSED);
        kh_worker_schedule_flush(h->c->w, h->c);
        return 0;
    case CLOSED_NEVER_OPENED:
        /* §5.1.1: an id lower than one already opened, never used */
        fail(h, NGHTTP2_PROTOCOL_ERROR, "stream id below one already opened");
        return 1;
    default:
        return 0; /* one we reset (§5.4.2: the peer's frames in flight), or forgotten */
    }
}

/* A complete frame header hd, the frame's first byte at p + at: feeds nghttp2 what comes before
 * it (from p + *fed) when the check needs nghttp2 to have seen every earlier frame, then checks
 * it. Returns 0 to go on, 1 when the connection is failing or gone (stop), or mem_recv's error
 * (< 0). */
static ssize_t frame_header(h2_conn *h, const uint8_t *hd, const uint8_t *p, size_t *fed,
                            size_t at)
{
    uint32_t len = (uint32_t)hd[0] << 16 | (uint32_t)hd[1] << 8 | hd[2];
    int32_t id = (int32_t)(((uint32_t)hd[5] << 24 | (uint32_t)hd[6] << 16 |
                            (uint32_t)hd[7] << 8 | hd[8]) &
                           0x7fffffffu);
    /* nghttp2 must have seen every earlier frame when the verdict depends on its stream state
     * or may end the connection; a HEADERS opening a new stream (the common case) needs no cut */
    int cut = hd[3] == NGHTTP2_PRIORITY ||
              ((hd[3] == NGHTTP2_DATA || hd[3] == NGHTTP2_HEADERS) && id <= h->max_id);
    if (cut && *fed < at) {
        ssize_t r = nghttp2_session_mem_recv(h->ng, p + *fed, at - *fed);
        *fed = at;
        if (r < 0)
            return r;
        if (h->flags & (H2_FAILED | H2_DEAD))
            return 1;
    }
    h->sc_left = len;
    h->sc_pri_id = 0;
    return check_frame(h, hd[3], id, len) ? 1 : 0;
}

/* Feeds n bytes to nghttp2, cut before a frame header whose check needs nghttp2 to have seen the
 * frames before it (check_frame). Returns 0 or the first error of mem_recv; stops early (0)
 * when the connection is failing or gone. A frame header whole in the input is read in place
 * (the byte-by-byte path, for one split across reads, cost ~180 of 17,300 instructions a
 * request: bench/h2.sh PARTS=ir). */
static ssize_t scan_recv(h2_conn *h, const uint8_t *p, size_t n)
{
    size_t at = 0, fed = 0;
    ssize_t r;
    while (at < n) {
        if (h->sc_skip) {
            size_t k = KH_MIN(h->sc_skip, n - at);
            h->sc_skip -= (uint32_t)k;
            at += k;
        } else if (h->sc_left) {
            size_t k = KH_MIN(h->sc_left, n - at);
            if (h->sc_pri_id && h->sc_npri < 4) {
                size_t m = KH_MIN(k, (size_t)(4 - h->sc_npri));
                memcpy(h->sc_pri + h->sc_npri, p + at, m);
                h->sc_npri = (uint8_t)(h->sc_npri + m);
                if (h->sc_npri == 4) {
                    uint32_t dep = ((uint32_t)h->sc_pri[0] << 24 | (uint32_t)h->sc_pri[1] << 16 |
                                    (uint32_t)h->sc_pri[2] << 8 | h->sc_pri[3]) &
                                   0x7fffffffu;
                    if (dep == (uint32_t)h->sc_pri_id) {
                        /* §5.3.1: a stream error; nghttp2 treats it as a connection error
                         * when it reads PRIORITY itself, and so do we */
                        r = fed < at ? nghttp2_session_mem_recv(h->ng, p + fed, at - fed) : 0;
                        if (r >= 0)
                            fail(h, NGHTTP2_PROTOCOL_ERROR, "PRIORITY depends on itself");
                        return r < 0 ? r : 0;
                    }
                    h->sc_pri_id = 0;
                }
            }
            h->sc_left -= (uint32_t)k;
            at += k;
        } else if (h->sc_nhd == 0 && n - at >= 9) {
            r = frame_header(h, p + at, p, &fed, at);
            if (r != 0)
                return r < 0 ? r : 0;
            at += 9;
        } else {
            h->sc_hd[h->sc_nhd++] = p[at];
            if (h->sc_nhd == 9) {
                h->sc_nhd = 0;
                /* (the header's first 8 bytes may have been fed already: nghttp2 acts on a
                 * frame header only once it has all 9) */
                r = frame_header(h, h->sc_hd, p, &fed, at);
                if (r != 0)
                    return r < 0 ? r : 0;
            }
            at++;
        }
    }
    if (fed < n) {
        r = nghttp2_session_mem_recv(h->ng, p + fed, n - fed);
        if (r < 0)
            return r;
    }
    return 0;
}

static void link_stream(h2_conn *h, kh_stream *s)
{
    h2_stream *hs = HS(s);
    hs->prev = NULL;
    hs->next = h->streams;
    if (h->streams)
        HS(h->streams)->prev = s;
    h->streams = s;
    h->nstreams++;
}

static void unlink_stream(h2_conn *h, kh_stream *s)
{
    h2_stream *hs = HS(s);
    if (hs->prev)
        HS(hs->prev)->next = hs->next;
    else
        h->streams = hs->next;
    if (hs->next)
        HS(hs->next)->prev = hs->prev;
    hs->next = hs->prev = NULL;
    h->nstreams--;
}

static kh_stream *new_stream(h2_conn *h, int32_t id)
{
    kh_conn *c = h->c;
    kh_stream *s = kh_stream_open(c->w, &h2_sink, c);
    h2_stream *hs = HS(s);
    memset(hs, 0, sizeof *hs);
    h->zpage_dirty = 1; /* nghttp2's stream map has been written */
    if (c->tls)
        s->flags |= KH_STREAM_F_TLS; /* from the connection: :scheme is only the client's word */
    hs->id = id;
    s->peer = c->peer;
    s->version_major = 2;
    s->version_minor = 0;
    link_stream(h, s);
    return s;
}

/* The stream is over on the h2 side (closed or reset, or the connection is going). */
static void stream_gone(h2_conn *h, kh_stream *s, int err)
{
    h2_stream *hs = HS(s);
    if (h->hd_stream == s) {
        h->hd_id = 0, h->hd_stream = NULL;
        kh_buf_release(&h->hdr, &h->c->w->bufs);
    }
    if (h->rb_stream == s)
        h->rb_id = 0, h->rb_stream = NULL;
    unlink_stream(h, s);
    body_release(h, hs);
    head_block_free(hs);
    hs->off = 0;
    hs->id = 0;
    hs->flags &= HS_PENDING;    /* a queued dispatch still holds its ref and will see proto NULL */
    kh_stream_on_reset(s, err); /* tells the app if it still waits; drops the protocol's ref */
}

static void queue_dispatch(h2_conn *h, kh_stream *s)
{
    h2_stream *hs = HS(s);
    kh_stream_retain(s);
    hs->flags |= HS_PENDING;
    hs->pend_next = NULL;
    if (h->pend_tail)
        HS(h->pend_tail)->pend_next = s;
    else
        h->pend_head = s;
    h->pend_tail = s;
}

static void dispatch_pending(h2_conn *h)
{
    while (h->pend_head && !(h->flags & H2_DEAD)) {
        kh_stream *s = h->pend_head;
        h2_stream *hs = HS(s);
        h->pend_head = hs->pend_next;
        if (h->pend_head == NULL)
            h->pend_tail = NULL;
        hs->flags &= ~HS_PENDING;
        if (s->proto) {
            if (hs->flags & HS_TOO_LARGE)
                kh_stream_respond_error(s, 431, "Request Header Fields Too Large", 0);
            else if (hs->flags & HS_URI_LONG)
                kh_stream_respond_error(s, 414, "URI Too Long", 0);
            else
                kh_stream_on_head(s);
        }
        kh_stream_release(s);
    }
}

/* ---- the request head ---- */

/* RFC 9113 §8.1.1: a malformed request is a stream error of type PROTOCOL_ERROR, as nghttp2's HTTP
 * messaging made it (kh_h2_fields.c says why the checks are ours). The stream is not dispatched
 * (or, with a body under way, gets no more of it); nghttp2 closes it once the reset is out. */
static void malformed(h2_conn *h, kh_stream *s, const char *why)
{
    KH_LOG_DEBUG("c%u h2: stream %d: malformed request (%s)", h->c->id, HS(s)->id, why);
    HS(s)->flags |= HS_BAD;
    nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, HS(s)->id, NGHTTP2_PROTOCOL_ERROR);
}

/* n bytes, most often a short name or value: up to 16 in two overlapping word moves, inline.
 * libc's memcpy, called twice a field, was ~130 instructions an h2load request (bench/h2.sh
 * PARTS=ir). */
static inline void copy_short(char *dst, const uint8_t *src, size_t n)
{
    uint64_t a, b;
    uint32_t c, d;
    if (n >= 8 && n <= 16) {
        memcpy(&a, src, 8);
        memcpy(&b, src + n - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + n - 8, &b, 8);
    } else if (n >= 4 && n < 8) {
        memcpy(&c, src, 4);
        memcpy(&d, src + n - 4, 4);
        memcpy(dst, &c, 4);
        memcpy(dst + n - 4, &d, 4);
    } else if (n < 4) {
        for (size_t i = 0; i < n; i++)
            dst[i] = (char)src[i];
    } else {
        memcpy(dst, src, n);
    }
}

/* Fields are packed in h->hdr as [u32 name len][u32 value len][name][value]. */
static void store_field(h2_conn *h, const uint8_t *name, size_t nlen, const uint8_t *value,
                        size_t vlen)
{
    kh_buf *hb = &h->hdr;
    uint32_t lens[2] = {(uint32_t)nlen, (uint32_t)vlen};
    size_t need = sizeof lens + nlen + vlen;
    char *o = KH_LIKELY(hb->cap - hb->len >= need) ? hb->base + hb->len
                                                  : kh_buf_reserve(hb, &h->c->w->bufs, need);
    memcpy(o, lens, sizeof lens);
    copy_short(o + sizeof lens, name, nlen);
    copy_short(o + sizeof lens + nlen, value, vlen);
    hb->len += sizeof lens + nlen + vlen;
}

/* Host names compare case-insensitively (RFC 3986 §6.2.2.1); the rest is compared as sent. */
static int same_authority(kh_str a, kh_str b)
{
    if (a.len != b.len)
        return 0;
    for (size_t i = 0; i < a.len; i++) {
        unsigned char x = (unsigned char)a.ptr[i], y = (unsigned char)b.ptr[i];
        if (x >= 'A' && x <= 'Z')
            x |= 0x20;
        if (y >= 'A' && y <= 'Z')
            y |= 0x20;
        if (x != y)
            return 0;
    }
    return 1;
}

/* END_HEADERS of a request: copy the head into the stream and queue its dispatch. */
static void head_done(h2_conn *h, kh_stream *s, int end_stream)
{
    h2_stream *hs = HS(s);
    hs->flags |= HS_HEAD_DONE;
    kh_str method = {0}, path = {0}, authority = {0}, host = {0}, protocol = {0};
    int64_t clen = h->fst.clen; /* one number (kh_h2_fields_check); -1 on a plain CONNECT */
    size_t nf = hs->nfields;
    kh_header fields_local[16];
    kh_header *fields = nf + 2 <= KH_ARRAY_LEN(fields_local) ? fields_local
                                                              : kh_xmalloc((nf + 2) * sizeof *fields);
    size_t n = 0;
    /* RFC 9113 §8.2.3: cookie may be split into several fields; rejoin them with "; " so the
     * app sees one Cookie as over HTTP/1.1. */
    kh_buf cookie = {0};
    if (!(hs->flags & (HS_TOO_LARGE | HS_URI_LONG))) {
        size_t at = 0;
        while (at + 8 <= h->hdr.len) {
            uint32_t lens[2];
            memcpy(lens, h->hdr.base + at, sizeof lens);
            kh_str nm = {h->hdr.base + at + 8, lens[0]};
            kh_str val = {h->hdr.base + at + 8 + lens[0], lens[1]};
            at += 8 + lens[0] + lens[1];
            if (nm.len && nm.ptr[0] == ':') {
                /* kh_h2_fields_check let through only :method, :scheme, :path, :authority and
                 * :protocol: the length tells them apart, but for :method and :scheme (no
                 * memcmp each) */
                if (nm.len == 7 && nm.ptr[1] == 'm')
                    method = val;
                else if (nm.len == 5)
                    path = val;
                else if (nm.len == 10)
                    authority = val;
                else if (nm.len == 9) /* (:scheme: the connection says) */
                    protocol = val; /* RFC 8441 §4; nghttp2 allows it on CONNECT only */
                continue;
            }
            if (kh_str_eq(nm, "cookie", 6)) {
                if (cookie.len)
                    kh_buf_append(&cookie, NULL, "; ", 2);
                kh_buf_append(&cookie, NULL, val.ptr, val.len);
                continue;
            }
            if (kh_str_eq(nm, "host", 4))
                host = val;
            if (n < nf)
                fields[n++] = (kh_header){nm, val};
        }
        if (cookie.len)
            fields[n++] = (kh_header){KH_STR_LIT("cookie"), {cookie.base, cookie.len}};
        /* RFC 9113 §8.3.1: :authority stands for Host; give the app a Host as HTTP/1.1 would */
        if (host.len == 0 && authority.len)
            fields[n++] = (kh_header){KH_STR_LIT("host"), authority};
        if (authority.len == 0)
            authority = host;
        /* RFC 9113 §8.3.1: a Host that names another entity than :authority makes the request
         * malformed: a stream error, as for the other malformed requests (each of the two
         * already took what HTTP/1.1 takes in Host: kh_h2_fields_check). */
        if (host.len && authority.len && !same_authority(host, authority)) {
            if (fields != fields_local)
                free(fields);
            kh_buf_release(&cookie, NULL);
            h->hdr.len = 0;
            malformed(h, s, "host names another entity than :authority");
            return;
        }
    }
    kh_str target = path, qpath = path, query = {NULL, 0};
    const char *q = path.len ? memchr(path.ptr, '?', path.len) : NULL;
    if (q) {
        qpath.len = (size_t)(q - path.ptr);
        query.ptr = q + 1;
        query.len = path.len - qpath.len - 1;
    }
    kh_stream_set_head(s, method, target, qpath, query, authority, 2, 0, fields, n);
    if (fields != fields_local)
        free(fields);
    kh_buf_release(&cookie, NULL);
    h->hdr.len = 0; /* the block itself goes at the end of the read (h2_on_read) */
    if (protocol.len && kh_str_eq(method, "CONNECT", 7) && !end_stream) {
        /* extended CONNECT (RFC 8441): a tunnel request; its DATA is the tunnel's, read once
         * the app accepts (kh_stream_accept_tunnel), so no body is expected before that */
        kh_stream_mark_tunnel(s, protocol);
        kh_stream_expect_body(s, 0);
    } else if (end_stream)
        kh_stream_expect_body(s, 0);
    else {
        if (clen >= 0)
            hs->flags |= HS_CLEN; /* on_data_chunk and on_frame_recv hold the DATA to it */
        if (kh_stream_expect_body(s, clen) != 0) /* over body_bytes: on_head answers 413 */
            kh_stream_allow_large_body(s);       /* unless the route streams its body */
    }
    queue_dispatch(h, s);
}

/* ---- nghttp2 callbacks ---- */

/* The stream a HEADERS frame belongs to: the one whose block is being read (no lookup in
 * nghttp2's stream map per field), else nghttp2's. */
static kh_stream *hd_stream(h2_conn *h, nghttp2_session *ng, int32_t id)
{
    if (id == h->hd_id)
        return h->hd_stream;
    h->hd_id = id;
    return h->hd_stream = nghttp2_session_get_stream_user_data(ng, id);
}

/* A stream by id: the one read_body served last, else nghttp2's map. */
static kh_stream *stream_of(h2_conn *h, nghttp2_session *ng, int32_t id)
{
    if (id == h->rb_id)
        return h->rb_stream;
    return nghttp2_session_get_stream_user_data(ng, id);
}

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    h2_conn *h = ud;
    if (f->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (f->headers.cat != NGHTTP2_HCAT_REQUEST) { /* trailers: held to the head's content-length */
        kh_h2_fields_begin(&h->fst, 1);
        kh_stream *t = hd_stream(h, ng, f->hd.stream_id);
        h->fst.clen = t && (HS(t)->flags & HS_CLEN) ? t->body_expected : -1;
        return 0;
    }
    kh_h2_fields_begin(&h->fst, 0);
    kh_stream *s = new_stream(h, f->hd.stream_id);
    nghttp2_session_set_stream_user_data(ng, f->hd.stream_id, s);
    h->hd_stream = s; /* on_header's fields go there: no map lookup per field */
    h->hd_id = f->hd.stream_id;
    h->hdr.len = 0; /* (a block cut short by a stream error leaves its fields) */
    return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name, size_t nlen,
                     const uint8_t *value, size_t vlen, uint8_t flags, void *ud)
{
    h2_conn *h = ud;
    kh_conn *c = h->c;
    (void)flags;
    if (f->hd.type != NGHTTP2_HEADERS)
        return 0;
    kh_stream *s = hd_stream(h, ng, f->hd.stream_id);
    if (s == NULL)
        return 0;
    h2_stream *hs = HS(s);
    /* a bad field ends the block's reading: nghttp2 decodes the rest (HPACK state) without
     * calling us, and leaves the reset we submitted as the stream's only answer */
    if (KH_UNLIKELY(kh_h2_fields_check(&h->fst, name, nlen, value, vlen) != 0)) {
        malformed(h, s, "field");
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    const kh_limits *l = c->w->limits;
    /* counted for trailers too (head + trailers share the bomb limit below) */
    hs->hbytes += (uint32_t)KH_MIN(nlen + vlen + 32, UINT32_MAX / 2);
    if (!(nlen && name[0] == ':'))
        hs->nfields++;
    /* A header list many times the limit from a small block is an HPACK bomb, not a large
     * cookie: the connection goes (RFC 9113 §10.5.1 lets us treat it as a flood). */
    if (hs->hbytes > 4 * l->header_bytes) {
        if (warn_ok(c->w))
            KH_LOG_WARN("c%u h2: header list over 4 x header_bytes (HPACK bomb?): closing", c->id);
        fail(h, NGHTTP2_ENHANCE_YOUR_CALM, "header list bomb");
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    if (hs->flags & HS_HEAD_DONE)
        return 0; /* trailers: not passed to the app (as on HTTP/1.1) */
    if (hs->hbytes > l->header_bytes || hs->nfields > l->header_fields) {
        hs->flags |= HS_TOO_LARGE; /* answered 431; the block is still decoded (HPACK state) */
        kh_buf_release(&h->hdr, &c->w->bufs);
        return 0;
    }
    if (hs->flags & (HS_TOO_LARGE | HS_URI_LONG))
        return 0;
    if (nlen == 5 && memcmp(name, ":path", 5) == 0 && vlen > l->target_bytes) {
        hs->flags |= HS_URI_LONG;
        return 0;
    }
    store_field(h, name, nlen, value, vlen);
    return 0;
}

static int on_begin_frame(nghttp2_session *ng, const nghttp2_frame_hd *hd, void *ud)
{
    (void)ng;
    h2_conn *h = ud;
    /* An empty DATA frame that does not end the stream does nothing but cost us work
     * (CVE-2019-9518). */
    if (hd->type == NGHTTP2_DATA && hd->length == 0 && !(hd->flags & NGHTTP2_FLAG_END_STREAM))
        count_frame(h, 0);
    return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    h2_conn *h = ud;
    kh_stream *s;
    switch (f->hd.type) {
    case NGHTTP2_HEADERS:
        s = hd_stream(h, ng, f->hd.stream_id);
        if (s == NULL)
            break;
        if (HS(s)->flags & HS_BAD)
            break;
        if (!(HS(s)->flags & HS_HEAD_DONE)) {
            if (kh_h2_fields_request_end(&h->fst, f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
                malformed(h, s, "head");
                break;
            }
            if (f->hd.flags & NGHTTP2_FLAG_END_STREAM)
                HS(s)->flags |= HS_PEER_END;
            if (h->fst.flags & KH_H2F_PRIORITY) { /* RFC 9218 §4, as nghttp2 read it */
                nghttp2_extpri pri = {h->fst.urgency, h->fst.incremental};
                nghttp2_session_change_extpri_stream_priority(ng, f->hd.stream_id, &pri, 0);
            }
            head_done(h, s, f->hd.flags & NGHTTP2_FLAG_END_STREAM);
        } else {
            /* trailers end the stream (§8.1), and the DATA before them add up to a
             * content-length (the head's or theirs) */
            if (!(f->hd.flags & NGHTTP2_FLAG_END_STREAM) ||
                (h->fst.clen >= 0 && (uint64_t)h->fst.clen != HS(s)->rx)) {
                malformed(h, s, "trailers");
                break;
            }
            HS(s)->flags |= HS_PEER_END;
            kh_stream_on_body_end(s);
        }
        break;
    case NGHTTP2_DATA:
        s = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
        if (s && (f->hd.flags & NGHTTP2_FLAG_END_STREAM) && !(HS(s)->flags & HS_BAD)) {
            if ((HS(s)->flags & HS_CLEN) && s->body_expected >= 0 &&
                (uint64_t)s->body_expected != HS(s)->rx) {
                malformed(h, s, "DATA short of content-length"); /* §8.1.1 */
                break;
            }
            HS(s)->flags |= HS_PEER_END;
            kh_stream_on_body_end(s);
        }
        break;
    case NGHTTP2_PING:
    case NGHTTP2_SETTINGS:
        if (!(f->hd.flags & NGHTTP2_FLAG_ACK))
            count_frame(h, 0);
        if (f->hd.type == NGHTTP2_SETTINGS) {
            /* nghttp2 walked the stream map (nghttp2_map_each): a page given back may be
             * back (a read maps a fresh page on a kernel without a zero page) */
            h->zpage_dirty = 1;
            h->zpage_next = 0;
        }
        break;
    case NGHTTP2_RST_STREAM:
        s = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
        if (s)
            HS(s)->flags |= HS_RST_RECV;
        count_frame(h, 1);
        break;
    default:
        break;
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *ud)
{
    h2_conn *h = ud;
    (void)flags;
    h->flags |= H2_PROGRESS;
    kh_stream *s = nghttp2_session_get_stream_user_data(ng, id);
    if (s && KH_UNLIKELY(HS(s)->flags & (HS_CLEN | HS_BAD)) &&
        ((HS(s)->flags & HS_BAD) || HS(s)->rx + len > (uint64_t)s->body_expected)) {
        /* past content-length (§8.1.1), or the rest of a frame on a stream reset for it */
        if (!(HS(s)->flags & HS_BAD))
            malformed(h, s, "DATA past content-length");
        nghttp2_session_consume_connection(ng, len);
        return 0;
    }
    if (s)
        HS(s)->rx += len;
    if (s && (s->flags & KH_STREAM_F_TUNNEL))
        HS(s)->tun_last = uv_now(&h->c->w->loop);
    if (s && s->proto)
        kh_stream_on_body(s, (const char *)data, len); /* past body_bytes: 413, then RST */
    /* The window is given back once the bytes are buffered (or dropped), never before: with
     * NO_AUTO_WINDOW_UPDATE the peer can have at most one window in flight beyond what the
     * stream accepted (RFC 9113 §5.2). */
    if (s && (s->flags & KH_STREAM_F_BODY_STREAM) && s->proto) {
        /* incremental body / tunnel: the stream's window comes back as the app consumes
         * (h2_consumed); the connection's now, so one slow reader holds no other stream */
        nghttp2_session_consume_connection(ng, len);
    } else if (s)
        nghttp2_session_consume(ng, id, len);
    else
        nghttp2_session_consume_connection(ng, len);
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code, void *ud)
{
    h2_conn *h = ud;
    kh_stream *s = stream_of(h, ng, id);
    if (s == NULL)
        return 0;
    /* (no set_stream_user_data(NULL): with no closed streams kept, nghttp2 destroys the stream
     * right after this callback) */
    if (code != NGHTTP2_NO_ERROR)
        KH_LOG_DEBUG("c%u h2: stream %d reset: %s", h->c->id, id, nghttp2_http2_strerror(code));
    if (!(HS(s)->flags & HS_RST_SENT))
        remember_closed(h, id, (HS(s)->flags & HS_RST_RECV) != 0);
    stream_gone(h, s, KH_ECLOSED);
    return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    h2_conn *h = ud;
    int32_t id = f->hd.stream_id;
    if (f->hd.type == NGHTTP2_RST_STREAM) {
        kh_stream *rs = nghttp2_session_get_stream_user_data(ng, id);
        if (rs)
            HS(rs)->flags |= HS_RST_SENT; /* its close is not remembered: frames in flight */
        /* Resets we send for the peer's malformed streams count like the peer's own: a stream
         * of bad requests is a reset flood too (CVE-2019-9514). */
        if (f->rst_stream.error_code != NGHTTP2_NO_ERROR &&
            f->rst_stream.error_code != NGHTTP2_CANCEL)
            count_frame(h, 1);
    }
    if (!((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
          (f->hd.flags & NGHTTP2_FLAG_END_STREAM) && id > 0))
        return 0;
    /* the usual end: the request ended first (HS_PEER_END; when the flag is not set, as on an
     * h2c upgrade's stream 1, nghttp2 is asked) */
    kh_stream *s = stream_of(h, ng, id);
    if ((s && (HS(s)->flags & HS_PEER_END)) || nghttp2_session_get_stream_remote_close(ng, id) != 0)
        return 0;
    /* RFC 9113 §8.1: a complete response before the whole request: the server may ask the
     * client to stop with RST_STREAM(NO_ERROR). When the rest of a declared body fits in the
     * window the client already has, we read and drop it instead: some clients (curl 7.88)
     * discard a response followed by that reset. */
    int64_t left = -1;
    if (s && s->body_expected >= 0 && (uint64_t)s->body_expected >= HS(s)->rx)
        left = s->body_expected - (int64_t)HS(s)->rx;
    if (left < 0 || left > nghttp2_session_get_stream_local_window_size(ng, id))
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_NO_ERROR);
    return 0;
}

static int on_invalid_frame(nghttp2_session *ng, const nghttp2_frame *f, int err, void *ud)
{
    (void)ng;
    h2_conn *h = ud;
    KH_LOG_DEBUG("c%u h2: invalid frame type %u on stream %d: %s", h->c->id, f->hd.type,
                 f->hd.stream_id, nghttp2_strerror(err));
    return 0;
}

static void h2_mem_init(void);

/* Built once per process; read-only afterwards, so every worker's sessions share it. */
static nghttp2_session_callbacks *h2_callbacks;
static uv_once_t h2_callbacks_once = UV_ONCE_INIT;

static void init_callbacks(void)
{
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        abort();
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_begin_frame_callback(cb, on_begin_frame);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(cb, on_invalid_frame);
    h2_callbacks = cb;
    h2_mem_init();
}

/* ---- nghttp2's memory ----
 * Every session's send side owns a 16394-byte frame buffer (aob.framebufs, one chunk of
 * NGHTTP2_FRAMEBUF_CHUNKLEN, allocated by nghttp2_session_server_new3 and kept for the life of
 * the session), the largest thing an idle connection holds: 16 KB of an idle h2 connection's
 * ~29 KB over TLS (the handshake's freed buffers are reused, so all of it is resident) and
 * the touched page(s) of ~15 KB in h2c. nghttp2 writes a frame into it in mem_send and we copy
 * the bytes out before the next mem_send call (h2_on_flush); it reads nothing of it back in a
 * later call, and connection flushes never nest on a worker. So every session of a worker
 * thread gets the same buffer: the first allocation of that size made while
 * nghttp2_session_server_new3 runs is served from it (a later one, e.g. a second chunk for a
 * header block over 16 KB, is the session's own). Counted: freed with the thread's last session.
 * This leans on nghttp2 1.52's send path (the version Debian 12 ships and we link);
 * spec/h2_idle_mem_spec.lua checks every byte of concurrent large responses of many connections.
 * The next largest, the stream map's table (256 buckets, 4096 bytes, calloc'd at creation), is
 * all zeros whenever no stream is open; it gets a page of its own, and update_timer gives that
 * page back (madvise MADV_DONTNEED: it reads as zeros again, which is what it held) when the
 * connection goes idle, at most once a second per connection, and only after checking that
 * every byte is zero (a SETTINGS frame, which nghttp2 answers by walking the map, marks it to
 * go back again). Together: 14.7 -> 6.4 KB per idle h2c connection, 29.9 -> 9.6 KB over TLS
 * (bench/h2.sh PARTS=idle; spec/h2_idle_mem_spec.lua bounds it). */
enum { H2_FRAMEBUF_CHUNKLEN = 16394 }; /* 9 + 1 + 16384: nghttp2_session.h's NGHTTP2_FRAMEBUF_CHUNKLEN */
enum { H2_ZPAGE = 4096 };
static _Thread_local struct {
    void *buf;            /* the worker thread's shared frame buffer */
    uint32_t users;       /* sessions holding it */
    int given;            /* the creating session has its share */
    const void *creating; /* the h2_conn whose nghttp2_session_server_new3 is running */
} h2_fb;
static int h2_page4k; /* the page size is H2_ZPAGE (set once, with the callbacks) */

/* nghttp2's small blocks per request: two outbound items (152 bytes in 1.52), the stream (224),
 * the copy of the response's header list (~300); malloc'd and freed in bursts of a read's worth
 * of streams, more of one size than glibc's per-thread cache keeps (7), so most went through
 * _int_malloc/_int_free: ~1,100 instructions a request. A free list per size class per worker
 * thread takes them instead, up to H2_CACHE_BYTES a thread; emptied when the thread's last
 * session goes (h2_cache_drain). Each block nghttp2 gets from us (but the shared frame buffer and
 * the stream map's page, told apart by address) has a 16-byte header in front holding its class
 * (H2_BIG: a plain malloc of any size), so a free needs neither malloc_usable_size nor a search:
 * 423 -> ~150 instructions of allocation a request (bench/h2.sh PARTS=ir). Under ASan a cached
 * block is poisoned past its link, so a use after free is still caught. */
enum { H2_NCLASS = 6, H2_CACHE_BYTES = 1024 * 1024, H2_HDR = 16, H2_BIG = 0xff };
enum { H2_HBLK = 240 - H2_HDR }; /* h2_head's block: a usual head's copied bytes fit */
static const uint16_t h2_class[H2_NCLASS] = {64, 96, 160, 240, 400, 512}; /* header included */
/* h2_class_of[(n + H2_HDR + 15) / 16]: the smallest class holding n bytes and the header */
static const uint8_t h2_class_of[512 / 16 + 1] = {
    0, 0, 0, 0, 0,                      /* up to 64 */
    1, 1,                               /* 96 */
    2, 2, 2, 2,                         /* 160 */
    3, 3, 3, 3, 3,                      /* 240 */
    4, 4, 4, 4, 4, 4, 4, 4, 4, 4,       /* 400 */
    5, 5, 5, 5, 5, 5, 5,                /* 512 */
};
_Static_assert(sizeof h2_class_of == 33, "one entry per 16 bytes up to 512");
static _Thread_local struct {
    void *head[H2_NCLASS];
    size_t bytes;
} h2_cache;

static void *h2_cache_get(size_t n)
{
    unsigned k = n + H2_HDR <= h2_class[H2_NCLASS - 1] ? h2_class_of[(n + H2_HDR + 15) / 16]
                                                       : H2_BIG;
    uint8_t *b;
    if (k != H2_BIG && (b = h2_cache.head[k]) != NULL) {
#ifdef KH_ASAN
        ASAN_UNPOISON_MEMORY_REGION(b, h2_class[k]);
#endif
        memcpy(&h2_cache.head[k], b, sizeof(void *));
        h2_cache.bytes -= h2_class[k];
    } else if ((b = malloc(k != H2_BIG ? h2_class[k] : n + H2_HDR)) == NULL) {
        return NULL;
    }
    b[0] = (uint8_t)k;
    return b + H2_HDR;
}

static void h2_cache_put(void *p)
{
    uint8_t *b = (uint8_t *)p - H2_HDR;
    unsigned k = b[0];
    if (k == H2_BIG || h2_cache.bytes + h2_class[k] > H2_CACHE_BYTES) {
        free(b);
        return;
    }
    memcpy(b, &h2_cache.head[k], sizeof(void *));
    h2_cache.head[k] = b;
    h2_cache.bytes += h2_class[k];
#ifdef KH_ASAN
    ASAN_POISON_MEMORY_REGION(b + sizeof(void *), h2_class[k] - sizeof(void *));
#endif
}

static void h2_cache_drain(void)
{
    for (int k = 0; k < H2_NCLASS; k++)
        while (h2_cache.head[k]) {
            void *p = h2_cache.head[k];
#ifdef KH_ASAN
            ASAN_UNPOISON_MEMORY_REGION(p, h2_class[k]);
#endif
            memcpy(&h2_cache.head[k], p, sizeof p);
            free(p);
        }
    h2_cache.bytes = 0;
}

/* nghttp2_session_del, and the thread's cache back to malloc when no session is left. */
static void h2_session_del(nghttp2_session *ng)
{
    nghttp2_session_del(ng);
    if (h2_fb.users == 0)
        h2_cache_drain();
}

static void h2_mem_init(void)
{
    h2_page4k = sysconf(_SC_PAGESIZE) == H2_ZPAGE;
}

static void *h2m_malloc(size_t n, void *ud)
{
    if (n == H2_FRAMEBUF_CHUNKLEN && ud == h2_fb.creating && !h2_fb.given) {
        h2_fb.given = 1; /* once per session */
        if (h2_fb.buf == NULL)
            h2_fb.buf = kh_xmalloc(n);
        h2_fb.users++;
        return h2_fb.buf;
    }
    return n <= SIZE_MAX - H2_HDR ? h2_cache_get(n) : NULL;
}

static void h2m_free(void *p, void *ud)
{
    h2_conn *h = ud;
    if (p == NULL)
        return;
    if (p == h->zpage) {
        h->zpage = NULL; /* a map that grew frees its first table */
        free(p);
        return;
    }
    if (p == h2_fb.buf) {
        if (--h2_fb.users == 0) {
            free(h2_fb.buf);
            h2_fb.buf = NULL;
        }
        return;
    }
    h2_cache_put(p);
}

static void *h2m_calloc(size_t n, size_t size, void *ud)
{
    h2_conn *h = ud;
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (h2_page4k && ud == h2_fb.creating && h->zpage == NULL && n * size == H2_ZPAGE) {
        void *p = aligned_alloc(H2_ZPAGE, H2_ZPAGE);
        if (p)
            memset(p, 0, H2_ZPAGE);
        return h->zpage = p;
    }
    void *p = h2m_malloc(n * size, ud);
    if (p)
        memset(p, 0, n * size);
    return p;
}

/* update_timer, as the connection goes idle: the map's page back if it holds only zeros. */
static void zpage_give_back(h2_conn *h, uint64_t now)
{
    if (h->zpage == NULL || !h->zpage_dirty || now < h->zpage_next)
        return;
    h->zpage_next = now + 1000;
    h->zpage_dirty = 0;
    /* memcmp with a page of zeros (vectorized: ~150 instructions) rather than a loop over
     * 512 words (~1,600): under callgrind, where a second is few requests, it showed as
     * ~150 Ir/request in bench/h2.sh PARTS=ir */
    static const uint64_t zeros[H2_ZPAGE / sizeof(uint64_t)];
    if (memcmp(h->zpage, zeros, H2_ZPAGE) != 0)
        return;
    madvise(h->zpage, H2_ZPAGE, MADV_DONTNEED);
}

/* Not on the request path (nghttp2 1.52 reallocs only a header block's buffers): a new block
 * and a copy, whatever the sizes. */
static void *h2m_realloc(void *p, size_t n, void *ud)
{
    h2_conn *h = ud;
    if (p == NULL)
        return h2m_malloc(n, ud); /* nghttp2_buf_reserve allocates the frame buffer this way */
    size_t old;
    if (p == h2_fb.buf)
        old = H2_FRAMEBUF_CHUNKLEN; /* not done by 1.52; a private copy if it ever is */
    else if (p == h->zpage)
        old = H2_ZPAGE;
    else {
        uint8_t *b = (uint8_t *)p - H2_HDR;
        if (b[0] == H2_BIG) {
            if (n > SIZE_MAX - H2_HDR || (b = realloc(b, n + H2_HDR)) == NULL)
                return NULL;
            return b + H2_HDR;
        }
        old = h2_class[b[0]] - H2_HDR;
    }
    void *q = h2m_malloc(n, ud);
    if (q == NULL)
        return NULL;
    memcpy(q, p, KH_MIN(n, old));
    h2m_free(p, ud);
    return q;
}

/* The response body's buffer. A body that starts small (a usual reply, all of it at once) goes
 * in a block of the h2 cache sized for it (HS_SMALL), not in a 16 KB block of the worker's
 * cache: those, one per stream between the reply and the flush pass, are 640 with h2load -c 64
 * -m 10, more than the worker's cache keeps (256), so most went through malloc/free (see
 * h2_conn.hdr). A body that outgrows its small block moves to a kh_buf. */
enum { H2_SMALL_MAX = 512 - H2_HDR };
static void body_append(h2_conn *h, h2_stream *hs, const char *p, size_t n)
{
    kh_buf *b = &hs->buf;
    if (b->base == NULL && n <= H2_SMALL_MAX) {
        uint8_t *blk = h2_cache_get(n);
        if (blk) {
            b->base = (char *)blk;
            b->cap = h2_class[blk[-H2_HDR]] - H2_HDR;
            b->len = 0;
            hs->flags |= HS_SMALL;
        }
    } else if ((hs->flags & HS_SMALL) && b->cap - b->len < n) {
        kh_buf nb = {0};
        kh_buf_append(&nb, &h->c->w->bufs, b->base, b->len);
        h2_cache_put(b->base);
        hs->flags &= ~HS_SMALL;
        *b = nb;
    }
    if (hs->flags & HS_SMALL) {
        memcpy(b->base + b->len, p, n);
        b->len += n;
    } else {
        kh_buf_append(b, &h->c->w->bufs, p, n);
    }
}

static void body_release(h2_conn *h, h2_stream *hs)
{
    if (hs->flags & HS_SMALL) {
        h2_cache_put(hs->buf.base);
        hs->flags &= ~HS_SMALL;
        hs->buf = (kh_buf){0};
    } else {
        kh_buf_release(&hs->buf, &h->c->w->bufs);
    }
}

/* The response head's block (h2_head), once nghttp2 no longer points into it. */
static void head_block_free(h2_stream *hs)
{
    if (hs->hblk) {
        h2_cache_put(hs->hblk);
        hs->hblk = NULL;
    }
}

/* ---- the connection ---- */

static h2_conn *session_new(kh_conn *c)
{
    const kh_limits *l = c->w->limits;
    uv_once(&h2_callbacks_once, init_callbacks);
    h2_conn *h = kh_xcalloc(1, sizeof *h);
    h->c = c;
    h->win_start = uv_now(&c->w->loop);
    h->tun_timer.cb = on_tunnel_timer;
    h->sc_skip = KH_H2_PREFACE_LEN; /* the scanner passes the client preface to nghttp2 unread */
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt) != 0)
        abort();
    /* we give window back as the body is buffered (on_data_chunk), not as bytes arrive */
    nghttp2_option_set_no_auto_window_update(opt, 1);
    /* closed streams are not kept for the RFC 7540 priority tree, which we do not use */
    nghttp2_option_set_no_closed_streams(opt, 1);
    /* the RFC 9113 §8 checks of each request are ours (kh_h2_fields.c: cheaper, made in the
     * pass on_header makes anyway) */
    nghttp2_option_set_no_http_messaging(opt, 1);
    nghttp2_option_set_max_continuations(opt, l->h2_max_continuations);
    /* nghttp2's own rapid-reset guard (CVE-2023-44487) backs ours (h2_peer_resets per second) */
    nghttp2_option_set_stream_reset_rate_limit(opt, 1000, 33);
    nghttp2_option_set_max_outbound_ack(opt, 1000);
    nghttp2_mem mem = {h, h2m_malloc, h2m_free, h2m_calloc, h2m_realloc}; /* copied by nghttp2 */
    h2_fb.creating = h;
    h2_fb.given = 0;
    if (nghttp2_session_server_new3(&h->ng, h2_callbacks, h, opt, &mem) != 0)
        abort();
    h2_fb.creating = NULL;
    nghttp2_option_del(opt);
    return h;
}

static void submit_settings(h2_conn *h)
{
    const kh_limits *l = h->c->w->limits;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, (uint32_t)l->h2_max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)l->h2_stream_window},
        /* advisory (RFC 9113 §6.5.2); on_header enforces it */
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)l->header_bytes},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
        /* RFC 8441: extended CONNECT (WebSocket over HTTP/2) */
        {NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL, 1},
    };
    nghttp2_submit_settings(h->ng, NGHTTP2_FLAG_NONE, iv, KH_ARRAY_LEN(iv));
    /* the connection window starts at 65535 whatever SETTINGS say (RFC 9113 §6.9.2) */
    nghttp2_session_set_local_window_size(h->ng, NGHTTP2_FLAG_NONE, 0, (int32_t)l->h2_conn_window);
}

static void attach(kh_conn *c, h2_conn *h)
{
    memset(c->proto_inline, 0, sizeof c->proto_inline);
    set_H(c, h);
    c->proto = &kh_h2_proto;
    kh_conn_set_timeout(c, KH_TO_IDLE);
    kh_worker_schedule_flush(c->w, c);
}

void kh_h2_start(kh_conn *c)
{
    h2_conn *h = session_new(c);
    submit_settings(h);
    attach(c, h);
}

static int b64url_val(int ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '-' || ch == '+')
        return 62;
    if (ch == '_' || ch == '/')
        return 63;
    return -1;
}

int kh_h2_upgrade(kh_conn *c, kh_stream *s, kh_str settings)
{
    /* HTTP2-Settings is base64url of a SETTINGS payload (RFC 7540 §3.2.1) */
    if (settings.len > 4096)
        return KH_EINVAL;
    uint8_t raw[3072];
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < settings.len; i++) {
        if (settings.ptr[i] == '=')
            break;
        int v = b64url_val((unsigned char)settings.ptr[i]);
        if (v < 0)
            return KH_EINVAL;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            raw[n++] = (uint8_t)(acc >> bits);
        }
    }
    h2_conn *h = session_new(c);
    int head = (s->flags & KH_STREAM_F_HEAD_METHOD) != 0;
    if (nghttp2_session_upgrade2(h->ng, raw, n, head, NULL) != 0) {
        h2_session_del(h->ng);
        free(h);
        return KH_EINVAL;
    }
    /* a server session ignores upgrade2's stream_user_data: attach the stream ourselves */
    nghttp2_session_set_stream_user_data(h->ng, 1, s);
    h->max_id = 1;
    static const char sw[] = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                             "Upgrade: h2c\r\n\r\n";
    kh_conn_write(c, sw, sizeof sw - 1);
    submit_settings(h);
    attach(c, h);
    /* the request becomes stream 1, half-closed (remote), answered over h2 */
    s->sink = &h2_sink;
    h2_stream *hs = HS(s);
    memset(hs, 0, sizeof *hs);
    hs->id = 1;
    hs->flags = HS_HEAD_DONE;
    s->version_major = 2;
    s->version_minor = 0;
    link_stream(h, s);
    kh_stream_expect_body(s, 0);
    queue_dispatch(h, s);
    return 0;
}

/* The whole response is sent but the request body still comes (a response before the body
 * ended, whose rest we read and drop, on_frame_send): the stream waits on the peer alone. */
static int draining(h2_conn *h, kh_stream *s)
{
    int32_t id = HS(s)->id;
    return id && nghttp2_session_get_stream_local_close(h->ng, id) == 1 &&
           nghttp2_session_get_stream_remote_close(h->ng, id) == 0;
}

static void update_timer(kh_conn *c, h2_conn *h)
{
    int kind = KH_TO_NONE;
    int heading = 0, reading = 0, blocked = 0;
    for (kh_stream *s = h->streams; s; s = HS(s)->next) {
        h2_stream *hs = HS(s);
        if (!(hs->flags & HS_HEAD_DONE))
            heading = 1;
        else if (s->flags & KH_STREAM_F_TUNNEL)
            ; /* its own idle time (tun_timer), never the body timeout */
        else if ((s->flags & KH_STREAM_F_BODY_STREAM) && s->body.len)
            ; /* the app has not consumed yet: the client is not the slow one */
        else if (s->body_state == KH_BODY_READING || draining(h, s))
            reading = 1;
        if ((hs->flags & HS_SUBMITTED) && hs->buf.len > hs->off)
            blocked = 1; /* response bytes the peer's window does not let out */
    }
    if (heading)
        kind = KH_TO_HEADER;
    else if (blocked)
        kind = KH_TO_WRITE; /* a stream that never reads its window goes after write_timeout */
    else if (reading)
        kind = KH_TO_BODY;
    else if (h->nstreams == 0)
        kind = KH_TO_IDLE;
    /* else none: open tunnels go idle one by one (tun_timer), each on its own */
    if (kind == KH_TO_IDLE)
        zpage_give_back(h, uv_now(&c->w->loop));
    if (kind != c->timer_kind || ((h->flags & H2_PROGRESS) && kind != KH_TO_IDLE))
        kh_conn_set_timeout(c, kind);
    h->flags &= ~H2_PROGRESS;
}

static size_t h2_on_read(kh_conn *c, char *p, size_t n)
{
    h2_conn *h = H(c);
    if (h->flags & H2_FAILED)
        return n;
    if (kh_conn_out_pending(c) >= c->w->limits->h2_out_high_water) {
        /* the peer does not read what we send: stop reading what it sends (the bytes wait in
         * the conn's input buffer, which is bounded by one read) */
        h->flags |= H2_IN_PAUSED;
        kh_conn_pause(c);
        return 0;
    }
    h->depth++;
    ssize_t r = scan_recv(h, (const uint8_t *)p, n);
    h->depth--;
    if (h->flags & H2_DEAD) {
        h2_free(h);
        set_H(c, NULL);
        return n;
    }
    if (h->hdr.len == 0) /* no header block cut by the read's end: let the fields' block go */
        kh_buf_release(&h->hdr, &c->w->bufs);
    if (r < 0) {
        if (r == NGHTTP2_ERR_BAD_CLIENT_MAGIC) {
            KH_LOG_DEBUG("c%u h2: no client preface", c->id);
            h->flags |= H2_FAILED;
            kh_conn_close(c);
            return n;
        }
        uint32_t code = h->fail_code;
        if (!code)
            code = (r == NGHTTP2_ERR_FLOODED || r == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS ||
                    r == NGHTTP2_ERR_TOO_MANY_SETTINGS)
                       ? NGHTTP2_ENHANCE_YOUR_CALM
                       : NGHTTP2_PROTOCOL_ERROR;
        h->flags &= ~H2_FAILED;
        fail(h, code, nghttp2_strerror((int)r));
    }
    dispatch_pending(h);
    kh_worker_schedule_flush(c->w, c);
    return n;
}

/* After the peer's FIN nothing more arrives, no WINDOW_UPDATE nor request bytes: a response
 * nghttp2 holds back for want of window (it has nothing more to send, yet bytes wait), or a
 * finished response still waiting for the request's end, never completes. Resets those streams
 * (CANCEL), so that the connection closes once the others are out, not after write_timeout_ms.
 * Returns the number reset. */
static int reset_stuck_after_eof(h2_conn *h)
{
    int n = 0;
    for (kh_stream *s = h->streams; s; s = HS(s)->next) {
        h2_stream *hs = HS(s);
        if (hs->flags & HS_RST_SENT)
            continue;
        if (((hs->flags & HS_SUBMITTED) && hs->buf.len > hs->off) || draining(h, s)) {
            hs->flags |= HS_RST_SENT;
            nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, hs->id, NGHTTP2_CANCEL);
            n++;
        }
    }
    if (n)
        KH_LOG_DEBUG("c%u h2: peer FIN: %d stream(s) that can no longer complete reset",
                     h->c->id, n);
    return n;
}

/* Streams cut (kh_stream_cut: a slow consumer) after mem_send put out what the peer's window
 * let through: one whose END_STREAM is still queued behind bytes the peer does not take is
 * reset (CANCEL), which drops those bytes and frees the stream; one whose END_STREAM went out
 * has had its RST_STREAM(NO_ERROR) from on_frame_send already (RFC 9113 §8.1), or is closed.
 * Returns the number reset. */
static int reset_cut(h2_conn *h)
{
    int n = 0;
    h->flags &= ~H2_CUTS;
    for (kh_stream *s = h->streams; s; s = HS(s)->next) {
        h2_stream *hs = HS(s);
        if (!(hs->flags & HS_CUT))
            continue;
        hs->flags &= ~HS_CUT;
        if ((hs->flags & HS_RST_SENT) || hs->id == 0 ||
            nghttp2_session_get_stream_local_close(h->ng, hs->id) != 0)
            continue;
        hs->flags |= HS_RST_SENT;
        nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, hs->id, NGHTTP2_CANCEL);
        KH_LOG_DEBUG("c%u h2: stream %d cut (slow consumer): %zu bytes dropped", h->c->id, hs->id,
                     hs->buf.len - hs->off);
        n++;
    }
    return n;
}

/* The tunnels' idle timer (kh_dtimer on the worker's heap): resets every tunnel that moved no
 * byte either way for tunnel_idle_timeout_ms (CANCEL; the app hears on_abort), the others on
 * the connection going on, and re-arms at the earliest deadline left. Activity only stamps
 * tun_last, so a busy tunnel costs no heap operation per byte. */
static void on_tunnel_timer(kh_dtimer *t)
{
    h2_conn *h = (h2_conn *)(void *)((char *)t - offsetof(h2_conn, tun_timer));
    kh_conn *c = h->c;
    uint64_t now = uv_now(&c->w->loop), to = c->w->limits->tunnel_idle_timeout_ms;
    uint64_t next = UINT64_MAX;
    int n = 0;
    if (h->flags & (H2_DEAD | H2_FAILED))
        return;
    h->depth++;
    for (kh_stream *s = h->streams; s; s = HS(s)->next) {
        h2_stream *hs = HS(s);
        if (!(s->flags & KH_STREAM_F_TUNNEL) || (hs->flags & HS_RST_SENT) || hs->id == 0)
            continue;
        if (hs->tun_last + to <= now) {
            hs->flags |= HS_RST_SENT;
            nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, hs->id, NGHTTP2_CANCEL);
            KH_LOG_DEBUG("c%u h2: tunnel on stream %d idle for tunnel_idle_timeout_ms: reset",
                         c->id, hs->id);
            n++;
        } else if (hs->tun_last + to < next) {
            next = hs->tun_last + to;
        }
    }
    h->depth--;
    if (next != UINT64_MAX)
        kh_worker_dtimer_set(c->w, t, next);
    if (n)
        kh_worker_schedule_flush(c->w, c);
}

static int h2_on_flush(kh_conn *c)
{
    h2_conn *h = H(c);
    const kh_limits *l = c->w->limits;
    int more = 1;
    dispatch_pending(h);
    /* resume input before refilling the queue: the WINDOW_UPDATEs waiting there are what lets
     * the next response bytes go */
    if ((h->flags & H2_IN_PAUSED) && kh_conn_out_pending(c) < l->h2_out_high_water / 2) {
        h->flags &= ~H2_IN_PAUSED;
        kh_conn_resume(c);
    }
    h->depth++;
again:
    while (kh_conn_out_pending(c) < l->h2_out_high_water) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(h->ng, &data);
        if (n <= 0) {
            if (n < 0) {
                KH_LOG_DEBUG("c%u h2: mem_send: %s", c->id, nghttp2_strerror((int)n));
                h->flags |= H2_FAILED;
                h->depth--;
                kh_conn_close(c); /* frees h (depth is 0 again) */
                return 0;
            }
            more = 0;
            break;
        }
        /* the bytes are valid until the next mem_send call: copy them now */
        char *o = kh_conn_out_reserve(c, (size_t)n);
        memcpy(o, data, (size_t)n);
        c->out.len += (size_t)n;
    }
    if (!more && (h->flags & H2_CUTS) && !(h->flags & H2_DEAD) && reset_cut(h)) {
        more = 1;
        goto again; /* send the resets */
    }
    if (!more && (h->flags & H2_PEER_EOF) && !(h->flags & H2_DEAD) && reset_stuck_after_eof(h)) {
        more = 1;
        goto again; /* send the resets (each stream is reset once: HS_RST_SENT) */
    }
    h->depth--;
    if (h->flags & H2_DEAD) {
        h2_free(h);
        set_H(c, NULL);
        return 0;
    }
    /* after mem_send, outside nghttp2: streams whose queue went down may write again (what
     * they write waits for the next pass: one batch per loop turn). Only a stream actually woken
     * asks for that pass: one still above its low water (the peer's window is closed) waits for
     * the WINDOW_UPDATE, else the flush would run again and again within one loop turn. */
    for (kh_stream *s = h->streams; s; s = HS(s)->next)
        if (s->flags & KH_STREAM_F_WANT_DRAIN) {
            if (drain_streams(h))
                more = 1;
            if (c->flags & KH_CONN_F_CLOSING)
                return 0;
            break;
        }
    if (!nghttp2_session_want_read(h->ng) && !nghttp2_session_want_write(h->ng)) {
        if (!(h->flags & H2_CLOSING)) {
            h->flags |= H2_CLOSING;
            kh_conn_set_timeout(c, KH_TO_NONE);
            kh_conn_close_after_write(c);
        }
        return 0;
    }
    update_timer(c, h);
    return more;
}

static void h2_on_eof(kh_conn *c)
{
    h2_conn *h = H(c);
    h->flags |= H2_PEER_EOF;
    KH_LOG_DEBUG("c%u h2: peer FIN with %u stream(s) open", c->id, h->nstreams);
    /* Nothing more will be read, and a client that closed cannot be told apart from one that
     * half-closed (nearly all that send FIN have left; kh_h1 decides the same way): a stream
     * still waiting for request bytes, or whose handler still works (sleeps, waits on the pool,
     * holds a deferred reply), is reset, so the app's waits are cancelled. Responses already
     * complete, and complete requests not yet dispatched, are answered behind a GOAWAY; the
     * flush pass closes once they are out. */
    uint32_t answerable = 0;
    if (!(h->flags & H2_FAILED)) {
        for (kh_stream *s = h->streams; s; s = HS(s)->next) {
            int working = (s->flags & KH_STREAM_F_APP) && !(s->flags & KH_STREAM_F_ENDED);
            if (!(HS(s)->flags & HS_HEAD_DONE) || s->body_state == KH_BODY_READING || working)
                nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, HS(s)->id, NGHTTP2_CANCEL);
            else
                answerable++;
        }
    }
    if (answerable == 0) {
        kh_conn_close(c);
        return;
    }
    if (!(h->flags & H2_SHUTDOWN)) {
        h->flags |= H2_SHUTDOWN;
        nghttp2_submit_goaway(h->ng, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(h->ng), NGHTTP2_NO_ERROR,
                              NULL, 0);
    }
    kh_worker_schedule_flush(c->w, c);
}

static void h2_on_timeout(kh_conn *c, int kind)
{
    h2_conn *h = H(c);
    if (kind == KH_TO_BODY) {
        /* no body byte for body_timeout_ms: 408 on every stream still waiting for its body */
        kh_stream *next;
        for (kh_stream *s = h->streams; s; s = next) {
            next = HS(s)->next;
            if (draining(h, s)) /* answered; the rest of its body stopped coming */
                nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, HS(s)->id, NGHTTP2_NO_ERROR);
            else if ((HS(s)->flags & HS_HEAD_DONE) && s->body_state == KH_BODY_READING)
                kh_stream_on_body_error(s, 408, "Request Timeout");
        }
        kh_conn_set_timeout(c, KH_TO_NONE);
        kh_worker_schedule_flush(c->w, c);
        return;
    }
    /* idle (RFC 9113 §9.1: a server may close an idle connection, with GOAWAY), a head that
     * never completed, or a response the peer's window has held back for write_timeout_ms */
    kh_conn_set_timeout(c, KH_TO_NONE);
    if (kind == KH_TO_IDLE)
        fail(h, NGHTTP2_NO_ERROR, "idle timeout");
    else if (kind == KH_TO_WRITE)
        fail(h, NGHTTP2_ENHANCE_YOUR_CALM, "window held shut");
    else
        fail(h, NGHTTP2_PROTOCOL_ERROR, "request head timeout");
}

static void h2_on_shutdown(kh_conn *c)
{
    h2_conn *h = H(c);
    if (h->flags & (H2_SHUTDOWN | H2_FAILED))
        return;
    h->flags |= H2_SHUTDOWN;
    /* RFC 9113 §6.8: streams up to the last one we processed complete; later ones are refused
     * and the client may retry them elsewhere */
    nghttp2_submit_goaway(h->ng, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(h->ng),
                          NGHTTP2_NO_ERROR, NULL, 0);
    /* long-lived streams (an idle SSE stream, a tunnel) would hold the stop until the grace
     * period: they end now (CANCEL; the app hears on_abort) */
    for (kh_stream *s = h->streams; s; s = HS(s)->next)
        if ((s->flags & (KH_STREAM_F_HELD | KH_STREAM_F_TUNNEL)) && !(HS(s)->flags & HS_RST_SENT))
            nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, HS(s)->id, NGHTTP2_CANCEL);
    kh_worker_schedule_flush(c->w, c);
}

static void h2_free(h2_conn *h)
{
    if (kh_dtimer_active(&h->tun_timer))
        kh_worker_dtimer_cancel(h->c->w, &h->tun_timer);
    kh_buf_release(&h->hdr, &h->c->w->bufs);
    h2_session_del(h->ng);
    free(h);
}

static void h2_on_close(kh_conn *c)
{
    h2_conn *h = H(c);
    if (h == NULL || (h->flags & H2_DEAD))
        return;
    h->flags |= H2_DEAD | H2_FAILED;
    while (h->streams) {
        kh_stream *s = h->streams;
        if (HS(s)->id)
            nghttp2_session_set_stream_user_data(h->ng, HS(s)->id, NULL);
        stream_gone(h, s, KH_ECLOSED);
    }
    while (h->pend_head) {
        kh_stream *s = h->pend_head;
        h->pend_head = HS(s)->pend_next;
        HS(s)->flags &= ~HS_PENDING;
        kh_stream_release(s);
    }
    h->pend_tail = NULL;
    if (h->depth == 0) {
        h2_free(h);
        set_H(c, NULL);
    }
    /* else the call into nghttp2 that is on the stack frees it when it returns */
}

const kh_proto_vt kh_h2_proto = {
    .name = "h2",
    .on_read = h2_on_read,
    .on_eof = h2_on_eof,
    .on_timeout = h2_on_timeout,
    .on_shutdown = h2_on_shutdown,
    .on_close = h2_on_close,
    .on_flush = h2_on_flush,
};

/* ---- sink: the response side ---- */

static ssize_t read_body(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len,
                         uint32_t *data_flags, nghttp2_data_source *src, void *ud)
{
    (void)ng;
    h2_conn *h = ud;
    kh_stream *s = src->ptr;
    h2_stream *hs = HS(s);
    h->rb_id = id, h->rb_stream = s;
    head_block_free(hs); /* HEADERS is out: DATA is asked for only after it */
    size_t avail = hs->buf.len - hs->off;
    if (avail == 0) {
        if (hs->flags & HS_FIN) {
            *data_flags |= NGHTTP2_DATA_FLAG_EOF;
            return 0;
        }
        hs->flags |= HS_DEFERRED;
        return NGHTTP2_ERR_DEFERRED;
    }
    size_t k = KH_MIN(avail, len);
    memcpy(buf, hs->buf.base + hs->off, k);
    hs->off += k;
    h->flags |= H2_PROGRESS;
    if (s->flags & KH_STREAM_F_TUNNEL)
        hs->tun_last = uv_now(&h->c->w->loop);
    if (hs->off == hs->buf.len) {
        /* all handed over: the block goes back to the cache now, not at stream end */
        body_release(h, hs);
        hs->off = 0;
        if (hs->flags & HS_FIN)
            *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return (ssize_t)k;
}

static int h2_head(kh_stream *s, int status, const kh_header *hdr, size_t n, int64_t clen)
{
    kh_conn *c = s->proto;
    h2_conn *h = H(c);
    h2_stream *hs = HS(s);
    kh_head_buf b; /* the fields as h2 and h3 send them (kh_stream_head_build) */
    kh_stream_head_build(&b, s, status, hdr, n, clen);
    nghttp2_nv local[KH_HEAD_LOCAL];
    nghttp2_nv *nv = b.n <= KH_HEAD_LOCAL ? local : kh_xmalloc(b.n * sizeof *nv);
    /* The names and values go to nghttp2 uncopied (NO_COPY_NAME | NO_COPY_VALUE): nghttp2's
     * nghttp2_nv_array_copy copied each field and lower-cased every name again, ~590 of 17,300
     * instructions a request (bench/h2.sh PARTS=ir). A name the builder did not lower into
     * b.lower is one of its static literals (":status", "server", "date", "content-length";
     * kh_stream.h), and so is such a field's value unless it is in b (the status and length
     * digits): "khamsin", or the worker's Date (rewritten in place once a second, so a HEADERS
     * packed later still reads a valid date). Everything else (the lowered names, the app's
     * values, the digits) is copied into one block of ours that lives until HEADERS is packed:
     * freed by read_body, which nghttp2 calls only once HEADERS is out, or when the stream
     * goes. A field that does not fit in the block is copied by nghttp2, as before. */
    int lower_local = b.lower == b.lower_local;
    uint8_t *at = lower_local && hs->hblk == NULL ? h2_cache_get(H2_HBLK) : NULL;
    uint8_t *end = at ? at + H2_HBLK : NULL;
    if (at)
        hs->hblk = at;
    const char *bb = (const char *)&b, *be = (const char *)(&b + 1);
    for (size_t i = 0; i < b.n; i++) {
        kh_str nm = b.f[i].name, val = b.f[i].value;
        nv[i] = (nghttp2_nv){(uint8_t *)nm.ptr, (uint8_t *)val.ptr, nm.len, val.len,
                             NGHTTP2_NV_FLAG_NONE};
        /* x-request-id differs on every response: indexed, each one pushes an entry into the
         * HPACK table that no later response matches, and the table fills with them (~70 in
         * 4 KB), all in one hash chain that nghttp2 walks, comparing, for every x-request-id:
         * ~5,000 instructions a response (bench/h2.sh PARTS=ir). Not indexed, the search stops
         * at the first entry of that name. One response in 64 (the stream ids 1, 129, ...)
         * is still indexed, so that the name stays in the table and goes out as an index. */
        if (nm.len == 12 && nm.ptr[0] == 'x' && memcmp(nm.ptr, "x-request-id", 12) == 0 &&
            (hs->id & 127) != 1) /* (content-type is 12 bytes too: no memcmp for it) */
            nv[i].flags = NGHTTP2_NV_FLAG_NO_INDEX;
        int lowered = nm.ptr >= b.lower_local && nm.ptr < b.lower_local + sizeof b.lower_local;
        if (!lower_local)
            continue;
        if (!lowered) {
            nv[i].flags |= NGHTTP2_NV_FLAG_NO_COPY_NAME;
            if (at && !(val.ptr >= bb && val.ptr < be)) {
                nv[i].flags |= NGHTTP2_NV_FLAG_NO_COPY_VALUE;
                continue;
            }
        }
        if (at == NULL || (lowered ? nm.len : 0) + val.len > (size_t)(end - at))
            continue;
        if (lowered) {
            memcpy(at, nm.ptr, nm.len);
            nv[i].name = at;
            at += nm.len;
            nv[i].flags |= NGHTTP2_NV_FLAG_NO_COPY_NAME; /* lower case: the builder's */
        }
        if (val.len)
            memcpy(at, val.ptr, val.len);
        nv[i].value = at;
        at += val.len;
        nv[i].flags |= NGHTTP2_NV_FLAG_NO_COPY_VALUE;
    }
    if (b.no_data)
        hs->flags |= HS_NO_DATA;
    nghttp2_data_provider prd = {.source.ptr = s, .read_callback = read_body};
    h->depth++;
    int r = nghttp2_submit_response(h->ng, hs->id, nv, b.n, (hs->flags & HS_NO_DATA) ? NULL : &prd);
    h->depth--;
    if (nv != local)
        free(nv);
    kh_stream_head_free(&b);
    kh_worker_schedule_flush(c->w, c);
    if (r != 0) {
        KH_LOG_DEBUG("c%u h2: stream %d: submit_response: %s", c->id, hs->id, nghttp2_strerror(r));
        head_block_free(hs);
        return KH_ECLOSED;
    }
    hs->flags |= HS_SUBMITTED;
    return 0;
}

static int h2_data(kh_stream *s, const char *p, size_t n, int fin)
{
    kh_conn *c = s->proto;
    h2_conn *h = H(c);
    h2_stream *hs = HS(s);
    if (hs->flags & HS_NO_DATA)
        return 0;
    if (n) {
        if (hs->off == hs->buf.len)
            hs->buf.len = hs->off = 0;
        body_append(h, hs, p, n);
    }
    if (fin)
        hs->flags |= HS_FIN;
    if (hs->flags & HS_DEFERRED) {
        hs->flags &= ~HS_DEFERRED;
        h->depth++;
        nghttp2_session_resume_data(h->ng, hs->id);
        h->depth--;
    }
    kh_worker_schedule_flush(c->w, c);
    return 0;
}

static void h2_want_body(kh_stream *s)
{
    (void)s; /* no 100-continue in HTTP/2: the client sends the body when it likes */
}

static void h2_reset(kh_stream *s, int err)
{
    kh_conn *c = s->proto;
    (void)err;
    if (c == NULL)
        return;
    h2_conn *h = H(c);
    h->depth++;
    nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, HS(s)->id, NGHTTP2_INTERNAL_ERROR);
    h->depth--;
    kh_worker_schedule_flush(c->w, c);
}

static size_t h2_queued(kh_stream *s)
{
    h2_stream *hs = HS(s);
    return hs->buf.len - hs->off;
}

static void h2_consumed(kh_stream *s, size_t n)
{
    kh_conn *c = s->proto;
    if (c == NULL || HS(s)->id == 0)
        return;
    h2_conn *h = H(c);
    h->depth++;
    nghttp2_session_consume_stream(h->ng, HS(s)->id, n); /* WINDOW_UPDATE when due */
    h->depth--;
    kh_worker_schedule_flush(c->w, c);
}

static int h2_tunnel(kh_stream *s, const kh_header *hdr, size_t n)
{
    /* RFC 8441 §5: a 2xx answers the extended CONNECT; DATA follows both ways */
    int r = h2_head(s, 200, hdr, n, -1);
    if (r == 0) {
        kh_conn *c = s->proto;
        h2_conn *h = H(c);
        HS(s)->tun_last = uv_now(&c->w->loop);
        if (!kh_dtimer_active(&h->tun_timer))
            kh_worker_dtimer_set(c->w, &h->tun_timer,
                                 HS(s)->tun_last + c->w->limits->tunnel_idle_timeout_ms);
    }
    return r;
}

static void h2_cut(kh_stream *s)
{
    kh_conn *c = s->proto;
    if (c == NULL || HS(s)->id == 0)
        return;
    HS(s)->flags |= HS_CUT;
    H(c)->flags |= H2_CUTS;
    kh_worker_schedule_flush(c->w, c);
}

/* Tells the streams waiting for drain whose queue is at or below the low-water mark. The app
 * runs from here: it may write (h2_data, which never changes the stream list) or end streams,
 * which close only inside a later mem_send. */
/* Wakes the streams waiting for their queue to go down; returns how many were woken. */
static int drain_streams(h2_conn *h)
{
    kh_stream *next;
    int woken = 0;
    for (kh_stream *s = h->streams; s; s = next) {
        next = HS(s)->next;
        if (s->flags & KH_STREAM_F_WANT_DRAIN) {
            kh_stream_retain(s); /* the app may end the stream from its callback */
            kh_stream_on_drain(s);
            woken += !(s->flags & KH_STREAM_F_WANT_DRAIN);
            kh_stream_release(s);
        }
        if (h->c->flags & KH_CONN_F_CLOSING)
            return woken;
    }
    return woken;
}

static const kh_sink_vt h2_sink = {
    .name = "h2",
    .head = h2_head,
    .data = h2_data,
    .want_body = h2_want_body,
    .reset = h2_reset,
    .alt_svc = kh_conn_alt_svc,
    .queued = h2_queued,
    .consumed = h2_consumed,
    .tunnel = h2_tunnel,
    .cut = h2_cut,
};
