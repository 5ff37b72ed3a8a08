/* kh_h3load.c: an HTTP/3 load generator for benchmarks and specs (Debian 12's h2load has no
 * HTTP/3), on the ngtcp2 0.12 + GnuTLS + nghttp3 0.8 client APIs; the client set-up, shared
 * callbacks and write loop are kh_h3cli.c's (with kh_h3get.c).
 * Owns:  C QUIC connections, each on a connected UDP socket of its own, with up to M requests in
 *        flight on each; one thread, one epoll loop (no libuv).
 * In:    argv: kh-h3load [options] https://HOST:PORT/PATH
 *          -c N        connections (default 1)
 *          -m N        requests in flight per connection (default 1)
 *          -n N        requests in all (default 100)
 *          -d S        send requests for S seconds instead of -n (those in flight then finish)
 *          -H 'N: v'   request header (repeatable)
 *          -t S        give up after S seconds without progress (default 10)
 *          --hold S    once every request is answered keep the connections open, idle, for S
 *                      seconds (printing "held: N connections idle" when they all are, then
 *                      "released"; SIGUSR1 releases them at once), then close them: the
 *                      server's memory per idle h3 connection (bench/h3mem.sh,
 *                      spec/h3_idle_mem_spec.lua)
 *          --ramp R    at most R connections in their handshake at once (default: all)
 * Out:   on stdout: requests done, ok and failed (a status other than 200, a reset stream, or a
 *        request lost with its connection or to the timeout all count as failed), requests per
 *        second, and latency percentiles (from submitting a request to the end of its
 *        response). Exit 0 when every request got a 200 (and, with -n, N completed); 1 otherwise.
 * Never: verifies the server's certificate (a test tool, like curl -k); reads response bodies
 *        beyond counting them. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kh_h3cli.h"

#define now_ns kh_h3cli_now_ns

typedef struct {
    const char *host, *port, *path, *authority;
    const char *hdrs[64];
    int nhdrs;
    int conns, streams;
    long long total;    /* -n */
    double duration;    /* -d (0: use -n) */
    double timeout;
    double hold;        /* --hold: keep each connection open idle this long once all is done */
    int ramp;           /* --ramp: at most this many connections in their handshake at once */
} opts_t;

typedef struct req {
    uint64_t t0;
    int status;
    int done;
    struct req *prev, *next; /* the connection's list; next: the free list */
} req_t;

typedef struct client {
    kh_h3cli q;    /* first: the callbacks' user data is both */
    int ready;     /* HTTP/3 is set up */
    int blocked;   /* the server's stream limit: wait for MAX_STREAMS */
    int dead;
    int dying;     /* being freed: nghttp3's callbacks change nothing */
    int in_flight;
    int issued;    /* requests submitted on this connection */
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
static volatile sig_atomic_t release_now; /* --hold: SIGUSR1 came */

static void on_usr1(int sig)
{
    (void)sig;
    release_now = 1;
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
    ngtcp2_conn_extend_max_stream_offset(c->q.qc, sid, n);
    ngtcp2_conn_extend_max_offset(c->q.qc, n);
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

/* 0 submitted, 1 the server's stream limit says wait, -1 error */
static int submit_request(client_t *c)
{
    int64_t sid;
    int rv = ngtcp2_conn_open_bidi_stream(c->q.qc, &sid, NULL);
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
    if (nghttp3_conn_submit_request(c->q.h3, sid, nv, k, NULL, r) != 0) {
        req_free(r);
        return -1;
    }
    c->in_flight++;
    c->issued++;
    S.issued++;
    return 0;
}

static int setup_h3(client_t *c)
{
    nghttp3_callbacks cb;
    kh_h3cli_h3_callbacks(&cb);
    cb.recv_header = h_recv_header;
    cb.recv_data = h_recv_data;
    cb.end_stream = h_end_stream;
    cb.stream_close = h_stream_close;
    if (kh_h3cli_setup_h3(&c->q, &cb, c) != 0)
        return -1;
    c->ready = 1;
    return 0;
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
    (void)qc, (void)off, (void)sud;
    client_t *c = ud;
    if (!c->q.h3)
        return 0;
    return kh_h3cli_read_stream(&c->q, flags, sid, d, n, "kh-h3load") == 0
               ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

static int q_extend_bidi(ngtcp2_conn *qc, uint64_t max, void *ud)
{
    (void)qc, (void)max;
    ((client_t *)ud)->blocked = 0;
    return 0;
}

/* Requests still without a response count as failed (lost with the connection). */
static void client_free(client_t *c)
{
    c->dying = 1;
    while (c->reqs.next != &c->reqs) {
        req_t *r = c->reqs.next;
        if (!r->done) {
            S.lost++;
            S.failed++;
            S.done++;
        }
        req_free(r);
    }
    kh_h3cli_free(&c->q);
    int idx = c->idx;
    memset(c, 0, sizeof *c);
    c->q.fd = -1;
    c->idx = idx;
    c->dead = 1;
}

static int client_open(client_t *c)
{
    int idx = c->idx;
    memset(c, 0, sizeof *c);
    c->idx = idx;
    c->reqs.prev = c->reqs.next = &c->reqs;
    if (kh_h3cli_socket(&c->q, target, SOCK_NONBLOCK, "kh-h3load") != 0)
        return -1;
    int rcvbuf = 4 << 20;
    setsockopt(c->q.fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_ADD, c->q.fd, &ev);

    ngtcp2_callbacks cb;
    kh_h3cli_callbacks(&cb);
    cb.handshake_completed = q_handshake_completed;
    cb.recv_stream_data = q_recv_stream_data;
    cb.extend_max_local_streams_bidi = q_extend_bidi;
    return kh_h3cli_connect(&c->q, &cb, -1, KH_H3CLI_MAX_UDP, 16 << 20,
                            O.hold > 0 ? O.timeout + O.hold + 10 : O.timeout, c);
}

/* The connection failed: its requests in flight count as failed (lost). */
static void client_fail(client_t *c, const char *why)
{
    fprintf(stderr, "kh-h3load: connection %d: %s\n", c->idx, why);
    client_free(c);
}

static int send_pkt(kh_h3cli *q, const uint8_t *p, size_t n)
{
    return send(q->fd, p, n, 0) < 0 && errno != EAGAIN && errno != ECONNREFUSED ? -1 : 0;
}

static int write_out(client_t *c)
{
    return kh_h3cli_write(&c->q, send_pkt, NULL);
}

static void read_in(client_t *c)
{
    uint8_t buf[65536];
    for (;;) {
        ssize_t n = recv(c->q.fd, buf, sizeof buf, 0);
        if (n < 0) {
            if (errno == ECONNREFUSED) {
                client_fail(c, "connection refused");
                return;
            }
            break;
        }
        ngtcp2_path path = {{(struct sockaddr *)&c->q.local, c->q.locallen},
                            {(struct sockaddr *)&c->q.remote, c->q.remotelen},
                            NULL};
        ngtcp2_pkt_info pi = {0};
        int r = ngtcp2_conn_read_pkt(c->q.qc, &path, &pi, buf, (size_t)n, now_ns());
        if (r != 0) {
            char why[128];
            if (r == NGTCP2_ERR_DRAINING || r == NGTCP2_ERR_CLOSING) {
                ngtcp2_connection_close_error ce;
                ngtcp2_conn_get_connection_close_error(c->q.qc, &ce);
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
    uint8_t buf[KH_H3CLI_MAX_UDP];
    ngtcp2_ssize n = kh_h3cli_close_pkt(&c->q, buf);
    if (n > 0)
        (void)send(c->q.fd, buf, (size_t)n, 0);
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
            "[-H 'Name: value']... [-t TIMEOUT] [--hold S] [--ramp R] https://HOST:PORT/PATH\n");
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
        else if (i + 1 < argc && strcmp(a, "--hold") == 0)
            O.hold = atof(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--ramp") == 0)
            O.ramp = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "-H") == 0 && O.nhdrs < 60)
            O.hdrs[O.nhdrs++] = argv[++i];
        else if (a[0] != '-' && !url)
            url = a;
        else
            usage();
    }
    kh_h3cli_url u;
    if (!url || kh_h3cli_parse_url(url, &u) != 0 || O.conns < 1 || O.streams < 1 ||
        O.total < 1 || O.timeout <= 0 || O.hold < 0 || O.ramp < 0)
        usage();
    O.host = u.host;
    O.port = u.port;
    O.authority = u.authority;
    O.path = u.path;
    struct addrinfo hints = {0};
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(O.host, O.port, &hints, &target) != 0) {
        fprintf(stderr, "kh-h3load: cannot resolve %s\n", O.host);
        return 2;
    }
    gnutls_global_init();
    if (O.hold > 0) {
        struct sigaction sa = {0};
        sa.sa_handler = on_usr1; /* no SA_RESTART: epoll_wait returns (EINTR) */
        sigaction(SIGUSR1, &sa, NULL);
    }
    epfd = epoll_create1(EPOLL_CLOEXEC);
    client_t *cs = calloc((size_t)O.conns, sizeof *cs);
    if (!cs)
        return 2;
    S.t_start = S.t_last = S.last_progress = now_ns();
    S.send_until = S.t_start + (uint64_t)(O.duration * 1e9);
    int opened = 0; /* cs[0..opened) have been opened (--ramp opens the rest as handshakes end) */
    for (int i = 0; i < O.conns; i++)
        cs[i].idx = i;
    int timed_out = 0;
    uint64_t held_until = 0; /* --hold: every connection idle, kept open until then */
    struct epoll_event evs[256];
    for (;;) {
        /* issue, write, and find the next deadline */
        uint64_t now = now_ns(), next = now + 100000000u;
        int active = 0, handshaking = 0;
        for (int i = 0; i < opened; i++)
            handshaking += !cs[i].dead && !cs[i].ready;
        while (opened < O.conns && (O.ramp == 0 || handshaking < O.ramp)) {
            if (client_open(&cs[opened++]) != 0)
                return 2;
            handshaking++;
        }
        if (O.hold > 0 && held_until == 0 && opened == O.conns && !more_to_issue() &&
            S.done == S.issued) {
            int idle = 0;
            for (int i = 0; i < O.conns; i++)
                idle += !cs[i].dead && cs[i].ready && cs[i].in_flight == 0;
            printf("held: %d connections idle\n", idle);
            fflush(stdout);
            held_until = now + (uint64_t)(O.hold * 1e9);
        }
        if (held_until && (now >= held_until || release_now)) {
            printf("released\n");
            fflush(stdout);
            for (int i = 0; i < O.conns; i++)
                if (!cs[i].dead)
                    close_gracefully(&cs[i]);
            break;
        }
        for (int i = 0; i < opened; i++) {
            client_t *c = &cs[i];
            if (c->dead) {
                if (!more_to_issue())
                    continue;
                if (client_open(c) != 0) /* reconnect: there is work left */
                    return 2;
            }
            if (c->ready) {
                /* --hold: the requests spread evenly, so that each connection made one */
                while (!c->blocked && c->in_flight < O.streams && more_to_issue() &&
                       (O.hold == 0 || c->issued < (O.total + O.conns - 1) / O.conns)) {
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
            if (c->in_flight == 0 && c->ready && !more_to_issue() && O.hold == 0) {
                close_gracefully(c);
                continue;
            }
            active++;
            if (write_out(c) != 0) {
                client_fail(c, "write failed");
                continue;
            }
            uint64_t exp = ngtcp2_conn_get_expiry(c->q.qc);
            if (exp < next)
                next = exp;
        }
        if (active == 0)
            break;
        now = now_ns();
        if (held_until == 0 && now - S.last_progress > (uint64_t)(O.timeout * 1e9)) {
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
        for (int i = 0; i < opened; i++) {
            client_t *c = &cs[i];
            if (c->dead || ngtcp2_conn_get_expiry(c->q.qc) > now)
                continue;
            int r = ngtcp2_conn_handle_expiry(c->q.qc, now);
            if (r != 0)
                client_fail(c, r == NGTCP2_ERR_IDLE_CLOSE ? "idle timeout" : ngtcp2_strerror(r));
        }
    }
    for (int i = 0; i < opened; i++)
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
