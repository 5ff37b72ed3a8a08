/* kh_timer.h: fixed-duration timeout queues, 24-byte entries embedded in their owners; and a
 * variable-deadline queue (kh_dtimeq) for owners whose next deadline changes all the time (a
 * QUIC connection: ngtcp2_conn_get_expiry after every packet).
 * Owns:  nothing but list links; the owner (a conn) embeds the kh_timer and is told by callback.
 * Why:   every connection timeout (header, keep-alive, body, write) has one duration per worker, so
 *        appending at the tail keeps each queue sorted by deadline: insert, remove and expiry are
 *        O(1), and one uv_timer_t per worker drives them all, where a uv_timer_t per connection
 *        would cost 152 bytes of the ~500-byte idle-connection budget. */
#ifndef KH_TIMER_H
#define KH_TIMER_H

#include <stdint.h>

typedef struct kh_timer kh_timer;
typedef struct kh_timeq kh_timeq;
typedef void (*kh_timer_cb)(kh_timer *t);

struct kh_timer {
    kh_timer *prev, *next; /* NULL when not queued */
    uint64_t deadline;     /* loop time in ms */
};

struct kh_timeq {
    kh_timer head; /* sentinel of a circular list */
    uint64_t timeout_ms;
    kh_timer_cb cb;
};

void kh_timeq_init(kh_timeq *q, uint64_t timeout_ms, kh_timer_cb cb);
/* (Re)queues t at the tail with deadline now + q->timeout_ms. */
void kh_timeq_add(kh_timeq *q, kh_timer *t, uint64_t now);
void kh_timer_remove(kh_timer *t);
static inline int kh_timer_active(const kh_timer *t)
{
    return t->next != 0;
}
/* Calls cb for (and removes) every entry whose deadline is <= now. The callback may re-queue or
 * free its entry's owner. */
void kh_timeq_expire(kh_timeq *q, uint64_t now);
/* Calls cb for (and removes) the n oldest entries, whatever their deadline (a timeout brought
 * forward: kh_accept closes idle keep-alive connections early at the `connections` limit).
 * Returns how many it called. */
int kh_timeq_expire_oldest(kh_timeq *q, int n);
/* Earliest deadline in q, or UINT64_MAX when empty. */
uint64_t kh_timeq_next(const kh_timeq *q);

/* Variable deadlines: a binary min-heap of pointers to entries embedded in their owners, so
 * set (insert or move), cancel and expiry are O(log n) whatever the order of the deadlines.
 * The worker drives it with a uv_timer_t armed at the earliest deadline (kh_worker.h). */
typedef struct kh_dtimer kh_dtimer;
typedef void (*kh_dtimer_cb)(kh_dtimer *t);
struct kh_dtimer {
    uint64_t deadline; /* loop time in ms */
    uint32_t idx;      /* 1 + its index in the heap; 0 when not queued */
    kh_dtimer_cb cb;
};
typedef struct kh_dtimeq {
    kh_dtimer **heap;
    uint32_t n, cap;
} kh_dtimeq;

void kh_dtimeq_free(kh_dtimeq *q);
/* (Re)queues t with this deadline; t->cb runs once it has passed. */
void kh_dtimer_set(kh_dtimeq *q, kh_dtimer *t, uint64_t deadline);
void kh_dtimer_cancel(kh_dtimeq *q, kh_dtimer *t);
static inline int kh_dtimer_active(const kh_dtimer *t)
{
    return t->idx != 0;
}
/* Calls cb for (and removes) every entry whose deadline is <= now; a callback may set any
 * entry again (one set to <= now runs in the same call). */
void kh_dtimeq_expire(kh_dtimeq *q, uint64_t now);
/* Earliest deadline, or UINT64_MAX when empty. */
static inline uint64_t kh_dtimeq_next(const kh_dtimeq *q)
{
    return q->n ? q->heap[0]->deadline : UINT64_MAX;
}

#endif
