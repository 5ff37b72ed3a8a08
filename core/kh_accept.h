/* kh_accept.h: a worker's accept path: it polls its SO_REUSEPORT listening sockets (uv_poll_t)
 * and accepts with accept4() itself, a batch per wakeup, handing each fd to kh_conn_accept.
 * libuv's uv_listen is not used: on EMFILE/ENFILE its uv__server_io closes a spare fd, accepts
 * every waiting connection and closes it without a word (the "EMFILE trick"), and with several
 * loops in one process another thread takes the freed fd, so it spins on accept forever.
 * Instead, when the process is out of file descriptors (EMFILE/ENFILE; also ENOBUFS/ENOMEM) a
 * worker stops polling its listeners for the accept_backoff_ms limit and tries again when the
 * timer fires or one of its connections closes, whichever comes first; at the `connections`
 * limit it first closes its oldest idle keep-alive connections (up to 16 per wakeup, as nginx
 * reuses keep-alive connections at worker_connections), then stops the same way and resumes
 * when a connection closes or after accept_backoff_ms (one may have gone idle since). Out of
 * fds it closes none (the limit is the process's, shared by the workers). Meanwhile the
 * clients wait in the kernel's listen backlog (as nginx's do), and nothing is accepted only to
 * be closed.
 * The log says so at most once a second per worker (less often as a pause drags on), with the
 * number of clients waiting in the backlog, and once more when accepting has resumed.
 * kh_accept_open sets TCP_DEFER_ACCEPT (limit defer_accept_s) on each listener: a connection
 * reaches accept4 once its first bytes are in, and kh_conn_accept reads them at once.
 * Owns:  the listening fds once opened (closes them), two timers, the pause state.
 * In:    cfg->listens[i].fds[w->id] (bound and listening, made by main); connection closes.
 * Out:   accepted fds to kh_conn_accept; log lines.
 * Never: accepts a connection it is going to close, or touches another worker's listener. Every
 *        call is on the worker's thread. */
#ifndef KH_ACCEPT_H
#define KH_ACCEPT_H

#include <stdint.h>
#include <uv.h>

typedef struct kh_worker kh_worker;
typedef struct kh_tls_ctx kh_tls_ctx;

typedef struct kh_listener {
    uv_poll_t poll;
    kh_worker *w;
    kh_tls_ctx *tls; /* the listener's TLS context, or NULL for cleartext */
    int fd;          /* -1 when not open (any more) */
} kh_listener;

enum { KH_ACCEPT_P_FDS = 1, KH_ACCEPT_P_LIMIT = 2 };

typedef struct kh_accept {
    kh_listener *ls;
    int n;
    int paused;   /* KH_ACCEPT_P_* bits; listeners are polled only when 0 */
    int err;      /* errno of the last shortage (EMFILE, ENFILE, ...) */
    int closed;   /* kh_accept_close ran: never polls again */
    int inited;   /* the timers exist (kh_accept_init ran) */
    uv_timer_t backoff; /* ends a KH_ACCEPT_P_FDS pause */
    uv_timer_t report;  /* 1 s ticks while there is something to report */
    /* counts since the last report line, and pauses since the last 1 s tick */
    uint64_t pauses, accepted, tick_pauses;
    /* loop ms: when the episode started, when the last line went out, when the next "still
     * paused" line may go out, and the gap after that one (doubles up to 32 s) */
    uint64_t episode_at, last_line_at, next_line_at, line_gap;
    uint64_t episode_accepted;
    uint64_t reused; /* idle keep-alive connections closed at the `connections` limit (ever) */
} kh_accept;

/* worker_prepare, on any thread before the loop runs: the timers. */
void kh_accept_init(kh_worker *w);
/* On the worker's thread: polls every listener. Returns 0, or -1 with a message in err. */
int kh_accept_open(kh_worker *w, char *err, size_t errlen);
/* Stops accepting for good: closes the listeners (their fds too) and the timers. Idempotent;
 * safe when kh_accept_open never ran. */
void kh_accept_close(kh_worker *w);
/* kh_conn calls it when one of w's connections has been freed: a pause for want of fds or at
 * the connection limit ends now. One branch when not paused. */
void kh_accept_on_conn_closed(kh_worker *w);
/* Frees what kh_accept_open allocated (kh_worker_join, after the loop closed). */
void kh_accept_free(kh_worker *w);

#endif
