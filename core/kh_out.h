/* kh_out.h: outbound TCP connections (optionally TLS) on a worker's loop, for k.socket and the
 * HTTP client. One operation at a time per connection (connect, tls, write or read), each with
 * its own timeout; a keep-alive pool per worker.
 * Owns:  per connection: the uv_tcp_t, a uv_timer_t for the operation's timeout, the plaintext
 *        input buffer (one owner: the kh_out; the caller reads it through kh_out_data and gives
 *        bytes back with kh_out_consume), the bytes of a write still in flight, the TLS client
 *        state (kh_tls_client, in khamsin-tls.so). Per worker (kh_out_reg, made on first use,
 *        closed by kh_out_reg_close when the worker stops): the idle pool, the counts behind
 *        the outbound_sockets / outbound_pool limits, the DNS cache (kh_dns).
 * In:    calls on the worker's thread; socket events, timer expiry, DNS answers.
 * Out:   the operation's callback, once, with 0 or an error code; never from inside a kh_out_*
 *        call (those return "done now" instead), so a caller that yields can tell the two apart.
 * Never: blocks (names resolve through kh_dns, connect is non-blocking); buffers more than
 *        64 KiB of input nobody asked for (between operations reading stays on up to that, then
 *        TCP pushes back; an idle pooled connection is read only to notice that the peer
 *        closed it, or over TLS to take session tickets); lets a uv handle of its own keep a stopping
 *        worker's loop alive (they are unref'd: whoever waits on them is a request, a timer or
 *        a pool entry, each of which has its own end); shares anything with another worker.
 *
 * Interface (the seam for lua/kh_lua_socket.c and the HTTP client):
 *
 *   kh_out *o = kh_out_connect(w, &target, cb, arg, &rc);
 *       rc == 1: o is a pooled connection, ready now (kh_out_reused(o) > 0); no callback.
 *       rc == 0: o is connecting (resolve, TCP connect, then the TLS handshake when
 *                target.tls is set), or waits for a connection of its key (pool_size);
 *                cb(o2, status, arg) follows, where o2 is the connection to use from then on:
 *                o itself, or a parked connection handed over to this waiter (then o is
 *                gone: forget it).
 *       rc < 0 : o == NULL; KH_ELIMIT (outbound_sockets reached and no idle connection to
 *                close), UV_EINVAL... kh_out_strerror(rc, NULL) says why.
 *   rc = kh_out_tls(o, &tls, timeout_ms, cb, arg);   TLS handshake on a connected socket
 *   rc = kh_out_write(o, p, n, timeout_ms, cb, arg); copies p; 1 all sent now, 0 pending
 *   rc = kh_out_read(o, mode, n, timeout_ms, cb, arg); 1 satisfied now, 0 pending
 *       After rc 1 or a callback with status 0: kh_out_data(o, &len) holds the input and
 *       kh_out_ready(o) says how many of its bytes the mode asked for (a line: up to and with
 *       its LF; n bytes: n; ALL: everything up to EOF; SOME: all there is, >= 1). After an error
 *       (KH_ETIMEDOUT, UV_EOF, ...) the partial input is still in kh_out_data. Give bytes back
 *       with kh_out_consume(o, n).
 *   kh_out_cancel(o)            the pending operation ends with no callback (the waiter left)
 *   rc = kh_out_keepalive(o, idle_ms, pool_size)   0: o is the pool's now (forget it);
 *                               < 0: refused (unread input, pending op, closed): still yours
 *   kh_out_close(o)             closes; o is freed later (forget it)
 *
 * Errors: UV_E* (libuv: UV_ECONNREFUSED, UV_EOF for "closed"...) or KH_E* (KH_ETIMEDOUT,
 * KH_ELIMIT, KH_EPROTO for TLS); kh_out_strerror(code, o) gives luasocket's words where it has
 * them ("timeout", "closed", "connection refused") and the TLS reason ("tls: certificate verify
 * failed: self-signed certificate"). Every error except a read timeout leaves the connection
 * unusable: the caller closes it. A read timeout keeps it (luasocket's and OpenResty's rule).
 * Timeouts: milliseconds; KH_OUT_NO_TIMEOUT waits forever.
 * Files: kh_out.c (life, operations, I/O), kh_out_connect.c, kh_out_pool.c (registry, keep-alive
 * pool, per-key caps), kh_out_tls.c; kh_out_int.h is what they share. */
#ifndef KH_OUT_H
#define KH_OUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct kh_worker kh_worker;
typedef struct kh_out kh_out;
typedef struct kh_out_reg kh_out_reg;

#define KH_OUT_NO_TIMEOUT UINT64_MAX

typedef void (*kh_out_cb)(kh_out *o, int status, void *arg);

enum kh_out_read_mode {
    KH_OUT_READ_SOME = 0, /* at least one byte (at most n when n > 0) */
    KH_OUT_READ_LINE = 1, /* up to and with LF */
    KH_OUT_READ_N = 2,    /* exactly n bytes */
    KH_OUT_READ_ALL = 3,  /* until the peer closes */
};

typedef struct kh_out_tls_opts {
    const char *server_name; /* SNI and the name the certificate must match; NULL: the host */
    int verify;              /* 1: check the chain (system store or ca_file) and the name */
    const char *ca_file;     /* PEM bundle to trust instead of the system store; NULL: system */
    const char *alpn;        /* comma-separated protocols to offer ("h2,http/1.1"); NULL: none */
} kh_out_tls_opts;

typedef struct kh_out_target {
    const char *host;         /* name or IP literal ("[::1]" too) */
    int port;
    uint64_t timeout_ms;      /* resolve + connect (+ TLS handshake) */
    const kh_out_tls_opts *tls; /* NULL: cleartext */
    const char *pool;         /* pool key instead of host:port (+TLS settings); NULL: default */
    int deny_private;         /* 1: refuse a host that resolves only to private/loopback addresses */
    int pool_size;            /* > 0: at most this many connections of the key (pooled ones
                               * included); a connect beyond it waits for one to be parked or
                               * closed (OpenResty's pool_size + backlog) */
    int backlog;              /* how many connects may wait so (then KH_EFULL) */
    char *err;                /* optional: why kh_out_connect failed at once (rc < 0) */
    size_t errlen;
} kh_out_target;

kh_out *kh_out_connect(kh_worker *w, const kh_out_target *t, kh_out_cb cb, void *arg, int *rc);
int kh_out_tls(kh_out *o, const kh_out_tls_opts *tls, uint64_t timeout_ms, kh_out_cb cb, void *arg);
int kh_out_write(kh_out *o, const char *p, size_t n, uint64_t timeout_ms, kh_out_cb cb, void *arg);
/* Bytes of the last write the kernel took (after an error: how many went out). */
size_t kh_out_written(const kh_out *o);
int kh_out_read(kh_out *o, int mode, size_t n, uint64_t timeout_ms, kh_out_cb cb, void *arg);
const char *kh_out_data(const kh_out *o, size_t *len);
/* 1 when a read would answer at once without new input: the peer closed, or reading failed. */
int kh_out_input_ended(const kh_out *o);
size_t kh_out_ready(const kh_out *o);
void kh_out_consume(kh_out *o, size_t n);
void kh_out_cancel(kh_out *o);
int kh_out_keepalive(kh_out *o, uint64_t idle_ms, int pool_size);
void kh_out_close(kh_out *o);
/* Half-close: no more writes (FIN after what is queued). */
int kh_out_shutdown(kh_out *o);

/* Facts about a connection. */
int kh_out_reused(const kh_out *o);            /* times it came from the pool */
int kh_out_is_tls(const kh_out *o);
const char *kh_out_alpn(const kh_out *o);      /* negotiated protocol, "" when none */
int kh_out_peer(const kh_out *o, char *ip, size_t iplen, int *port);
int kh_out_setopt(kh_out *o, const char *name, int value); /* "tcp-nodelay", "keepalive" */
const char *kh_out_strerror(int code, const kh_out *o);

/* Resolves host through the worker's DNS cache (kh_dns.h): n >= 1 addresses now (port 0), 0
 * pending (cb later; *req for kh_dns_cancel), or a UV_E* code. */
struct sockaddr_storage;
typedef struct kh_dns_req kh_dns_req;
typedef void (*kh_out_resolve_cb)(void *arg, int status, const struct sockaddr_storage *addrs,
                                  int n);
int kh_out_resolve(kh_worker *w, const char *host, struct sockaddr_storage *out,
                   kh_out_resolve_cb cb, void *arg, kh_dns_req **req);

/* Loads khamsin-tls.so and the client context for (verify, ca_file) now, rather than in the
 * first TLS connection's slice (~50-150 ms once per process: dlopen, OpenSSL's start, the CA
 * store). Any thread; 0 or -1 with a message. */
int kh_out_tls_preload(int verify, const char *ca_file, char *err, size_t errlen);

/* Per worker. */
typedef struct kh_out_stats {
    uint64_t open;      /* open outbound sockets (pooled idle ones included) */
    uint64_t idle;      /* of which idle in the pool */
    uint64_t connects;  /* new TCP connections made */
    uint64_t reuses;    /* connections taken from the pool */
    uint64_t evicted;   /* idle ones closed to make room (pool size, outbound_pool, outbound_sockets) */
    uint64_t dns_hits, dns_lookups;
    uint64_t max_open, max_idle; /* high-water marks */
} kh_out_stats;
void kh_out_stats_get(kh_worker *w, kh_out_stats *st);
/* The worker stops: closes every idle pooled connection; later keepalives close instead. */
void kh_out_reg_close(kh_worker *w);
/* After the loop ended: frees the registry. */
void kh_out_reg_free(kh_worker *w);

#endif
