/* kh_h3load.c: an HTTP/3 load generator for benchmarks and specs (Debian 12's h2load has no
 * HTTP/3), on the ngtcp2 0.12 + GnuTLS + nghttp3 0.8 client APIs, like kh_h3get.c.
 * Owns:  C QUIC connections, each on a connected UDP socket of its own, with up to M requests in
 *        flight on each; one thread, one epoll loop (no libuv).
 * In:    argv: kh-h3load [options] https://HOST:PORT/PATH
 *          -c N        connections (default 1)
 *          -m N        requests in flight per connection (default 1)
 *          -n N        requests in all (default 100)
 *          -d S        send requests for S seconds instead of -n (those in flight then finish)
 *          -H 'N: v'   request header (repeatable)
 *          -t S        give up after S seconds without progress (default 10)
 * Out:   on stdout: requests done, ok and failed (a status other than 200, a reset stream, or a
 *        request lost with its connection or to the timeout all count as failed), requests per
 *        second, and latency percentiles (from submitting a request to the end of its
 *        response). Exit 0 when every request got a 200 (and, with -n, N completed); 1 otherwise.
 * Never: verifies the server's certificate (a test tool, like curl -k); reads response bodies
 *        beyond counting them. */
#include <errno.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <netdb.h>
#include <nghttp3/nghttp3.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_UDP 1452

typedef struct {
    const char *host, *port, *path, *authority;
    const char *hdrs[64];
    int nhdrs;
    int conns, streams;
    long long total;    /* -n */
    double duration;    /* -d (0: use -n) */
    double timeout;
} opts_t;

typedef struct req {
    uint64_t t0;
    int status;
    int done;
    struct req *prev, *next; /* the connection's list; next: the free list */
} req_t;

typedef struct client {
    ngtcp2_conn *qc;
    nghttp3_conn *h3;
    gnutls_session_t tls;
    gnutls_certificate_credentials_t cred;
    ngtcp2_crypto_conn_ref ref;
    int fd;
    struct sockaddr_storage local, remote;
    socklen_t locallen, remotelen;
    int ready;     /* HTTP/3 is set up */
    int blocked;   /* the server's stream limit: wait for MAX_STREAMS */
    int dead;
    int dying;     /* being freed: nghttp3's callbacks change nothing */
    int in_flight;
    int idx;
    req_t reqs;    /* list head: requests whose stream has not closed yet */
} client_t;

static opts_t O;
static struct {
    long long issued, done, ok, failed, non200, resets, lost;
    uint64_t t_start, t_last, last_progress, send_until;
    uint32_t *lat; /* microseconds */
    size_t nlat, caplat;
    req_t *free_reqs;
} S;
static struct addrinfo *target;
static int epfd;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "kh-h3load: out of memory\n");
        exit(2);
    }
    return p;
}

static int more_to_issue(void)
{
    if (O.duration > 0)
        return now_ns() < S.send_until;
    return S.issued < O.total;
}

/* ---- requests ---- */

static req_t *req_new(client_t *c)
{
    req_t *r = S.free_reqs;
    if (r)
        S.free_reqs = r->next;
    else
        r = xmalloc(sizeof *r);
    memset(r, 0, sizeof *r);
    r->t0 = now_ns();
    r->prev = &c->reqs;
    r->next = c->reqs.next;
    r->next->prev = r;
    c->reqs.next = r;
    return r;
}

static void req_free(req_t *r)
{
    r->prev->next = r->next;
    r->next->prev = r->prev;
    r->next = S.free_reqs;
    S.free_reqs = r;
}

static void record(client_t *c, req_t *r, int ok, int reset)
{
    if (r->done)
        return;
    r->done = 1;
    c->in_flight--;
    S.done++;
    uint64_t t = now_ns();
    S.t_last = S.last_progress = t;
    if (ok) {
        S.ok++;
        if (S.nlat == S.caplat) {
            S.caplat = S.caplat ? S.caplat * 2 : 4096;
            S.lat = realloc(S.lat, S.caplat * sizeof *S.lat);
            if (!S.lat) {
                fprintf(stderr, "kh-h3load: out of memory\n");
                exit(2);
            }
        }
        uint64_t us = (t - r->t0) / 1000;
        S.lat[S.nlat++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    } else {
        S.failed++;
        if (reset)
            S.resets++;
        else
            S.non200++;
    }
}

/* ---- nghttp3 ---- */

static int h_recv_header(nghttp3_conn *h, int64_t sid, int32_t token, nghttp3_rcbuf *name,
                         nghttp3_rcbuf *value, uint8_t flags, void *ud, void *sud)
{
    (void)h, (void)sid, (void)token, (void)flags, (void)ud;
    req_t *r = sud;
    nghttp3_vec n = nghttp3_rcbuf_get_buf(name), v = nghttp3_rcbuf_get_buf(value);
    if (r && n.len == 7 && memcmp(n.base, ":status", 7) == 0) {
        int st = 0;
        for (size_t i = 0; i < v.len && v.base[i] >= '0' && v.base[i] <= '9'; i++)
            st = st * 10 + (v.base[i] - '0');
        r->status = st;
    }
    return 0;
}

static int h_recv_data(nghttp3_conn *h, int64_t sid, const uint8_t *d, size_t n, void *ud,
                       void *sud)
{
    (void)h, (void)d, (void)sud;
    client_t *c = ud;
    ngtcp2_conn_extend_max_stream_offset(c->qc, sid, n);
    ngtcp2_conn_extend_max_offset(c->qc, n);
    return 0;
}

static int h_deferred_consume(nghttp3_conn *h, int64_t sid, size_t n, void *ud, void *sud)
{
    (void)h, (void)sud;
    client_t *c = ud;
    ngtcp2_conn_extend_max_stream_offset(c->qc, sid, n);
    ngtcp2_conn_extend_max_offset(c->qc, n);
    return 0;
}

static int h_end_stream(nghttp3_conn *h, int64_t sid, void *ud, void *sud)
{
    (void)h, (void)sid;
    req_t *r = sud;
    if (r && !((client_t *)ud)->dying)
        record(ud, r, r->status == 200, 0);
    return 0;
}

static int h_stream_close(nghttp3_conn *h, int64_t sid, uint64_t code, void *ud, void *sud)
{
    (void)h, (void)sid, (void)code;
    req_t *r = sud;
    if (r == NULL || ((client_t *)ud)->dying)
        return 0;
    record(ud, r, 0, 1); /* closed before its response ended: a reset */
    req_free(r);
    return 0;
}

static int h_stop_sending(nghttp3_conn *h, int64_t sid, uint64_t code, void *ud, void *sud)
{
    (void)h, (void)sud;
    client_t *c = ud;
    ngtcp2_conn_shutdown_stream_read(c->qc, sid, code);
    return 0;
}

static int h_reset_stream(nghttp3_conn *h, int64_t sid, uint64_t code, void *ud, void *sud)
{
    (void)h, (void)sud;
    client_t *c = ud;
    ngtcp2_conn_shutdown_stream_write(c->qc, sid, code);
    return 0;
}

/* 0 submitted, 1 the server's stream limit says wait, -1 error */
static int submit_request(client_t *c)
{
    int64_t sid;
    int rv = ngtcp2_conn_open_bidi_stream(c->qc, &sid, NULL);
    if (rv == NGTCP2_ERR_STREAM_ID_BLOCKED) {
        c->blocked = 1;
        return 1;
    }
    if (rv != 0)
        return -1;
    nghttp3_nv nv[70];
    size_t k = 0;
#define NV(n, nl, v, vl) (nghttp3_nv){(uint8_t *)(n), (uint8_t *)(v), nl, vl, 0}
    nv[k++] = NV(":method", 7, "GET", 3);
    nv[k++] = NV(":scheme", 7, "https", 5);
    nv[k++] = NV(":authority", 10, O.authority, strlen(O.authority));
    nv[k++] = NV(":path", 5, O.path, strlen(O.path));
    static char names[64][128];
    for (int i = 0; i < O.nhdrs; i++) {
        const char *colon = strchr(O.hdrs[i], ':');
        if (!colon)
            continue;
        size_t nl = (size_t)(colon - O.hdrs[i]);
        if (nl >= sizeof names[i])
            nl = sizeof names[i] - 1;
        for (size_t j = 0; j < nl; j++) {
            char ch = O.hdrs[i][j];
            names[i][j] = (ch >= 'A' && ch <= 'Z') ? (char)(ch | 0x20) : ch;
        }
        const char *v = colon + 1;
        while (*v == ' ')
            v++;
        nv[k++] = NV(names[i], nl, v, strlen(v));
    }
    req_t *r = req_new(c);
    if (nghttp3_conn_submit_request(c->h3, sid, nv, k, NULL, r) != 0) {
        req_free(r);
        return -1;
    }
    c->in_flight++;
    S.issued++;
    return 0;
}

static int setup_h3(client_t *c)
{
    nghttp3_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.recv_header = h_recv_header;
    cb.recv_data = h_recv_data;
    cb.deferred_consume = h_deferred_consume;
    cb.end_stream = h_end_stream;
    cb.stream_close = h_stream_close;
    cb.stop_sending = h_stop_sending;
    cb.reset_stream = h_reset_stream;
    nghttp3_settings st;
    nghttp3_settings_default(&st);
    st.qpack_max_dtable_capacity = 4096;
    st.qpack_blocked_streams = 100;
    if (nghttp3_conn_client_new(&c->h3, &cb, &st, nghttp3_mem_default(), c) != 0)
        return -1;
    int64_t ctrl, enc, dec;
    if (ngtcp2_conn_open_uni_stream(c->qc, &ctrl, NULL) ||
        ngtcp2_conn_open_uni_stream(c->qc, &enc, NULL) ||
        ngtcp2_conn_open_uni_stream(c->qc, &dec, NULL) ||
        nghttp3_conn_bind_control_stream(c->h3, ctrl) ||
        nghttp3_conn_bind_qpack_streams(c->h3, enc, dec))
        return -1;
    c->ready = 1;
    return 0;
}

/* ---- ngtcp2 ---- */

static void rand_cb(uint8_t *p, size_t n, const ngtcp2_rand_ctx *ctx)
{
    (void)ctx;
    gnutls_rnd(GNUTLS_RND_RANDOM, p, n);
}

static int get_new_cid(ngtcp2_conn *qc, ngtcp2_cid *cid, uint8_t *token, size_t len, void *ud)
{
    (void)qc, (void)ud;
    gnutls_rnd(GNUTLS_RND_RANDOM, cid->data, len);
    cid->datalen = len;
    gnutls_rnd(GNUTLS_RND_RANDOM, token, NGTCP2_STATELESS_RESET_TOKENLEN);
    return 0;
}

static int q_handshake_completed(ngtcp2_conn *qc, void *ud)
{
    (void)qc;
    return setup_h3(ud) == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

static int q_recv_stream_data(ngtcp2_conn *qc, uint32_t flags, int64_t sid, uint64_t off,
                              const uint8_t *d, size_t n, void *ud, void *sud)
{
    (void)off, (void)sud;
    client_t *c = ud;
    if (!c->h3)
        return 0;
    nghttp3_ssize r = nghttp3_conn_read_stream(c->h3, sid, d, n, flags & NGTCP2_STREAM_DATA_FLAG_FIN);
    if (r < 0) {
        fprintf(stderr, "kh-h3load: %s\n", nghttp3_strerror((int)r));
        return NGTCP2_ERR_CALLBACK_FAILURE;
    }
    ngtcp2_conn_extend_max_stream_offset(qc, sid, (uint64_t)r);
    ngtcp2_conn_extend_max_offset(qc, (uint64_t)r);
    return 0;
}

static int q_acked(ngtcp2_conn *qc, int64_t sid, uint64_t off, uint64_t n, void *ud, void *sud)
{
    (void)qc, (void)off, (void)sud;
    client_t *c = ud;
    return c->h3 && nghttp3_conn_add_ack_offset(c->h3, sid, n) ? NGTCP2_ERR_CALLBACK_FAILURE : 0;
}

static int q_stream_close(ngtcp2_conn *qc, uint32_t flags, int64_t sid, uint64_t code, void *ud,
                          void *sud)
{
    (void)qc, (void)sud;
    client_t *c = ud;
    if (!(flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET))
        code = NGHTTP3_H3_NO_ERROR;
    if (c->h3) {
        int r = nghttp3_conn_close_stream(c->h3, sid, code);
        if (r != 0 && r != NGHTTP3_ERR_STREAM_NOT_FOUND)
            return NGTCP2_ERR_CALLBACK_FAILURE;
    }
    return 0;
}

static int q_stream_reset(ngtcp2_conn *qc, int64_t sid, uint64_t fs, uint64_t code, void *ud,
                          void *sud)
{
    (void)qc, (void)fs, (void)code, (void)sud;
    client_t *c = ud;
    if (c->h3)
        nghttp3_conn_shutdown_stream_read(c->h3, sid);
    return 0;
}

static int q_extend_stream_data(ngtcp2_conn *qc, int64_t sid, uint64_t max, void *ud, void *sud)
{
    (void)qc, (void)max, (void)sud;
    client_t *c = ud;
    if (c->h3)
        nghttp3_conn_unblock_stream(c->h3, sid);
    return 0;
}

static int q_extend_bidi(ngtcp2_conn *qc, uint64_t max, void *ud)
{
    (void)qc, (void)max;
    ((client_t *)ud)->blocked = 0;
    return 0;
}

static ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref)
{
    return ((client_t *)ref->user_data)->qc;
}

/* Requests still without a response count as failed (lost with the connection). */
static void client_free(client_t *c)
{
    c->dying = 1;
    if (c->h3)
        nghttp3_conn_del(c->h3);
    while (c->reqs.next != &c->reqs) {
        req_t *r = c->reqs.next;
        if (!r->done) {
            S.lost++;
            S.failed++;
            S.done++;
        }
        req_free(r);
    }
    if (c->qc)
        ngtcp2_conn_del(c->qc);
    if (c->tls)
        gnutls_deinit(c->tls);
    if (c->cred)
        gnutls_certificate_free_credentials(c->cred);
    if (c->fd >= 0)
        close(c->fd);
    int idx = c->idx;
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->idx = idx;
    c->dead = 1;
}

static int client_open(client_t *c)
{
    int idx = c->idx;
    memset(c, 0, sizeof *c);
    c->idx = idx;
    c->reqs.prev = c->reqs.next = &c->reqs;
    c->fd = socket(target->ai_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0 || connect(c->fd, target->ai_addr, target->ai_addrlen) != 0) {
        fprintf(stderr, "kh-h3load: connect: %s\n", strerror(errno));
        return -1;
    }
    int rcvbuf = 4 << 20;
    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    memcpy(&c->remote, target->ai_addr, target->ai_addrlen);
    c->remotelen = target->ai_addrlen;
    c->locallen = sizeof c->local;
    getsockname(c->fd, (struct sockaddr *)&c->local, &c->locallen);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);

    ngtcp2_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.client_initial = ngtcp2_crypto_client_initial_cb;
    cb.recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
    cb.encrypt = ngtcp2_crypto_encrypt_cb;
    cb.decrypt = ngtcp2_crypto_decrypt_cb;
    cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
    cb.recv_retry = ngtcp2_crypto_recv_retry_cb;
    cb.update_key = ngtcp2_crypto_update_key_cb;
    cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
    cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
    cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
    cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
    cb.rand = rand_cb;
    cb.get_new_connection_id = get_new_cid;
    cb.handshake_completed = q_handshake_completed;
    cb.recv_stream_data = q_recv_stream_data;
    cb.acked_stream_data_offset = q_acked;
    cb.stream_close = q_stream_close;
    cb.stream_reset = q_stream_reset;
    cb.extend_max_stream_data = q_extend_stream_data;
    cb.extend_max_local_streams_bidi = q_extend_bidi;

    ngtcp2_cid dcid, scid;
    dcid.datalen = 18;
    scid.datalen = 18;
    gnutls_rnd(GNUTLS_RND_RANDOM, dcid.data, dcid.datalen);
    gnutls_rnd(GNUTLS_RND_RANDOM, scid.data, scid.datalen);
    ngtcp2_settings st;
    ngtcp2_settings_default(&st);
    st.initial_ts = now_ns();
    st.max_tx_udp_payload_size = MAX_UDP;
    ngtcp2_transport_params p;
    ngtcp2_transport_params_default(&p);
    p.initial_max_stream_data_bidi_local = 1 << 20;
    p.initial_max_stream_data_uni = 1 << 20;
    p.initial_max_data = 16 << 20;
    p.initial_max_streams_uni = 3;
    p.max_idle_timeout = (uint64_t)(O.timeout * 1e9);
    ngtcp2_path path = {{(struct sockaddr *)&c->local, c->locallen},
                        {(struct sockaddr *)&c->remote, c->remotelen},
                        NULL};
    if (ngtcp2_conn_client_new(&c->qc, &dcid, &scid, &path, NGTCP2_PROTO_VER_V1, &cb, &st, &p,
                               NULL, c) != 0)
        return -1;
    gnutls_certificate_allocate_credentials(&c->cred);
    gnutls_init(&c->tls, GNUTLS_CLIENT | GNUTLS_ENABLE_EARLY_DATA | GNUTLS_NO_END_OF_EARLY_DATA);
    gnutls_priority_set_direct(c->tls,
        "%DISABLE_TLS13_COMPAT_MODE:NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:"
        "+AES-256-GCM:+CHACHA20-POLY1305:+AES-128-CCM", NULL);
    ngtcp2_crypto_gnutls_configure_client_session(c->tls);
    gnutls_credentials_set(c->tls, GNUTLS_CRD_CERTIFICATE, c->cred);
    c->ref.get_conn = get_conn;
    c->ref.user_data = c;
    gnutls_session_set_ptr(c->tls, &c->ref);
    gnutls_datum_t alpn = {(unsigned char *)"h3", 2};
    gnutls_alpn_set_protocols(c->tls, &alpn, 1, 0);
    gnutls_server_name_set(c->tls, GNUTLS_NAME_DNS, "localhost", 9);
    ngtcp2_conn_set_tls_native_handle(c->qc, c->tls);
    return 0;
}

/* The connection failed: its requests in flight count as failed (lost). */
static void client_fail(client_t *c, const char *why)
{
    fprintf(stderr, "kh-h3load: connection %d: %s\n", c->idx, why);
    client_free(c);
}

static int write_out(client_t *c)
{
    uint8_t buf[MAX_UDP];
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi;
    uint64_t ts = now_ns();
    for (int guard = 0; guard < 100000; guard++) {
        int64_t sid = -1;
        int fin = 0;
        nghttp3_vec vec[16];
        nghttp3_ssize nv = 0;
        if (c->h3 && ngtcp2_conn_get_max_data_left(c->qc)) {
            nv = nghttp3_conn_writev_stream(c->h3, &sid, &fin, vec, 16);
            if (nv < 0)
                return -1;
        }
        ngtcp2_ssize nd = -1;
        uint32_t fl = NGTCP2_WRITE_STREAM_FLAG_MORE | (fin ? NGTCP2_WRITE_STREAM_FLAG_FIN : 0);
        ngtcp2_ssize n = ngtcp2_conn_writev_stream(c->qc, &ps.path, &pi, buf, sizeof buf, &nd, fl,
                                                   sid, (const ngtcp2_vec *)vec, (size_t)nv, ts);
        if (n < 0) {
            if (n == NGTCP2_ERR_STREAM_DATA_BLOCKED) {
                nghttp3_conn_block_stream(c->h3, sid);
                continue;
            }
            if (n == NGTCP2_ERR_STREAM_SHUT_WR) {
                nghttp3_conn_shutdown_stream_write(c->h3, sid);
                continue;
            }
            if (n == NGTCP2_ERR_WRITE_MORE) {
                nghttp3_conn_add_write_offset(c->h3, sid, (size_t)nd);
                continue;
            }
            return -1;
        }
        if (nd >= 0 && c->h3)
            nghttp3_conn_add_write_offset(c->h3, sid, (size_t)nd);
        if (n == 0)
            break;
        if (send(c->fd, buf, (size_t)n, 0) < 0 && errno != EAGAIN && errno != ECONNREFUSED)
            return -1;
    }
    ngtcp2_conn_update_pkt_tx_time(c->qc, ts);
    return 0;
}

static void read_in(client_t *c)
{
    uint8_t buf[65536];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n < 0) {
            if (errno == ECONNREFUSED) {
                client_fail(c, "connection refused");
                return;
            }
            break;
        }
        ngtcp2_path path = {{(struct sockaddr *)&c->local, c->locallen},
                            {(struct sockaddr *)&c->remote, c->remotelen},
                            NULL};
        ngtcp2_pkt_info pi = {0};
        int r = ngtcp2_conn_read_pkt(c->qc, &path, &pi, buf, (size_t)n, now_ns());
        if (r != 0) {
            char why[128];
            if (r == NGTCP2_ERR_DRAINING || r == NGTCP2_ERR_CLOSING) {
                ngtcp2_connection_close_error ce;
                ngtcp2_conn_get_connection_close_error(c->qc, &ce);
                snprintf(why, sizeof why, "closed by the server (%s 0x%llx)",
                         ce.type == NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_APPLICATION
                             ? "application" : "transport",
                         (unsigned long long)ce.error_code);
            } else {
                snprintf(why, sizeof why, "read: %s", ngtcp2_strerror(r));
            }
            client_fail(c, why);
            return;
        }
    }
}

static void close_gracefully(client_t *c)
{
    uint8_t buf[MAX_UDP];
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi;
    ngtcp2_connection_close_error e;
    ngtcp2_connection_close_error_default(&e);
    ngtcp2_connection_close_error_set_application_error(&e, NGHTTP3_H3_NO_ERROR, NULL, 0);
    ngtcp2_ssize n = ngtcp2_conn_write_connection_close(c->qc, &ps.path, &pi, buf, sizeof buf, &e,
                                                        now_ns());
    if (n > 0)
        (void)send(c->fd, buf, (size_t)n, 0);
    client_free(c);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(double p)
{
    if (S.nlat == 0)
        return 0;
    size_t i = (size_t)(p / 100.0 * (double)S.nlat);
    if (i >= S.nlat)
        i = S.nlat - 1;
    return S.lat[i] / 1000.0;
}

static void usage(void)
{
    fprintf(stderr, "usage: kh-h3load [-c CONNECTIONS] [-m STREAMS] [-n TOTAL | -d SECONDS] "
            "[-H 'Name: value']... [-t TIMEOUT] https://HOST:PORT/PATH\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *url = NULL;
    O.conns = O.streams = 1;
    O.total = 100;
    O.timeout = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 < argc && strcmp(a, "-c") == 0)
            O.conns = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "-m") == 0)
            O.streams = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "-n") == 0)
            O.total = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "-d") == 0)
            O.duration = atof(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "-t") == 0)
            O.timeout = atof(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "-H") == 0 && O.nhdrs < 60)
            O.hdrs[O.nhdrs++] = argv[++i];
        else if (a[0] != '-' && !url)
            url = a;
        else
            usage();
    }
    if (!url || strncmp(url, "https://", 8) != 0 || O.conns < 1 || O.streams < 1 ||
        O.total < 1 || O.timeout <= 0)
        usage();
    static char host[300], port[300] = "443", authority[300];
    const char *h = url + 8, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    snprintf(authority, sizeof authority, "%.*s", (int)hl, h);
    O.path = slash ? slash : "/";
    const char *colon = strrchr(authority, ':');
    if (authority[0] == '[') {
        const char *end = strchr(authority, ']');
        if (!end)
            usage();
        snprintf(host, sizeof host, "%.*s", (int)(end - authority - 1), authority + 1);
        if (end[1] == ':')
            snprintf(port, sizeof port, "%s", end + 2);
    } else if (colon) {
        snprintf(host, sizeof host, "%.*s", (int)(colon - authority), authority);
        snprintf(port, sizeof port, "%s", colon + 1);
    } else {
        snprintf(host, sizeof host, "%s", authority);
    }
    O.host = host;
    O.port = port;
    O.authority = authority;
    struct addrinfo hints = {0};
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(O.host, O.port, &hints, &target) != 0) {
        fprintf(stderr, "kh-h3load: cannot resolve %s\n", O.host);
        return 2;
    }
    gnutls_global_init();
    epfd = epoll_create1(EPOLL_CLOEXEC);
    client_t *cs = calloc((size_t)O.conns, sizeof *cs);
    if (!cs)
        return 2;
    S.t_start = S.t_last = S.last_progress = now_ns();
    S.send_until = S.t_start + (uint64_t)(O.duration * 1e9);
    int live = 0;
    for (int i = 0; i < O.conns; i++) {
        cs[i].idx = i;
        if (client_open(&cs[i]) != 0)
            return 2;
        live++;
    }
    int timed_out = 0;
    struct epoll_event evs[256];
    for (;;) {
        /* issue, write, and find the next deadline */
        uint64_t now = now_ns(), next = now + 100000000u;
        int active = 0;
        for (int i = 0; i < O.conns; i++) {
            client_t *c = &cs[i];
            if (c->dead) {
                if (!more_to_issue())
                    continue;
                if (client_open(c) != 0) /* reconnect: there is work left */
                    return 2;
            }
            if (c->ready) {
                while (!c->blocked && c->in_flight < O.streams && more_to_issue()) {
                    int r = submit_request(c);
                    if (r < 0) {
                        client_fail(c, "cannot submit a request");
                        break;
                    }
                    if (r == 1)
                        break;
                }
            }
            if (c->dead)
                continue;
            if (c->in_flight == 0 && c->ready && !more_to_issue()) {
                close_gracefully(c);
                continue;
            }
            active++;
            if (write_out(c) != 0) {
                client_fail(c, "write failed");
                continue;
            }
            uint64_t exp = ngtcp2_conn_get_expiry(c->qc);
            if (exp < next)
                next = exp;
        }
        if (active == 0)
            break;
        now = now_ns();
        if (now - S.last_progress > (uint64_t)(O.timeout * 1e9)) {
            timed_out = 1;
            break;
        }
        int ms = next <= now ? 0 : (int)((next - now + 999999) / 1000000);
        int ne = epoll_wait(epfd, evs, 256, ms);
        for (int k = 0; k < ne; k++) {
            client_t *c = evs[k].data.ptr;
            if (!c->dead)
                read_in(c);
        }
        now = now_ns();
        for (int i = 0; i < O.conns; i++) {
            client_t *c = &cs[i];
            if (c->dead || ngtcp2_conn_get_expiry(c->qc) > now)
                continue;
            int r = ngtcp2_conn_handle_expiry(c->qc, now);
            if (r != 0)
                client_fail(c, r == NGTCP2_ERR_IDLE_CLOSE ? "idle timeout" : ngtcp2_strerror(r));
        }
    }
    for (int i = 0; i < O.conns; i++)
        if (!cs[i].dead)
            client_fail(&cs[i], "timed out");
    double secs = (double)(S.t_last - S.t_start) / 1e9;
    if (secs <= 0)
        secs = 1e-9;
    if (S.nlat)
        qsort(S.lat, S.nlat, sizeof *S.lat, cmp_u32);
    printf("requests: %lld issued, %lld done, %lld ok, %lld failed (%lld not 200, %lld reset, "
           "%lld lost with a connection)\n", S.issued, S.done, S.ok, S.failed, S.non200,
           S.resets, S.lost);
    printf("time: %.3f s, %.0f req/s (ok)\n", secs, (double)S.ok / secs);
    printf("latency ms: min %.3f p50 %.3f p90 %.3f p99 %.3f max %.3f\n",
           S.nlat ? S.lat[0] / 1000.0 : 0.0, pct(50), pct(90), pct(99),
           S.nlat ? S.lat[S.nlat - 1] / 1000.0 : 0.0);
    if (timed_out)
        fprintf(stderr, "kh-h3load: no progress for %.1f s: stopped\n", O.timeout);
    int ok = S.failed == 0 && !timed_out && (O.duration > 0 || S.ok == O.total);
    freeaddrinfo(target);
    free(cs);
    free(S.lat);
    while (S.free_reqs) {
        req_t *r = S.free_reqs;
        S.free_reqs = r->next;
        free(r);
    }
    return ok ? 0 : 1;
}
