/* kh_h3.c: HTTP/3 (RFC 9114) on nghttp3 0.8 inside khamsin-h3.so, over kh_quic's streams.
 * Each request stream is a kh_stream with the h3 sink, as on h1 and h2: Lua sees no difference.
 * Owns:  the nghttp3_conn; per request stream an h3_stream (s->proto_area[0]): the packed
 *        request fields until the head is complete, and the response body as a list of
 *        chunks, which nghttp3 sends without copying: a chunk is freed only once the peer has
 *        acknowledged all of it (acked_stream_data).
 * In:    stream data and events from kh_quic (kh_quic.h); sink calls from the app.
 * Out:   kh_stream_on_* events; stream data for kh_quic to send (kh_h3_writev). A response
 *        head's fields come from kh_stream_head_build (kh_stream.h, shared with kh_h2).
 * Never: calls ngtcp2 (kh_quic.h is the way down), or dispatches a request from inside an
 *        nghttp3 callback (dispatches queue until nghttp3_conn_read_stream returns).
 * Streams (kh_stream.h's seam): sink queued is a stream's response bytes not yet acknowledged
 *        (nghttp3 holds them until then); an ack for a stream whose app waits marks drain_due,
 *        and kh_h3_after_write (kh_quic's write pass, outside every library callback) calls
 *        kh_stream_on_drain. An incremental body credits the connection's window on arrival
 *        and the stream's as the app consumes (h3_consumed). An extended CONNECT with :protocol
 *        (RFC 9220, SETTINGS_ENABLE_CONNECT_PROTOCOL on) is a tunnel request; accepted, 200 and
 *        DATA both ways, the client's FIN its end; a tunnel with no byte either way for
 *        tunnel_idle_timeout_ms is reset (H3_REQUEST_CANCELLED), alone.
 * Timeouts: header_timeout_ms from a stream's first byte to its complete head (then the stream
 *        is reset with H3_REQUEST_INCOMPLETE), body_timeout_ms between body bytes while the
 *        body is incomplete (408 as on h1/h2); the keep-alive idle timeout is QUIC's own
 *        (max_idle_timeout = keepalive_timeout_ms, kh_quic.c). All are per-stream deadlines
 *        (h3_stream.deadline) folded into the QUIC connection's one kh_dtimer (kh_h3_deadline). */
#include <nghttp3/nghttp3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_err.h"
#include "kh_h1_parse.h"
#include "kh_log.h"
#include "kh_quic.h"
#include "kh_worker.h"

typedef struct chunk chunk;
struct chunk {
    chunk *next;
    size_t len;
    char data[];
};

enum { T_NONE = 0, T_HEADER, T_BODY, T_TUNNEL };
enum {
    HS_HEAD_DONE = 1,
    HS_FIN = 2,      /* the app ended the response */
    HS_BLOCKED = 4,  /* read_data returned WOULDBLOCK: resume when data comes */
    HS_NO_DATA = 8,  /* submitted without a body */
    HS_TOO_LARGE = 16,
    HS_PENDING = 32, /* on the dispatch queue */
    HS_GONE = 64,    /* closed while queued: the dispatch only frees it */
};

typedef struct h3_stream {
    kh_stream *s;
    struct h3_stream *prev, *next, *pend_next;
    int64_t sid;
    kh_buf fields; /* [u32 name len][u32 value len][name][value]... */
    uint32_t nfields;
    uint32_t flags;
    chunk *head, *tail, *unsent; /* the body: unsent is the first not handed to nghttp3 */
    uint64_t acked;              /* bytes of head acknowledged so far */
    uint64_t held;               /* bytes in the chunk list (sink queued: held - acked) */
    uint64_t owed;               /* incremental body bytes not yet credited to the stream's
                                  * flow-control window (credited as the app consumes) */
    uint64_t deadline;
    int tkind;
} h3_stream;

struct kh_h3 {
    kh_quic_conn *q;
    kh_worker *w;
    nghttp3_conn *ng;
    h3_stream *streams;
    h3_stream *pend_head, *pend_tail;
    uint32_t nstreams;
    int shutdown;
    int drain_due; /* an ack shrank a queue whose app waits: kh_h3_after_write tells it */
};

static const kh_sink_vt h3_sink;

static h3_stream *HS(kh_stream *s)
{
    return (h3_stream *)(uintptr_t)s->proto_area[0];
}

static void set_deadline(kh_h3 *h, h3_stream *hs, int kind)
{
    const kh_limits *l = h->w->limits;
    hs->tkind = kind;
    hs->deadline = kind == T_NONE     ? UINT64_MAX
                   : kind == T_HEADER ? uv_now(&h->w->loop) + l->header_timeout_ms
                   : kind == T_TUNNEL ? uv_now(&h->w->loop) + l->tunnel_idle_timeout_ms
                                      : uv_now(&h->w->loop) + l->body_timeout_ms;
}

static void free_chunks(h3_stream *hs)
{
    while (hs->head) {
        chunk *c = hs->head;
        hs->head = c->next;
        free(c);
    }
    hs->tail = hs->unsent = NULL;
    hs->held = hs->acked = 0;
}

/* The stream is over on the h3 side: unlinked, and the app told (it drops the protocol's ref). */
static void stream_gone(kh_h3 *h, h3_stream *hs, int err)
{
    if (hs->prev)
        hs->prev->next = hs->next;
    else
        h->streams = hs->next;
    if (hs->next)
        hs->next->prev = hs->prev;
    h->nstreams--;
    kh_buf_release(&hs->fields, &h->w->bufs);
    free_chunks(hs);
    kh_stream *s = hs->s;
    if (hs->flags & HS_PENDING)
        hs->flags |= HS_GONE; /* the queued dispatch holds a ref on s; it frees hs */
    else
        free(hs);
    kh_stream_on_reset(s, err); /* tells the app if it waits; drops the protocol's ref */
}

/* ---- nghttp3 callbacks ---- */

static int cb_begin_headers(nghttp3_conn *ng, int64_t sid, void *ud, void *sud)
{
    kh_h3 *h = ud;
    kh_stream *s = kh_stream_open(h->w, &h3_sink, h);
    h3_stream *hs = kh_xcalloc(1, sizeof *hs);
    hs->s = s;
    hs->sid = sid;
    s->proto_area[0] = (uint64_t)(uintptr_t)hs;
    s->flags |= KH_STREAM_F_TLS;
    s->peer = *kh_quic_peer(h->q);
    s->version_major = 3;
    s->version_minor = 0;
    hs->next = h->streams;
    if (h->streams)
        h->streams->prev = hs;
    h->streams = hs;
    h->nstreams++;
    set_deadline(h, hs, T_HEADER);
    nghttp3_conn_set_stream_user_data(ng, sid, hs);
    return 0;
}

static int cb_recv_header(nghttp3_conn *ng, int64_t sid, int32_t token, nghttp3_rcbuf *name,
                          nghttp3_rcbuf *value, uint8_t flags, void *ud, void *sud)
{
    kh_h3 *h = ud;
    h3_stream *hs = sud;
    if (hs == NULL)
        return 0;
    nghttp3_vec n = nghttp3_rcbuf_get_buf(name), v = nghttp3_rcbuf_get_buf(value);
    const kh_limits *l = h->w->limits;
    if (hs->fields.len + n.len + v.len + 8 > l->header_bytes || hs->nfields >= l->header_fields) {
        hs->flags |= HS_TOO_LARGE;
        return 0;
    }
    uint32_t lens[2] = {(uint32_t)n.len, (uint32_t)v.len};
    kh_buf_append(&hs->fields, &h->w->bufs, lens, sizeof lens);
    kh_buf_append(&hs->fields, &h->w->bufs, n.base, n.len);
    kh_buf_append(&hs->fields, &h->w->bufs, v.base, v.len);
    hs->nfields++;
    return 0;
}

static void queue_dispatch(kh_h3 *h, h3_stream *hs)
{
    kh_stream_retain(hs->s);
    hs->flags |= HS_PENDING;
    hs->pend_next = NULL;
    if (h->pend_tail)
        h->pend_tail->pend_next = hs;
    else
        h->pend_head = hs;
    h->pend_tail = hs;
}

static void dispatch_pending(kh_h3 *h)
{
    while (h->pend_head) {
        h3_stream *hs = h->pend_head;
        h->pend_head = hs->pend_next;
        if (h->pend_head == NULL)
            h->pend_tail = NULL;
        hs->flags &= ~HS_PENDING;
        kh_stream *s = hs->s;
        if (hs->flags & HS_GONE) {
            free(hs);
            kh_stream_release(s);
            continue;
        }
        if (s->proto) {
            if (hs->flags & HS_TOO_LARGE)
                kh_stream_respond_error(s, 431, "Request Header Fields Too Large", 0);
            else
                kh_stream_on_head(s);
        }
        kh_stream_release(s);
    }
}

static int cb_end_headers(nghttp3_conn *ng, int64_t sid, int fin, void *ud, void *sud)
{
    kh_h3 *h = ud;
    h3_stream *hs = sud;
    if (hs == NULL)
        return 0;
    kh_stream *s = hs->s;
    hs->flags |= HS_HEAD_DONE;
    kh_str method = {0}, path = {0}, authority = {0}, host = {0}, protocol = {0};
    int64_t clen = -1;
    kh_header *fields = kh_xmalloc((hs->nfields + 2) * sizeof *fields);
    size_t n = 0, at = 0;
    kh_buf cookie = {0};
    while (at + 8 <= hs->fields.len && !(hs->flags & HS_TOO_LARGE)) {
        uint32_t lens[2];
        memcpy(lens, hs->fields.base + at, sizeof lens);
        kh_str nm = {hs->fields.base + at + 8, lens[0]};
        kh_str val = {hs->fields.base + at + 8 + lens[0], lens[1]};
        at += 8 + lens[0] + lens[1];
        if (nm.len && nm.ptr[0] == ':') {
            if (kh_str_eq(nm, ":method", 7))
                method = val;
            else if (kh_str_eq(nm, ":path", 5))
                path = val;
            else if (kh_str_eq(nm, ":authority", 10))
                authority = val;
            else if (kh_str_eq(nm, ":protocol", 9))
                protocol = val;
            continue;
        }
        /* RFC 9114 §4.2.1: cookie may be split; rejoined as one, as over HTTP/1.1 */
        if (kh_str_eq(nm, "cookie", 6)) {
            if (cookie.len)
                kh_buf_append(&cookie, NULL, "; ", 2);
            kh_buf_append(&cookie, NULL, val.ptr, val.len);
            continue;
        }
        if (kh_str_eq(nm, "host", 4))
            host = val;
        if (kh_str_eq(nm, "content-length", 14)) {
            clen = 0; /* nghttp3 checked it is a number the DATA frames will match */
            for (size_t i = 0; i < val.len; i++)
                clen = clen * 10 + (val.ptr[i] - '0');
        }
        fields[n++] = (kh_header){nm, val};
    }
    if (cookie.len)
        fields[n++] = (kh_header){KH_STR_LIT("cookie"), {cookie.base, cookie.len}};
    if (host.len == 0 && authority.len)
        fields[n++] = (kh_header){KH_STR_LIT("host"), authority};
    if (authority.len == 0)
        authority = host;
    int bad = (authority.len && !kh_h1_host_ok(authority)) || (host.len && !kh_h1_host_ok(host));
    kh_str qpath = path, query = {NULL, 0};
    const char *qm = path.len ? memchr(path.ptr, '?', path.len) : NULL;
    if (qm) {
        qpath.len = (size_t)(qm - path.ptr);
        query.ptr = qm + 1;
        query.len = path.len - qpath.len - 1;
    }
    if (!bad)
        kh_stream_set_head(s, method, path, qpath, query, authority, 3, 0, fields, n);
    free(fields);
    kh_buf_release(&cookie, NULL);
    kh_buf_release(&hs->fields, &h->w->bufs);
    if (bad) {
        KH_LOG_DEBUG("q%u h3: stream %lld: malformed :authority/host", kh_quic_id(h->q),
                     (long long)sid);
        nghttp3_conn_shutdown_stream_read(ng, sid);
        kh_quic_stop_sending(h->q, sid, NGHTTP3_H3_MESSAGE_ERROR);
        kh_quic_reset_stream(h->q, sid, NGHTTP3_H3_MESSAGE_ERROR);
        return 0;
    }
    if (protocol.len && kh_str_eq(method, "CONNECT", 7)) {
        /* extended CONNECT (RFC 9220): a tunnel request; its DATA is the tunnel's, read once
         * the app accepts (kh_stream_accept_tunnel), so no body is expected before that */
        kh_stream_mark_tunnel(s, protocol);
        kh_stream_expect_body(s, 0);
        set_deadline(h, hs, T_NONE);
    } else {
        if (kh_stream_expect_body(s, fin ? 0 : clen) != 0) /* over body_bytes: 413 ... */
            kh_stream_allow_large_body(s);                 /* unless the route streams it */
        set_deadline(h, hs, fin ? T_NONE : T_BODY);
    }
    queue_dispatch(h, hs);
    return 0;
}

static int cb_recv_data(nghttp3_conn *ng, int64_t sid, const uint8_t *data, size_t len, void *ud,
                        void *sud)
{
    kh_h3 *h = ud;
    h3_stream *hs = sud;
    if (hs && hs->s->proto && (hs->s->flags & KH_STREAM_F_BODY_STREAM)) {
        /* incremental body: the stream's window comes back as the app consumes (h3_consumed),
         * the connection's now, so one slow reader holds no other stream */
        kh_quic_consumed_conn(h->q, len);
        hs->owed += len;
    } else {
        kh_quic_consumed(h->q, sid, len); /* copied into the stream's body below (or dropped) */
    }
    if (hs == NULL || hs->s->proto == NULL)
        return 0;
    set_deadline(h, hs, (hs->s->flags & KH_STREAM_F_TUNNEL) ? T_TUNNEL : T_BODY);
    if (kh_stream_on_body(hs->s, (const char *)data, len) != 0) {
        /* past body_bytes: 413 is out; the rest of the body is not wanted */
        set_deadline(h, hs, T_NONE);
        nghttp3_conn_shutdown_stream_read(ng, sid);
        kh_quic_stop_sending(h->q, sid, NGHTTP3_H3_NO_ERROR);
    }
    return 0;
}

static int cb_end_stream(nghttp3_conn *ng, int64_t sid, void *ud, void *sud)
{
    kh_h3 *h = ud;
    h3_stream *hs = sud;
    if (hs == NULL)
        return 0;
    set_deadline(h, hs, T_NONE);
    if (hs->s->proto && hs->s->body_state == KH_BODY_READING)
        kh_stream_on_body_end(hs->s); /* a tunnel: its input ended; the app ends its side */
    return 0;
}

static int cb_stream_close(nghttp3_conn *ng, int64_t sid, uint64_t code, void *ud, void *sud)
{
    kh_h3 *h = ud;
    h3_stream *hs = sud;
    if (hs)
        stream_gone(h, hs, KH_ECLOSED);
    return 0;
}

static int cb_acked(nghttp3_conn *ng, int64_t sid, uint64_t n, void *ud, void *sud)
{
    h3_stream *hs = sud;
    if (hs == NULL)
        return 0;
    hs->acked += n;
    if (hs->s->flags & KH_STREAM_F_WANT_DRAIN) {
        kh_h3 *h = ud;
        h->drain_due = 1; /* the app runs from the flush pass, never from here */
        kh_quic_dirty(h->q);
    }
    while (hs->head && hs->head != hs->unsent && hs->acked >= hs->head->len) {
        chunk *c = hs->head;
        hs->acked -= c->len;
        hs->held -= c->len;
        hs->head = c->next;
        if (hs->tail == c)
            hs->tail = NULL;
        free(c);
    }
    return 0;
}

static int cb_deferred_consume(nghttp3_conn *ng, int64_t sid, size_t n, void *ud, void *sud)
{
    kh_h3 *h = ud;
    kh_quic_consumed(h->q, sid, n);
    return 0;
}

static int cb_stop_sending(nghttp3_conn *ng, int64_t sid, uint64_t code, void *ud, void *sud)
{
    kh_h3 *h = ud;
    kh_quic_stop_sending(h->q, sid, code);
    return 0;
}

static int cb_reset_stream(nghttp3_conn *ng, int64_t sid, uint64_t code, void *ud, void *sud)
{
    kh_h3 *h = ud;
    kh_quic_reset_stream(h->q, sid, code);
    return 0;
}

/* ---- for kh_quic ---- */

kh_h3 *kh_h3_new(kh_quic_conn *q)
{
    kh_h3 *h = kh_xcalloc(1, sizeof *h);
    h->q = q;
    h->w = kh_quic_worker(q);
    nghttp3_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.begin_headers = cb_begin_headers;
    cb.recv_header = cb_recv_header;
    cb.end_headers = cb_end_headers;
    cb.recv_data = cb_recv_data;
    cb.end_stream = cb_end_stream;
    cb.stream_close = cb_stream_close;
    cb.acked_stream_data = cb_acked;
    cb.deferred_consume = cb_deferred_consume;
    cb.stop_sending = cb_stop_sending;
    cb.reset_stream = cb_reset_stream;
    nghttp3_settings st;
    nghttp3_settings_default(&st);
    /* no QPACK dynamic table either way (RFC 9204 §3.2.3: capacity 0 is allowed): an idle
     * connection would keep up to two tables' entries (4 KiB each, plus nghttp3's per-entry
     * overhead) for the odd header it saves; static-table and literal field lines remain */
    st.qpack_max_dtable_capacity = 0;
    st.qpack_encoder_max_dtable_capacity = 0;
    st.qpack_blocked_streams = 0;
    st.max_field_section_size = h->w->limits->header_bytes;
    st.enable_connect_protocol = 1; /* RFC 9220: WebSocket (tunnels) over h3 */
    int64_t ctrl, enc, dec;
    /* kh_quic's allocator: big pool blocks mmap'd, so their untouched pages cost nothing */
    static const nghttp3_mem mem = {NULL, kh_quic_malloc, kh_quic_free, kh_quic_calloc,
                                    kh_quic_realloc}; /* copied by nghttp3 */
    if (nghttp3_conn_server_new(&h->ng, &cb, &st, &mem, h) != 0) {
        free(h);
        return NULL;
    }
    nghttp3_conn_set_max_client_streams_bidi(h->ng, kh_quic_max_bidi_streams(q));
    if (kh_quic_open_uni(q, &ctrl) || kh_quic_open_uni(q, &enc) || kh_quic_open_uni(q, &dec) ||
        nghttp3_conn_bind_control_stream(h->ng, ctrl) ||
        nghttp3_conn_bind_qpack_streams(h->ng, enc, dec)) {
        nghttp3_conn_del(h->ng);
        free(h);
        return NULL;
    }
    return h;
}

void kh_h3_free(kh_h3 *h)
{
    if (h == NULL)
        return;
    while (h->streams)
        stream_gone(h, h->streams, KH_ECLOSED);
    dispatch_pending(h); /* frees what stream_gone left queued (their streams see proto NULL) */
    nghttp3_conn_del(h->ng);
    free(h);
}

ssize_t kh_h3_recv(kh_h3 *h, int64_t sid, const uint8_t *p, size_t n, int fin)
{
    nghttp3_ssize r = nghttp3_conn_read_stream(h->ng, sid, p, n, fin);
    if (r < 0) {
        KH_LOG_DEBUG("q%u h3: %s", kh_quic_id(h->q), nghttp3_strerror((int)r));
        return -(ssize_t)nghttp3_err_infer_quic_app_error_code((int)r);
    }
    dispatch_pending(h);
    return (ssize_t)r;
}

int kh_h3_acked(kh_h3 *h, int64_t sid, uint64_t n)
{
    return nghttp3_conn_add_ack_offset(h->ng, sid, n) == 0 ? 0 : -1;
}

int kh_h3_stream_closed(kh_h3 *h, int64_t sid, uint64_t code)
{
    int r = nghttp3_conn_close_stream(h->ng, sid, code);
    return r == 0 || r == NGHTTP3_ERR_STREAM_NOT_FOUND ? 0 : -1;
}

/* Both cases end the read side only. ngtcp2 0.12's stream_stop_sending callback (stop_sending
 * 1) means *we* stop reading (it fires as our STOP_SENDING goes out, e.g. after a 413), not
 * that the peer asked us to stop writing: shutting the write side there dropped the 413 that
 * was still to be sent. A peer's STOP_SENDING makes ngtcp2 reset the stream itself; the next
 * write then gets NGTCP2_ERR_STREAM_SHUT_WR and kh_h3_write_shut tells nghttp3. */
void kh_h3_peer_reset(kh_h3 *h, int64_t sid, int stop_sending)
{
    (void)stop_sending;
    nghttp3_conn_shutdown_stream_read(h->ng, sid);
}

void kh_h3_unblock(kh_h3 *h, int64_t sid)
{
    nghttp3_conn_unblock_stream(h->ng, sid);
}

void kh_h3_max_bidi(kh_h3 *h, uint64_t n)
{
    nghttp3_conn_set_max_client_streams_bidi(h->ng, n);
}

ssize_t kh_h3_writev(kh_h3 *h, int64_t *sid, int *fin, kh_iov *v, size_t n)
{
    nghttp3_ssize r = nghttp3_conn_writev_stream(h->ng, sid, fin, (nghttp3_vec *)v, n);
    return r < 0 ? -1 : (ssize_t)r;
}

void kh_h3_blocked(kh_h3 *h, int64_t sid)
{
    nghttp3_conn_block_stream(h->ng, sid);
}

void kh_h3_write_shut(kh_h3 *h, int64_t sid)
{
    nghttp3_conn_shutdown_stream_write(h->ng, sid);
}

int kh_h3_written(kh_h3 *h, int64_t sid, size_t n)
{
    return nghttp3_conn_add_write_offset(h->ng, sid, n) == 0 ? 0 : -1;
}

void kh_h3_shutdown(kh_h3 *h)
{
    if (h->shutdown)
        return;
    h->shutdown = 1;
    nghttp3_conn_shutdown(h->ng); /* GOAWAY: streams already open are finished */
    /* long-lived streams (an idle SSE stream, a tunnel) would hold the stop until the grace
     * period: they end now (H3_REQUEST_CANCELLED; the app hears on_abort when they close) */
    for (h3_stream *hs = h->streams; hs; hs = hs->next)
        if (hs->s->flags & (KH_STREAM_F_HELD | KH_STREAM_F_TUNNEL)) {
            nghttp3_conn_shutdown_stream_read(h->ng, hs->sid);
            kh_quic_stop_sending(h->q, hs->sid, NGHTTP3_H3_REQUEST_CANCELLED);
            kh_quic_reset_stream(h->q, hs->sid, NGHTTP3_H3_REQUEST_CANCELLED);
        }
    kh_quic_dirty(h->q);
}

int kh_h3_done(kh_h3 *h)
{
    return h->nstreams == 0;
}

int kh_h3_busy(kh_h3 *h)
{
    return h->nstreams != 0;
}

uint64_t kh_h3_deadline(kh_h3 *h)
{
    uint64_t d = UINT64_MAX;
    for (h3_stream *hs = h->streams; hs; hs = hs->next)
        if (hs->tkind != T_NONE && hs->deadline < d)
            d = hs->deadline;
    return d;
}

int kh_h3_on_timeout(kh_h3 *h, uint64_t now)
{
    for (h3_stream *hs = h->streams, *next; hs; hs = next) {
        next = hs->next;
        if (hs->tkind == T_NONE || hs->deadline > now)
            continue;
        int kind = hs->tkind;
        hs->tkind = T_NONE;
        if (kind == T_TUNNEL) {
            /* no byte either way for tunnel_idle_timeout_ms: this tunnel only is reset (the
             * app hears on_abort once it closes), the connection's other streams go on */
            KH_LOG_DEBUG("q%u h3: tunnel on stream %lld idle for tunnel_idle_timeout_ms: reset",
                         kh_quic_id(h->q), (long long)hs->sid);
            nghttp3_conn_shutdown_stream_read(h->ng, hs->sid);
            kh_quic_stop_sending(h->q, hs->sid, NGHTTP3_H3_REQUEST_CANCELLED);
            kh_quic_reset_stream(h->q, hs->sid, NGHTTP3_H3_REQUEST_CANCELLED);
        } else if (kind == T_HEADER) {
            KH_LOG_DEBUG("q%u h3: stream %lld: header timeout", kh_quic_id(h->q),
                         (long long)hs->sid);
            nghttp3_conn_shutdown_stream_read(h->ng, hs->sid);
            kh_quic_stop_sending(h->q, hs->sid, NGHTTP3_H3_REQUEST_INCOMPLETE);
            kh_quic_reset_stream(h->q, hs->sid, NGHTTP3_H3_REQUEST_INCOMPLETE);
        } else if (hs->s->proto && (hs->s->flags & KH_STREAM_F_BODY_STREAM) && hs->s->body.len) {
            set_deadline(h, hs, T_BODY); /* the app has not consumed: the client is not slow */
        } else if (hs->s->proto && hs->s->body_state == KH_BODY_READING) {
            kh_stream_on_body_error(hs->s, 408, "Request Timeout");
        }
    }
    kh_quic_dirty(h->q);
    return 0;
}

/* ---- sink: the response side ---- */

static nghttp3_ssize read_data(nghttp3_conn *ng, int64_t sid, nghttp3_vec *vec, size_t veccnt,
                               uint32_t *pflags, void *ud, void *sud)
{
    h3_stream *hs = sud;
    size_t k = 0;
    while (hs->unsent && k < veccnt) {
        vec[k].base = (uint8_t *)hs->unsent->data;
        vec[k].len = hs->unsent->len;
        k++;
        hs->unsent = hs->unsent->next;
    }
    if (hs->unsent == NULL && (hs->flags & HS_FIN))
        *pflags |= NGHTTP3_DATA_FLAG_EOF;
    else if (k == 0) {
        hs->flags |= HS_BLOCKED;
        return NGHTTP3_ERR_WOULDBLOCK;
    }
    return (nghttp3_ssize)k;
}

static int h3_head(kh_stream *s, int status, const kh_header *hdr, size_t n, int64_t clen)
{
    kh_h3 *h = s->proto;
    h3_stream *hs = HS(s);
    kh_head_buf b; /* the fields as h2 and h3 send them (kh_stream_head_build) */
    kh_stream_head_build(&b, s, status, hdr, n, clen);
    nghttp3_nv local[KH_HEAD_LOCAL];
    nghttp3_nv *nv = b.n <= KH_HEAD_LOCAL ? local : kh_xmalloc(b.n * sizeof *nv);
    for (size_t i = 0; i < b.n; i++)
        nv[i] = (nghttp3_nv){(uint8_t *)b.f[i].name.ptr, (uint8_t *)b.f[i].value.ptr,
                             b.f[i].name.len, b.f[i].value.len, NGHTTP3_NV_FLAG_NONE};
    if (b.no_data)
        hs->flags |= HS_NO_DATA;
    nghttp3_data_reader dr = {read_data};
    int r = nghttp3_conn_submit_response(h->ng, hs->sid, nv, b.n,
                                         (hs->flags & HS_NO_DATA) ? NULL : &dr);
    if (nv != local)
        free(nv);
    kh_stream_head_free(&b);
    kh_quic_dirty(h->q);
    if (r != 0) {
        KH_LOG_DEBUG("q%u h3: stream %lld: submit_response: %s", kh_quic_id(h->q),
                     (long long)hs->sid, nghttp3_strerror(r));
        return KH_ECLOSED;
    }
    return 0;
}

static int h3_data(kh_stream *s, const char *p, size_t n, int fin)
{
    kh_h3 *h = s->proto;
    h3_stream *hs = HS(s);
    if (hs->flags & HS_NO_DATA)
        return 0;
    if (n) {
        chunk *c = kh_xmalloc(sizeof *c + n);
        c->next = NULL;
        c->len = n;
        memcpy(c->data, p, n);
        hs->held += n;
        if (hs->tail)
            hs->tail->next = c;
        else
            hs->head = c;
        hs->tail = c;
        if (hs->unsent == NULL)
            hs->unsent = c;
    }
    if (fin)
        hs->flags |= HS_FIN;
    if (hs->flags & HS_BLOCKED) {
        hs->flags &= ~HS_BLOCKED;
        nghttp3_conn_resume_stream(h->ng, hs->sid);
    }
    if (n && hs->tkind == T_TUNNEL)
        set_deadline(h, hs, T_TUNNEL); /* a byte out: the tunnel is not idle */
    kh_quic_dirty(h->q);
    return 0;
}

static void h3_want_body(kh_stream *s)
{
    (void)s; /* no 100-continue in HTTP/3 */
}

static void h3_reset(kh_stream *s, int err)
{
    kh_h3 *h = s->proto;
    if (h == NULL)
        return;
    h3_stream *hs = HS(s);
    nghttp3_conn_shutdown_stream_read(h->ng, hs->sid);
    kh_quic_stop_sending(h->q, hs->sid, NGHTTP3_H3_INTERNAL_ERROR);
    kh_quic_reset_stream(h->q, hs->sid, NGHTTP3_H3_INTERNAL_ERROR);
}

static int h3_tunnel(kh_stream *s, const kh_header *hdr, size_t n)
{
    /* RFC 9220 §3 (RFC 8441 §5): a 2xx answers the extended CONNECT; DATA follows both ways,
     * each byte moving its idle deadline (tunnel_idle_timeout_ms, kh_h3_on_timeout) */
    int r = h3_head(s, 200, hdr, n, -1);
    if (r == 0)
        set_deadline(s->proto, HS(s), T_TUNNEL);
    return r;
}

static size_t h3_queued(kh_stream *s)
{
    h3_stream *hs = HS(s);
    return (size_t)(hs->held - hs->acked);
}

static void h3_consumed(kh_stream *s, size_t n)
{
    kh_h3 *h = s->proto;
    h3_stream *hs = HS(s);
    size_t c = n < hs->owed ? n : (size_t)hs->owed; /* bytes credited on arrival stay credited */
    hs->owed -= c;
    if (c) {
        kh_quic_consumed_stream(h->q, hs->sid, c); /* MAX_STREAM_DATA at the flush pass */
        kh_quic_dirty(h->q);
    }
    if (s->flags & KH_STREAM_F_TUNNEL)
        ; /* a tunnel keeps its idle deadline (T_TUNNEL), moved by bytes only */
    else if (s->body_state == KH_BODY_READING)
        set_deadline(h, hs, T_BODY); /* the client may send again: its body timeout restarts */
}

/* After the flush pass wrote what it could (kh_quic's write_out, outside every library
 * callback): tells the apps waiting for drain whose queue acks shrank (kh_stream_on_drain).
 * They may write (h3_data only queues) or end streams, which close only in a later pass. */
void kh_h3_after_write(kh_h3 *h)
{
    if (!h->drain_due)
        return;
    h->drain_due = 0;
    h3_stream *next;
    for (h3_stream *hs = h->streams; hs; hs = next) {
        next = hs->next;
        if ((hs->s->flags & KH_STREAM_F_WANT_DRAIN) && hs->s->proto)
            kh_stream_on_drain(hs->s);
    }
}

static const kh_sink_vt h3_sink = {
    .name = "h3",
    .head = h3_head,
    .data = h3_data,
    .want_body = h3_want_body,
    .reset = h3_reset,
    .queued = h3_queued,
    .consumed = h3_consumed,
    .tunnel = h3_tunnel,
};

const char *kh_h3_versions(void)
{
    static char v[160];
    snprintf(v, sizeof v, "%s, nghttp3 %s", kh_quic_versions(), nghttp3_version(0)->version_str);
    return v;
}
