/* kh_timer.c: see kh_timer.h. */
#include "kh_timer.h"

#include <stddef.h>

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
