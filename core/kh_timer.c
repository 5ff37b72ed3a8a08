/* kh_timer.c: see kh_timer.h (fixed-duration queues, then the variable-deadline heap). */
#include "kh_timer.h"

#include <stddef.h>
#include <stdlib.h>

#include "kh_common.h"

void kh_timeq_init(kh_timeq *q, uint64_t timeout_ms, kh_timer_cb cb)
{
    q->head.prev = q->head.next = &q->head;
    q->head.deadline = 0;
    q->timeout_ms = timeout_ms;
    q->cb = cb;
}

void kh_timer_remove(kh_timer *t)
{
    if (t->next == NULL)
        return;
    t->prev->next = t->next;
    t->next->prev = t->prev;
    t->prev = t->next = NULL;
}

void kh_timeq_add(kh_timeq *q, kh_timer *t, uint64_t now)
{
    kh_timer_remove(t);
    t->deadline = now + q->timeout_ms;
    t->prev = q->head.prev;
    t->next = &q->head;
    q->head.prev->next = t;
    q->head.prev = t;
}

void kh_timeq_expire(kh_timeq *q, uint64_t now)
{
    while (q->head.next != &q->head && q->head.next->deadline <= now) {
        kh_timer *t = q->head.next;
        kh_timer_remove(t);
        q->cb(t);
    }
}

int kh_timeq_expire_oldest(kh_timeq *q, int n)
{
    int done = 0;
    while (done < n && q->head.next != &q->head) {
        kh_timer *t = q->head.next;
        kh_timer_remove(t);
        q->cb(t);
        done++;
    }
    return done;
}

uint64_t kh_timeq_next(const kh_timeq *q)
{
    return q->head.next == &q->head ? UINT64_MAX : q->head.next->deadline;
}

/* ---- variable deadlines: a binary min-heap ---- */

static void put(kh_dtimeq *q, uint32_t i, kh_dtimer *t)
{
    q->heap[i] = t;
    t->idx = i + 1;
}

static void sift_up(kh_dtimeq *q, uint32_t i)
{
    kh_dtimer *t = q->heap[i];
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (q->heap[parent]->deadline <= t->deadline)
            break;
        put(q, i, q->heap[parent]);
        i = parent;
    }
    put(q, i, t);
}

static void sift_down(kh_dtimeq *q, uint32_t i)
{
    kh_dtimer *t = q->heap[i];
    for (;;) {
        uint32_t l = 2 * i + 1, m = i;
        uint64_t best = t->deadline;
        if (l < q->n && q->heap[l]->deadline < best) {
            m = l;
            best = q->heap[l]->deadline;
        }
        if (l + 1 < q->n && q->heap[l + 1]->deadline < best)
            m = l + 1;
        if (m == i)
            break;
        put(q, i, q->heap[m]);
        i = m;
    }
    put(q, i, t);
}

void kh_dtimeq_free(kh_dtimeq *q)
{
    for (uint32_t i = 0; i < q->n; i++)
        q->heap[i]->idx = 0;
    free(q->heap);
    q->heap = NULL;
    q->n = q->cap = 0;
}

void kh_dtimer_cancel(kh_dtimeq *q, kh_dtimer *t)
{
    if (t->idx == 0)
        return;
    uint32_t i = t->idx - 1;
    t->idx = 0;
    kh_dtimer *last = q->heap[--q->n];
    if (i == q->n)
        return;
    put(q, i, last);
    sift_up(q, i);
    sift_down(q, last->idx - 1);
}

void kh_dtimer_set(kh_dtimeq *q, kh_dtimer *t, uint64_t deadline)
{
    if (t->idx) {
        uint32_t i = t->idx - 1;
        t->deadline = deadline;
        sift_up(q, i);
        sift_down(q, t->idx - 1);
        return;
    }
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 64;
        q->heap = kh_xrealloc(q->heap, q->cap * sizeof *q->heap);
    }
    t->deadline = deadline;
    put(q, q->n++, t);
    sift_up(q, q->n - 1);
}

void kh_dtimeq_expire(kh_dtimeq *q, uint64_t now)
{
    while (q->n && q->heap[0]->deadline <= now) {
        kh_dtimer *t = q->heap[0];
        kh_dtimer_cancel(q, t);
        t->cb(t);
    }
}
