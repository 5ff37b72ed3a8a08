/* kh_out_int.h: what the files of the outbound transport share (kh_out.h is the interface):
 * the kh_out and kh_out_reg structures and the kh__out_* functions one file calls in another.
 *   kh_out.c          a connection's life and its operations: close, the operation slot and its
 *                     timer, the writes, the reads and the input buffer, facts and errors
 *   kh_out_connect.c  kh_out_connect: the pool first, else resolve (kh_dns), connect, the next
 *                     address after a refusal, then the TLS handshake when asked
 *   kh_out_pool.c     the per-worker registry, the keep-alive pool (keys, parking, reuse, idle
 *                     timeouts, eviction) and the per-key caps (pool_size, backlog: waiters)
 *   kh_out_tls.c      TLS on a connection: options, the handshake, ciphertext in and out
 * Only these four files include it. */
#ifndef KH_OUT_INT_H
#define KH_OUT_INT_H

#include <netinet/in.h>
#include <stdint.h>
#include <uv.h>

#include "kh_dns.h"
#include "kh_out.h"
#include "kh_tls_client.h"
#include "kh_worker.h"

enum { S_NEW = 0, S_WAITING, S_RESOLVING, S_CONNECTING, S_HANDSHAKE, S_OPEN, S_IDLE, S_CLOSED };
enum { OP_NONE = 0, OP_CONNECT, OP_TLS, OP_WRITE, OP_READ };

#define HOST_MAX 256
#define KEY_MAX 1024
#define READ_CHUNK 16384
/* Reading stays on between operations until this much input waits (then TCP pushes back):
 * stopping and restarting it around every request/reply exchange costs two epoll_ctl calls. */
#define KEEP_READING 65536

/* Connections of one key when the caller caps them (kh_out_target.pool_size): how many are
 * open (idle ones included) and who waits for one (the backlog), oldest first. */
typedef struct kh_out_kpool {
    char key[KEY_MAX];
    int conns, waiting;
    kh_out *wait_head, *wait_tail;
    struct kh_out_kpool *next;
} kpool;

struct kh_out_reg {
    kh_worker *w;
    kh_dns *dns;
    kpool *kpools;
    kh_out *idle_head, *idle_tail; /* the pool, oldest first */
    uint64_t open, idle, connects, reuses, evicted, max_open, max_idle;
    int closing;
};

struct kh_out {
    uv_tcp_t tcp;     /* tcp.data = the worker: kh_worker's handle walks skip it (not a kh_conn) */
    uv_timer_t timer; /* the operation's timeout, or the idle timeout in the pool */
    kh_out_reg *reg;
    int state, op;
    int handles;      /* handles still to close */
    kh_out_cb cb;
    void *arg;
    /* connect */
    struct sockaddr_storage addrs[KH_DNS_MAX_ADDRS];
    int naddr;
    int ai;           /* the address being tried; the next one after a refusal */
    int retrying;     /* tcp is closing to connect again to addrs[ai] */
    kh_dns_req *dreq;
    uv_connect_t creq;
    int deny_private;
    int port;
    char host[HOST_MAX];
    char key[KEY_MAX];
    uint32_t keyhash; /* of key: the pool's scans compare it before the strings */
    const char *pool; /* points into key when the caller named the pool */
    /* TLS */
    kh_tls_client *tls;
    int want_tls;     /* connect then handshake */
    int verify;
    char sni[HOST_MAX];
    char ca[HOST_MAX];
    char alpn[128];
    char alpn_sel[32];
    /* input (plaintext) */
    char *in;
    size_t in_len, in_cap;
    int rmode;
    size_t rn, ready;
    int reading, eof, rerr;
    /* output */
    uv_write_t wreq;
    char *wbuf;
    size_t wbuf_len;
    int wbusy;
    char *pend;
    size_t pend_len, pend_cap;
    size_t op_len, written;
    uv_shutdown_t sreq;
    int shut, broken;
    uint32_t reused;
    kh_out *idle_prev, *idle_next;
    /* a capped key (pool_size): the connection counts in kp->conns; a waiter (S_WAITING, no
     * socket yet) is queued on kp until a connection of the key is parked (handed over to it:
     * `handover`) or closed (then it connects itself) */
    kpool *kp;
    kh_out *wait_next;
    kh_out *handover;
    int woken;        /* a waiter given a slot, its timer set to fire at once */
    uint64_t connect_timeout;
    char errmsg[512];
};

/* The TLS settings as a connection keeps them (and its pool key spells them). */
typedef struct tls_fields {
    char sni[HOST_MAX];
    char ca[HOST_MAX];
    char alpn[128];
    int verify;
} tls_fields;

/* kh_out.c */
void kh__out_close_cb(uv_handle_t *h);
void kh__out_timer_cb(uv_timer_t *t);
/* The operation ends with status; its callback is the last thing the caller does with o. */
void kh__out_op_done(kh_out *o, int status);
void kh__out_start_op(kh_out *o, int op, uint64_t timeout_ms, kh_out_cb cb, void *arg);
/* Undoes kh__out_start_op when the operation could not begin (no callback will come): o is
 * left broken; returns r. */
int kh__out_start_failed(kh_out *o, int r);
/* Queues n bytes for the socket (tries to write them at once); 0 or a UV_E* code. */
int kh__out_send_raw(kh_out *o, const char *p, size_t n);
char *kh__out_in_reserve(kh_out *o, size_t extra);
int kh__out_start_reading(kh_out *o);

/* kh_out_connect.c */
void kh__out_retry_connect(kh_out *o);
int kh__out_open_socket(kh_out *o, char *err, size_t errlen);

/* kh_out_pool.c */
kh_out_reg *kh__out_reg_get(kh_worker *w);
void kh__out_idle_unlink(kh_out *o);
uint32_t kh__out_key_build(char key[KEY_MAX], const char *pool, const char *host, int port,
                           int deny_private, const tls_fields *tf);
void kh__out_make_key(kh_out *o, const char *pool);
void kh__out_pool_take(kh_out *o);
kpool *kh__out_kp_get(kh_out_reg *r, const char *key);
void kh__out_kp_unqueue(kh_out *o);
void kh__out_kp_slot_freed(kpool *kp);
void kh__out_wake_waiter(kh_out *o);

/* kh_out_tls.c */
void kh__out_tls_fields_of(const char *host, const kh_out_tls_opts *t, tls_fields *f);
int kh__out_flush_tls(kh_out *o);
void kh__out_tls_drain(kh_out *o);
int kh__out_tls_begin(kh_out *o);
void kh__out_tls_step(kh_out *o);

#endif
