/* kh_quic.c: QUIC on ngtcp2 0.12 inside khamsin-h3.so: each worker's UDP sockets, its CID
 * table and its QUIC connections (with kh_quic_crypto.c, the only files that know the 0.12
 * API; kh_h3.c speaks to this file through kh_quic.h).
 * Owns:  per worker an endpoint (w->quic): one uv_udp_t per TLS listener on the fd main bound
 *        (cfg->listens[i].udp_fds[w->id]), a receive buffer of h3_recv_batch x 64 KiB (recvmmsg
 *        batches; the answers leave at the flush pass after the whole batch), a 57 KiB send
 *        buffer, the CID table; per connection the ngtcp2_conn, its TLS session (until the
 *        handshake is complete: drop_tls), its kh_h3, a kh_dtimer and its CIDs.
 * Memory: ngtcp2 and nghttp3 allocate through kh_quic_malloc & co., which mmap malloc'd blocks
 *        of 6 KiB and more (the libraries' per-connection pools), so untouched pool pages are
 *        free, and keep calloc'd objects (ngtcp2_conn) in the heap. An idle connection still
 *        costs ~84 KB (bench/h3mem.sh, 5,000 held; h2 over TLS 10 KB): about one page per pool
 *        ngtcp2 0.12 and nghttp3 0.8 keep (11 of them) plus ~32 KB of heap objects, fixed in the
 *        libraries (see "memory for ngtcp2 and nghttp3" below).
 * In:    datagrams; the worker's flush pass (kh_wconn.flush), its variable-deadline timer
 *        (ngtcp2_conn_get_expiry and kh_h3's application timeouts), its stop walks.
 * Out:   datagrams: a write pass (write_out) collects a connection's packets and sends runs of
 *        same-size ones with one sendmsg and UDP_SEGMENT (GSO; h3_gso, probed with getsockopt at
 *        open, off for the worker after EIO/EINVAL), else one sendmsg each, straight on the fd;
 *        stream data to kh_h3; CONNECTION_CLOSE.
 * Retry: above h3_retry_above connections on the worker, a new client gets a Retry first (its
 *        token sealed with the secret the workers share, so any worker can check it).
 * Never: frees a connection inside an ngtcp2 or nghttp3 callback (closing is flagged and done
 *        when the call returns); accepts a connection over the `connections` limit or while the
 *        worker stops (its Initial is dropped: the client retries or falls back to TCP); parses
 *        HTTP/3.
 * CIDs: every CID we issue is SCID_LEN bytes, the first the worker's id, by which the reuseport
 *        program of kh_listen.c routes packets to their worker. Stateless reset tokens come from
 *        a secret all workers share (ctx); a short-header packet for an unknown CID of this
 *        worker gets a stateless reset, one for another worker's CID nothing.
 * Close: RFC 9000 §10.2. A connection we close (CONNECTION_CLOSE sent) or the peer closed
 *        (draining) gives up its ngtcp2, TLS and HTTP/3 state and its registry entry at once, but
 *        its CIDs stay in the table for three PTOs (ep->closed): packets for them get the saved
 *        CONNECTION_CLOSE datagram again (closing; the 1st, 2nd, 4th, 8th... packet) or nothing
 *        (draining), not a stateless reset. An idle timeout or a dropped first packet frees at
 *        once; so does any close while the worker stops (its table goes with it).
 * Stop:  each worker reads a duplicate of main's UDP socket and closes only that; main closes
 *        the sockets once every worker has stopped, so the reuseport group, and the router's
 *        index -> worker mapping, stays whole while slower workers still drain. */
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uv.h>

#include "kh_conn.h"
#include "kh_h3_module.h"
#include "kh_log.h"
#include "kh_quic.h"
#include "kh_quic_crypto.h"
#include "kh_worker.h"

#define SCID_LEN 18
#define MAX_UDP 1452 /* a payload that fits a 1500-byte MTU with IPv6 */
#define H3_NO_ERROR 0x100
/* The receive buffer: libuv 1.44 reads a batch with recvmmsg(2) only when the buffer holds at
 * least two 64 KiB datagrams (batch = size / 64 KiB, at most 20): h3_recv_batch per syscall. */
#define RBUF_DGRAM 65536
/* GSO (UDP_SEGMENT): one sendmsg carries up to GSO_MAX packets of one connection, all of the
 * first one's size but the last, which may be shorter; 64 KiB in all at most (a UDP length). */
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#define GSO_MAX 40
#define SBUF_SIZE (GSO_MAX * MAX_UDP)

struct kh_h3_ctx {
    kh_quic_creds *creds;
    uint8_t secret[32]; /* stateless reset tokens (RFC 9000 §10.3.2), shared by the workers */
};

typedef struct cid_entry cid_entry;
struct cid_entry {
    ngtcp2_cid cid;
    kh_quic_conn *q;
    cid_entry *next;      /* bucket chain */
    cid_entry *conn_next; /* the connection's list */
};

typedef struct quic_sock {
    uv_udp_t udp;
    struct quic_ep *ep;
    struct sockaddr_storage local;
    socklen_t locallen;
    int fd;
} quic_sock;

typedef struct quic_ep {
    kh_worker *w;
    kh_h3_ctx *ctx;
    quic_sock *socks;
    int nsocks;
    int open_socks;
    char *rbuf;
    size_t rbuf_size;
    uint8_t *sbuf; /* the packets of one write pass, SBUF_SIZE */
    int gso;       /* 1: UDP_SEGMENT works here (h3_gso, probed at open; off after EIO/EINVAL) */
    cid_entry **buckets;
    size_t nbuckets, ncids;
    struct kh_quic_conn *closed; /* connections in their closing or draining period */
    size_t nclosed;
} quic_ep;

/* Q_CLOSED: in the closing (close_pkt set) or draining period: only the CIDs, the saved
 * CONNECTION_CLOSE and the timer are left, and the worker's registry no longer counts it */
enum { Q_CLOSING = 1, Q_DEAD = 2, Q_SHUTDOWN = 4, Q_IN_CALL = 8, Q_CLOSED = 16 };

struct kh_quic_conn {
    kh_wconn wc;
    quic_ep *ep;
    quic_sock *sock;
    ngtcp2_conn *qc;
    void *tls;
    ngtcp2_crypto_conn_ref ref;
    kh_h3 *h3;
    kh_dtimer timer;
    cid_entry *cids;
    struct sockaddr_storage remote;
    socklen_t remotelen;
    kh_addr peer;
    uint32_t id;
    int flags;
    uint64_t app_error; /* kh_quic_app_error's code while Q_CLOSING */
    int app_error_set;
    /* Q_CLOSED: the CONNECTION_CLOSE datagram sent (NULL: draining), answered again to the
     * packets that keep coming (the 1st, 2nd, 4th, 8th...: RFC 9000 §10.2.1 rate limit) */
    uint8_t *close_pkt;
    size_t close_len;
    uint32_t closed_pkts;
    kh_quic_conn *closed_prev, *closed_next;
};

static uint64_t now_ts(void)
{
    return uv_hrtime(); /* CLOCK_MONOTONIC in ns, as ngtcp2 wants */
}

/* ---- the CID table ---- */

static size_t cid_hash(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return (size_t)h;
}

static kh_quic_conn *cid_find(quic_ep *ep, const uint8_t *p, size_t n)
{
    if (ep->nbuckets == 0)
        return NULL;
    for (cid_entry *e = ep->buckets[cid_hash(p, n) & (ep->nbuckets - 1)]; e; e = e->next)
        if (e->cid.datalen == n && memcmp(e->cid.data, p, n) == 0)
            return e->q;
    return NULL;
}

static void cid_rehash(quic_ep *ep, size_t nb)
{
    cid_entry **b = kh_xcalloc(nb, sizeof *b);
    for (size_t i = 0; i < ep->nbuckets; i++) {
        for (cid_entry *e = ep->buckets[i], *next; e; e = next) {
            next = e->next;
            size_t k = cid_hash(e->cid.data, e->cid.datalen) & (nb - 1);
            e->next = b[k];
            b[k] = e;
        }
    }
    free(ep->buckets);
    ep->buckets = b;
    ep->nbuckets = nb;
}

static void cid_add(kh_quic_conn *q, const ngtcp2_cid *cid)
{
    quic_ep *ep = q->ep;
    if (cid_find(ep, cid->data, cid->datalen))
        return;
    if (ep->ncids + 1 > ep->nbuckets)
        cid_rehash(ep, ep->nbuckets ? ep->nbuckets * 2 : 64);
    cid_entry *e = kh_xmalloc(sizeof *e);
    e->cid = *cid;
    e->q = q;
    size_t k = cid_hash(cid->data, cid->datalen) & (ep->nbuckets - 1);
    e->next = ep->buckets[k];
    ep->buckets[k] = e;
    e->conn_next = q->cids;
    q->cids = e;
    ep->ncids++;
}

static void cid_unlink(quic_ep *ep, cid_entry *e)
{
    cid_entry **pp = &ep->buckets[cid_hash(e->cid.data, e->cid.datalen) & (ep->nbuckets - 1)];
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp)
        *pp = e->next;
    ep->ncids--;
}

static void cid_remove(kh_quic_conn *q, const ngtcp2_cid *cid)
{
    for (cid_entry **pp = &q->cids; *pp; pp = &(*pp)->conn_next) {
        cid_entry *e = *pp;
        if (e->cid.datalen == cid->datalen && memcmp(e->cid.data, cid->data, cid->datalen) == 0) {
            *pp = e->conn_next;
            cid_unlink(q->ep, e);
            free(e);
            return;
        }
    }
}

/* ---- connection lifecycle ---- */

/* Everything but the CIDs and the struct: the ngtcp2 connection, its TLS session, the HTTP/3
 * state, the registry entry (so a graceful stop does not wait for a closing period). */
static void conn_release(kh_quic_conn *q)
{
    kh_worker *w = q->ep->w;
    kh_worker_dtimer_cancel(w, &q->timer);
    kh_h3_free(q->h3); /* resets what the app still holds */
    q->h3 = NULL;
    if (q->qc)
        ngtcp2_conn_del(q->qc);
    q->qc = NULL;
    kh_quic_session_free(q->tls);
    q->tls = NULL;
    kh_worker_conn_remove(w, &q->wc);
}

static void conn_free(kh_quic_conn *q)
{
    if (q->flags & Q_DEAD)
        return;
    q->flags |= Q_DEAD;
    quic_ep *ep = q->ep;
    if (q->flags & Q_CLOSED) {
        kh_worker_dtimer_cancel(ep->w, &q->timer);
        if (q->closed_prev)
            q->closed_prev->closed_next = q->closed_next;
        else
            ep->closed = q->closed_next;
        if (q->closed_next)
            q->closed_next->closed_prev = q->closed_prev;
        ep->nclosed--;
        free(q->close_pkt);
    } else {
        conn_release(q);
    }
    while (q->cids) {
        cid_entry *e = q->cids;
        q->cids = e->conn_next;
        cid_unlink(ep, e);
        free(e);
    }
    free(q);
}

static socklen_t sa_len(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* One sendmsg on the socket's fd (libuv's send queue stays empty: we never queue there). A
 * datagram the kernel cannot take now (EAGAIN) is dropped: QUIC recovers it as a loss. */
static int send_msg(quic_sock *s, const struct sockaddr *to, const uint8_t *p, size_t n,
                    size_t seg)
{
    struct iovec iov = {(void *)p, n};
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } cm;
    struct msghdr m = {.msg_name = (void *)to, .msg_namelen = sa_len(to), .msg_iov = &iov,
                       .msg_iovlen = 1};
    if (seg) {
        memset(&cm, 0, sizeof cm);
        m.msg_control = cm.buf;
        m.msg_controllen = sizeof cm.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        uint16_t v = (uint16_t)seg;
        memcpy(CMSG_DATA(c), &v, sizeof v);
    }
    ssize_t r;
    do
        r = sendmsg(s->fd, &m, 0);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : 0;
}

static void send_to(quic_sock *s, const struct sockaddr *to, const uint8_t *p, size_t n)
{
    int r = send_msg(s, to, p, n, 0);
    if (r < 0 && r != -EAGAIN)
        KH_LOG_DEBUG("quic: send: %s", strerror(-r));
}

/* n bytes of packets of seg bytes each (the last may be shorter) to one address: one sendmsg
 * with UDP_SEGMENT when there are several and GSO works, else one sendmsg each. A kernel or
 * device that refuses GSO (EIO: no checksum offload; EINVAL) turns it off for the worker and
 * the batch leaves packet by packet. */
static void send_batch(quic_sock *s, const struct sockaddr *to, const uint8_t *p, size_t n,
                       size_t seg)
{
    if (n > seg && s->ep->gso) {
        int r = send_msg(s, to, p, n, seg);
        if (r != -EIO && r != -EINVAL) {
            if (r < 0 && r != -EAGAIN)
                KH_LOG_DEBUG("quic: send: %s", strerror(-r));
            return;
        }
        KH_LOG_INFO("quic: UDP_SEGMENT refused (%s): GSO off on this worker", strerror(-r));
        s->ep->gso = 0;
    }
    for (size_t off = 0; off < n; off += seg)
        send_to(s, to, p + off, n - off < seg ? n - off : seg);
}

/* The closing (pkt: the CONNECTION_CLOSE datagram just sent) or draining (pkt NULL: the peer
 * closed) period of RFC 9000 §10.2: the connection's state goes, its CIDs stay for three PTOs
 * so that late packets get the CONNECTION_CLOSE again (closing) or nothing (draining) instead
 * of a stateless reset; then they go too. Not while the worker stops (it frees everything). */
static void enter_closed(kh_quic_conn *q, const uint8_t *pkt, size_t n)
{
    quic_ep *ep = q->ep;
    kh_worker *w = ep->w;
    uint64_t pto_ms = q->qc ? (ngtcp2_conn_get_pto(q->qc) + NGTCP2_MILLISECONDS - 1) /
                                  NGTCP2_MILLISECONDS
                            : 0;
    if (w->stopping || pto_ms == 0 || q->cids == NULL) {
        conn_free(q);
        return;
    }
    conn_release(q);
    q->flags = (q->flags & ~Q_CLOSING) | Q_CLOSED;
    if (pkt) {
        q->close_pkt = kh_xmalloc(n);
        memcpy(q->close_pkt, pkt, n);
        q->close_len = n;
    }
    q->closed_next = ep->closed;
    if (ep->closed)
        ep->closed->closed_prev = q;
    ep->closed = q;
    ep->nclosed++;
    KH_LOG_DEBUG("q%u quic: %s period: %llu ms", q->id, pkt ? "closing" : "draining",
                 (unsigned long long)(3 * pto_ms));
    kh_worker_dtimer_set(w, &q->timer, uv_now(&w->loop) + 3 * pto_ms);
}

/* A packet for a connection in its closing or draining period. */
static void closed_recv(kh_quic_conn *q, quic_sock *s, const struct sockaddr *addr)
{
    q->closed_pkts++;
    if (q->close_pkt && (q->closed_pkts & (q->closed_pkts - 1)) == 0)
        send_to(s, addr, q->close_pkt, q->close_len);
}

/* CONNECTION_CLOSE (once, best effort), then the closing period. */
static void close_now(kh_quic_conn *q, ngtcp2_connection_close_error *ccerr)
{
    if (q->qc && !ngtcp2_conn_is_in_closing_period(q->qc) &&
        !ngtcp2_conn_is_in_draining_period(q->qc)) {
        uint8_t out[MAX_UDP];
        ngtcp2_path_storage ps;
        ngtcp2_path_storage_zero(&ps);
        ngtcp2_pkt_info pi;
        ngtcp2_ssize n = ngtcp2_conn_write_connection_close(q->qc, &ps.path, &pi, out, sizeof out,
                                                            ccerr, now_ts());
        if (n > 0) {
            send_to(q->sock, (struct sockaddr *)&q->remote, out, (size_t)n);
            enter_closed(q, out, (size_t)n);
            return;
        }
    }
    conn_free(q);
}

static void close_app(kh_quic_conn *q, uint64_t code)
{
    ngtcp2_connection_close_error ccerr;
    ngtcp2_connection_close_error_default(&ccerr);
    ngtcp2_connection_close_error_set_application_error(&ccerr, code, NULL, 0);
    close_now(q, &ccerr);
}

/* After an ngtcp2 call returned rv: close as RFC 9000 asks. Returns 1 when q is gone. */
static int handle_error(kh_quic_conn *q, int rv)
{
    if (rv == 0)
        return 0;
    if (rv == NGTCP2_ERR_IDLE_CLOSE)
        KH_LOG_DEBUG("q%u quic: idle timeout: closed", q->id);
    else if (rv == NGTCP2_ERR_DRAINING)
        KH_LOG_DEBUG("q%u quic: closed by the peer", q->id);
    else if (rv == NGTCP2_ERR_DROP_CONN)
        KH_LOG_DEBUG("q%u quic: dropped: %s", q->id,
                     ngtcp2_conn_get_handshake_completed(q->qc)
                         ? "ngtcp2 says so"
                         : "a first packet that did not decrypt");
    if (rv == NGTCP2_ERR_DRAINING) {
        enter_closed(q, NULL, 0); /* the peer closed: nothing to send, its CIDs stay a while */
        return 1;
    }
    if (rv == NGTCP2_ERR_DROP_CONN || rv == NGTCP2_ERR_IDLE_CLOSE) {
        conn_free(q); /* silently (RFC 9000 §10.1: an idle timeout discards the state) */
        return 1;
    }
    ngtcp2_connection_close_error ccerr;
    ngtcp2_connection_close_error_default(&ccerr);
    if (q->app_error_set)
        ngtcp2_connection_close_error_set_application_error(&ccerr, q->app_error, NULL, 0);
    else if (rv == NGTCP2_ERR_CRYPTO)
        ngtcp2_connection_close_error_set_transport_error_tls_alert(
            &ccerr, ngtcp2_conn_get_tls_alert(q->qc), NULL, 0);
    else
        ngtcp2_connection_close_error_set_transport_error_liberr(&ccerr, rv, NULL, 0);
    KH_LOG_DEBUG("q%u quic: closing: %s", q->id, ngtcp2_strerror(rv));
    close_now(q, &ccerr);
    return 1;
}

static void arm_timer(kh_quic_conn *q)
{
    kh_worker *w = q->ep->w;
    uint64_t exp = ngtcp2_conn_get_expiry(q->qc), now = now_ts();
    uint64_t loop_now = uv_now(&w->loop);
    uint64_t dl = exp == UINT64_MAX ? UINT64_MAX
                  : exp <= now     ? loop_now
                                   : loop_now + (exp - now + NGTCP2_MILLISECONDS - 1) / NGTCP2_MILLISECONDS;
    uint64_t app = q->h3 ? kh_h3_deadline(q->h3) : UINT64_MAX;
    if (app < dl)
        dl = app;
    if (dl == UINT64_MAX)
        kh_worker_dtimer_cancel(w, &q->timer);
    else
        kh_worker_dtimer_set(w, &q->timer, dl);
}

/* Writes everything ngtcp2 and nghttp3 have to send now. Returns 1 when q is gone. */
static int write_out(kh_quic_conn *q)
{
    if (q->flags & Q_CLOSING) {
        close_app(q, q->app_error);
        return 1;
    }
    /* Packets collect in ep->sbuf while they go to one address and each is no larger than the
     * first (the segment size); a shorter one ends the batch, as does a full sbuf. */
    quic_ep *ep = q->ep;
    uint8_t *sbuf = ep->sbuf;
    /* (ngtcp2 keeps packets to the path's size by itself; only a PMTUD probe uses all of
     * MAX_UDP) */
    size_t maxpkts = ep->gso ? GSO_MAX : 1, npkts = 0, off = 0, seg = 0;
    struct sockaddr_storage to = {0};
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi;
    uint64_t ts = now_ts();
    for (int guard = 0; guard < 4096; guard++) {
        uint8_t *buf = sbuf + off;
        int64_t sid = -1;
        int fin = 0;
        kh_iov vec[16];
        ssize_t nvec = 0;
        if (q->h3 && ngtcp2_conn_get_max_data_left(q->qc)) {
            nvec = kh_h3_writev(q->h3, &sid, &fin, vec, 16);
            if (nvec < 0)
                return handle_error(q, NGTCP2_ERR_CALLBACK_FAILURE);
        }
        uint32_t fl = NGTCP2_WRITE_STREAM_FLAG_MORE | (fin ? NGTCP2_WRITE_STREAM_FLAG_FIN : 0);
        ngtcp2_ssize ndatalen = -1;
        ngtcp2_ssize n = ngtcp2_conn_writev_stream(q->qc, &ps.path, &pi, buf, MAX_UDP,
                                                   &ndatalen, fl, sid, (const ngtcp2_vec *)vec,
                                                   (size_t)nvec, ts);
        if (n < 0) {
            if (n == NGTCP2_ERR_STREAM_DATA_BLOCKED) {
                kh_h3_blocked(q->h3, sid);
                continue;
            }
            if (n == NGTCP2_ERR_STREAM_SHUT_WR) {
                kh_h3_write_shut(q->h3, sid);
                continue;
            }
            if (n == NGTCP2_ERR_WRITE_MORE) {
                if (kh_h3_written(q->h3, sid, (size_t)ndatalen) != 0)
                    return handle_error(q, NGTCP2_ERR_CALLBACK_FAILURE);
                continue;
            }
            return handle_error(q, (int)n);
        }
        if (ndatalen >= 0 && q->h3 && kh_h3_written(q->h3, sid, (size_t)ndatalen) != 0)
            return handle_error(q, NGTCP2_ERR_CALLBACK_FAILURE);
        if (n == 0)
            break;
        const struct sockaddr *ra = ps.path.remote.addr;
        if (npkts && ((size_t)n > seg || ps.path.remote.addrlen != sa_len((struct sockaddr *)&to) ||
                      memcmp(ra, &to, ps.path.remote.addrlen) != 0)) {
            /* it cannot join the batch: the batch leaves, the packet starts the next */
            send_batch(q->sock, (struct sockaddr *)&to, sbuf, off, seg);
            memmove(sbuf, buf, (size_t)n);
            npkts = off = 0;
        }
        if (npkts++ == 0) {
            seg = (size_t)n;
            memcpy(&to, ra, ps.path.remote.addrlen);
        }
        off += (size_t)n;
        if ((size_t)n < seg || npkts == maxpkts || off + MAX_UDP > SBUF_SIZE) {
            send_batch(q->sock, (struct sockaddr *)&to, sbuf, off, seg);
            npkts = off = 0;
        }
    }
    if (npkts)
        send_batch(q->sock, (struct sockaddr *)&to, sbuf, off, seg);
    ngtcp2_conn_update_pkt_tx_time(q->qc, ts);
    if (q->h3)
        kh_h3_after_write(q->h3); /* apps waiting for drain; what they queue goes next pass */
    /* a request in flight keeps the connection from idling out: PINGs at half the timeout */
    ngtcp2_conn_set_keep_alive_timeout(q->qc, q->h3 && kh_h3_busy(q->h3)
                                                  ? q->ep->w->limits->keepalive_timeout_ms *
                                                        NGTCP2_MILLISECONDS / 2
                                                  : 0);
    if ((q->flags & Q_SHUTDOWN) && q->h3 && kh_h3_done(q->h3)) {
        close_app(q, H3_NO_ERROR); /* graceful stop: GOAWAY went out, the streams are done */
        return 1;
    }
    arm_timer(q);
    return 0;
}

static void on_timer(kh_dtimer *t)
{
    kh_quic_conn *q = KH_CONTAINER_OF(t, kh_quic_conn, timer);
    if (q->flags & Q_CLOSED) {
        KH_LOG_DEBUG("q%u quic: closing period over: %u packets came", q->id, q->closed_pkts);
        conn_free(q);
        return;
    }
    uint64_t ts = now_ts();
    if (ngtcp2_conn_get_expiry(q->qc) <= ts) {
        int rv = ngtcp2_conn_handle_expiry(q->qc, ts);
        if (handle_error(q, rv))
            return;
    }
    if (q->h3 && kh_h3_on_timeout(q->h3, uv_now(&q->ep->w->loop))) {
        close_app(q, H3_NO_ERROR); /* kept idle past keepalive_timeout_ms */
        return;
    }
    write_out(q);
}

/* ---- the registry (kh_wconn) ---- */

static void wc_flush(kh_wconn *wc)
{
    write_out(KH_CONTAINER_OF(wc, kh_quic_conn, wc));
}

static void wc_shutdown(kh_wconn *wc)
{
    kh_quic_conn *q = KH_CONTAINER_OF(wc, kh_quic_conn, wc);
    q->flags |= Q_SHUTDOWN;
    if (q->h3 == NULL) {
        close_app(q, H3_NO_ERROR); /* still in its handshake: no request to finish */
        return;
    }
    kh_h3_shutdown(q->h3);
    write_out(q);
}

static void wc_close(kh_wconn *wc)
{
    close_app(KH_CONTAINER_OF(wc, kh_quic_conn, wc), H3_NO_ERROR);
}

static const kh_wconn_vt quic_wc_vt = {wc_flush, wc_shutdown, wc_close};

/* ---- for kh_h3 ---- */

kh_worker *kh_quic_worker(kh_quic_conn *q) { return q->ep->w; }
uint32_t kh_quic_id(kh_quic_conn *q) { return q->id; }
const kh_addr *kh_quic_peer(kh_quic_conn *q) { return &q->peer; }

void kh_quic_consumed(kh_quic_conn *q, int64_t sid, size_t n)
{
    ngtcp2_conn_extend_max_stream_offset(q->qc, sid, n);
    ngtcp2_conn_extend_max_offset(q->qc, n);
}

void kh_quic_consumed_conn(kh_quic_conn *q, size_t n)
{
    ngtcp2_conn_extend_max_offset(q->qc, n);
}

void kh_quic_consumed_stream(kh_quic_conn *q, int64_t sid, size_t n)
{
    ngtcp2_conn_extend_max_stream_offset(q->qc, sid, n);
}

void kh_quic_stop_sending(kh_quic_conn *q, int64_t sid, uint64_t code)
{
    ngtcp2_conn_shutdown_stream_read(q->qc, sid, code);
}

void kh_quic_reset_stream(kh_quic_conn *q, int64_t sid, uint64_t code)
{
    ngtcp2_conn_shutdown_stream_write(q->qc, sid, code);
    kh_quic_dirty(q);
}

int kh_quic_open_uni(kh_quic_conn *q, int64_t *sid)
{
    return ngtcp2_conn_open_uni_stream(q->qc, sid, NULL);
}

uint64_t kh_quic_max_bidi_streams(kh_quic_conn *q)
{
    return ngtcp2_conn_get_local_transport_params(q->qc)->initial_max_streams_bidi;
}

void kh_quic_dirty(kh_quic_conn *q)
{
    if (!(q->flags & (Q_DEAD | Q_CLOSED)))
        kh_worker_flush_later(q->ep->w, &q->wc);
}

void kh_quic_app_error(kh_quic_conn *q, uint64_t code)
{
    q->flags |= Q_CLOSING;
    q->app_error = code;
    q->app_error_set = 1;
    kh_quic_dirty(q);
}

/* ---- ngtcp2 callbacks ---- */

static void rand_cb(uint8_t *dest, size_t n, const ngtcp2_rand_ctx *ctx)
{
    (void)ctx;
    kh_quic_rand(dest, n);
}

static void new_scid(kh_quic_conn *q, ngtcp2_cid *cid, size_t len)
{
    kh_quic_rand(cid->data, len);
    cid->data[0] = (uint8_t)q->ep->w->id; /* the worker that owns it */
    cid->datalen = len;
}

static int get_new_cid(ngtcp2_conn *qc, ngtcp2_cid *cid, uint8_t *token, size_t len, void *ud)
{
    kh_quic_conn *q = ud;
    new_scid(q, cid, len);
    if (ngtcp2_crypto_generate_stateless_reset_token(token, q->ep->ctx->secret,
                                                     sizeof q->ep->ctx->secret, cid) != 0)
        return NGTCP2_ERR_CALLBACK_FAILURE;
    cid_add(q, cid);
    return 0;
}

static int remove_cid(ngtcp2_conn *qc, const ngtcp2_cid *cid, void *ud)
{
    cid_remove(ud, cid);
    return 0;
}

static int recv_stream_data(ngtcp2_conn *qc, uint32_t flags, int64_t sid, uint64_t offset,
                            const uint8_t *data, size_t len, void *ud, void *sud)
{
    kh_quic_conn *q = ud;
    if (q->h3 == NULL)
        return 0;
    ssize_t n = kh_h3_recv(q->h3, sid, data, len, (flags & NGTCP2_STREAM_DATA_FLAG_FIN) != 0);
    if (n < 0) {
        if (!q->app_error_set) {
            q->app_error_set = 1;
            q->app_error = (uint64_t)-n;
        }
        return NGTCP2_ERR_CALLBACK_FAILURE;
    }
    kh_quic_consumed(q, sid, (size_t)n);
    return 0;
}

static int acked(ngtcp2_conn *qc, int64_t sid, uint64_t offset, uint64_t len, void *ud, void *sud)
{
    kh_quic_conn *q = ud;
    if (q->h3 && kh_h3_acked(q->h3, sid, len) != 0)
        return NGTCP2_ERR_CALLBACK_FAILURE;
    return 0;
}

static int stream_close(ngtcp2_conn *qc, uint32_t flags, int64_t sid, uint64_t code, void *ud,
                        void *sud)
{
    kh_quic_conn *q = ud;
    if (!(flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET))
        code = H3_NO_ERROR;
    if (q->h3 && kh_h3_stream_closed(q->h3, sid, code) != 0)
        return NGTCP2_ERR_CALLBACK_FAILURE;
    /* ngtcp2 does not raise the peer's stream limit by itself: one closed, one more allowed
     * (so h3_max_streams bounds the streams open at once, not per connection) */
    if (!(sid & 1)) {
        if (sid & 2)
            ngtcp2_conn_extend_max_streams_uni(qc, 1);
        else
            ngtcp2_conn_extend_max_streams_bidi(qc, 1);
    }
    return 0;
}

static int stream_reset(ngtcp2_conn *qc, int64_t sid, uint64_t final_size, uint64_t code, void *ud,
                        void *sud)
{
    kh_quic_conn *q = ud;
    if (q->h3)
        kh_h3_peer_reset(q->h3, sid, 0);
    return 0;
}

static int stream_stop_sending(ngtcp2_conn *qc, int64_t sid, uint64_t code, void *ud, void *sud)
{
    kh_quic_conn *q = ud;
    if (q->h3)
        kh_h3_peer_reset(q->h3, sid, 1);
    return 0;
}

static int extend_bidi(ngtcp2_conn *qc, uint64_t max, void *ud)
{
    kh_quic_conn *q = ud;
    if (q->h3)
        kh_h3_max_bidi(q->h3, max);
    return 0;
}

static int extend_stream_data(ngtcp2_conn *qc, int64_t sid, uint64_t max, void *ud, void *sud)
{
    kh_quic_conn *q = ud;
    if (q->h3)
        kh_h3_unblock(q->h3, sid);
    return 0;
}

/* CRYPTO data to GnuTLS while the handshake runs. Once it is complete the session is gone
 * (drop_tls): a QUIC client has nothing more to say in TLS (no KeyUpdate, RFC 9001 §6; no
 * post-handshake authentication, §4.4), so CRYPTO data then fails the connection. */
static int recv_crypto_data(ngtcp2_conn *qc, ngtcp2_crypto_level level, uint64_t offset,
                            const uint8_t *data, size_t len, void *ud)
{
    kh_quic_conn *q = ud;
    if (q->tls == NULL)
        return NGTCP2_ERR_CALLBACK_FAILURE;
    return ngtcp2_crypto_recv_crypto_data_cb(qc, level, offset, data, len, ud);
}

/* The GnuTLS session (~20 KB) is given back once the handshake is complete, which for a server
 * is also confirmed (RFC 9001 §4.1.2): the 1-RTT keys and AEAD contexts live in ngtcp2 and key
 * updates derive from them (ngtcp2_crypto_update_key), the Handshake keys are discarded, and
 * our Finished flight, if it must be sent again, is in ngtcp2's crypto buffers. */
static void drop_tls(kh_quic_conn *q)
{
    if (q->tls == NULL || !ngtcp2_conn_get_handshake_completed(q->qc))
        return;
    ngtcp2_conn_set_tls_native_handle(q->qc, NULL);
    kh_quic_session_free(q->tls);
    q->tls = NULL;
}

/* HTTP/3 starts once the 1-RTT keys are installed (where ngtcp2 0.12's own example does) */
static int recv_tx_key(ngtcp2_conn *qc, ngtcp2_crypto_level level, void *ud)
{
    kh_quic_conn *q = ud;
    if (level != NGTCP2_CRYPTO_LEVEL_APPLICATION || q->h3)
        return 0;
    q->h3 = kh_h3_new(q);
    return q->h3 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

static ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref)
{
    return ((kh_quic_conn *)ref->user_data)->qc;
}

static void peer_from(kh_addr *a, const struct sockaddr *sa)
{
    memset(a, 0, sizeof *a);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        a->family = 4;
        memcpy(a->bytes, &in->sin_addr, 4);
        a->port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        a->family = 6;
        memcpy(a->bytes, &in6->sin6_addr, 16);
        a->port = ntohs(in6->sin6_port);
    }
}

/* odcid: the client's first DCID, from a verified Retry token (NULL: no Retry happened) */
static kh_quic_conn *conn_new(quic_sock *s, const ngtcp2_pkt_hd *hd, const ngtcp2_path *path,
                              const ngtcp2_cid *odcid)
{
    quic_ep *ep = s->ep;
    kh_worker *w = ep->w;
    const kh_limits *l = w->limits;
    kh_quic_conn *q = kh_xcalloc(1, sizeof *q);
    q->ep = ep;
    q->sock = s;
    q->timer.cb = on_timer;
    q->id = ++w->next_conn_id;

    ngtcp2_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.recv_client_initial = ngtcp2_crypto_recv_client_initial_cb;
    cb.recv_crypto_data = recv_crypto_data;
    cb.encrypt = ngtcp2_crypto_encrypt_cb;
    cb.decrypt = ngtcp2_crypto_decrypt_cb;
    cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
    cb.update_key = ngtcp2_crypto_update_key_cb;
    cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
    cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
    cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
    cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
    cb.rand = rand_cb;
    cb.get_new_connection_id = get_new_cid;
    cb.remove_connection_id = remove_cid;
    cb.recv_stream_data = recv_stream_data;
    cb.acked_stream_data_offset = acked;
    cb.stream_close = stream_close;
    cb.stream_reset = stream_reset;
    cb.stream_stop_sending = stream_stop_sending;
    cb.extend_max_remote_streams_bidi = extend_bidi;
    cb.extend_max_stream_data = extend_stream_data;
    cb.recv_tx_key = recv_tx_key;

    ngtcp2_settings st;
    ngtcp2_settings_default(&st);
    st.initial_ts = now_ts();
    st.max_tx_udp_payload_size = MAX_UDP;
    /* the handshake gets the TLS handshake timeout, as over TCP */
    st.handshake_timeout = l->tls_handshake_timeout_ms * NGTCP2_MILLISECONDS;

    ngtcp2_transport_params p;
    ngtcp2_transport_params_default(&p);
    p.initial_max_stream_data_bidi_remote = 256 * 1024;
    p.initial_max_stream_data_bidi_local = 256 * 1024;
    p.initial_max_stream_data_uni = 256 * 1024;
    p.initial_max_data = 1024 * 1024;
    p.initial_max_streams_bidi = l->h3_max_streams;
    p.initial_max_streams_uni = 3;
    /* an idle connection closes after keepalive_timeout_ms, as over TCP; while a request is in
     * flight kh_h3 keeps it open (PINGs, ngtcp2_conn_set_keep_alive_timeout) */
    p.max_idle_timeout = (l->keepalive_timeout_ms ? l->keepalive_timeout_ms : 1000) *
                         NGTCP2_MILLISECONDS; /* 0 would mean no idle timeout at all in QUIC */
    p.original_dcid = hd->dcid;
    if (odcid) { /* RFC 9000 §7.3: after a Retry, both go in the transport parameters */
        p.original_dcid = *odcid;
        p.retry_scid = hd->dcid;
        p.retry_scid_present = 1;
    }

    ngtcp2_cid scid;
    new_scid(q, &scid, SCID_LEN);
    if (ngtcp2_crypto_generate_stateless_reset_token(p.stateless_reset_token, ep->ctx->secret,
                                                     sizeof ep->ctx->secret, &scid) == 0)
        p.stateless_reset_token_present = 1;
    static const ngtcp2_mem mem = {NULL, kh_quic_malloc, kh_quic_free, kh_quic_calloc,
                                   kh_quic_realloc}; /* copied by ngtcp2 */
    int rv = ngtcp2_conn_server_new(&q->qc, &hd->scid, &scid, path, hd->version, &cb, &st, &p,
                                    &mem, q);
    if (rv != 0) {
        KH_LOG_DEBUG("quic: ngtcp2_conn_server_new: %s", ngtcp2_strerror(rv));
        free(q);
        return NULL;
    }
    q->ref.get_conn = get_conn;
    q->ref.user_data = q;
    q->tls = kh_quic_session_new(ep->ctx->creds, q->qc, &q->ref);
    if (q->tls == NULL) {
        ngtcp2_conn_del(q->qc);
        free(q);
        return NULL;
    }
    kh_worker_conn_add(w, &q->wc, &quic_wc_vt);
    cid_add(q, &scid);
    cid_add(q, &hd->dcid); /* the client's first DCID: its Initials may be retransmitted */
    peer_from(&q->peer, path->remote.addr);
    KH_LOG_DEBUG("q%u quic: new connection (%llu open on this worker)", q->id,
                 (unsigned long long)w->num_conns);
    return q;
}

/* ---- memory for ngtcp2 and nghttp3 ----
 * Both libraries carve their objects from pools they malloc per connection, a block at a time,
 * and use the front of each. An idle connection (bench/results/h3mem-trace-20261202.txt, per
 * call site) keeps ngtcp2 0.12's skip-list node pools (8 nodes of 1-1.5 KiB a block, one node
 * used: 5 blocks of 8-12 KiB, 2 of 4 KiB), its pools of 64 frame chains, 64 sent-packet entries
 * and 64 streams (7-11 KiB each, a few used), nghttp3 0.8's pool of 64 streams (43 KiB, 7 used)
 * and skip-list pool (8 KiB). From malloc's heap such a block lands on pages a freed connection
 * left resident, all of it counted; a malloc'd block of KH_QUIC_MMAP_MIN bytes or more is mmap'd
 * instead, so only the pages the pool handed out count: one page a block (two for nghttp3's
 * streams), which is the floor, since the used fronts of two blocks cannot share a page. What
 * the libraries calloc is an object they use whole (ngtcp2_conn, 8.2 KiB): it stays in the
 * heap, where it takes its size and not three whole pages. The block counts and sizes are
 * compile-time constants of the libraries; ngtcp2 >= 1.6 (one-node skip-list blocks, pools of
 * 16) and nghttp3 >= 1.4 (8 streams a pool) shrink them. A 16-byte header holds the size. */
#define KH_QUIC_MMAP_MIN (6 * 1024)
#define KH_QUIC_HDR 16
typedef struct {
    size_t size;
    size_t mapped;
} quic_mem_hd;

static void *mem_alloc(size_t n, int zero)
{
    quic_mem_hd *h;
    size_t total = n + KH_QUIC_HDR;
    if (total < n)
        return NULL;
    h = MAP_FAILED;
    if (n >= KH_QUIC_MMAP_MIN && !zero) /* (out of mappings, vm.max_map_count: malloc) */
        h = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h != MAP_FAILED) {
        h->mapped = 1;
    } else {
        h = zero ? calloc(1, total) : malloc(total);
        if (h == NULL)
            return NULL;
        h->mapped = 0;
    }
    h->size = n;
    return (char *)h + KH_QUIC_HDR;
}

void *kh_quic_malloc(size_t n, void *ud)
{
    (void)ud;
    return mem_alloc(n, 0);
}

void *kh_quic_calloc(size_t nmemb, size_t size, void *ud)
{
    (void)ud;
    if (size && nmemb > SIZE_MAX / size)
        return NULL;
    return mem_alloc(nmemb * size, 1);
}

void kh_quic_free(void *p, void *ud)
{
    (void)ud;
    if (p == NULL)
        return;
    quic_mem_hd *h = (quic_mem_hd *)((char *)p - KH_QUIC_HDR);
    if (h->mapped)
        munmap(h, h->size + KH_QUIC_HDR);
    else
        free(h);
}

void *kh_quic_realloc(void *p, size_t n, void *ud)
{
    if (p == NULL)
        return kh_quic_malloc(n, ud);
    quic_mem_hd *h = (quic_mem_hd *)((char *)p - KH_QUIC_HDR);
    if (!h->mapped && n < KH_QUIC_MMAP_MIN) {
        quic_mem_hd *r = realloc(h, n + KH_QUIC_HDR);
        if (r == NULL)
            return NULL;
        r->size = n;
        return (char *)r + KH_QUIC_HDR;
    }
    void *q = mem_alloc(n, 0);
    if (q == NULL)
        return NULL;
    memcpy(q, p, KH_MIN(n, h->size));
    kh_quic_free(p, ud);
    return q;
}

/* ---- datagrams in ---- */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    quic_sock *s = h->data;
    b->base = s->ep->rbuf;
    b->len = s->ep->rbuf_size;
}

static void send_vn(quic_sock *s, const ngtcp2_version_cid *vc, const struct sockaddr *to)
{
    uint8_t out[256], r;
    uint32_t sv[] = {NGTCP2_PROTO_VER_V1};
    kh_quic_rand(&r, 1);
    ngtcp2_ssize n = ngtcp2_pkt_write_version_negotiation(out, sizeof out, r, vc->scid,
                                                          vc->scidlen, vc->dcid, vc->dcidlen, sv, 1);
    if (n > 0)
        send_to(s, to, out, (size_t)n);
}

/* A short-header packet for a CID this worker issued but no longer knows (restarted, closed):
 * a stateless reset (RFC 9000 §10.3) tells the peer at once instead of its idle timeout. Not
 * for CIDs of another worker (their owner answers; reuseport routing sends them there), and
 * always shorter than what came in, so two endpoints cannot loop. */
static void send_reset(quic_sock *s, const ngtcp2_version_cid *vc, size_t n,
                       const struct sockaddr *to)
{
    if (vc->dcidlen != SCID_LEN || vc->dcid[0] != (uint8_t)s->ep->w->id || n < 22)
        return;
    ngtcp2_cid cid;
    ngtcp2_cid_init(&cid, vc->dcid, vc->dcidlen);
    uint8_t token[NGTCP2_STATELESS_RESET_TOKENLEN], rnd[64], out[128];
    if (ngtcp2_crypto_generate_stateless_reset_token(token, s->ep->ctx->secret,
                                                     sizeof s->ep->ctx->secret, &cid) != 0)
        return;
    size_t len = n - 1 < sizeof out ? n - 1 : sizeof out;
    size_t randlen = len - NGTCP2_STATELESS_RESET_TOKENLEN;
    if (randlen < NGTCP2_MIN_STATELESS_RESET_RANDLEN)
        return;
    if (randlen > sizeof rnd)
        randlen = sizeof rnd;
    kh_quic_rand(rnd, randlen);
    ngtcp2_ssize k = ngtcp2_pkt_write_stateless_reset(out, sizeof out, token, rnd, randlen);
    if (k > 0)
        send_to(s, to, out, (size_t)k);
}

/* Address validation (RFC 9000 §8.1.2) when the worker is under load: a Retry carrying a token
 * sealed with the workers' shared secret, bound to the client's address and its first DCID;
 * its new SCID bears this worker's id, so the client's next Initial comes back here. */
static void send_retry(quic_sock *s, const ngtcp2_pkt_hd *hd, const struct sockaddr *to,
                       socklen_t tolen)
{
    kh_quic_conn dummy = {.ep = s->ep};
    ngtcp2_cid scid;
    new_scid(&dummy, &scid, SCID_LEN);
    uint8_t token[NGTCP2_CRYPTO_MAX_RETRY_TOKENLEN], out[MAX_UDP];
    ngtcp2_ssize tl = ngtcp2_crypto_generate_retry_token(
        token, s->ep->ctx->secret, sizeof s->ep->ctx->secret, hd->version, to, tolen, &scid,
        &hd->dcid, now_ts());
    if (tl < 0)
        return;
    ngtcp2_ssize n = ngtcp2_crypto_write_retry(out, sizeof out, hd->version, &hd->scid, &scid,
                                               &hd->dcid, token, (size_t)tl);
    if (n > 0)
        send_to(s, to, out, (size_t)n);
}

static void on_recv(uv_udp_t *u, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *addr,
                    unsigned flags)
{
    quic_sock *s = u->data;
    if (nread <= 0 || addr == NULL)
        return;
    const uint8_t *data = (const uint8_t *)buf->base;
    size_t n = (size_t)nread;
    ngtcp2_version_cid vc;
    int rv = ngtcp2_pkt_decode_version_cid(&vc, data, n, SCID_LEN);
    if (rv == NGTCP2_ERR_VERSION_NEGOTIATION) {
        send_vn(s, &vc, addr);
        return;
    }
    if (rv != 0)
        return; /* not QUIC: dropped */
    socklen_t alen = addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);
    ngtcp2_path path = {{(struct sockaddr *)&s->local, s->locallen},
                        {(struct sockaddr *)addr, alen},
                        NULL};
    kh_quic_conn *q = cid_find(s->ep, vc.dcid, vc.dcidlen);
    if (q && (q->flags & Q_CLOSED)) {
        closed_recv(q, s, addr);
        return;
    }
    if (q == NULL) {
        ngtcp2_pkt_hd hd;
        if (!(data[0] & 0x80)) {
            send_reset(s, &vc, n, addr);
            return;
        }
        /* only a client Initial opens a connection; anything else unknown is dropped (cheaply:
         * no state, no answer) */
        if (ngtcp2_accept(&hd, data, n) != 0)
            return;
        if (!kh_worker_conn_room(s->ep->w))
            return; /* at the `connections` limit, or stopping */
        ngtcp2_cid odcid;
        int retried = 0;
        if (hd.type == NGTCP2_PKT_INITIAL && hd.token.len &&
            hd.token.base[0] == NGTCP2_CRYPTO_TOKEN_MAGIC_RETRY) {
            if (ngtcp2_crypto_verify_retry_token(&odcid, hd.token.base, hd.token.len,
                                                 s->ep->ctx->secret, sizeof s->ep->ctx->secret,
                                                 hd.version, addr, alen, &hd.dcid,
                                                 10 * NGTCP2_SECONDS, now_ts()) != 0)
                return; /* forged, expired, or from another address: dropped */
            retried = 1;
        }
        if (!retried && s->ep->w->num_conns >= s->ep->w->limits->h3_retry_above) {
            send_retry(s, &hd, addr, alen);
            return;
        }
        q = conn_new(s, &hd, &path, retried ? &odcid : NULL);
        if (q == NULL)
            return;
    }
    memcpy(&q->remote, addr, alen);
    q->remotelen = alen;
    ngtcp2_pkt_info pi = {0};
    rv = ngtcp2_conn_read_pkt(q->qc, &path, &pi, data, n, now_ts());
    if (rv != 0) {
        handle_error(q, rv);
        return;
    }
    if (q->flags & Q_CLOSING) {
        close_app(q, q->app_error);
        return;
    }
    drop_tls(q); /* not in a callback: GnuTLS may be on the stack there */
    kh_quic_dirty(q); /* answers leave at the flush pass, after the rest of this batch */
}

/* ---- the module's worker and context calls (kh_h3_module.c) ---- */

kh_h3_ctx *kh_quic_ctx_new(const kh_h3_opts *o, char *err, size_t errlen)
{
    kh_h3_ctx *ctx = kh_xcalloc(1, sizeof *ctx);
    ctx->creds = kh_quic_creds_new(o->cert_pem, o->cert_len, o->key_pem, o->key_len, err, errlen);
    if (ctx->creds == NULL) {
        free(ctx);
        return NULL;
    }
    kh_quic_rand(ctx->secret, sizeof ctx->secret);
    return ctx;
}

void kh_quic_ctx_free(kh_h3_ctx *ctx)
{
    if (ctx == NULL)
        return;
    kh_quic_creds_free(ctx->creds);
    free(ctx);
}

static void ep_free(quic_ep *ep)
{
    free(ep->socks);
    free(ep->rbuf);
    free(ep->sbuf);
    free(ep->buckets);
    free(ep);
}

static void sock_closed(uv_handle_t *h)
{
    quic_sock *s = h->data;
    quic_ep *ep = s->ep;
    if (--ep->open_socks == 0)
        ep_free(ep);
}

void kh_quic_worker_close(kh_worker *w)
{
    quic_ep *ep = w->quic;
    if (ep == NULL)
        return;
    w->quic = NULL;
    while (ep->closed) /* closing periods end with the worker */
        conn_free(ep->closed);
    KH_LOG_DEBUG("quic: the worker's sockets close (each stays in its reuseport group until "
                 "every worker has stopped)");
    /* the registry closed every connection before (finish_stop); handles close their fds */
    if (ep->open_socks == 0) {
        ep_free(ep);
        return;
    }
    for (int i = 0; i < ep->nsocks; i++)
        if (ep->socks[i].fd != -1)
            uv_close((uv_handle_t *)&ep->socks[i].udp, sock_closed);
}

int kh_quic_worker_open(kh_worker *w, kh_h3_ctx *ctx, char *err, size_t errlen)
{
    const kh_config *cfg = w->cfg;
    quic_ep *ep = kh_xcalloc(1, sizeof *ep);
    ep->w = w;
    ep->ctx = ctx;
    ep->rbuf_size = (size_t)w->limits->h3_recv_batch * RBUF_DGRAM;
    ep->rbuf = kh_xmalloc(ep->rbuf_size);
    ep->sbuf = kh_xmalloc(SBUF_SIZE);
    ep->gso = w->limits->h3_gso != 0;
    ep->socks = kh_xcalloc((size_t)cfg->num_listens, sizeof *ep->socks);
    ep->nsocks = cfg->num_listens;
    w->quic = ep;
    for (int i = 0; i < cfg->num_listens; i++) {
        quic_sock *s = &ep->socks[i];
        s->fd = -1; /* -1: no handle */
        s->ep = ep;
        if (cfg->listens[i].udp_fds == NULL)
            continue;
        /* a duplicate: closing the handle when this worker stops leaves the socket (main's
         * fd) in the reuseport group until every worker has stopped, so the group's order, by
         * which the CID router steers packets (kh_listen.c), stays put while others drain */
        int fd = fcntl(cfg->listens[i].udp_fds[w->id], F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(err, errlen, "listen on %s:%d (quic): dup: %s", cfg->listens[i].host,
                     cfg->listens[i].port, strerror(errno));
            return -1;
        }
        uv_udp_init_ex(&w->loop, &s->udp, AF_UNSPEC | UV_UDP_RECVMMSG);
        s->udp.data = s;
        s->fd = fd;
        ep->open_socks++;
        int r = uv_udp_open(&s->udp, fd);
        if (r != 0)
            close(fd); /* the handle did not take it */
        if (r == 0) {
            int len = (int)sizeof s->local;
            r = uv_udp_getsockname(&s->udp, (struct sockaddr *)&s->local, &len);
            s->locallen = (socklen_t)len;
        }
        if (r == 0 && ep->gso) {
            /* the kernel knows UDP_SEGMENT (4.18+) when it answers for the option */
            int v = 0;
            socklen_t vl = sizeof v;
            if (getsockopt(fd, SOL_UDP, UDP_SEGMENT, &v, &vl) != 0) {
                KH_LOG_INFO("quic: no UDP_SEGMENT here (%s): one sendmsg per packet",
                            strerror(errno));
                ep->gso = 0;
            }
        }
        if (r == 0)
            r = uv_udp_recv_start(&s->udp, alloc_cb, on_recv);
        if (r != 0) {
            snprintf(err, errlen, "listen on %s:%d (quic): %s", cfg->listens[i].host,
                     cfg->listens[i].port, uv_strerror(r));
            return -1; /* kh_quic_worker_close closes what was opened */
        }
    }
    return 0;
}

const char *kh_quic_versions(void)
{
    static char v[128];
    snprintf(v, sizeof v, "ngtcp2 %s, GnuTLS %s", ngtcp2_version(0)->version_str,
             kh_quic_crypto_version());
    return v;
}
