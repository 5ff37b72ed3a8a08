/* test_timer.c: fixed-duration timeout queues stay sorted, remove is O(1) and idempotent, and
 * an expiry callback may re-queue its own entry; the variable-deadline heap expires in deadline
 * order whatever the order of set, moves and cancels. */
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

#define DN 200
static kh_dtimer dts[DN];
static int dfired, dorder_ok = 1;
static uint64_t dlast;

static void on_dexpire(kh_dtimer *t)
{
    if (t->deadline < dlast)
        dorder_ok = 0;
    dlast = t->deadline;
    dfired++;
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

    kh_subtest("variable deadlines: order, moves, cancels");
    kh_dtimeq dq = {0};
    kh_is_int(kh_dtimeq_next(&dq), UINT64_MAX, "an empty heap has no deadline");
    uint64_t pseudo = 12345;
    for (int i = 0; i < DN; i++) {
        pseudo = pseudo * 6364136223846793005ull + 1442695040888963407ull;
        dts[i].cb = on_dexpire;
        kh_dtimer_set(&dq, &dts[i], (pseudo >> 33) % 1000);
    }
    kh_dtimer_set(&dq, &dts[3], 2000); /* moved later */
    kh_dtimer_set(&dq, &dts[4], 0);    /* moved earlier */
    kh_dtimer_cancel(&dq, &dts[5]);
    kh_dtimer_cancel(&dq, &dts[5]);
    kh_ok(!kh_dtimer_active(&dts[5]), "cancel twice is harmless");
    kh_is_int(kh_dtimeq_next(&dq), 0, "the moved-earlier entry is first");
    kh_dtimeq_expire(&dq, 999);
    kh_is_int(dfired, DN - 2, "all but the cancelled and the moved-later fired");
    kh_ok(dorder_ok, "in deadline order");
    kh_ok(kh_dtimer_active(&dts[3]), "the moved-later one waits");
    kh_dtimeq_expire(&dq, 2000);
    kh_is_int(dfired, DN - 1, "then fires");
    kh_is_int(dq.n, 0, "the heap is empty");
    kh_dtimeq_free(&dq);
    return kh_test_done();
}
