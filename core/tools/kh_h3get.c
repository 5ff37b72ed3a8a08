/* kh_h3get.c: a small HTTP/3 client for specs and benchmarks (Debian 12's curl has no HTTP/3 and
 * gtlsclient 0.12 sends no request headers), on ngtcp2 0.12 + GnuTLS + nghttp3 0.8 client APIs;
 * the QUIC/HTTP/3 client set-up, shared callbacks and write loop are kh_h3cli.c's (with
 * kh_h3load.c).
 * Owns:  one UDP socket, one QUIC connection at a time; a poll() loop (no libuv).
 * In:    argv: kh-h3get [options] https://HOST:PORT/PATH
 *          -X METHOD          request method (default GET, POST with -d)
 *          -H 'Name: value'   request header (repeatable); as with curl, 'Name;' sends an empty
 *                             value and 'Name:' sends nothing (it drops the default
 *                             "user-agent: kh-h3get/1", which any -H User-Agent replaces)
 *          -d DATA | -d @FILE request body (--data-binary is the same), with its content-length
 *                             (none with -H 'Transfer-Encoding: chunked': HTTP/1.1
 *                             connection fields are dropped, as curl does on h2)
 *          -F name=value | name=@FILE[;type=T][;filename=F] | name=<FILE
 *                             a multipart/form-data body part, as curl -F (repeatable)
 *          --compressed       ask for "deflate, gzip, zstd" (Accept-Encoding) and decode the
 *                             body (kh_http_decode.c) before writing it, as curl --compressed
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
 *        Closing-period probes (RFC 9000 §10.2), once the connection has closed:
 *          --replay N         send N copies of a datagram for the closed connection (the last
 *                             one we sent when the server closed, our CONNECTION_CLOSE when we
 *                             did) and print "replay: sent N, close K, reset R (stray S)": K
 *                             answers were the server's CONNECTION_CLOSE datagram again, R
 *                             stateless resets
 *          --replay-late MS   then wait MS ms, send one more and print what came back:
 *                             "late: close", "late: reset", "late: none"
 *        Raw HTTP/3 (conformance specs): no request; the bytes go as they are, then wait for the
 *        server's verdict and print it (exit 0 once one came: "the server closed the
 *        connection (application 0xCODE)", "raw: reset stream S 0xCODE", "raw: stop-sending
 *        stream S 0xCODE", or "raw: response stream S N bytes" when it answered):
 *          --raw-uni HEX      open a unidirectional stream with these bytes (repeatable)
 *          --raw-bidi HEX     open a bidirectional stream with these bytes, FIN after them
 *          --no-h3            no HTTP/3 layer of our own (no control or QPACK streams): the
 *                             raw streams are all the server gets
 *          --fork N           run the whole job N times at once, each in a child process
 *                             (with --linger: N idle connections held together, for the
 *                             memory bench); exit 0 when every child succeeded
 *          --first-dcid-byte B the first byte of the first Initial's DCID (khamsin's CID
 *                             router sends it to worker B mod workers)
 *          --rebind-after N   a NAT rebinding: once N bytes of datagrams went out, the rest go
 *                             from a new socket (a new source port), with the same connection
 *                             IDs and nothing said to the server (ngtcp2_conn_set_local_addr);
 *                             the old socket is closed, as a NAT forgets its old mapping.
 *                             Counted in bytes, not time, so that an upload is still going
 *                             when it happens however fast the machine is; prints "rebound
 *                             from port A to port B after N bytes" on stderr
 * Out:   exit 0 when every response arrived complete; 1 otherwise (a message on stderr).
 * Never: verifies the server's certificate (a test tool, like curl -k). */
#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kh_h3cli.h"
#include "kh_http_decode.h"

#define now_ns kh_h3cli_now_ns

typedef struct {
    const char *method, *host, *port, *path, *authority;
    const char *hdrs[64];
    int nhdrs;
    char *body;
    size_t body_len;
    FILE *dump, *out;
    int repeat, conns, verbose, stall_headers, compressed;
    long long leave_after;
    const char *protocol;
    double timeout, linger;
    long long declare_length;
    int replay, replay_late_ms;
    struct { uint8_t b[256]; size_t n; int bidi; } raw[8];
    int nraw, no_h3;
    int dcid_byte, forks;
    long long rebind_after;
} opts_t;

typedef struct {
    kh_h3cli q; /* first: the callbacks' user data is both */
    int64_t sid;
    int done_requests, in_flight, status, failed, closed, body_sent;
    int complete; /* the current response ended */
    int raw_pending;  /* --stall-headers: the partial frame is still to be sent */
    long long body_bytes; /* of the current response, for --leave-after */
    kh_hd *dec;           /* --compressed: the current response's Content-Encoding decoder */
    int dec_failed, dec_fed; /* dec_fed: body bytes came (a HEAD, 204 or 304 has none) */
    uint64_t linger_until;
    uint64_t last_progress;
    uint8_t last_sent[1452], close_pkt[1452];
    size_t last_sent_len, close_pkt_len;
    int64_t raw_sids[8];
    size_t raw_off[8];
    int raw_open; /* --raw-*: the handshake is done, the streams are to be opened */
    int raw_done; /* the server's verdict on the raw streams came */
    long long sent_bytes; /* datagram bytes sent, for --rebind-after */
    int rebound;
} client_t;

static opts_t O;

/* kh_http_decode.c's allocator (kh_common.h; the server's is in kh_err.c) */
void *kh_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p)
        abort();
    return p;
}
static int is_raw(client_t *c, int64_t sid);

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
    } else {
        if (O.compressed && n.len == 16 && memcmp(n.base, "content-encoding", 16) == 0 && !c->dec) {
            int kind = kh_hd_kind_of((const char *)v.base, v.len);
            if (kind > 0)
                c->dec = kh_hd_new(kind, (uint64_t)1 << 32);
        }
        if (O.dump)
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

static void write_body(void *arg, const char *p, size_t n)
{
    (void)arg;
    if (O.out) {
        fwrite(p, 1, n, O.out);
        fflush(O.out); /* a reader of a stream (SSE) sees each piece as it arrives */
    }
}

static int h_recv_data(nghttp3_conn *h, int64_t sid, const uint8_t *d, size_t n, void *ud,
                       void *sud)
{
    (void)h, (void)sud;
    client_t *c = ud;
    if (c->dec) {
        c->dec_fed = 1;
        int r = kh_hd_feed(c->dec, (const char *)d, n, write_body, NULL);
        if (r != 0 && !c->dec_failed) {
            fprintf(stderr, "kh-h3get: --compressed: %s\n", kh_hd_error_reason(r));
            c->dec_failed = 1;
        }
    } else {
        write_body(NULL, (const char *)d, n);
    }
    c->body_bytes += (long long)n;
    ngtcp2_conn_extend_max_stream_offset(c->q.qc, sid, n);
    ngtcp2_conn_extend_max_offset(c->q.qc, n);
    return 0;
}

static void finish_request(client_t *c)
{
    if (!c->in_flight)
        return;
    if (c->dec) {
        int r = c->dec_fed ? kh_hd_finish(c->dec) : 0;
        if (r != 0 && !c->dec_failed)
            fprintf(stderr, "kh-h3get: --compressed: %s\n", kh_hd_error_reason(r));
        if (r != 0 || c->dec_failed)
            c->failed = 1;
        kh_hd_free(c->dec);
        c->dec = NULL;
    }
    c->dec_failed = c->dec_fed = 0;
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

static int conn_field(const char *n, size_t nl)
{
    static const char *const names[] = {"connection", "keep-alive", "proxy-connection",
                                        "transfer-encoding", "upgrade"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == nl && strncasecmp(n, names[i], nl) == 0)
            return 1;
    return 0;
}

/* 0 when submitted; 1 when the server's stream limit says wait (MAX_STREAMS comes later) */
static int submit_request(client_t *c)
{
    int r = ngtcp2_conn_open_bidi_stream(c->q.qc, &c->sid, NULL);
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
    int own_agent = 0, no_length = 0;
    for (int i = 0; i < O.nhdrs; i++)
        own_agent |= strncasecmp(O.hdrs[i], "user-agent", 10) == 0 &&
                     (O.hdrs[i][10] == ':' || O.hdrs[i][10] == ';');
    if (!own_agent)
        nv[k++] = NV("user-agent", "kh-h3get/1");
    for (int i = 0; i < O.nhdrs; i++) {
        const char *colon = strchr(O.hdrs[i], ':');
        size_t hl = strlen(O.hdrs[i]);
        int empty = !colon && hl > 1 && O.hdrs[i][hl - 1] == ';'; /* curl's "Name;" */
        if (!colon && !empty)
            continue;
        if (empty)
            colon = O.hdrs[i] + hl - 1;
        const char *v = empty ? "" : colon + 1;
        while (*v == ' ')
            v++;
        if (!empty && *v == '\0')
            continue; /* curl's "Name:" removes a header; there is none to remove */
        size_t nl = (size_t)(colon - O.hdrs[i]);
        if (conn_field(O.hdrs[i], nl)) {
            /* HTTP/1.1 connection fields have no place in HTTP/3 (RFC 9114 §4.2): dropped, as
             * curl does on h2; Transfer-Encoding: chunked means a body of unknown length */
            if (nl == 17 && strncasecmp(O.hdrs[i], "transfer-encoding", 17) == 0)
                no_length = 1;
            continue;
        }
        if (nl >= sizeof names[i])
            nl = sizeof names[i] - 1;
        for (size_t j = 0; j < nl; j++) {
            char ch = O.hdrs[i][j];
            names[i][j] = (ch >= 'A' && ch <= 'Z') ? (char)(ch | 0x20) : ch;
        }
        names[i][nl] = '\0';
        nv[k++] = NV(names[i], v);
    }
    if (O.compressed)
        nv[k++] = NV("accept-encoding", "deflate, gzip, zstd");
    if (O.body && !O.protocol && !no_length) {
        snprintf(clen, sizeof clen, "%lld",
                 O.declare_length ? O.declare_length : (long long)O.body_len);
        nv[k++] = NV("content-length", clen);
    }
    nghttp3_data_reader dr = {read_body};
    c->body_sent = 0;
    c->complete = 0;
    c->status = 0;
    c->in_flight = 1;
    return nghttp3_conn_submit_request(c->q.h3, c->sid, nv, k, O.body ? &dr : NULL, NULL);
}

static int setup_h3(client_t *c)
{
    nghttp3_callbacks cb;
    kh_h3cli_h3_callbacks(&cb);
    cb.recv_header = h_recv_header;
    cb.end_headers = h_end_headers;
    cb.recv_data = h_recv_data;
    cb.end_stream = h_end_stream;
    cb.stream_close = h_stream_close;
    if (kh_h3cli_setup_h3(&c->q, &cb, c) != 0)
        return -1;
    if (O.nraw)
        return 0; /* --raw-*: no request of our own */
    return submit_request(c) < 0 ? -1 : 0;
}

/* ---- ngtcp2 ---- */

static int q_handshake_completed(ngtcp2_conn *qc, void *ud)
{
    (void)qc;
    client_t *c = ud;
    if (O.nraw) {
        c->raw_open = 1; /* run_conn sends them, outside this callback */
        return O.no_h3 || setup_h3(c) == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
    }
    return setup_h3(c) == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

static int q_stream_stop_sending(ngtcp2_conn *qc, int64_t sid, uint64_t code, void *ud, void *sud)
{
    (void)qc, (void)sud;
    client_t *c = ud;
    if (is_raw(c, sid)) {
        printf("raw: stop-sending stream %lld 0x%llx\n", (long long)sid, (unsigned long long)code);
        fflush(stdout);
        c->raw_done = 1;
    }
    return 0;
}

static int q_recv_stream_data(ngtcp2_conn *qc, uint32_t flags, int64_t sid, uint64_t off,
                              const uint8_t *d, size_t n, void *ud, void *sud)
{
    (void)off, (void)sud;
    client_t *c = ud;
    if (is_raw(c, sid)) {
        if (n) {
            printf("raw: response stream %lld %zu bytes\n", (long long)sid, n);
            fflush(stdout);
            c->raw_done = 1;
        }
        ngtcp2_conn_extend_max_stream_offset(qc, sid, n);
        ngtcp2_conn_extend_max_offset(qc, n);
        return 0;
    }
    if (!c->q.h3)
        return 0;
    if (kh_h3cli_read_stream(&c->q, flags, sid, d, n, "kh-h3get") != 0)
        return NGTCP2_ERR_CALLBACK_FAILURE;
    c->last_progress = now_ns();
    return 0;
}

static int q_stream_reset(ngtcp2_conn *qc, int64_t sid, uint64_t fs, uint64_t code, void *ud,
                          void *sud)
{
    (void)qc, (void)fs, (void)sud;
    client_t *c = ud;
    if (is_raw(c, sid)) {
        printf("raw: reset stream %lld 0x%llx\n", (long long)sid, (unsigned long long)code);
        fflush(stdout);
        c->raw_done = 1;
        return 0;
    }
    if ((O.stall_headers || O.protocol) && sid == c->sid && c->in_flight) {
        fprintf(stderr, "reset 0x%llx\n", (unsigned long long)code);
        c->complete = 1;
        finish_request(c);
    }
    return kh_h3cli_stream_reset(qc, sid, fs, code, ud, sud);
}

static int send_pkt(client_t *c, const uint8_t *p, size_t n)
{
    if (n <= sizeof c->last_sent) {
        memcpy(c->last_sent, p, n);
        c->last_sent_len = n;
    }
    c->sent_bytes += (long long)n;
    return send(c->q.fd, p, n, 0) < 0 && errno != EAGAIN ? -1 : 0;
}

static int send_q(kh_h3cli *q, const uint8_t *p, size_t n)
{
    return send_pkt((client_t *)q, p, n);
}

static int is_raw(client_t *c, int64_t sid)
{
    for (int i = 0; i < O.nraw; i++)
        if (c->raw_sids[i] == sid)
            return 1;
    return 0;
}

/* --raw-uni / --raw-bidi: open the streams; write_out sends their bytes */
static int open_raw(client_t *c)
{
    for (int i = 0; i < O.nraw; i++) {
        int64_t sid;
        int r = O.raw[i].bidi ? ngtcp2_conn_open_bidi_stream(c->q.qc, &sid, NULL)
                              : ngtcp2_conn_open_uni_stream(c->q.qc, &sid, NULL);
        if (r != 0) {
            fprintf(stderr, "kh-h3get: open stream: %s\n", ngtcp2_strerror(r));
            return -1;
        }
        c->raw_sids[i] = sid;
    }
    return 0;
}

static int port_of(const struct sockaddr_storage *ss)
{
    return ntohs(ss->ss_family == AF_INET ? ((const struct sockaddr_in *)ss)->sin_port
                                          : ((const struct sockaddr_in6 *)ss)->sin6_port);
}

/* --rebind-after: the same connection from a new socket (a new source port), unannounced */
static int rebind(client_t *c)
{
    int old = c->q.fd, oldport = port_of(&c->q.local);
    int fd = socket(c->q.remote.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&c->q.remote, c->q.remotelen) != 0) {
        fprintf(stderr, "kh-h3get: rebind: %s\n", strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    c->q.locallen = sizeof c->q.local;
    getsockname(fd, (struct sockaddr *)&c->q.local, &c->q.locallen);
    int newport = port_of(&c->q.local);
    c->q.fd = fd;
    close(old);
    ngtcp2_addr a;
    ngtcp2_addr_init(&a, (struct sockaddr *)&c->q.local, c->q.locallen);
    ngtcp2_conn_set_local_addr(c->q.qc, &a);
    c->rebound = 1;
    fprintf(stderr, "rebound from port %d to port %d after %lld bytes\n", oldport, newport,
            c->sent_bytes);
    return 0;
}

/* the raw streams' bytes not yet taken by ngtcp2 (it keeps them until acknowledged) */
static int write_raw(client_t *c)
{
    uint8_t buf[1452];
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi;
    for (int i = 0; i < O.nraw; i++) {
        while (c->raw_sids[i] >= 0 && c->raw_off[i] < O.raw[i].n) {
            ngtcp2_vec v = {O.raw[i].b + c->raw_off[i], O.raw[i].n - c->raw_off[i]};
            ngtcp2_ssize nd = -1;
            ngtcp2_ssize n = ngtcp2_conn_writev_stream(
                c->q.qc, &ps.path, &pi, buf, sizeof buf, &nd,
                O.raw[i].bidi ? NGTCP2_WRITE_STREAM_FLAG_FIN : 0, c->raw_sids[i], &v, 1, now_ns());
            if (n < 0) {
                fprintf(stderr, "kh-h3get: raw stream: %s\n", ngtcp2_strerror((int)n));
                return -1;
            }
            if (nd > 0)
                c->raw_off[i] += (size_t)nd;
            if (n == 0)
                return 0; /* blocked: later */
            if (send_pkt(c, buf, (size_t)n) != 0)
                return -1;
        }
    }
    return 0;
}

static int write_out(client_t *c)
{
    if (O.nraw && write_raw(c) != 0)
        return -1;
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
        ngtcp2_ssize n = ngtcp2_conn_writev_stream(c->q.qc, &ps.path, &pi, buf, sizeof buf, &nd, 0,
                                                   c->sid, &v, 1, ts);
        if (n > 0 && nd == (ngtcp2_ssize)sizeof partial) {
            c->raw_pending = 0;
            if (send_pkt(c, buf, (size_t)n) != 0)
                return -1;
        }
    }
    return kh_h3cli_write(&c->q, send_q, "kh-h3get");
}

static int client_open(client_t *c)
{
    memset(c, 0, sizeof *c);
    c->sid = -1;
    for (int i = 0; i < 8; i++)
        c->raw_sids[i] = -1;
    struct addrinfo hints = {0}, *ai;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(O.host, O.port, &hints, &ai) != 0) {
        fprintf(stderr, "kh-h3get: cannot resolve %s\n", O.host);
        return -1;
    }
    int r = kh_h3cli_socket(&c->q, ai, 0, "kh-h3get");
    freeaddrinfo(ai);
    if (r != 0)
        return -1;

    ngtcp2_callbacks cb;
    kh_h3cli_callbacks(&cb);
    cb.handshake_completed = q_handshake_completed;
    cb.recv_stream_data = q_recv_stream_data;
    cb.stream_reset = q_stream_reset;
    cb.stream_stop_sending = q_stream_stop_sending;
    return kh_h3cli_connect(&c->q, &cb, O.dcid_byte, 0, 4 << 20, O.timeout, c);
}

/* Waits up to ms for a datagram; returns its length (0: none). */
static size_t recv_wait(int fd, uint8_t *buf, size_t len, int ms)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, ms) <= 0)
        return 0;
    ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
    return n > 0 ? (size_t)n : 0;
}

static ngtcp2_cid_token reset_tokens[8];
static size_t nreset_tokens;

/* A reply to a replayed datagram: the server's CONNECTION_CLOSE again, a stateless reset (a
 * short header ending in the token the server gave for one of our DCIDs), or a stray packet
 * the server had sent before it saw the close */
static const char *reply_kind(client_t *c, const uint8_t *b, size_t k)
{
    if (k == c->close_pkt_len && memcmp(b, c->close_pkt, k) == 0)
        return "close";
    for (size_t i = 0; !(b[0] & 0x80) && k >= 21 && i < nreset_tokens; i++)
        if (reset_tokens[i].token_present &&
            memcmp(b + k - NGTCP2_STATELESS_RESET_TOKENLEN, reset_tokens[i].token,
                   NGTCP2_STATELESS_RESET_TOKENLEN) == 0)
            return "reset";
    return "stray";
}

/* --replay / --replay-late: what the server answers, in its closing or draining period and
 * after, to a datagram for the closed connection (padded to 300 bytes: the server looks at the
 * DCID only) */
static void replay(client_t *c, const uint8_t *pkt, size_t n)
{
    uint8_t buf[2048], out[300] = {0};
    memcpy(out, pkt, n < sizeof out ? n : sizeof out);
    int closes = 0, resets = 0, strays = 0;
    nreset_tokens = 0;
    if (ngtcp2_conn_get_num_active_dcid(c->q.qc) <= 8)
        nreset_tokens = ngtcp2_conn_get_active_dcid(c->q.qc, reset_tokens);
    for (int i = 0; i < O.replay; i++) {
        (void)send(c->q.fd, out, sizeof out, 0);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    for (size_t k; (k = recv_wait(c->q.fd, buf, sizeof buf, 300)) > 0;) {
        const char *kind = reply_kind(c, buf, k);
        if (kind[0] == 'c')
            closes++;
        else if (kind[0] == 'r')
            resets++;
        else
            strays++;
    }
    printf("replay: sent %d, close %d, reset %d (stray %d)\n", O.replay, closes, resets, strays);
    if (O.replay_late_ms > 0) {
        struct timespec ts = {O.replay_late_ms / 1000, (long)(O.replay_late_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
        while (recv_wait(c->q.fd, buf, sizeof buf, 0) > 0) {
        }
        (void)send(c->q.fd, out, sizeof out, 0);
        size_t k = recv_wait(c->q.fd, buf, sizeof buf, 500);
        printf("late: %s\n", k == 0 ? "none" : reply_kind(c, buf, k));
    }
    fflush(stdout);
}

static void client_close(client_t *c)
{
    if (c->q.qc && c->closed && O.replay > 0 && c->last_sent_len)
        replay(c, c->last_sent, c->last_sent_len); /* the server closed */
    if (c->q.qc && !c->closed) {
        uint8_t buf[KH_H3CLI_MAX_UDP];
        ngtcp2_ssize n = kh_h3cli_close_pkt(&c->q, buf);
        if (n > 0) {
            (void)send(c->q.fd, buf, (size_t)n, 0);
            if (O.replay > 0) { /* we closed: the server drains */
                memcpy(c->close_pkt, buf, (size_t)n);
                c->close_pkt_len = (size_t)n;
                replay(c, buf, (size_t)n);
            }
        }
    }
    if (c->dec)
        kh_hd_free(c->dec);
    kh_h3cli_free(&c->q);
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
        if (c.raw_open) {
            c.raw_open = 0;
            if (open_raw(&c) != 0 || write_out(&c) != 0)
                break;
        }
        if (O.nraw && c.raw_done) {
            rc = 0;
            break;
        }
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
        if (O.rebind_after > 0 && !c.rebound && c.sent_bytes >= O.rebind_after &&
            rebind(&c) != 0)
            break;
        if (c.q.h3 && !O.nraw && !c.in_flight && c.done_requests < O.repeat) {
            if (submit_request(&c) < 0)
                break;
            if (write_out(&c) != 0)
                break;
        }
        uint64_t now = now_ns(), exp = ngtcp2_conn_get_expiry(c.q.qc);
        if (now - c.last_progress > (uint64_t)(O.timeout * 1e9)) {
            fprintf(stderr, "kh-h3get: timed out\n");
            break;
        }
        int ms = exp <= now ? 0 : (int)((exp - now) / 1000000 + 1);
        if (ms > 100)
            ms = 100;
        struct pollfd pfd = {c.q.fd, POLLIN, 0};
        int pr = poll(&pfd, 1, ms);
        if (pr > 0) {
            uint8_t buf[65536];
            for (;;) {
                ssize_t n = recv(c.q.fd, buf, sizeof buf, MSG_DONTWAIT);
                if (n < 0)
                    break;
                ngtcp2_path path = {{(struct sockaddr *)&c.q.local, c.q.locallen},
                                    {(struct sockaddr *)&c.q.remote, c.q.remotelen},
                                    NULL};
                ngtcp2_pkt_info pi = {0};
                int r = ngtcp2_conn_read_pkt(c.q.qc, &path, &pi, buf, (size_t)n, now_ns());
                if (r != 0) {
                    if (r == NGTCP2_ERR_DRAINING && (size_t)n <= sizeof c.close_pkt) {
                        memcpy(c.close_pkt, buf, (size_t)n); /* for --replay */
                        c.close_pkt_len = (size_t)n;
                    }
                    if (r == NGTCP2_ERR_DRAINING || r == NGTCP2_ERR_CLOSING) {
                        ngtcp2_connection_close_error ce;
                        ngtcp2_conn_get_connection_close_error(c.q.qc, &ce);
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
        if (ngtcp2_conn_get_expiry(c.q.qc) <= now_ns()) {
            int r = ngtcp2_conn_handle_expiry(c.q.qc, now_ns());
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
    rc = (O.nraw || c.done_requests == O.repeat) && !c.failed ? 0 : -1;
out:
    client_close(&c);
    return rc;
}

/* the whole of a file, malloc'd (NULL with a message when it cannot be read) */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)(n > 0 ? n : 0) + 1);
    *len = p ? fread(p, 1, (size_t)(n > 0 ? n : 0), f) : 0;
    fclose(f);
    return p;
}

/* -F: the multipart body, built as the arguments come */
static struct {
    char *p;
    size_t len, cap;
} form;
static char form_bnd_line[64]; /* "--" boundary CRLF */

static void form_add(const void *p, size_t n)
{
    if (form.len + n > form.cap) {
        form.cap = (form.len + n) * 2 + 256;
        form.p = realloc(form.p, form.cap);
        if (!form.p)
            abort();
    }
    memcpy(form.p + form.len, p, n);
    form.len += n;
}

static void form_adds(const char *s)
{
    form_add(s, strlen(s));
}

/* curl -F: name=value, name=@FILE[;type=T][;filename=F] (a file part), name=<FILE (a field
 * whose value is the file's content). 0, or -1 with a message. */
static int form_part(const char *arg)
{
    if (!form_bnd_line[0]) {
        uint8_t r[8];
        gnutls_rnd(GNUTLS_RND_NONCE, r, sizeof r);
        snprintf(form_bnd_line, sizeof form_bnd_line,
                 "------------------------%02x%02x%02x%02x%02x%02x%02x%02x\r\n", r[0], r[1], r[2],
                 r[3], r[4], r[5], r[6], r[7]);
    }
    const char *eq = strchr(arg, '=');
    if (!eq) {
        fprintf(stderr, "kh-h3get: -F %s: no '='\n", arg);
        return -1;
    }
    form_adds(form_bnd_line);
    form_adds("Content-Disposition: form-data; name=\"");
    form_add(arg, (size_t)(eq - arg));
    form_adds("\"");
    const char *v = eq + 1;
    if (*v != '@' && *v != '<') {
        form_adds("\r\n\r\n");
        form_adds(v);
        form_adds("\r\n");
        return 0;
    }
    /* FILE[;type=T][;filename=F] */
    char path[1024], type[256] = "application/octet-stream", fname[1024] = "";
    const char *semi = strchr(v + 1, ';');
    size_t pl = semi ? (size_t)(semi - v - 1) : strlen(v + 1);
    snprintf(path, sizeof path, "%.*s", (int)pl, v + 1);
    const char *base = strrchr(path, '/');
    snprintf(fname, sizeof fname, "%s", base ? base + 1 : path);
    while (semi) {
        const char *opt = semi + 1, *next = strchr(opt, ';');
        size_t ol = next ? (size_t)(next - opt) : strlen(opt);
        if (ol > 5 && strncmp(opt, "type=", 5) == 0)
            snprintf(type, sizeof type, "%.*s", (int)(ol - 5), opt + 5);
        else if (ol > 9 && strncmp(opt, "filename=", 9) == 0)
            snprintf(fname, sizeof fname, "%.*s", (int)(ol - 9), opt + 9);
        semi = next;
    }
    size_t n;
    char *data = slurp(path, &n);
    if (!data)
        return -1;
    if (*v == '@') {
        form_adds("; filename=\"");
        form_adds(fname);
        form_adds("\"\r\nContent-Type: ");
        form_adds(type);
    }
    form_adds("\r\n\r\n");
    form_add(data, n);
    form_adds("\r\n");
    free(data);
    return 0;
}

/* "00 04 00" or "000400" */
static int unhex(const char *h, uint8_t *out, size_t cap, size_t *n)
{
    *n = 0;
    for (;;) {
        while (*h == ' ')
            h++;
        if (!*h)
            return 0;
        unsigned v;
        if (*n == cap || sscanf(h, "%2x", &v) != 1 || !h[1] || h[1] == ' ')
            return -1;
        out[(*n)++] = (uint8_t)v;
        h += 2;
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: kh-h3get [-X METHOD] [-H 'Name: value']... [-d DATA|@FILE] [-D FILE] "
            "[-F name=value]... [--compressed] [-o FILE] [--repeat N] [--connections N] [--timeout S] [-w] https://HOST:PORT/PATH\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *url = NULL, *dump = NULL, *out = NULL;
    O.repeat = O.conns = 1;
    O.dcid_byte = -1;
    O.timeout = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 < argc && strcmp(a, "-X") == 0)
            O.method = argv[++i];
        else if (i + 1 < argc && strcmp(a, "-H") == 0 && O.nhdrs < 60)
            O.hdrs[O.nhdrs++] = argv[++i];
        else if (i + 1 < argc && (strcmp(a, "-d") == 0 || strcmp(a, "--data-binary") == 0)) {
            const char *d = argv[++i];
            if (d[0] == '@') {
                if (!(O.body = slurp(d + 1, &O.body_len)))
                    return 2;
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
        else if (i + 1 < argc && strcmp(a, "-F") == 0) {
            if (form_part(argv[++i]) != 0)
                return 2;
        } else if (strcmp(a, "--compressed") == 0)
            O.compressed = 1;
        else if (i + 1 < argc && strcmp(a, "--replay") == 0)
            O.replay = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--replay-late") == 0)
            O.replay_late_ms = atoi(argv[++i]);
        else if (i + 1 < argc && O.nraw < 8 &&
                 (strcmp(a, "--raw-uni") == 0 || strcmp(a, "--raw-bidi") == 0)) {
            O.raw[O.nraw].bidi = strcmp(a, "--raw-bidi") == 0;
            if (unhex(argv[++i], O.raw[O.nraw].b, sizeof O.raw[O.nraw].b, &O.raw[O.nraw].n) != 0)
                usage();
            O.nraw++;
        } else if (i + 1 < argc && strcmp(a, "--first-dcid-byte") == 0)
            O.dcid_byte = atoi(argv[++i]) & 0xff;
        else if (i + 1 < argc && strcmp(a, "--rebind-after") == 0)
            O.rebind_after = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--fork") == 0)
            O.forks = atoi(argv[++i]);
        else if (strcmp(a, "--no-h3") == 0)
            O.no_h3 = 1;
        else if (strcmp(a, "-w") == 0)
            O.verbose = 1;
        else if (a[0] != '-' && !url)
            url = a;
        else
            usage();
    }
    kh_h3cli_url u;
    if (!url || kh_h3cli_parse_url(url, &u) != 0 || O.repeat < 1 || O.conns < 1)
        usage();
    if (form.len) { /* -F: the close delimiter, and the body's Content-Type */
        static char ctype[128];
        if (O.body) {
            fprintf(stderr, "kh-h3get: -F and -d cannot be used together\n");
            return 2;
        }
        form_add(form_bnd_line, strlen(form_bnd_line) - 2);
        form_add("--\r\n", 4);
        O.body = form.p;
        O.body_len = form.len;
        snprintf(ctype, sizeof ctype, "content-type: multipart/form-data; boundary=%s", form_bnd_line + 2);
        ctype[strlen(ctype) - 2] = '\0';
        if (O.nhdrs < 60)
            O.hdrs[O.nhdrs++] = ctype;
    }
    if (!O.method)
        O.method = O.protocol ? "CONNECT" : O.body ? "POST" : "GET";
    O.host = u.host;
    O.port = u.port;
    O.authority = u.authority;
    O.path = u.path;
    O.dump = dump ? (strcmp(dump, "-") == 0 ? stdout : fopen(dump, "w")) : NULL;
    O.out = out ? (strcmp(out, "/dev/null") == 0 ? NULL : fopen(out, "wb")) : stdout;
    int failed = 0;
    if (O.forks > 1) { /* --fork: the children do the job, the parent counts */
        fflush(NULL);
        for (int i = 0; i < O.forks; i++) {
            pid_t pid = fork();
            if (pid == 0) {
                O.forks = 0;
                break;
            }
            if (pid < 0) {
                perror("kh-h3get: fork");
                failed++;
            }
        }
        if (O.forks > 1) {
            int st;
            while (wait(&st) > 0)
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                    failed++;
            if (failed)
                fprintf(stderr, "kh-h3get: %d of %d processes failed\n", failed, O.forks);
            return failed ? 1 : 0;
        }
    }
    gnutls_global_init();
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
