/* kh_h3get.c: a small HTTP/3 client for specs and benchmarks (Debian 12's curl has no HTTP/3 and
 * gtlsclient 0.12 sends no request headers), on ngtcp2 0.12 + GnuTLS + nghttp3 0.8 client APIs.
 * Owns:  one UDP socket, one QUIC connection at a time; a poll() loop (no libuv).
 * In:    argv: kh-h3get [options] https://HOST:PORT/PATH
 *          -X METHOD          request method (default GET, POST with -d)
 *          -H 'Name: value'   request header (repeatable)
 *          -d DATA | -d @FILE request body
 *          -D FILE            write the response head there (- for stdout), curl-like:
 *                             "HTTP/3 200" then "name: value" lines, then an empty line
 *          -o FILE            write the response body there (default stdout)
 *          --repeat N         N requests one after another on the same connection
 *          --connections N    N connections one after another (each with --repeat requests)
 *          --timeout S        give up after S seconds without progress (default 10)
 *          -w                 print "status=N" for each response on stderr
 *          --declare-length N send content-length N with the -d body and never finish the
 *                             body (a stalled upload: the server's body timeout answers)
 *          --stall-headers    open a request stream, send the first bytes of a HEADERS frame
 *                             and nothing more; succeed when the server resets the stream
 *                             (its header timeout), printing "reset 0xCODE"
 *          --protocol P       extended CONNECT (RFC 9220): :method CONNECT (unless -X), :protocol
 *                             P; the -d bytes go once a 2xx came, and the stream stays open
 *                             until the server ends it (a reset: "reset 0xCODE", exit 0)
 *          --leave-after N    once N body bytes arrived, close the connection (CONNECTION_CLOSE)
 *                             and exit 0: a client leaving an endless stream (SSE)
 *          --linger S         after the last response keep the connection open S seconds,
 *                             and say so if the server closes it meanwhile
 * Out:   exit 0 when every response arrived complete; 1 otherwise (a message on stderr).
 * Never: verifies the server's certificate (a test tool, like curl -k). */
#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <netdb.h>
#include <nghttp3/nghttp3.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *method, *host, *port, *path, *authority;
    const char *hdrs[64];
    int nhdrs;
    char *body;
    size_t body_len;
    FILE *dump, *out;
    int repeat, conns, verbose, stall_headers;
    long long leave_after;
    const char *protocol;
    double timeout, linger;
    long long declare_length;
} opts_t;

typedef struct {
    ngtcp2_conn *qc;
    nghttp3_conn *h3;
    gnutls_session_t tls;
    gnutls_certificate_credentials_t cred;
    ngtcp2_crypto_conn_ref ref;
    int fd;
    struct sockaddr_storage local, remote;
    socklen_t locallen, remotelen;
    int64_t sid;
    int done_requests, in_flight, status, failed, closed, body_sent;
    int complete; /* the current response ended */
    int raw_pending;  /* --stall-headers: the partial frame is still to be sent */
    long long body_bytes; /* of the current response, for --leave-after */
    uint64_t linger_until;
    uint64_t last_progress;
} client_t;

static opts_t O;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void rand_cb(uint8_t *p, size_t n, const ngtcp2_rand_ctx *c)
{
    (void)c;
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

/* ---- nghttp3 ---- */

static int h_recv_header(nghttp3_conn *h, int64_t sid, int32_t token, nghttp3_rcbuf *name,
                         nghttp3_rcbuf *value, uint8_t flags, void *ud, void *sud)
{
    (void)h, (void)sid, (void)token, (void)flags, (void)sud;
    client_t *c = ud;
    nghttp3_vec n = nghttp3_rcbuf_get_buf(name), v = nghttp3_rcbuf_get_buf(value);
    if (n.len == 7 && memcmp(n.base, ":status", 7) == 0) {
        c->status = atoi((const char *)v.base);
        if (O.protocol && c->status / 100 == 2)
            nghttp3_conn_resume_stream(h, sid); /* the tunnel is open: send the -d bytes */
        if (O.dump)
            fprintf(O.dump, "HTTP/3 %.*s\r\n", (int)v.len, v.base);
    } else if (O.dump) {
        fprintf(O.dump, "%.*s: %.*s\r\n", (int)n.len, n.base, (int)v.len, v.base);
    }
    return 0;
}

static int h_end_headers(nghttp3_conn *h, int64_t sid, int fin, void *ud, void *sud)
{
    (void)h, (void)sid, (void)fin, (void)ud, (void)sud;
    if (O.dump) {
        fprintf(O.dump, "\r\n");
        fflush(O.dump);
    }
    return 0;
}

static int h_recv_data(nghttp3_conn *h, int64_t sid, const uint8_t *d, size_t n, void *ud,
                       void *sud)
{
    (void)h, (void)sud;
    client_t *c = ud;
    if (O.out) {
        fwrite(d, 1, n, O.out);
        fflush(O.out); /* a reader of a stream (SSE) sees each piece as it arrives */
    }
    c->body_bytes += (long long)n;
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

static void finish_request(client_t *c)
{
    if (!c->in_flight)
        return;
    if (O.verbose)
        fprintf(stderr, "status=%d\n", c->status);
    if (O.out)
        fflush(O.out);
    c->in_flight = 0;
    c->done_requests++;
}

/* the response is complete: the request counts as done (even if our upload never finished) */
static int h_end_stream(nghttp3_conn *h, int64_t sid, void *ud, void *sud)
{
    (void)h, (void)sud;
    client_t *c = ud;
    if (sid != c->sid)
        return 0;
    c->complete = 1;
    finish_request(c);
    return 0;
}

static int h_stream_close(nghttp3_conn *h, int64_t sid, uint64_t code, void *ud, void *sud)
{
    (void)h, (void)sud;
    client_t *c = ud;
    if (sid != c->sid)
        return 0;
    if (!c->complete && c->in_flight) {
        fprintf(stderr, "kh-h3get: stream %lld closed with error 0x%llx before the response "
                "completed\n", (long long)sid, (unsigned long long)code);
        c->failed = 1;
    }
    finish_request(c);
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

static nghttp3_ssize read_body(nghttp3_conn *h, int64_t sid, nghttp3_vec *vec, size_t veccnt,
                               uint32_t *flags, void *ud, void *sud)
{
    (void)h, (void)sid, (void)veccnt, (void)sud;
    client_t *c = ud;
    if (O.protocol && (c->status / 100 != 2 || c->body_sent))
        return NGHTTP3_ERR_WOULDBLOCK; /* a tunnel: after its 2xx, and it stays open */
    if (O.declare_length > (long long)O.body_len && c->body_sent)
        return NGHTTP3_ERR_WOULDBLOCK; /* the rest never comes */
    if (O.declare_length <= (long long)O.body_len && !O.protocol)
        *flags |= NGHTTP3_DATA_FLAG_EOF; /* a tunnel's input never ends by itself */
    if (c->body_sent || O.body_len == 0)
        return 0;
    c->body_sent = 1;
    vec[0].base = (uint8_t *)O.body;
    vec[0].len = O.body_len;
    return 1;
}

/* 0 when submitted; 1 when the server's stream limit says wait (MAX_STREAMS comes later) */
static int submit_request(client_t *c)
{
    int r = ngtcp2_conn_open_bidi_stream(c->qc, &c->sid, NULL);
    if (r == NGTCP2_ERR_STREAM_ID_BLOCKED)
        return 1;
    if (r != 0)
        return -1;
    if (O.stall_headers) {
        c->raw_pending = 1; /* write_out sends it on the stream, around nghttp3 */
        c->in_flight = 1;
        return 0;
    }
    nghttp3_nv nv[80];
    size_t k = 0;
#define NV(n, v) (nghttp3_nv){(uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v), 0}
    nv[k++] = NV(":method", O.method);
    nv[k++] = NV(":scheme", "https");
    nv[k++] = NV(":authority", O.authority);
    nv[k++] = NV(":path", O.path);
    if (O.protocol)
        nv[k++] = NV(":protocol", O.protocol);
    static char names[64][128];
    char clen[32];
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
        names[i][nl] = '\0';
        const char *v = colon + 1;
        while (*v == ' ')
            v++;
        nv[k++] = NV(names[i], v);
    }
    if (O.body && !O.protocol) {
        snprintf(clen, sizeof clen, "%lld",
                 O.declare_length ? O.declare_length : (long long)O.body_len);
        nv[k++] = NV("content-length", clen);
    }
    nghttp3_data_reader dr = {read_body};
    c->body_sent = 0;
    c->complete = 0;
    c->status = 0;
    c->in_flight = 1;
    return nghttp3_conn_submit_request(c->h3, c->sid, nv, k, O.body ? &dr : NULL, NULL);
}

static int setup_h3(client_t *c)
{
    nghttp3_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.recv_header = h_recv_header;
    cb.end_headers = h_end_headers;
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
    return submit_request(c) < 0 ? -1 : 0;
}

/* ---- ngtcp2 ---- */

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
        fprintf(stderr, "kh-h3get: %s\n", nghttp3_strerror((int)r));
        return NGTCP2_ERR_CALLBACK_FAILURE;
    }
    ngtcp2_conn_extend_max_stream_offset(qc, sid, (uint64_t)r);
    ngtcp2_conn_extend_max_offset(qc, (uint64_t)r);
    c->last_progress = now_ns();
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
    (void)qc, (void)fs, (void)sud;
    client_t *c = ud;
    if ((O.stall_headers || O.protocol) && sid == c->sid && c->in_flight) {
        fprintf(stderr, "reset 0x%llx\n", (unsigned long long)code);
        c->complete = 1;
        finish_request(c);
    }
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

static ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref)
{
    return ((client_t *)ref->user_data)->qc;
}

static int write_out(client_t *c)
{
    uint8_t buf[1452];
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi;
    uint64_t ts = now_ns();
    if (c->raw_pending) {
        /* HEADERS (type 0x01), length 100, then nothing: a head that never completes */
        static uint8_t partial[] = {0x01, 0x40, 0x64, 0x00};
        ngtcp2_vec v = {partial, sizeof partial};
        ngtcp2_ssize nd = -1;
        ngtcp2_ssize n = ngtcp2_conn_writev_stream(c->qc, &ps.path, &pi, buf, sizeof buf, &nd, 0,
                                                   c->sid, &v, 1, ts);
        if (n > 0 && nd == (ngtcp2_ssize)sizeof partial) {
            c->raw_pending = 0;
            if (send(c->fd, buf, (size_t)n, 0) < 0 && errno != EAGAIN)
                return -1;
        }
    }
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
            fprintf(stderr, "kh-h3get: write: %s\n", ngtcp2_strerror((int)n));
            return -1;
        }
        if (nd >= 0 && c->h3)
            nghttp3_conn_add_write_offset(c->h3, sid, (size_t)nd);
        if (n == 0)
            break;
        if (send(c->fd, buf, (size_t)n, 0) < 0 && errno != EAGAIN)
            return -1;
    }
    ngtcp2_conn_update_pkt_tx_time(c->qc, ts);
    return 0;
}

static int client_open(client_t *c)
{
    memset(c, 0, sizeof *c);
    c->sid = -1;
    struct addrinfo hints = {0}, *ai;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(O.host, O.port, &hints, &ai) != 0) {
        fprintf(stderr, "kh-h3get: cannot resolve %s\n", O.host);
        return -1;
    }
    c->fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        fprintf(stderr, "kh-h3get: connect: %s\n", strerror(errno));
        freeaddrinfo(ai);
        return -1;
    }
    memcpy(&c->remote, ai->ai_addr, ai->ai_addrlen);
    c->remotelen = ai->ai_addrlen;
    freeaddrinfo(ai);
    c->locallen = sizeof c->local;
    getsockname(c->fd, (struct sockaddr *)&c->local, &c->locallen);

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

    ngtcp2_cid dcid, scid;
    dcid.datalen = 18;
    scid.datalen = 18;
    gnutls_rnd(GNUTLS_RND_RANDOM, dcid.data, dcid.datalen);
    gnutls_rnd(GNUTLS_RND_RANDOM, scid.data, scid.datalen);
    ngtcp2_settings st;
    ngtcp2_settings_default(&st);
    st.initial_ts = now_ns();
    ngtcp2_transport_params p;
    ngtcp2_transport_params_default(&p);
    p.initial_max_stream_data_bidi_local = 1 << 20;
    p.initial_max_stream_data_uni = 1 << 20;
    p.initial_max_data = 4 << 20;
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

static void client_close(client_t *c)
{
    if (c->qc && !c->closed) {
        uint8_t buf[1452];
        ngtcp2_path_storage ps;
        ngtcp2_path_storage_zero(&ps);
        ngtcp2_pkt_info pi;
        ngtcp2_connection_close_error e;
        ngtcp2_connection_close_error_default(&e);
        ngtcp2_connection_close_error_set_application_error(&e, NGHTTP3_H3_NO_ERROR, NULL, 0);
        ngtcp2_ssize n = ngtcp2_conn_write_connection_close(c->qc, &ps.path, &pi, buf, sizeof buf,
                                                            &e, now_ns());
        if (n > 0)
            (void)send(c->fd, buf, (size_t)n, 0);
    }
    if (c->h3)
        nghttp3_conn_del(c->h3);
    if (c->qc)
        ngtcp2_conn_del(c->qc);
    if (c->tls)
        gnutls_deinit(c->tls);
    if (c->cred)
        gnutls_certificate_free_credentials(c->cred);
    if (c->fd >= 0)
        close(c->fd);
}

/* One connection, O.repeat requests. 0 when all completed. */
static int run_conn(void)
{
    client_t c;
    if (client_open(&c) != 0)
        return -1;
    int rc = -1;
    c.last_progress = now_ns();
    if (write_out(&c) != 0)
        goto out;
    for (;;) {
        if (c.failed)
            break;
        if (O.leave_after > 0 && c.body_bytes >= O.leave_after) {
            rc = 0;
            break; /* client_close sends CONNECTION_CLOSE */
        }
        if (c.done_requests == O.repeat) {
            if (O.linger > 0 && c.linger_until == 0)
                c.linger_until = now_ns() + (uint64_t)(O.linger * 1e9);
            if (c.linger_until == 0 || now_ns() >= c.linger_until) {
                rc = 0;
                break;
            }
            c.last_progress = now_ns();
        }
        if (c.h3 && !c.in_flight && c.done_requests < O.repeat) {
            if (submit_request(&c) < 0)
                break;
            if (write_out(&c) != 0)
                break;
        }
        uint64_t now = now_ns(), exp = ngtcp2_conn_get_expiry(c.qc);
        if (now - c.last_progress > (uint64_t)(O.timeout * 1e9)) {
            fprintf(stderr, "kh-h3get: timed out\n");
            break;
        }
        int ms = exp <= now ? 0 : (int)((exp - now) / 1000000 + 1);
        if (ms > 100)
            ms = 100;
        struct pollfd pfd = {c.fd, POLLIN, 0};
        int pr = poll(&pfd, 1, ms);
        if (pr > 0) {
            uint8_t buf[65536];
            for (;;) {
                ssize_t n = recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
                if (n < 0)
                    break;
                ngtcp2_path path = {{(struct sockaddr *)&c.local, c.locallen},
                                    {(struct sockaddr *)&c.remote, c.remotelen},
                                    NULL};
                ngtcp2_pkt_info pi = {0};
                int r = ngtcp2_conn_read_pkt(c.qc, &path, &pi, buf, (size_t)n, now_ns());
                if (r != 0) {
                    if (r == NGTCP2_ERR_DRAINING || r == NGTCP2_ERR_CLOSING) {
                        ngtcp2_connection_close_error ce;
                        ngtcp2_conn_get_connection_close_error(c.qc, &ce);
                        fprintf(stderr, "kh-h3get: the server closed the connection (%s 0x%llx)\n",
                                ce.type == NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_APPLICATION
                                    ? "application" : "transport",
                                (unsigned long long)ce.error_code);
                    } else {
                        fprintf(stderr, "kh-h3get: read: %s\n", ngtcp2_strerror(r));
                    }
                    c.closed = 1;
                    goto out_check;
                }
            }
        }
        if (ngtcp2_conn_get_expiry(c.qc) <= now_ns()) {
            int r = ngtcp2_conn_handle_expiry(c.qc, now_ns());
            if (r == NGTCP2_ERR_IDLE_CLOSE) {
                fprintf(stderr, "kh-h3get: idle timeout: the connection is closed\n");
                c.closed = 1;
                goto out_check;
            }
            if (r != 0) {
                fprintf(stderr, "kh-h3get: %s\n", ngtcp2_strerror(r));
                c.closed = 1;
                break;
            }
        }
        if (write_out(&c) != 0)
            break;
    }
    goto out;
out_check:
    rc = c.done_requests == O.repeat && !c.failed ? 0 : -1;
out:
    client_close(&c);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: kh-h3get [-X METHOD] [-H 'Name: value']... [-d DATA|@FILE] [-D FILE] "
            "[-o FILE] [--repeat N] [--connections N] [--timeout S] [-w] https://HOST:PORT/PATH\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *url = NULL, *dump = NULL, *out = NULL;
    O.repeat = O.conns = 1;
    O.timeout = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 < argc && strcmp(a, "-X") == 0)
            O.method = argv[++i];
        else if (i + 1 < argc && strcmp(a, "-H") == 0 && O.nhdrs < 60)
            O.hdrs[O.nhdrs++] = argv[++i];
        else if (i + 1 < argc && strcmp(a, "-d") == 0) {
            const char *d = argv[++i];
            if (d[0] == '@') {
                FILE *f = fopen(d + 1, "rb");
                if (!f) {
                    perror(d + 1);
                    return 2;
                }
                fseek(f, 0, SEEK_END);
                long n = ftell(f);
                fseek(f, 0, SEEK_SET);
                O.body = malloc((size_t)n + 1);
                O.body_len = fread(O.body, 1, (size_t)n, f);
                fclose(f);
            } else {
                O.body = strdup(d);
                O.body_len = strlen(d);
            }
        } else if (i + 1 < argc && strcmp(a, "-D") == 0)
            dump = argv[++i];
        else if (i + 1 < argc && strcmp(a, "-o") == 0)
            out = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--repeat") == 0)
            O.repeat = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--connections") == 0)
            O.conns = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--timeout") == 0)
            O.timeout = atof(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--declare-length") == 0)
            O.declare_length = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--protocol") == 0)
            O.protocol = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--leave-after") == 0)
            O.leave_after = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--linger") == 0)
            O.linger = atof(argv[++i]);
        else if (strcmp(a, "--stall-headers") == 0)
            O.stall_headers = 1;
        else if (strcmp(a, "-w") == 0)
            O.verbose = 1;
        else if (a[0] != '-' && !url)
            url = a;
        else
            usage();
    }
    if (!url || strncmp(url, "https://", 8) != 0 || O.repeat < 1 || O.conns < 1)
        usage();
    if (!O.method)
        O.method = O.protocol ? "CONNECT" : O.body ? "POST" : "GET";
    static char host[300], port[300] = "443", authority[300];
    const char *h = url + 8, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    snprintf(authority, sizeof authority, "%.*s", (int)hl, h);
    O.path = slash ? slash : "/";
    const char *colon = strrchr(authority, ':');
    if (authority[0] == '[') {
        const char *end = strchr(authority, ']');
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
    O.dump = dump ? (strcmp(dump, "-") == 0 ? stdout : fopen(dump, "w")) : NULL;
    O.out = out ? (strcmp(out, "/dev/null") == 0 ? NULL : fopen(out, "wb")) : stdout;
    gnutls_global_init();
    int failed = 0;
    for (int i = 0; i < O.conns; i++)
        if (run_conn() != 0)
            failed++;
    if (O.dump && O.dump != stdout)
        fclose(O.dump);
    if (O.out && O.out != stdout)
        fclose(O.out);
    if (failed)
        fprintf(stderr, "kh-h3get: %d of %d connections failed\n", failed, O.conns);
    return failed ? 1 : 0;
}
