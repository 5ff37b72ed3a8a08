/* test_timer.c: fixed-duration timeout queues stay sorted, remove is O(1) and idempotent, and
 * an expiry callback may re-queue its own entry. */
#include "kh_test.h"
#include "kh_timer.h"

static int fired[8];
static kh_timer entries[8];
static kh_timeq *requeue_q;

static void on_expire(kh_timer *t)
{
    int i = (int)(t - entries);
    fired[i]++;
    if (requeue_q && i == 0 && fired[0] == 1)
        kh_timeq_add(requeue_q, t, 1000);
}

int main(void)
{
    kh_timeq q;
    kh_timeq_init(&q, 100, on_expire);
    kh_is_int(kh_timeq_next(&q), UINT64_MAX, "an empty queue has no deadline");
    kh_timeq_add(&q, &entries[0], 0);
    kh_timeq_add(&q, &entries[1], 10);
    kh_timeq_add(&q, &entries[2], 20);
    kh_is_int(kh_timeq_next(&q), 100, "the head is the earliest deadline");
    kh_ok(kh_timer_active(&entries[1]), "a queued entry is active");
    kh_timer_remove(&entries[1]);
    kh_timer_remove(&entries[1]);
    kh_ok(!kh_timer_active(&entries[1]), "remove twice is harmless");
    kh_timeq_expire(&q, 99);
    kh_is_int(fired[0] + fired[2], 0, "nothing fires before its deadline");
    kh_timeq_expire(&q, 110);
    kh_is_int(fired[0], 1, "the first entry fired");
    kh_is_int(fired[2], 0, "the later entry did not");
    kh_timeq_add(&q, &entries[2], 200); /* re-adding moves it to the tail with a new deadline */
    kh_is_int(kh_timeq_next(&q), 300, "re-adding restarts the clock");

    kh_subtest("a callback may re-queue its entry");
    kh_timeq q2;
    kh_timeq_init(&q2, 50, on_expire);
    requeue_q = &q2;
    fired[0] = 0;
    kh_timeq_add(&q2, &entries[0], 0);
    kh_timeq_expire(&q2, 60);
    kh_is_int(fired[0], 1, "fired once");
    kh_ok(kh_timer_active(&entries[0]), "and is queued again");
    kh_is_int(kh_timeq_next(&q2), 1050, "with its new deadline");
    kh_timeq_expire(&q2, 2000);
    kh_is_int(fired[0], 2, "then fires again");
    return kh_test_done();
}
