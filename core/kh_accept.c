/* kh_accept.c: a worker's accept path (see kh_accept.h).
 * Owns:  the listeners' uv_poll_t handles and fds, the back-off and report timers.
 * In:    readable listeners (level-triggered: a batch is accepted per wakeup and the rest on
 *        the next loop turn, so one busy listener cannot starve the worker's connections).
 * Out:   kh_conn_accept(w, fd, peer, tls, listener) for each accepted fd; rate-limited log lines.
 * Never: lets libuv accept (no uv_listen: see kh_accept.h), or retries accept() in a loop on an
 *        error that the next call would repeat. */
#define _GNU_SOURCE /* accept4 */
#include "kh_accept.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kh_conn.h"
#include "kh_log.h"
#include "kh_worker.h"

/* Connections accepted per wakeup and listener: enough to drain a burst in few loop turns,
 * few enough that the worker's open connections get their turn in between. */
#define ACCEPT_BATCH 64
/* Idle keep-alive connections closed per wakeup at the `connections` limit (nginx closes up to
 * 32 of its reusable connections each time it runs out, ngx_drain_connections). */
#define REUSE_BATCH 16
#define REPORT_TICK_MS 1000
#define REPORT_GAP_MAX_MS 32000

static void poll_cb(uv_poll_t *p, int status, int events);
static void backoff_cb(uv_timer_t *t);

void kh_accept_init(kh_worker *w)
{
    kh_accept *a = &w->accept;
    uv_timer_init(&w->loop, &a->backoff);
    a->backoff.data = w;
    uv_timer_init(&w->loop, &a->report);
    a->report.data = w;
    uv_unref((uv_handle_t *)&a->report); /* only ever reports: keeps no loop alive */
    a->inited = 1;
}

/* Clients waiting in this worker's listen backlogs and their capacity: for a listening socket
 * Linux reports the accept queue's length in tcpi_unacked and its size in tcpi_sacked. */
static void backlog(kh_worker *w, uint64_t *waiting, uint64_t *cap)
{
    kh_accept *a = &w->accept;
    *waiting = *cap = 0;
    for (int i = 0; i < a->n; i++) {
        struct tcp_info ti;
        socklen_t len = sizeof ti;
        if (a->ls[i].fd >= 0 && getsockopt(a->ls[i].fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0) {
            *waiting += ti.tcpi_unacked;
            *cap += ti.tcpi_sacked;
        }
    }
}

static const char *err_name(int err)
{
    switch (err) {
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case ENOBUFS: return "ENOBUFS";
    case ENOMEM: return "ENOMEM";
    default: return "";
    }
}

/* Why accepting is paused, for a log line: "out of file descriptors (EMFILE, ...)". */
static void why(kh_worker *w, char *out, size_t cap)
{
    kh_accept *a = &w->accept;
    if (a->paused & KH_ACCEPT_P_LIMIT) {
        snprintf(out, cap, "connection limit (%llu) reached; resumes when a connection closes "
                 "(%llu idle keep-alive connections closed to make room)",
                 (unsigned long long)w->limits->connections, (unsigned long long)a->reused);
        return;
    }
    const char *what = (a->err == EMFILE || a->err == ENFILE) ? "out of file descriptors"
                       : (a->err == ENOBUFS || a->err == ENOMEM) ? "out of memory"
                                                                 : strerror(a->err);
    snprintf(out, cap, "%s (%s); retrying every %llu ms or when a connection closes", what,
             err_name(a->err), (unsigned long long)w->limits->accept_backoff_ms);
}

static void backlog_text(kh_worker *w, char *out, size_t cap)
{
    uint64_t waiting, size;
    backlog(w, &waiting, &size);
    snprintf(out, cap, "%llu clients waiting in the listen backlog (of %llu)%s",
             (unsigned long long)waiting, (unsigned long long)size,
             size && waiting >= size ? "; the backlog is full: the kernel drops new connection "
                                       "attempts until it has room (clients retry)"
                                     : "");
}

/* At most one line a second per worker, whatever happens: a new episode right after the
 * "resumed" line of the last one is reported by the next tick instead of at once. */
static int may_log(const kh_accept *a, uint64_t now)
{
    return a->last_line_at == 0 || now - a->last_line_at >= REPORT_TICK_MS;
}

static void report_cb(uv_timer_t *t)
{
    kh_worker *w = t->data;
    kh_accept *a = &w->accept;
    uint64_t now = uv_now(&w->loop);
    char reason[160], bl[200];
    int quiet = a->paused == 0 && a->tick_pauses == 0;
    a->tick_pauses = 0;
    if (!may_log(a, now))
        return;
    if (quiet) {
        /* a whole tick without a pause: the episode is over */
        backlog_text(w, bl, sizeof bl);
        KH_LOG_WARN("accept resumed after %.1f s: %llu connections accepted since the first pause, "
                    "%llu open on this worker; %s",
                    (double)(now - a->episode_at) / 1000.0,
                    (unsigned long long)(a->episode_accepted + a->accepted),
                    (unsigned long long)w->num_conns, bl);
        uv_timer_stop(&a->report);
        a->last_line_at = now;
        a->pauses = a->accepted = 0;
        return;
    }
    if (now < a->next_line_at)
        return;
    why(w, reason, sizeof reason);
    backlog_text(w, bl, sizeof bl);
    KH_LOG_WARN("accept %s: %s; %llu pauses and %llu connections accepted in the last %.0f s, "
                "%llu open on this worker; %s",
                a->paused ? "still paused" : "paused on and off", reason,
                (unsigned long long)a->pauses, (unsigned long long)a->accepted,
                (double)(now - a->last_line_at) / 1000.0, (unsigned long long)w->num_conns, bl);
    a->episode_accepted += a->accepted;
    a->pauses = a->accepted = 0;
    a->last_line_at = now;
    if (a->line_gap < REPORT_GAP_MAX_MS)
        a->line_gap *= 2;
    a->next_line_at = now + a->line_gap - REPORT_TICK_MS / 2;
}

static void start_polling(kh_worker *w)
{
    kh_accept *a = &w->accept;
    for (int i = 0; i < a->n; i++)
        if (a->ls[i].fd >= 0)
            uv_poll_start(&a->ls[i].poll, UV_READABLE, poll_cb);
}

static void pause_accepting(kh_worker *w, int reason, int err)
{
    kh_accept *a = &w->accept;
    a->paused |= reason;
    for (int i = 0; i < a->n; i++)
        if (a->ls[i].fd >= 0)
            uv_poll_stop(&a->ls[i].poll);
    if (reason == KH_ACCEPT_P_FDS)
        a->err = err;
    /* at the limit too: a connection that has gone idle since can make room for a waiting
     * client (poll_cb closes it), and no close would tell us */
    uv_timer_start(&a->backoff, backoff_cb, w->limits->accept_backoff_ms, 0);
    a->pauses++;
    a->tick_pauses++;
    if (uv_is_active((uv_handle_t *)&a->report))
        return;
    /* the first pause of an episode: say so now (unless a line went out less than a second
     * ago: then the next tick does), then at most once a tick, less often as it drags on */
    uint64_t now = uv_now(&w->loop);
    a->episode_at = now;
    a->episode_accepted = 0;
    a->tick_pauses = 1;
    a->line_gap = REPORT_TICK_MS;
    a->next_line_at = now;
    if (may_log(a, now)) {
        char reason_text[160], bl[200];
        why(w, reason_text, sizeof reason_text);
        backlog_text(w, bl, sizeof bl);
        KH_LOG_WARN("accept paused: %s; %llu connections open on this worker; %s", reason_text,
                    (unsigned long long)w->num_conns, bl);
        a->last_line_at = now;
        a->pauses = a->accepted = 0;
        a->next_line_at = now + REPORT_TICK_MS / 2;
    }
    uv_timer_start(&a->report, report_cb, REPORT_TICK_MS, REPORT_TICK_MS);
}

static void resume(kh_worker *w)
{
    kh_accept *a = &w->accept;
    if (a->paused || a->closed)
        return;
    start_polling(w);
}

static void backoff_cb(uv_timer_t *t)
{
    kh_worker *w = t->data;
    /* poll_cb pauses again at once if still at the limit or out of fds */
    w->accept.paused &= ~(KH_ACCEPT_P_FDS | KH_ACCEPT_P_LIMIT);
    resume(w);
}

void kh_accept_on_conn_closed(kh_worker *w)
{
    kh_accept *a = &w->accept;
    if (KH_LIKELY(a->paused == 0))
        return;
    /* a closed connection gave an fd back: try now rather than at the end of the back-off */
    a->paused &= ~KH_ACCEPT_P_FDS;
    if ((a->paused & KH_ACCEPT_P_LIMIT) && w->num_conns < w->limits->connections)
        a->paused &= ~KH_ACCEPT_P_LIMIT;
    if (a->paused == 0)
        uv_timer_stop(&a->backoff);
    resume(w);
}

static void poll_cb(uv_poll_t *p, int status, int events)
{
    (void)events;
    kh_listener *l = p->data;
    kh_worker *w = l->w;
    kh_accept *a = &w->accept;
    if (status < 0) {
        /* epoll reported an error on the listening socket: treat it as a shortage (back off) */
        pause_accepting(w, KH_ACCEPT_P_FDS, -status);
        return;
    }
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        if (w->num_conns >= w->limits->connections) {
            /* A client waits and every slot is taken: the oldest idle keep-alive connections
             * make room, closed the way their keepalive_timeout_ms would close them (h2: with
             * GOAWAY), as nginx reuses its keep-alive connections when worker_connections run
             * out. Else a flood of idle keep-alive connections kept every new client out for
             * keepalive_timeout_ms. The closes complete on the next loop turn, and each one
             * resumes accepting (kh_accept_on_conn_closed). Connections that are reading a
             * request or writing an answer are never closed for this. */
            a->reused += (uint64_t)kh_timeq_expire_oldest(&w->timeq[KH_TO_IDLE], REUSE_BATCH);
            pause_accepting(w, KH_ACCEPT_P_LIMIT, 0);
            return;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            a->accepted++;
            if (kh_conn_accept(w, fd, &ss, l->tls, (int)(l - a->ls)) != 0)
                close(fd);
            if (a->closed || a->paused)
                return;
            continue;
        }
        switch (errno) {
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
            return;
        /* interrupted, or the connection at the head of the queue failed (reset while queued,
         * or a network error Linux passes through accept, accept(2)): the next may be fine */
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
        case EPERM:
        case ENETDOWN:
        case ENOPROTOOPT:
        case EHOSTDOWN:
        case ENONET:
        case EHOSTUNREACH:
        case EOPNOTSUPP:
        case ENETUNREACH:
            continue;
        default:
            /* EMFILE, ENFILE, ENOBUFS, ENOMEM, or anything unexpected: the connection stays
             * in the backlog; calling again now would fail the same way */
            pause_accepting(w, KH_ACCEPT_P_FDS, errno);
            return;
        }
    }
}

int kh_accept_open(kh_worker *w, char *err, size_t errlen)
{
    kh_accept *a = &w->accept;
    const kh_config *cfg = w->cfg;
    a->ls = kh_xcalloc((size_t)cfg->num_listens, sizeof *a->ls);
    for (int i = 0; i < cfg->num_listens; i++) {
        kh_listener *l = &a->ls[i];
        l->w = w;
        l->fd = -1;
        l->tls = cfg->listens[i].tls ? cfg->tls : NULL;
        int fd = cfg->listens[i].fds[w->id];
        int r = uv_poll_init_socket(&w->loop, &l->poll, fd);
        if (r != 0) {
            snprintf(err, errlen, "listen on %s:%d: %s", cfg->listens[i].host,
                     cfg->listens[i].port, uv_strerror(r));
            return -1; /* kh_accept_close closes the ones before */
        }
        l->poll.data = l;
        l->fd = fd;
        a->n = i + 1;
        /* TCP_DEFER_ACCEPT (nginx's `listen ... deferred`): the kernel queues a connection for
         * accept only once its first bytes are in, so kh_conn_accept reads the request at once
         * instead of waiting for epoll (no wakeup and no epoll_ctl for a connection that is
         * answered and closed in the same turn). A client that sends nothing is accepted after
         * about defer_accept_s (the kernel resends its SYN-ACK then, and the client's ACK
         * completes the connection), and its header_timeout_ms runs from there. */
        int defer = (int)w->limits->defer_accept_s;
        if (setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof defer) != 0)
            KH_LOG_DEBUG("listen on %s:%d: TCP_DEFER_ACCEPT: %s", cfg->listens[i].host,
                         cfg->listens[i].port, strerror(errno));
    }
    start_polling(w);
    return 0;
}

static void listener_closed(uv_handle_t *h)
{
    kh_listener *l = h->data;
    close(l->fd);
    l->fd = -1;
}

void kh_accept_close(kh_worker *w)
{
    kh_accept *a = &w->accept;
    if (a->closed)
        return;
    a->closed = 1;
    for (int i = 0; i < a->n; i++)
        if (a->ls[i].fd >= 0 && !uv_is_closing((uv_handle_t *)&a->ls[i].poll))
            uv_close((uv_handle_t *)&a->ls[i].poll, listener_closed);
    if (a->inited) {
        uv_close((uv_handle_t *)&a->backoff, NULL);
        uv_close((uv_handle_t *)&a->report, NULL);
    }
}

void kh_accept_free(kh_worker *w)
{
    free(w->accept.ls);
    w->accept.ls = NULL;
    w->accept.n = 0;
}
