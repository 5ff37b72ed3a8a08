/* kh_h3cli.c: the QUIC + HTTP/3 client code shared by kh_h3get.c and kh_h3load.c (see
 * kh_h3cli.h for the seam). */
#include "kh_h3cli.h"

#include <errno.h>
#include <gnutls/crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t kh_h3cli_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int kh_h3cli_parse_url(const char *url, kh_h3cli_url *u)
{
    static char host[300], port[300] = "443", authority[300];
    if (strncmp(url, "https://", 8) != 0)
        return -1;
    const char *h = url + 8, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    snprintf(authority, sizeof authority, "%.*s", (int)hl, h);
    u->path = slash ? slash : "/";
    const char *colon = strrchr(authority, ':');
    if (authority[0] == '[') {
        const char *end = strchr(authority, ']');
        if (!end)
            return -1;
        snprintf(host, sizeof host, "%.*s", (int)(end - authority - 1), authority + 1);
        if (end[1] == ':')
            snprintf(port, sizeof port, "%s", end + 2);
    } else if (colon) {
        snprintf(host, sizeof host, "%.*s", (int)(colon - authority), authority);
        snprintf(port, sizeof port, "%s", colon + 1);
    } else {
        snprintf(host, sizeof host, "%s", authority);
    }
    u->host = host;
    u->port = port;
    u->authority = authority;
    return 0;
}

int kh_h3cli_socket(kh_h3cli *c, const struct addrinfo *ai, int type_flags, const char *prog)
{
    c->fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC | type_flags, 0);
    if (c->fd < 0 || connect(c->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        fprintf(stderr, "%s: connect: %s\n", prog, strerror(errno));
        return -1;
    }
    memcpy(&c->remote, ai->ai_addr, ai->ai_addrlen);
    c->remotelen = ai->ai_addrlen;
    c->locallen = sizeof c->local;
    getsockname(c->fd, (struct sockaddr *)&c->local, &c->locallen);
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

static int q_acked(ngtcp2_conn *qc, int64_t sid, uint64_t off, uint64_t n, void *ud, void *sud)
{
    (void)qc, (void)off, (void)sud;
    kh_h3cli *c = ud;
    return c->h3 && nghttp3_conn_add_ack_offset(c->h3, sid, n) ? NGTCP2_ERR_CALLBACK_FAILURE : 0;
}

static int q_stream_close(ngtcp2_conn *qc, uint32_t flags, int64_t sid, uint64_t code, void *ud,
                          void *sud)
{
    (void)qc, (void)sud;
    kh_h3cli *c = ud;
    if (!(flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET))
        code = NGHTTP3_H3_NO_ERROR;
    if (c->h3) {
        int r = nghttp3_conn_close_stream(c->h3, sid, code);
        if (r != 0 && r != NGHTTP3_ERR_STREAM_NOT_FOUND)
            return NGTCP2_ERR_CALLBACK_FAILURE;
    }
    return 0;
}

int kh_h3cli_stream_reset(ngtcp2_conn *qc, int64_t sid, uint64_t fs, uint64_t code, void *ud,
                          void *sud)
{
    (void)qc, (void)fs, (void)code, (void)sud;
    kh_h3cli *c = ud;
    if (c->h3)
        nghttp3_conn_shutdown_stream_read(c->h3, sid);
    return 0;
}

static int q_extend_stream_data(ngtcp2_conn *qc, int64_t sid, uint64_t max, void *ud, void *sud)
{
    (void)qc, (void)max, (void)sud;
    kh_h3cli *c = ud;
    if (c->h3)
        nghttp3_conn_unblock_stream(c->h3, sid);
    return 0;
}

static ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref)
{
    return ((kh_h3cli *)ref->user_data)->qc;
}

void kh_h3cli_callbacks(ngtcp2_callbacks *cb)
{
    memset(cb, 0, sizeof *cb);
    cb->client_initial = ngtcp2_crypto_client_initial_cb;
    cb->recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
    cb->encrypt = ngtcp2_crypto_encrypt_cb;
    cb->decrypt = ngtcp2_crypto_decrypt_cb;
    cb->hp_mask = ngtcp2_crypto_hp_mask_cb;
    cb->recv_retry = ngtcp2_crypto_recv_retry_cb;
    cb->update_key = ngtcp2_crypto_update_key_cb;
    cb->delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
    cb->delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
    cb->get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
    cb->version_negotiation = ngtcp2_crypto_version_negotiation_cb;
    cb->rand = rand_cb;
    cb->get_new_connection_id = get_new_cid;
    cb->acked_stream_data_offset = q_acked;
    cb->stream_close = q_stream_close;
    cb->stream_reset = kh_h3cli_stream_reset;
    cb->extend_max_stream_data = q_extend_stream_data;
}

int kh_h3cli_connect(kh_h3cli *c, const ngtcp2_callbacks *cb, int dcid_byte, size_t max_udp,
                     uint64_t max_data, double idle_timeout, void *ud)
{
    ngtcp2_cid dcid, scid;
    dcid.datalen = 18;
    scid.datalen = 18;
    gnutls_rnd(GNUTLS_RND_RANDOM, dcid.data, dcid.datalen);
    gnutls_rnd(GNUTLS_RND_RANDOM, scid.data, scid.datalen);
    if (dcid_byte >= 0)
        dcid.data[0] = (uint8_t)dcid_byte;
    ngtcp2_settings st;
    ngtcp2_settings_default(&st);
    st.initial_ts = kh_h3cli_now_ns();
    if (max_udp)
        st.max_tx_udp_payload_size = max_udp;
    ngtcp2_transport_params p;
    ngtcp2_transport_params_default(&p);
    p.initial_max_stream_data_bidi_local = 1 << 20;
    p.initial_max_stream_data_uni = 1 << 20;
    p.initial_max_data = max_data;
    p.initial_max_streams_uni = 3;
    p.max_idle_timeout = (uint64_t)(idle_timeout * 1e9);
    ngtcp2_path path = {{(struct sockaddr *)&c->local, c->locallen},
                        {(struct sockaddr *)&c->remote, c->remotelen},
                        NULL};
    if (ngtcp2_conn_client_new(&c->qc, &dcid, &scid, &path, NGTCP2_PROTO_VER_V1, cb, &st, &p,
                               NULL, ud) != 0)
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

/* ---- nghttp3 ---- */

static int h_deferred_consume(nghttp3_conn *h, int64_t sid, size_t n, void *ud, void *sud)
{
    (void)h, (void)sud;
    kh_h3cli *c = ud;
    ngtcp2_conn_extend_max_stream_offset(c->qc, sid, n);
    ngtcp2_conn_extend_max_offset(c->qc, n);
    return 0;
}

static int h_stop_sending(nghttp3_conn *h, int64_t sid, uint64_t code, void *ud, void *sud)
{
    (void)h, (void)sud;
    kh_h3cli *c = ud;
    ngtcp2_conn_shutdown_stream_read(c->qc, sid, code);
    return 0;
}

static int h_reset_stream(nghttp3_conn *h, int64_t sid, uint64_t code, void *ud, void *sud)
{
    (void)h, (void)sud;
    kh_h3cli *c = ud;
    ngtcp2_conn_shutdown_stream_write(c->qc, sid, code);
    return 0;
}

void kh_h3cli_h3_callbacks(nghttp3_callbacks *cb)
{
    memset(cb, 0, sizeof *cb);
    cb->deferred_consume = h_deferred_consume;
    cb->stop_sending = h_stop_sending;
    cb->reset_stream = h_reset_stream;
}

int kh_h3cli_setup_h3(kh_h3cli *c, const nghttp3_callbacks *cb, void *ud)
{
    nghttp3_settings st;
    nghttp3_settings_default(&st);
    st.qpack_max_dtable_capacity = 4096;
    st.qpack_blocked_streams = 100;
    if (nghttp3_conn_client_new(&c->h3, cb, &st, nghttp3_mem_default(), ud) != 0)
        return -1;
    int64_t ctrl, enc, dec;
    if (ngtcp2_conn_open_uni_stream(c->qc, &ctrl, NULL) ||
        ngtcp2_conn_open_uni_stream(c->qc, &enc, NULL) ||
        ngtcp2_conn_open_uni_stream(c->qc, &dec, NULL) ||
        nghttp3_conn_bind_control_stream(c->h3, ctrl) ||
        nghttp3_conn_bind_qpack_streams(c->h3, enc, dec))
        return -1;
    return 0;
}

int kh_h3cli_read_stream(kh_h3cli *c, uint32_t flags, int64_t sid, const uint8_t *d, size_t n,
                         const char *prog)
{
    nghttp3_ssize r =
        nghttp3_conn_read_stream(c->h3, sid, d, n, flags & NGTCP2_STREAM_DATA_FLAG_FIN);
    if (r < 0) {
        fprintf(stderr, "%s: %s\n", prog, nghttp3_strerror((int)r));
        return -1;
    }
    ngtcp2_conn_extend_max_stream_offset(c->qc, sid, (uint64_t)r);
    ngtcp2_conn_extend_max_offset(c->qc, (uint64_t)r);
    return 0;
}

/* ---- packets ---- */

int kh_h3cli_write(kh_h3cli *c, int (*send)(kh_h3cli *c, const uint8_t *p, size_t n),
                   const char *prog)
{
    uint8_t buf[KH_H3CLI_MAX_UDP];
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi;
    uint64_t ts = kh_h3cli_now_ns();
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
            if (prog)
                fprintf(stderr, "%s: write: %s\n", prog, ngtcp2_strerror((int)n));
            return -1;
        }
        if (nd >= 0 && c->h3)
            nghttp3_conn_add_write_offset(c->h3, sid, (size_t)nd);
        if (n == 0)
            break;
        if (send(c, buf, (size_t)n) != 0)
            return -1;
    }
    ngtcp2_conn_update_pkt_tx_time(c->qc, ts);
    return 0;
}

ngtcp2_ssize kh_h3cli_close_pkt(kh_h3cli *c, uint8_t *buf)
{
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi;
    ngtcp2_connection_close_error e;
    ngtcp2_connection_close_error_default(&e);
    ngtcp2_connection_close_error_set_application_error(&e, NGHTTP3_H3_NO_ERROR, NULL, 0);
    return ngtcp2_conn_write_connection_close(c->qc, &ps.path, &pi, buf, KH_H3CLI_MAX_UDP, &e,
                                              kh_h3cli_now_ns());
}

void kh_h3cli_free(kh_h3cli *c)
{
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
