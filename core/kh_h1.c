/* kh_h1.c: HTTP/1.1 protocol module (RFC 9112) on a kh_conn.
 * Owns:  the per-connection h1 state (inline in the conn: 16 bytes) and the per-request h1 state
 *        (inside the stream's proto_area: the chunked decoder, bytes left, keep-alive decision).
 * In:    plaintext from kh_conn (on_read); sink calls from kh_stream.
 * Out:   response bytes into the conn's out buffer; kh_stream_on_* events.
 * Never: touches the socket, the loop or Lua.
 *
 * One request at a time: while a response is pending, input is paused and pipelined bytes wait
 * in the conn's `in` buffer, so answers leave in request order without a queue of streams.
 * Output backpressure (out_full): the next request is not parsed, nor more input read, while
 * h1_out_high_water bytes or more wait for the socket, so a connection holds at most the mark
 * plus one response (and one read of input) however many requests it pipelines.
 *
 * Streams (kh_stream.h's seam): sink queued is the conn's out queue (one stream at a time); a
 * stream waiting for drain is told from the flush pass (h1_on_flush) once a socket write has
 * completed and the queue is at or below stream_high_water / 2. An incremental body stops
 * reading at body_window buffered bytes (the rest waits in `in`, reading pauses) until the app
 * consumes. A GET with Upgrade + Connection: upgrade is marked a tunnel request (the Upgrade's
 * first token); accepted, it answers 101 and enters PH_TUNNEL: bytes both ways, no body cap, no
 * header/body timeout but KH_TO_TUNNEL, the peer's FIN as the end of its input, the app's fin
 * closing the connection once written. A file body (sink file) on a cleartext connection goes
 * to kh_conn_sendfile (sendfile(2), after the head); on TLS the app reads and sends data. */
#include "kh_h1.h"

#include <stdio.h>

#include "kh_err.h"
#include "kh_h1_parse.h"
#include "kh_log.h"
#include "kh_proto.h"

enum h1_phase {
    PH_HEAD = 0, /* waiting for a request head */
    PH_BODY,     /* reading the current request's body */
    PH_WAIT,     /* request fully read; its response is not done */
    PH_DISCARD,  /* response done before the body was read: read and drop the rest */
    PH_CLOSED,   /* an error reply is out; nothing more is read */
    PH_TUNNEL,   /* 101 sent: raw bytes both ways until either side ends */
};

enum {
    H1_SHUTDOWN = 1u << 0, /* graceful stop: close after the current response */
    H1_SEEN = 1u << 1,     /* a request was read: the h2 preface can no longer come */
    H1_OUT_WAIT = 1u << 2, /* input paused until the output queue drains below the low mark */
};

typedef struct h1_conn {
    kh_stream *s;
    uint32_t prev_len; /* bytes of the pending head already scanned */
    uint8_t phase;
    uint8_t flags;
    uint16_t _pad;
} h1_conn;

/* Its first word is all a compact stream keeps (kh_stream_compact, a held tunnel): the flags;
 * a tunnel never touches the decoder or remaining. */
typedef struct h1_stream {
    uint8_t chunked_body;
    uint8_t expect_continue;  /* the client waits for 100 Continue */
    uint8_t continue_sent;
    uint8_t keepalive;        /* decided when the head goes out */
    uint8_t resp_chunked;     /* the response body uses chunked framing */
    uint8_t dispatched;
    uint8_t win_paused;       /* incremental body: reading paused at body_window */
    kh_h1_chunked chunked;
    uint64_t remaining;       /* Content-Length bytes still to read */
} h1_stream;

_Static_assert(sizeof(h1_conn) <= sizeof(((kh_conn *)0)->proto_inline), "h1_conn fits inline");
_Static_assert(sizeof(h1_stream) <= sizeof(((kh_stream *)0)->proto_area), "h1_stream fits");
_Static_assert(offsetof(h1_stream, chunked) <= sizeof(uint64_t), "a tunnel's h1_stream fields fit "
                                                                  "in a compact stream");

static inline h1_conn *H(kh_conn *c)
{
    return (h1_conn *)c->proto_inline;
}

static inline h1_stream *HS(kh_stream *s)
{
    return (h1_stream *)s->proto_area;
}

static const kh_sink_vt h1_sink;

void kh_h1_start(kh_conn *c)
{
    memset(H(c), 0, sizeof(h1_conn));
    kh_conn_set_timeout(c, KH_TO_HEADER);
}

/* A reply without a stream (the head could not be parsed): always closes the connection.
 * head_method: the request line named HEAD (the parser got past the method): the reply has its
 * header fields but no content (RFC 9110 §9.3.2), as every answer to a HEAD request. */
static void reply_error(kh_conn *c, int status, const char *reason, int head_method)
{
    char buf[512];
    char body[256];
    int blen = snprintf(body, sizeof body, "%s\n", reason);
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nServer: khamsin\r\nDate: %s\r\n"
                     "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                     "Connection: close\r\n\r\n%s",
                     status, kh_status_reason(status), kh_worker_date(c->w), blen,
                     head_method ? "" : body);
    kh_conn_write(c, buf, (size_t)n);
    H(c)->phase = PH_CLOSED;
    kh_conn_set_timeout(c, KH_TO_NONE);
    kh_conn_close_after_write(c);
}

/* The method slice is set once the parser got past it, even when it returns an error. */
static int is_head(kh_str m)
{
    return m.len == 4 && memcmp(m.ptr, "HEAD", 4) == 0;
}

/* Output backpressure: a client that pipelines requests and reads no answers must not make us
 * queue every answer. Past h1_out_high_water bytes queued for the socket (out plus the write in
 * flight), the next request waits unparsed and reading stops; h1_on_flush resumes both once the
 * queue is below half the mark (on a write's completion, or when the socket took it all). */
static int out_full(kh_conn *c)
{
    return kh_conn_out_pending(c) >= c->w->limits->h1_out_high_water;
}

/* The request's input is over and its response complete: get ready for the next one, or close.
 * input_done: the request was read to its end (0: its framing was lost while its body was being
 * discarded; then the close lingers, as more of that body may come). */
static void finish_request(kh_conn *c, int input_done)
{
    h1_conn *h = H(c);
    kh_stream *s = h->s;
    int keep = HS(s)->keepalive && !(h->flags & H1_SHUTDOWN) && !(c->flags & KH_CONN_F_EOF);
    h->s = NULL;
    kh_stream_release(s); /* the protocol's ref */
    if (!keep) {
        h->phase = PH_CLOSED;
        kh_conn_set_timeout(c, KH_TO_NONE);
        if (input_done)
            kh_conn_end_after_write(c);
        else
            kh_conn_close_after_write(c);
        return;
    }
    h->phase = PH_HEAD;
    h->prev_len = 0;
    c->flags &= ~KH_CONN_F_HAS_INPUT;
    kh_conn_set_timeout(c, c->in.len ? KH_TO_HEADER : KH_TO_IDLE);
    if (out_full(c)) {
        h->flags |= H1_OUT_WAIT;
        kh_conn_pause(c);
        kh_worker_schedule_flush(c->w, c); /* h1_on_flush watches the queue from now on */
        return;
    }
    kh_conn_resume(c);
}

/* The stream's response is complete (sink data with fin). */
static void response_done(kh_conn *c, kh_stream *s)
{
    h1_conn *h = H(c);
    if (h->s != s)
        return;
    if (!HS(s)->keepalive) {
        /* nothing after this response will be read: the rest of the body does not matter. A
         * request read to its end (PH_WAIT) leaves nothing to drain: the connection may close
         * without lingering (kh_conn_end_after_write) */
        int input_done = h->phase == PH_WAIT && !(s->flags & KH_STREAM_F_TUNNEL);
        h->phase = PH_CLOSED;
        h->s = NULL;
        /* (ws branch) a tunnel ended by the app may still have a coroutine waiting for its
         * input (a WebSocket closed by a push from elsewhere): reset it, so the wait ends,
         * instead of only dropping our ref (s->proto would outlive the connection) */
        if (s->flags & KH_STREAM_F_TUNNEL)
            kh_stream_on_reset(s, 0);
        else
            kh_stream_release(s);
        kh_conn_set_timeout(c, KH_TO_NONE);
        if (input_done)
            kh_conn_end_after_write(c);
        else
            kh_conn_close_after_write(c);
        return;
    }
    if (h->phase == PH_WAIT) {
        finish_request(c, 1);
    } else if (h->phase == PH_BODY) {
        h->phase = PH_DISCARD; /* keep-alive: read and drop the unread body, then go on */
        kh_conn_resume(c);
    }
}

/* Feeds body bytes to the stream. Returns bytes consumed, or -1 after an error reply. */
static ssize_t read_body(kh_conn *c, kh_stream *s, char *p, size_t n, int deliver)
{
    h1_stream *hs = HS(s);
    size_t used, out_len;
    if (hs->chunked_body) {
        /* body_bytes bounds the sum of the chunk sizes, so a size line that passes it is
         * answered 413 at once, as a Content-Length over it is (kh_stream_expect_body) */
        kh_h1_limits lim = {c->w->limits->header_bytes, c->w->limits->header_fields,
                            c->w->limits->target_bytes, s->body_limit};
        ssize_t r = kh_h1_chunked_decode(&hs->chunked, p, n, &out_len, &lim);
        if (r < 0) {
            KH_LOG_DEBUG("c%u bad chunked body: %s", c->id, kh_h1_error_reason((int)r));
            hs->keepalive = 0; /* the framing is lost: close after the reply */
            if (!deliver) {
                /* discarding after a complete response: nothing more to say, just close */
                finish_request(c, 0);
                return -1;
            }
            if (r == KH_H1_EBODYLEN && s->body_state == KH_BODY_READING)
                s->body_state = KH_BODY_TOO_LARGE; /* req:body() says "too large", as for CL */
            kh_stream_on_body_error(s, kh_h1_error_status((int)r), kh_h1_error_reason((int)r));
            return -1;
        }
        used = (size_t)r;
        if (deliver && out_len && kh_stream_on_body(s, p, out_len) != 0)
            return -1;
        if (hs->chunked.done)
            hs->remaining = 0;
    } else {
        used = (size_t)KH_MIN((uint64_t)n, hs->remaining);
        hs->remaining -= used;
        if (deliver && used && kh_stream_on_body(s, p, used) != 0)
            return -1;
    }
    int complete = hs->chunked_body ? hs->chunked.done : hs->remaining == 0;
    if (complete) {
        kh_conn_set_timeout(c, KH_TO_NONE);
        if (deliver)
            kh_stream_on_body_end(s);
    } else {
        kh_conn_set_timeout(c, KH_TO_BODY);
    }
    return (ssize_t)used;
}

/* 1 if token (lower case) is in the comma-separated list v (case-insensitive). */
static int has_token(kh_str v, const char *token, size_t tlen)
{
    size_t i = 0;
    while (i < v.len) {
        while (i < v.len && (v.ptr[i] == ' ' || v.ptr[i] == '\t' || v.ptr[i] == ','))
            i++;
        size_t j = i;
        while (j < v.len && v.ptr[j] != ',' && v.ptr[j] != ' ' && v.ptr[j] != '\t')
            j++;
        if (kh_str_ieq_lower((kh_str){v.ptr + i, j - i}, token, tlen))
            return 1;
        i = j;
    }
    return 0;
}

/* Upgrade: h2c (RFC 7540 §3.2) is off unless the limit h2c_upgrade is 1: RFC 9113 removed it,
 * and behind a proxy that passes Upgrade on (the common WebSocket lines `proxy_set_header
 * Upgrade $http_upgrade; proxy_set_header Connection "upgrade";`) a 101 would turn the proxy's
 * connection into an HTTP/2 tunnel past the proxy's own rules. Off, or when the request does not
 * qualify, the Upgrade header is ignored and the request served as HTTP/1.1 (as nginx does).
 * To qualify: cleartext HTTP/1.1 (over TLS, h2 is ALPN's business, RFC 9113 §3.2), not shutting
 * down, no request body (it would have to be read as HTTP/1.1 first; the client must accept an
 * HTTP/1.1 answer), Upgrade lists h2c and Connection lists both "upgrade" and "http2-settings"
 * (§3.2.1: HTTP2-Settings is hop-by-hop, so a request that lost the token went through a hop that
 * rewrote Connection, and was not sent to us). A request that qualifies must then carry exactly
 * one valid HTTP2-Settings (kh_h1_h2_settings), else it is answered 400 and the connection
 * closed: the client asked us, not a proxy, to switch, and a SETTINGS payload HTTP/2 would refuse
 * is a malformed request, which this server never serves leniently; ignoring the upgrade would
 * run the handler for a client that may follow with the h2 preface regardless.
 * Returns 1 with *settings set (upgrade), 0 (serve HTTP/1.1) or KH_H1_EH2SETTINGS. */
static int h2c_upgrade(kh_conn *c, const kh_h1_head *head, const kh_h1_field *f,
                       const kh_h1_field **settings)
{
    if (!c->w->limits->h2c_upgrade || !(head->flags & KH_H1_F_HAS_UPGRADE) ||
        !(head->flags & KH_H1_F_CONN_UPGRADE) || head->minor_version < 1 ||
        !has_token(head->upgrade, "h2c", 3) || c->w->stopping || c->tls ||
        (H(c)->flags & H1_SHUTDOWN) || head->body_kind == KH_H1_BODY_CHUNKED ||
        (head->body_kind == KH_H1_BODY_LENGTH && head->content_length != 0))
        return 0;
    int token = 0, count = 0;
    for (size_t i = 0; i < head->num_fields; i++) {
        if (kh_str_ieq_lower(f[i].name, "connection", 10) &&
            has_token(f[i].value, "http2-settings", 14))
            token = 1;
        else if (kh_str_ieq_lower(f[i].name, "http2-settings", 14) && count++ == 0)
            *settings = &f[i];
    }
    if (!token)
        return 0;
    uint8_t raw[KH_H1_H2_SETTINGS_MAX * 6];
    if (count != 1 || kh_h1_h2_settings((*settings)->value, raw) < 0)
        return KH_H1_EH2SETTINGS;
    return 1;
}

/* Connection-specific fields of an upgrade request do not belong to the h2 request. */
static int upgrade_field(kh_str nm)
{
    return kh_str_ieq_lower(nm, "connection", 10) || kh_str_ieq_lower(nm, "upgrade", 7) ||
           kh_str_ieq_lower(nm, "http2-settings", 14);
}

static int start_request(kh_conn *c, kh_h1_head *head, kh_h1_field *fields)
{
    h1_conn *h = H(c);
    h->flags |= H1_SEEN;
    const kh_h1_field *h2c = NULL;
    int up = h2c_upgrade(c, head, fields, &h2c);
    if (up < 0) {
        KH_LOG_DEBUG("c%u bad request: %s", c->id, kh_h1_error_reason(up));
        reply_error(c, kh_h1_error_status(up), kh_h1_error_reason(up), is_head(head->method));
        return -1;
    }
    if (up == 0)
        h2c = NULL;
    kh_stream *s = kh_stream_open(c->w, &h1_sink, c);
    if (c->tls)
        s->flags |= KH_STREAM_F_TLS;
    kh_header hdrs[head->num_fields ? head->num_fields : 1];
    size_t nh = 0;
    for (size_t i = 0; i < head->num_fields; i++) {
        if (h2c && upgrade_field(fields[i].name))
            continue;
        hdrs[nh].name = fields[i].name;
        hdrs[nh].value = fields[i].value;
        nh++;
    }
    kh_str authority = head->authority.len ? head->authority : head->host;
    kh_stream_set_head(s, head->method, head->target, head->path, head->query, authority, 1,
                       head->minor_version, hdrs, nh);
    s->peer = c->peer;
    const kh_proto *up_to = h2c ? kh_proto_by_upgrade("h2c", 3) : NULL;
    if (up_to && up_to->upgrade(c, s, h2c->value) == 0)
        return 1; /* c speaks h2 now; the stream is stream 1 there */
    if (!h2c && (head->flags & KH_H1_F_HAS_UPGRADE) && (head->flags & KH_H1_F_CONN_UPGRADE) &&
        head->minor_version >= 1 && kh_str_eq(head->method, "GET", 3) &&
        head->body_kind == KH_H1_BODY_NONE) {
        /* RFC 9110 §7.8: a tunnel request (WebSocket, RFC 6455 §4.1); its first protocol */
        kh_str upv = head->upgrade;
        size_t i = 0;
        while (i < upv.len && (upv.ptr[i] == ' ' || upv.ptr[i] == '\t'))
            i++;
        size_t j = i;
        while (j < upv.len && upv.ptr[j] != ',' && upv.ptr[j] != ' ' && upv.ptr[j] != '\t')
            j++;
        kh_stream_mark_tunnel(s, (kh_str){upv.ptr + i, j - i});
    }
    h1_stream *hs = HS(s);
    memset(hs, 0, sizeof *hs);
    /* RFC 9112 §9.3: 1.1 persists unless "close"; 1.0 only with "keep-alive". */
    if (head->minor_version >= 1)
        hs->keepalive = !(head->flags & KH_H1_F_CONN_CLOSE);
    else
        hs->keepalive = (head->flags & KH_H1_F_CONN_KEEPALIVE) && !(head->flags & KH_H1_F_CONN_CLOSE);
    if (c->w->limits->keepalive_timeout_ms == 0 || (h->flags & H1_SHUTDOWN) || c->w->stopping)
        hs->keepalive = 0;
    h->s = s;
    int64_t len = 0;
    if (head->body_kind == KH_H1_BODY_CHUNKED) {
        hs->chunked_body = 1;
        len = -1;
    } else if (head->body_kind == KH_H1_BODY_LENGTH) {
        hs->remaining = head->content_length;
        len = (int64_t)head->content_length;
    }
    hs->expect_continue = (head->flags & KH_H1_F_EXPECT_CONTINUE) && len != 0 && head->minor_version >= 1;
    if (kh_stream_expect_body(s, len) != 0 && !kh_stream_allow_large_body(s)) {
        /* declared Content-Length over body_bytes: 413 before reading a byte of it */
        hs->keepalive = 0;
        kh_stream_on_head(s);
        return -1;
    }
    h->phase = len == 0 ? PH_WAIT : PH_BODY;
    kh_conn_set_timeout(c, len == 0 ? KH_TO_NONE : KH_TO_BODY);
    return 0;
}

/* Incremental body / tunnel: how many more bytes s->body may take before body_window; at 0,
 * reading pauses (the rest waits in `in`) until the app consumes (h1_consumed). */
static size_t window_room(kh_conn *c, kh_stream *s)
{
    size_t win = c->w->limits->body_window;
    if (s->body.len < win)
        return win - s->body.len;
    HS(s)->win_paused = 1;
    kh_conn_pause(c);
    if (H(c)->phase != PH_TUNNEL)
        kh_conn_set_timeout(c, KH_TO_NONE); /* the app is slow, not the client */
    return 0;
}

static void dispatch(kh_conn *c, kh_stream *s)
{
    HS(s)->dispatched = 1;
    kh_stream_retain(s); /* on_head may finish the request; keep s valid for the checks */
    kh_stream_on_head(s);
    kh_stream_release(s);
}

static size_t h1_on_read(kh_conn *c, char *p, size_t n)
{
    h1_conn *h = H(c);
    size_t off = 0;
    const kh_limits *l = c->w->limits;
    while (off < n && !(c->flags & KH_CONN_F_CLOSING)) {
        switch (h->phase) {
        case PH_HEAD: {
            if (h->flags & H1_OUT_WAIT) {
                kh_conn_pause(c); /* the rest waits in `in` for h1_on_flush */
                return off;
            }
            if (!(h->flags & H1_SEEN) && off == 0) {
                /* a protocol with prior knowledge (RFC 9113 §3.3: h2) starts with a preface
                 * the HTTP/1.1 parser would refuse: kh_proto hands the connection over */
                int sw = kh_proto_sniff(c, p, n);
                if (sw < 0)
                    return 0; /* wait for the rest of the preface */
                if (sw > 0)
                    return c->proto->on_read(c, p, n);
            }
            kh_h1_field fields[l->header_fields];
            kh_h1_head head;
            memset(&head, 0, sizeof head);
            head.fields = fields;
            kh_h1_limits lim = {l->header_bytes, l->header_fields, l->target_bytes, l->body_bytes};
            ssize_t r = kh_h1_parse_request(p + off, n - off, h->prev_len, &head, &lim);
            if (r == KH_EAGAIN) {
                /* A first byte that cannot start a method or an empty line (a TLS ClientHello
                 * is 0x16) will never become a request: say so now instead of holding the
                 * connection until the header timeout. */
                unsigned char first = (unsigned char)p[off];
                if ((first <= 0x20 || first >= 0x7f) && first != '\r') {
                    reply_error(c, 400, "not an HTTP/1.x request", 0);
                    return n;
                }
                h->prev_len = (uint32_t)(n - off);
                if (c->timer_kind != KH_TO_HEADER)
                    kh_conn_set_timeout(c, KH_TO_HEADER);
                return off;
            }
            if (r < 0) {
                KH_LOG_DEBUG("c%u bad request: %s", c->id, kh_h1_error_reason((int)r));
                reply_error(c, kh_h1_error_status((int)r), kh_h1_error_reason((int)r),
                            is_head(head.method));
                return n;
            }
            h->prev_len = 0;
            int rc = start_request(c, &head, fields);
            off += (size_t)r;
            if (rc == 1) {
                /* upgraded to h2c: what follows (the client preface) is h2's to read */
                kh_conn_resume(c);
                return off;
            }
            if (rc != 0)
                return n; /* 413 or 400 is out and the connection closes */
            if (h->phase == PH_WAIT)
                dispatch(c, h->s);
            break;
        }
        case PH_TUNNEL: {
            kh_stream *s = h->s;
            if (s == NULL || s->body_state != KH_BODY_READING)
                return n; /* the app ended its side, or the input is over: dropped */
            size_t room = window_room(c, s);
            if (room == 0)
                return off;
            size_t k = KH_MIN(room, n - off);
            kh_conn_set_timeout(c, KH_TO_TUNNEL);
            kh_stream_on_body(s, p + off, k);
            off += k;
            break;
        }
        case PH_BODY:
        case PH_DISCARD: {
            kh_stream *s = h->s;
            int discard = h->phase == PH_DISCARD;
            size_t lim = n - off;
            if (!discard && (s->flags & KH_STREAM_F_BODY_STREAM)) {
                lim = KH_MIN(lim, window_room(c, s));
                if (lim == 0)
                    return off;
            }
            ssize_t r = read_body(c, s, p + off, lim, !discard);
            if (r < 0)
                return n;
            off += (size_t)r;
            int complete = HS(s)->chunked_body ? HS(s)->chunked.done : HS(s)->remaining == 0;
            if (!HS(s)->dispatched && !discard) {
                /* the body bytes at hand went in first, so most handlers find it complete */
                if (complete && h->phase == PH_BODY)
                    h->phase = PH_WAIT;
                dispatch(c, s);
                if (h->s != s)
                    break; /* answered and finished, or closed */
            }
            if (complete && h->s == s) {
                if (h->phase == PH_DISCARD)
                    finish_request(c, 1);
                else if (h->phase == PH_BODY)
                    h->phase = PH_WAIT;
            }
            break;
        }
        case PH_WAIT:
            /* Reading goes on while the app works, so a client that leaves is seen at once
             * (its FIN or RST aborts the stream); pipelined bytes wait in the conn's `in`,
             * up to one head's worth, then reading pauses. */
            if (n - off > l->header_bytes)
                kh_conn_pause(c);
            return off;
        case PH_CLOSED:
        default:
            return n;
        }
    }
    /* the body has not (fully) arrived: the handler runs now and waits for it if it asks */
    if (h->phase == PH_BODY && h->s && !HS(h->s)->dispatched && !(c->flags & KH_CONN_F_CLOSING))
        dispatch(c, h->s);
    /* every byte was a complete request: finish_request, called while they were still in `in`
     * (fed again after a pause), took them for the start of a next head; the connection is idle */
    if (h->phase == PH_HEAD && c->timer_kind == KH_TO_HEADER && !(c->flags & KH_CONN_F_CLOSING))
        kh_conn_set_timeout(c, KH_TO_IDLE);
    return off;
}

static void h1_on_eof(kh_conn *c)
{
    h1_conn *h = H(c);
    if (h->phase == PH_TUNNEL && h->s) {
        /* the peer ended its side of the tunnel: the app hears it as the body's end and
         * ends its own (fin closes the connection) */
        kh_stream *s = h->s;
        if (s->body_state == KH_BODY_READING)
            kh_stream_on_body_end(s);
        return;
    }
    if (h->phase == PH_WAIT && h->s && !(h->s->flags & KH_STREAM_F_APP)) {
        /* half-close after a complete request: answer it, then close */
        HS(h->s)->keepalive = 0;
        return;
    }
    /* FIN while the app still works on the request (it sleeps, waits on the pool, holds a
     * deferred reply): HTTP/1.1 cannot tell a half-close from a client that left, and nearly
     * every client that sends FIN here has left (nginx's lua_check_client_abort does the
     * same). Closing aborts the stream, so the app's waits are cancelled. */
    kh_conn_close(c);
}

static void h1_on_timeout(kh_conn *c, int kind)
{
    h1_conn *h = H(c);
    switch (kind) {
    case KH_TO_HEADER:
        if (c->in.len || (c->flags & KH_CONN_F_HAS_INPUT)) {
            KH_LOG_DEBUG("c%u request head timed out", c->id);
            reply_error(c, 408, "Request Timeout", 0);
        } else {
            kh_conn_close(c);
        }
        break;
    case KH_TO_BODY:
        KH_LOG_DEBUG("c%u request body timed out", c->id);
        if (h->s && h->phase == PH_BODY) {
            HS(h->s)->keepalive = 0;
            kh_stream_on_body_error(h->s, 408, "Request Timeout");
        } else {
            kh_conn_close(c);
        }
        break;
    case KH_TO_TUNNEL:
        KH_LOG_DEBUG("c%u tunnel idle for tunnel_idle_timeout_ms: closing", c->id);
        kh_conn_close(c);
        break;
    case KH_TO_IDLE:
    default:
        kh_conn_close(c);
        break;
    }
}

/* The flush pass is about to write: end an output wait once the queue is below half the mark.
 * Returns 1 while still waiting: kh_conn then writes through uv_write, whose callback runs the
 * next flush a loop turn later even if the socket takes everything now, so a client that reads
 * as fast as we answer gets one answer per loop turn, not the whole pipeline in one pass. */
static int h1_on_flush(kh_conn *c)
{
    h1_conn *h = H(c);
    if (h->s && (h->s->flags & KH_STREAM_F_WANT_DRAIN)) {
        /* a streamed response waits for its queue to go down: told once at or below the
         * low-water mark (the app writes again from here); until then, and once after, the
         * bytes go by uv_write so that the next check comes when a write has completed (one
         * batch per loop turn, never a loop of writes inside one flush pass) */
        kh_stream_on_drain(h->s);
        if (c->flags & KH_CONN_F_CLOSING)
            return 0;
        return 1;
    }
    if (!(h->flags & H1_OUT_WAIT))
        return 0;
    if (kh_conn_out_pending(c) >= c->w->limits->h1_out_high_water / 2)
        return 1;
    h->flags &= ~H1_OUT_WAIT;
    kh_conn_resume(c); /* the next flush pass parses what waits in `in`, and reads again */
    return 0;
}

static void h1_on_shutdown(kh_conn *c)
{
    h1_conn *h = H(c);
    h->flags |= H1_SHUTDOWN;
    if (h->phase == PH_HEAD && c->in.len == 0 && h->s == NULL) {
        /* between requests; an answer can still be on its way out to a slow reader (a
         * keep-alive request is finished once its answer is queued): close after it */
        h->phase = PH_CLOSED;
        kh_conn_set_timeout(c, KH_TO_NONE);
        if (kh_conn_out_pending(c) == 0)
            kh_conn_close(c);
        else
            kh_conn_close_after_write(c);
    } else if (h->s && (h->s->flags & (KH_STREAM_F_HELD | KH_STREAM_F_TUNNEL))) {
        /* a long-lived stream (an idle SSE stream, a tunnel) would hold the stop until the
         * grace period: it ends now (the app hears on_abort; an EventSource reconnects) */
        kh_conn_close(c);
    } else if (h->s && !(h->s->flags & KH_STREAM_F_HEAD_SENT))
        HS(h->s)->keepalive = 0;
}

static void h1_on_close(kh_conn *c)
{
    h1_conn *h = H(c);
    if (h->s) {
        kh_stream *s = h->s;
        h->s = NULL;
        kh_stream_on_reset(s, KH_ECLOSED);
    }
    h->phase = PH_CLOSED;
}

const kh_proto_vt kh_h1_proto = {
    .name = "h1",
    .on_read = h1_on_read,
    .on_eof = h1_on_eof,
    .on_timeout = h1_on_timeout,
    .on_shutdown = h1_on_shutdown,
    .on_close = h1_on_close,
    .on_flush = h1_on_flush,
};

/* ---- sink: the response side ---- */

static char *put(char *o, const char *s, size_t n)
{
    memcpy(o, s, n);
    return o + n;
}

#define PUT_LIT(o, lit) put((o), (lit), sizeof(lit) - 1)

static int h1_head(kh_stream *s, int status, const kh_header *hdr, size_t n, int64_t clen)
{
    kh_conn *c = s->proto;
    h1_conn *h = H(c);
    h1_stream *hs = HS(s);
    int has_server = 0, has_date = 0;
    size_t need = 256;
    for (size_t i = 0; i < n; i++) {
        need += hdr[i].name.len + hdr[i].value.len + 4;
        if (kh_str_ieq_lower(hdr[i].name, "server", 6))
            has_server = 1;
        else if (kh_str_ieq_lower(hdr[i].name, "date", 4))
            has_date = 1;
    }
    /* RFC 9110 §15.3.5 / §15.4.5: 204 and 304 have no content. */
    int bodyless = status == 204 || status == 304;
    if (s->flags & KH_STREAM_F_CLOSE)
        hs->keepalive = 0;
    if (h->flags & H1_SHUTDOWN)
        hs->keepalive = 0;
    /* RFC 9110 §10.1.1: a final answer before a 100-continue body arrived: the client may or may
     * not send it now, so the connection cannot be reused safely. */
    if (hs->expect_continue && !hs->continue_sent && s->body_state == KH_BODY_READING)
        hs->keepalive = 0;
    if (clen < 0 && !bodyless) {
        if (s->version_minor >= 1)
            hs->resp_chunked = 1;
        else
            hs->keepalive = 0; /* HTTP/1.0: the end of the body is the end of the connection */
    }
    char *o = kh_conn_out_reserve(c, need);
    char *start = o;
    /* fixed-size copies for the common head (200, our Server, our Date) rather than the status
     * line, the reason's strlen and the Date in pieces: 5,463 -> 5,354 instructions per h1 hello
     * request (REQUESTS=20000 CONNS=64 bench/callgrind.sh) */
    if (status == 200 && !has_server) {
        o = PUT_LIT(o, "HTTP/1.1 200 OK\r\nServer: khamsin\r\n");
    } else {
        const char *reason = kh_status_reason(status);
        o = PUT_LIT(o, "HTTP/1.1 ");
        o = kh_put_u64(o, (uint64_t)status);
        *o++ = ' ';
        o = put(o, reason, strlen(reason));
        o = PUT_LIT(o, "\r\n");
        if (!has_server)
            o = PUT_LIT(o, "Server: khamsin\r\n");
    }
    if (!has_date)
        o = put(o, kh_worker_date_line(c->w), KH_WORKER_DATE_LINE);
    for (size_t i = 0; i < n; i++) {
        kh_str nm = hdr[i].name;
        /* framing and hop-by-hop fields are ours to write */
        if (kh_str_ieq_lower(nm, "content-length", 14) ||
            kh_str_ieq_lower(nm, "transfer-encoding", 17) ||
            kh_str_ieq_lower(nm, "connection", 10) || kh_str_ieq_lower(nm, "keep-alive", 10))
            continue;
        o = put(o, nm.ptr, nm.len);
        o = PUT_LIT(o, ": ");
        o = put(o, hdr[i].value.ptr, hdr[i].value.len);
        o = PUT_LIT(o, "\r\n");
    }
    if (!bodyless) {
        if (clen >= 0) {
            o = PUT_LIT(o, "Content-Length: ");
            o = kh_put_u64(o, (uint64_t)clen);
            o = PUT_LIT(o, "\r\n");
        } else if (hs->resp_chunked) {
            o = PUT_LIT(o, "Transfer-Encoding: chunked\r\n");
        }
    }
    if (!hs->keepalive)
        o = PUT_LIT(o, "Connection: close\r\n");
    else if (s->version_minor == 0)
        o = PUT_LIT(o, "Connection: keep-alive\r\n");
    o = PUT_LIT(o, "\r\n");
    kh_conn_out_commit(c, (size_t)(o - start));
    return 0;
}

static int h1_data(kh_stream *s, const char *p, size_t n, int fin)
{
    kh_conn *c = s->proto;
    h1_stream *hs = HS(s);
    int bodyless = s->status == 204 || s->status == 304 || (s->flags & KH_STREAM_F_HEAD_METHOD);
    if (H(c)->phase == PH_TUNNEL && !fin)
        kh_conn_set_timeout(c, KH_TO_TUNNEL);
    if (n && !bodyless) {
        if (hs->resp_chunked) {
            char line[24];
            int k = snprintf(line, sizeof line, "%zx\r\n", n);
            kh_conn_write(c, line, (size_t)k);
            kh_conn_write(c, p, n);
            kh_conn_write(c, "\r\n", 2);
        } else {
            kh_conn_write(c, p, n);
        }
    }
    if (fin) {
        if (hs->resp_chunked && !bodyless)
            kh_conn_write(c, "0\r\n\r\n", 5);
        response_done(c, s);
    }
    return 0;
}

/* A file body: sendfile on a cleartext connection with a Content-Length framed response (the
 * connection owns fd from here); TLS needs the bytes for its records, chunked its framing. */
static int h1_file(kh_stream *s, int fd, int64_t off, uint64_t n, int fin)
{
    kh_conn *c = s->proto;
    if (c->tls || HS(s)->resp_chunked || H(c)->phase == PH_TUNNEL)
        return UV_ENOTSUP;
    kh_conn_sendfile(c, fd, off, n);
    if (fin)
        response_done(c, s);
    return 0;
}

static void h1_want_body(kh_stream *s)
{
    kh_conn *c = s->proto;
    h1_stream *hs = HS(s);
    if (hs->expect_continue && !hs->continue_sent && !(s->flags & KH_STREAM_F_HEAD_SENT)) {
        hs->continue_sent = 1;
        kh_conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    }
}

static void h1_reset(kh_stream *s, int err)
{
    kh_conn *c = s->proto;
    if (c)
        kh_conn_close(c);
}

static size_t h1_queued(kh_stream *s)
{
    kh_conn *c = s->proto;
    return c ? kh_conn_out_pending(c) : 0;
}

static void h1_consumed(kh_stream *s, size_t n)
{
    (void)n;
    kh_conn *c = s->proto;
    h1_stream *hs = HS(s);
    if (c == NULL || !hs->win_paused || s->body.len >= c->w->limits->body_window)
        return;
    hs->win_paused = 0;
    if (H(c)->phase == PH_TUNNEL)
        kh_conn_set_timeout(c, KH_TO_TUNNEL);
    else if (H(c)->phase == PH_BODY)
        kh_conn_set_timeout(c, KH_TO_BODY);
    kh_conn_resume(c); /* the bytes waiting in `in` are offered again at the next flush */
}

static int h1_tunnel(kh_stream *s, const kh_header *hdr, size_t n)
{
    kh_conn *c = s->proto;
    h1_conn *h = H(c);
    h1_stream *hs = HS(s);
    size_t need = 128 + strlen(s->tunnel_proto);
    for (size_t i = 0; i < n; i++)
        need += hdr[i].name.len + hdr[i].value.len + 4;
    char *o = kh_conn_out_reserve(c, need);
    char *start = o;
    o = PUT_LIT(o, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ");
    o = put(o, s->tunnel_proto, strlen(s->tunnel_proto));
    o = PUT_LIT(o, "\r\n");
    for (size_t i = 0; i < n; i++) {
        kh_str nm = hdr[i].name;
        if (kh_str_ieq_lower(nm, "content-length", 14) ||
            kh_str_ieq_lower(nm, "transfer-encoding", 17) ||
            kh_str_ieq_lower(nm, "connection", 10) || kh_str_ieq_lower(nm, "upgrade", 7))
            continue;
        o = put(o, nm.ptr, nm.len);
        o = PUT_LIT(o, ": ");
        o = put(o, hdr[i].value.ptr, hdr[i].value.len);
        o = PUT_LIT(o, "\r\n");
    }
    o = PUT_LIT(o, "\r\n");
    kh_conn_out_commit(c, (size_t)(o - start));
    hs->keepalive = 0; /* the connection ends with the tunnel */
    hs->resp_chunked = 0;
    h->phase = PH_TUNNEL;
    kh_conn_set_timeout(c, KH_TO_TUNNEL);
    kh_conn_resume(c); /* bytes that came after the head wait in `in` */
    return 0;
}

/* kh_stream_compact: the connection's one stream is now t */
static void h1_moved(kh_stream *s, kh_stream *t)
{
    kh_conn *c = s->proto;
    if (H(c)->s == s)
        H(c)->s = t;
}

static const kh_sink_vt h1_sink = {
    .name = "h1",
    .head = h1_head,
    .data = h1_data,
    .file = h1_file,
    .want_body = h1_want_body,
    .reset = h1_reset,
    .alt_svc = kh_conn_alt_svc,
    .queued = h1_queued,
    .consumed = h1_consumed,
    .tunnel = h1_tunnel,
    .moved = h1_moved,
};
