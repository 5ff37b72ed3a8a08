/* kh_h2_client.c: HTTP/2 client session (RFC 9113) over nghttp2's client session, sans-io:
 * mem_recv in, mem_send out, per-stream state read by the caller.
 * Owns:  the nghttp2 session and the h2c_stream list (each: request body copy, response fields
 *        in one growing buffer of offsets, response body bytes not yet taken).
 * In:    connection bytes, requests, takes of body bytes.
 * Out:   bytes to send; per-stream head/body/end/error.
 * Never: touches I/O; sends WINDOW_UPDATE for bytes the caller has not taken (automatic window
 *        updates are off: nghttp2_session_consume runs in kh_h2c_take), so a slow reader bounds
 *        what the server may push to the windows granted.
 *
 * Errors land on streams, not on the caller's stack: a RST_STREAM from the server sets
 * KH_H2C_ERESET on that stream, a GOAWAY sets KH_H2C_EGOAWAY on the streams above its
 * last-stream-id (nghttp2 closes them with REFUSED_STREAM), a limit resets the stream with
 * CANCEL and sets KH_H2C_EHEADLEN / KH_H2C_EBODYLEN, a failed session sets KH_H2C_EPROTO on every
 * stream still open. */
#include "kh_h2_client.h"

#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <string.h>

#include "kh_err.h"

typedef struct h2c_stream {
    struct h2c_stream *next;
    int32_t id;
    int status;
    int done;
    int err;
    uint32_t h2_code;
    int head_done;      /* the final (non-1xx) head has arrived: later HEADERS are trailers */
    /* request body still to hand to nghttp2 (streamed: appended by kh_h2c_write until fin) */
    char *req;
    size_t req_len, req_off, req_cap;
    int streamed, fin;
    /* response fields: names and values back to back in hbuf; offsets in hoff (4 per field) */
    char *hbuf;
    size_t hlen, hcap;
    size_t *hoff;
    size_t nfields, fcap;
    /* response body not yet taken */
    char *body;
    size_t blen, bcap;
    uint64_t btotal;
    size_t taken; /* bytes the caller took last time (consumed toward the window) */
} h2c_stream;

struct kh_h2c {
    nghttp2_session *ng;
    kh_h2c_limits lim;
    h2c_stream *streams;
    size_t nstreams;
    int failed;
    int goaway;
};

const char *kh_h2c_error_reason(int err)
{
    switch (err) {
    case KH_H2C_ERESET:
        return "stream reset by server";
    case KH_H2C_EGOAWAY:
        return "connection going away (request not processed)";
    case KH_H2C_EHEADLEN:
        return "response head too large";
    case KH_H2C_EBODYLEN:
        return "response body too large";
    case KH_H2C_EPROTO:
        return "http2 protocol error";
    case KH_H2C_ECLOSED:
        return "closed mid-body";
    case KH_H2C_EREQ:
        return "invalid request";
    case KH_H2C_ESTATUS:
        return "invalid :status";
    default:
        return kh_strerror(err);
    }
}

static h2c_stream *find(kh_h2c *s, int32_t id)
{
    for (h2c_stream *st = s->streams; st; st = st->next)
        if (st->id == id)
            return st;
    return NULL;
}

static void stream_fail(kh_h2c *s, h2c_stream *st, int err, uint32_t code)
{
    if (st->done || st->err)
        return;
    st->err = err;
    st->h2_code = code;
    if (s->ng && nghttp2_session_find_stream(s->ng, st->id) != NULL)
        nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
}

static void grow(char **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    *p = kh_xrealloc(*p, c);
    *cap = c;
}

/* ---- nghttp2 callbacks ---- */

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    (void)ng;
    kh_h2c *s = ud;
    h2c_stream *st = find(s, f->hd.stream_id);
    if (st && f->headers.cat == NGHTTP2_HCAT_RESPONSE) {
        st->status = 0;
        st->nfields = 0;
        st->hlen = 0;
    }
    return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
    (void)ng;
    (void)flags;
    kh_h2c *s = ud;
    h2c_stream *st = find(s, f->hd.stream_id);
    if (st == NULL || st->err)
        return 0;
    if (st->head_done)
        return 0; /* trailers: dropped */
    if (namelen == 7 && memcmp(name, ":status", 7) == 0) {
        int v = 0;
        if (valuelen != 3)
            goto bad_status;
        for (size_t i = 0; i < 3; i++) {
            if (value[i] < '0' || value[i] > '9')
                goto bad_status;
            v = v * 10 + (value[i] - '0');
        }
        if (v < 100)
            goto bad_status;
        st->status = v;
        return 0;
    bad_status:
        stream_fail(s, st, KH_H2C_ESTATUS, 0);
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    if (st->status >= 100 && st->status < 200)
        return 0; /* an interim head's fields: skipped */
    if (st->hlen + namelen + valuelen > s->lim.header_bytes ||
        st->nfields + 1 > s->lim.header_fields) {
        stream_fail(s, st, KH_H2C_EHEADLEN, 0);
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    grow(&st->hbuf, &st->hcap, st->hlen + namelen + valuelen);
    if (st->nfields + 1 > st->fcap) {
        st->fcap = st->fcap ? st->fcap * 2 : 16;
        st->hoff = kh_xrealloc(st->hoff, st->fcap * 4 * sizeof(size_t));
    }
    size_t *o = st->hoff + st->nfields * 4;
    o[0] = st->hlen;
    o[1] = namelen;
    memcpy(st->hbuf + st->hlen, name, namelen);
    st->hlen += namelen;
    o[2] = st->hlen;
    o[3] = valuelen;
    if (valuelen)
        memcpy(st->hbuf + st->hlen, value, valuelen);
    st->hlen += valuelen;
    st->nfields++;
    return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    (void)ng;
    kh_h2c *s = ud;
    if (f->hd.type == NGHTTP2_GOAWAY) {
        s->goaway = 1;
        return 0;
    }
    h2c_stream *st = find(s, f->hd.stream_id);
    if (st == NULL || st->err)
        return 0;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_RESPONSE) {
        if (st->status == 0) {
            stream_fail(s, st, KH_H2C_ESTATUS, 0);
            return 0;
        }
    }
    if (f->hd.type == NGHTTP2_HEADERS && !st->head_done) {
        if (st->status < 200) { /* 1xx: wait for the final head */
            st->status = 0;
            st->nfields = 0;
            st->hlen = 0;
            return 0;
        }
        st->head_done = 1;
    }
    if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
        (f->hd.flags & NGHTTP2_FLAG_END_STREAM) && st->status >= 200)
        st->done = 1;
    return 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *ud)
{
    (void)flags;
    kh_h2c *s = ud;
    h2c_stream *st = find(s, id);
    if (st == NULL || st->err) {
        nghttp2_session_consume(ng, id, len); /* not ours to keep: give the window back */
        return 0;
    }
    if (st->btotal + len > s->lim.body_bytes) {
        nghttp2_session_consume(ng, id, len);
        stream_fail(s, st, KH_H2C_EBODYLEN, 0);
        return 0;
    }
    grow(&st->body, &st->bcap, st->blen + len);
    memcpy(st->body + st->blen, data, len);
    st->blen += len;
    st->btotal += len;
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code, void *ud)
{
    (void)ng;
    kh_h2c *s = ud;
    h2c_stream *st = find(s, id);
    if (st == NULL || st->done || st->err)
        return 0;
    if (code == NGHTTP2_REFUSED_STREAM && s->goaway)
        st->err = KH_H2C_EGOAWAY;
    else if (code != NGHTTP2_NO_ERROR)
        st->err = KH_H2C_ERESET;
    else
        st->err = KH_H2C_ECLOSED; /* closed cleanly without END_STREAM reaching us */
    st->h2_code = code;
    return 0;
}

static void fail_all(kh_h2c *s, int err);

/* nghttp2 tells of a connection error it found (and answers with GOAWAY) */
static int on_error(nghttp2_session *ng, int lib_error_code, const char *msg, size_t len, void *ud)
{
    (void)ng;
    (void)msg;
    (void)len;
    kh_h2c *s = ud;
    if (lib_error_code != NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE && lib_error_code != 0) {
        s->failed = 1;
        fail_all(s, KH_H2C_EPROTO);
    }
    return 0;
}

/* The body of stream id: looked up by id, not through the data source, so a stream the caller
 * forgot (freed) while nghttp2 still held a DATA item for it is simply ended. */
static ssize_t read_body(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len,
                         uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)ng;
    (void)src;
    h2c_stream *st = find(ud, id);
    if (st == NULL) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        return 0;
    }
    size_t n = KH_MIN(len, st->req_len - st->req_off);
    if (n == 0 && st->streamed && !st->fin)
        return NGHTTP2_ERR_DEFERRED; /* kh_h2c_write resumes it */
    if (n)
        memcpy(buf, st->req + st->req_off, n);
    st->req_off += n;
    if (st->req_off == st->req_len && (!st->streamed || st->fin)) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        free(st->req);
        st->req = NULL;
        st->req_len = st->req_off = st->req_cap = 0;
    }
    return (ssize_t)n;
}

kh_h2c *kh_h2c_new(const kh_h2c_limits *lim)
{
    kh_h2c *s = kh_xcalloc(1, sizeof(*s));
    s->lim = *lim;
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        abort();
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_error_callback2(cb, on_error);
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt) != 0)
        abort();
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_option_set_max_send_header_block_length(opt, 1u << 20);
    int rc = nghttp2_session_client_new2(&s->ng, cb, s, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    if (rc != 0)
        abort();
    nghttp2_settings_entry iv[3] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, lim->stream_window},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)KH_MIN(lim->header_bytes + 32 * lim->header_fields, UINT32_MAX)},
    };
    nghttp2_submit_settings(s->ng, NGHTTP2_FLAG_NONE, iv, 3);
    if (lim->conn_window > 65535)
        nghttp2_session_set_local_window_size(s->ng, NGHTTP2_FLAG_NONE, 0,
                                              (int32_t)lim->conn_window);
    return s;
}

static void stream_free(h2c_stream *st)
{
    free(st->req);
    free(st->hbuf);
    free(st->hoff);
    free(st->body);
    free(st);
}

void kh_h2c_free(kh_h2c *s)
{
    if (s == NULL)
        return;
    nghttp2_session_del(s->ng);
    h2c_stream *st = s->streams;
    while (st) {
        h2c_stream *n = st->next;
        stream_free(st);
        st = n;
    }
    free(s);
}

static int conn_specific(kh_str n)
{
    static const char *const names[] = {"connection", "keep-alive", "proxy-connection",
                                        "transfer-encoding", "upgrade", "host", "te",
                                        "content-length"};
    for (size_t i = 0; i < KH_ARRAY_LEN(names); i++)
        if (kh_str_ieq_lower(n, names[i], strlen(names[i])))
            return 1;
    return 0;
}

static int32_t submit(kh_h2c *s, kh_str method, kh_str scheme, kh_str authority, kh_str path,
                      const kh_h1_field *fields, size_t num_fields, const char *body,
                      size_t body_len, int streamed, int64_t content_length)
{
    if (s->failed || s->goaway)
        return KH_H2C_EGOAWAY;
    size_t n = 0;
    nghttp2_nv *nv = kh_xmalloc((num_fields + 5) * sizeof(*nv));
    char *lower = NULL;
    size_t lower_len = 0;
    for (size_t i = 0; i < num_fields; i++)
        lower_len += fields[i].name.len;
    lower = kh_xmalloc(lower_len + 1);
    char clbuf[24];
#define NV(nm, vl)                                                                                 \
    nv[n++] = (nghttp2_nv){(uint8_t *)(nm).ptr, (uint8_t *)(vl).ptr, (nm).len, (vl).len,         \
                           NGHTTP2_NV_FLAG_NONE}
    NV(KH_STR_LIT(":method"), method);
    NV(KH_STR_LIT(":scheme"), scheme);
    NV(KH_STR_LIT(":authority"), authority);
    NV(KH_STR_LIT(":path"), path);
    size_t lo = 0;
    for (size_t i = 0; i < num_fields; i++) {
        kh_str nm = fields[i].name;
        if (conn_specific(nm))
            continue;
        for (size_t k = 0; k < nm.len; k++) {
            char c = nm.ptr[k];
            lower[lo + k] = (c >= 'A' && c <= 'Z') ? (char)(c | 0x20) : c;
        }
        kh_str ln = {lower + lo, nm.len};
        lo += nm.len;
        NV(ln, fields[i].value);
    }
    if (body || (streamed && content_length >= 0)) {
        int k = snprintf(clbuf, sizeof(clbuf), "%zu", body ? body_len : (size_t)content_length);
        kh_str v = {clbuf, (size_t)k};
        NV(KH_STR_LIT("content-length"), v);
    }
#undef NV
    h2c_stream *st = kh_xcalloc(1, sizeof(*st));
    nghttp2_data_provider prd = {.source.ptr = NULL, .read_callback = read_body};
    if (body) {
        st->req = kh_xmalloc(body_len ? body_len : 1);
        memcpy(st->req, body, body_len);
        st->req_len = st->req_cap = body_len;
    }
    st->streamed = streamed;
    int32_t id = nghttp2_submit_request(s->ng, NULL, nv, n, body || streamed ? &prd : NULL, st);
    free(nv);
    free(lower);
    if (id < 0) {
        stream_free(st);
        return KH_H2C_EREQ;
    }
    st->id = id;
    st->next = s->streams;
    s->streams = st;
    s->nstreams++;
    return id;
}

int32_t kh_h2c_submit(kh_h2c *s, kh_str method, kh_str scheme, kh_str authority, kh_str path,
                      const kh_h1_field *fields, size_t num_fields, const char *body,
                      size_t body_len)
{
    return submit(s, method, scheme, authority, path, fields, num_fields, body, body_len, 0, -1);
}

int32_t kh_h2c_submit_streamed(kh_h2c *s, kh_str method, kh_str scheme, kh_str authority,
                               kh_str path, const kh_h1_field *fields, size_t num_fields,
                               int64_t content_length)
{
    return submit(s, method, scheme, authority, path, fields, num_fields, NULL, 0, 1,
                  content_length);
}

int kh_h2c_write(kh_h2c *s, int32_t id, const char *p, size_t n, int fin)
{
    h2c_stream *st = find(s, id);
    if (st == NULL || !st->streamed || st->fin)
        return KH_H2C_EREQ;
    if (st->err)
        return st->err;
    if (s->failed)
        return KH_H2C_EPROTO;
    if (st->req_off > 0) { /* what nghttp2 took is gone: keep only the unsent tail */
        memmove(st->req, st->req + st->req_off, st->req_len - st->req_off);
        st->req_len -= st->req_off;
        st->req_off = 0;
    }
    if (n) {
        grow(&st->req, &st->req_cap, st->req_len + n);
        memcpy(st->req + st->req_len, p, n);
        st->req_len += n;
    }
    st->fin = fin;
    if (nghttp2_session_find_stream(s->ng, id) != NULL)
        nghttp2_session_resume_data(s->ng, id);
    return 0;
}

size_t kh_h2c_unsent(kh_h2c *s, int32_t id)
{
    h2c_stream *st = find(s, id);
    return st ? st->req_len - st->req_off : 0;
}

static void fail_all(kh_h2c *s, int err)
{
    for (h2c_stream *st = s->streams; st; st = st->next)
        if (!st->done && !st->err)
            st->err = err;
}

int kh_h2c_recv(kh_h2c *s, const uint8_t *p, size_t n)
{
    if (s->failed)
        return KH_H2C_EPROTO;
    ssize_t r = nghttp2_session_mem_recv(s->ng, p, n);
    /* a bad frame from the server: nghttp2 queues GOAWAY and stops reading, mem_recv itself
     * may still return the bytes as processed */
    if (r < 0 || s->failed || (!nghttp2_session_want_read(s->ng) && !s->goaway)) {
        s->failed = 1;
        fail_all(s, KH_H2C_EPROTO);
        return KH_H2C_EPROTO;
    }
    return 0;
}

void kh_h2c_eof(kh_h2c *s)
{
    s->failed = 1;
    fail_all(s, KH_H2C_ECLOSED);
}

ssize_t kh_h2c_send(kh_h2c *s, const uint8_t **out)
{
    ssize_t n = nghttp2_session_mem_send(s->ng, out);
    if (n < 0 || (!nghttp2_session_want_read(s->ng) && !s->goaway && !s->failed)) {
        s->failed = 1;
        fail_all(s, KH_H2C_EPROTO);
        return n < 0 ? 0 : n; /* the GOAWAY still goes out */
    }
    return n;
}

void kh_h2c_info_get(kh_h2c *s, int32_t id, kh_h2c_info *info)
{
    memset(info, 0, sizeof(*info));
    h2c_stream *st = find(s, id);
    if (st == NULL)
        return;
    info->known = 1;
    info->status = st->status >= 200 ? st->status : 0;
    info->num_fields = info->status ? st->nfields : 0;
    info->body_len = st->blen - st->taken;
    info->body_total = st->btotal;
    info->done = st->done && !st->err;
    info->err = st->err;
    info->h2_code = st->h2_code;
}

int kh_h2c_field(kh_h2c *s, int32_t id, size_t i, kh_str *name, kh_str *value)
{
    h2c_stream *st = find(s, id);
    if (st == NULL || st->status < 200 || i >= st->nfields)
        return 0;
    const size_t *o = st->hoff + i * 4;
    *name = (kh_str){st->hbuf + o[0], o[1]};
    *value = (kh_str){st->hbuf + o[2], o[3]};
    return 1;
}

size_t kh_h2c_take(kh_h2c *s, int32_t id, const char **p)
{
    h2c_stream *st = find(s, id);
    *p = NULL;
    if (st == NULL)
        return 0;
    /* the bytes handed out last time are the caller's no more: drop them now */
    if (st->taken) {
        memmove(st->body, st->body + st->taken, st->blen - st->taken);
        st->blen -= st->taken;
        st->taken = 0;
    }
    if (st->blen == 0)
        return 0;
    if (nghttp2_session_find_stream(s->ng, id) != NULL)
        nghttp2_session_consume(s->ng, id, st->blen);
    else
        nghttp2_session_consume_connection(s->ng, st->blen);
    st->taken = st->blen;
    *p = st->body;
    return st->blen;
}

void kh_h2c_forget(kh_h2c *s, int32_t id)
{
    h2c_stream **pp = &s->streams;
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->next;
    h2c_stream *st = *pp;
    if (st == NULL)
        return;
    if (!s->failed && nghttp2_session_find_stream(s->ng, id) != NULL) {
        nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        nghttp2_session_set_stream_user_data(s->ng, id, NULL);
    }
    /* body bytes buffered and never taken still hold connection window: give it back */
    size_t untaken = st->blen - st->taken;
    if (untaken && !s->failed)
        nghttp2_session_consume_connection(s->ng, untaken);
    *pp = st->next;
    s->nstreams--;
    stream_free(st);
}

int kh_h2c_can_submit(kh_h2c *s)
{
    if (s->failed || s->goaway)
        return 0;
    uint32_t max = nghttp2_session_get_remote_settings(s->ng,
                                                       NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
    return s->nstreams < max && nghttp2_session_get_next_stream_id(s->ng) < INT32_MAX - 2;
}

size_t kh_h2c_streams(kh_h2c *s)
{
    return s->nstreams;
}

int kh_h2c_dead(kh_h2c *s)
{
    return s->failed || (s->goaway && s->nstreams == 0) ||
           (!nghttp2_session_want_read(s->ng) && !nghttp2_session_want_write(s->ng));
}
