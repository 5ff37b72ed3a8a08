/* test_threadpool.c: kh_threadpool: no thread starts before the first job, jobs run on M
 * threads with their own state, results come back through the mailbox, a full queue is KH_EFULL
 * at once, abandoned jobs are skipped, and freeing the pool disposes of queued jobs. */
#include <uv.h>

#include "kh_chan.h"
#include "kh_err.h"
#include "kh_test.h"
#include "kh_threadpool.h"

typedef struct job {
    kh_job base;
    int value, ran_on, sleep_ms;
} job;

static int inits, closes, received, ran, disposed, want;
static uv_mutex_t mu;
static uv_sem_t gate;
static int gated;

static void *thread_init(void *ud, int index)
{
    uv_mutex_lock(&mu);
    inits++;
    uv_mutex_unlock(&mu);
    int *state = malloc(sizeof *state);
    *state = index;
    return state;
}

static void thread_close(void *ud, void *state)
{
    uv_mutex_lock(&mu);
    closes++;
    uv_mutex_unlock(&mu);
    free(state);
}

static void run(kh_job *j, void *state)
{
    job *x = (job *)j;
    if (gated)
        uv_sem_wait(&gate);
    x->ran_on = *(int *)state;
    x->value *= 2;
    uv_mutex_lock(&mu);
    ran++;
    uv_mutex_unlock(&mu);
}

static void dispose(kh_chan_msg *m)
{
    disposed++;
    free(m);
}

static int sum;

static void on_msg(kh_chan *ch, kh_chan_msg *m)
{
    job *x = (job *)m;
    if (!atomic_load(&x->base.abandoned))
        sum += x->value;
    received++;
    free(x);
    if (received == want)
        uv_stop(ch->async.loop);
}

static job *new_job(kh_chan *ch, int v)
{
    job *j = calloc(1, sizeof *j);
    j->base.msg.dispose = dispose;
    j->base.run = run;
    j->base.reply_to = ch;
    atomic_init(&j->base.abandoned, 0);
    j->value = v;
    return j;
}

static void open_gates(void *arg)
{
    uv_sleep(100);
    for (int i = 0; i < 3; i++)
        uv_sem_post(&gate);
}

static void guard_cb(uv_timer_t *t)
{
    uv_stop(t->loop);
}

int main(void)
{
    uv_mutex_init(&mu);
    uv_sem_init(&gate, 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    kh_chan ch;
    kh_chan_init(&ch, &loop, on_msg, NULL);
    uv_timer_t guard;
    uv_timer_init(&loop, &guard);

    kh_subtest("no thread before the first job; a pool never used frees without any");
    kh_threadpool *idle = kh_threadpool_new(2, 8, thread_init, thread_close, NULL);
    kh_ok(idle != NULL, "pool made");
    kh_is_int(kh_threadpool_threads(idle), 2, "2 threads asked");
    kh_is_int(kh_threadpool_started(idle), 0, "none started");
    kh_threadpool_free(idle);
    kh_is_int(inits + closes, 0, "no thread state was made or freed");

    kh_subtest("3 threads, 100 jobs");
    kh_threadpool *p = kh_threadpool_new(3, 128, thread_init, thread_close, NULL);
    kh_ok(p != NULL, "pool starts");
    kh_is_int(kh_threadpool_threads(p), 3, "3 threads");
    kh_is_int(kh_threadpool_started(p), 0, "not started before the first submit");
    want = 100;
    int expect = 0;
    for (int i = 1; i <= 100; i++) {
        kh_job *j = &new_job(&ch, i)->base;
        if (kh_threadpool_submit(p, j) != 0)
            kh_ok(0, "submit %d", i);
        expect += 2 * i;
    }
    kh_is_int(kh_threadpool_started(p), 3, "the first submit started the 3 threads");
    uv_timer_start(&guard, guard_cb, 10000, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    kh_is_int(received, 100, "every result came back through the mailbox");
    kh_is_int(sum, expect, "results computed on pool threads");
    /* a thread may still be starting if the other two took every job */
    int n_init = 0;
    for (int spin = 0; spin < 1000; spin++) {
        uv_mutex_lock(&mu);
        n_init = inits;
        uv_mutex_unlock(&mu);
        if (n_init == 3)
            break;
        uv_sleep(1);
    }
    kh_is_int(n_init, 3, "one state per thread");

    kh_subtest("a full queue is KH_EFULL at once; abandoned jobs are skipped");
    gated = 1;
    received = 0;
    ran = 0;
    /* 3 jobs block the 3 threads, 128 fill the ring, the next one is refused */
    job *held[3 + 128];
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        held[i] = new_job(&ch, 1);
        ok &= kh_threadpool_submit(p, &held[i]->base) == 0;
    }
    /* wait until the 3 are taken by the threads */
    for (int spin = 0; spin < 1000 && kh_threadpool_pending(p) > 0; spin++)
        uv_sleep(1);
    for (int i = 3; i < 3 + 128; i++) {
        held[i] = new_job(&ch, 1);
        ok &= kh_threadpool_submit(p, &held[i]->base) == 0;
    }
    kh_ok(ok, "131 jobs accepted (3 running + 128 queued)");
    job *extra = new_job(&ch, 1);
    uint64_t t0 = uv_hrtime();
    kh_is_int(kh_threadpool_submit(p, &extra->base), KH_EFULL, "the 132nd: KH_EFULL");
    kh_ok(uv_hrtime() - t0 < 5000000, "refused without waiting (< 5 ms)");
    free(extra);
    for (int i = 3; i < 3 + 128; i++)
        atomic_store(&held[i]->base.abandoned, 1);
    want = 131;
    for (int i = 0; i < 3; i++)
        uv_sem_post(&gate);
    /* the abandoned ones skip run(), so they need no gate */
    uv_timer_start(&guard, guard_cb, 10000, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    kh_is_int(received, 131, "abandoned jobs still come back to their owner");
    kh_is_int(ran, 3, "only the 3 live jobs ran");

    kh_subtest("free disposes of queued jobs and joins");
    gated = 1;
    received = 0;
    for (int i = 0; i < 3; i++)
        kh_threadpool_submit(p, &new_job(&ch, 1)->base);
    for (int spin = 0; spin < 1000 && kh_threadpool_pending(p) > 0; spin++)
        uv_sleep(1);
    for (int i = 0; i < 5; i++)
        kh_threadpool_submit(p, &new_job(&ch, 1)->base);
    /* the gates open 100 ms later, from another thread, once free has disposed of the queue
     * (it does that first, under the lock, then joins) */
    uv_thread_t opener;
    uv_thread_create(&opener, open_gates, NULL);
    kh_threadpool_free(p);
    uv_thread_join(&opener);
    kh_is_int(disposed, 5, "5 queued jobs disposed of");
    kh_is_int(closes, 3, "every thread freed its state");
    kh_chan_drain(&ch);
    kh_is_int(received, 3, "the 3 running jobs were posted back");

    kh_chan_close(&ch);
    uv_close((uv_handle_t *)&guard, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    kh_chan_destroy(&ch);
    kh_is_int(uv_loop_close(&loop), 0, "loop closes");
    uv_sem_destroy(&gate);
    uv_mutex_destroy(&mu);
    return kh_test_done();
}
