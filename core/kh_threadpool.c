/* kh_threadpool.c: see kh_threadpool.h. One mutex and one condition variable over a ring of job
 * pointers. The design asks for "pool queue 64 per thread": the ring holds threads x pool_queue
 * jobs, shared, so an idle thread never waits while another thread's queue is full. The lock is
 * held for one push or pop. A worker never waits on it for longer than that.
 * The threads start on the first submit, not in kh_threadpool_new: most apps never call
 * k.blocking, and starting M threads (each building a Lua state) cost start-up about 0.5 ms.
 * The submit that finds them not started starts them under start_mu; a submit racing with it
 * waits for that once; afterwards `live` is set and submit takes no extra lock. */
#include "kh_threadpool.h"

#include <stdio.h>
#include <stdlib.h>

#include "kh_common.h"
#include "kh_err.h"
#include "kh_log.h"

struct kh_threadpool {
    uv_mutex_t mu;
    uv_cond_t cv;
    kh_job **ring;
    uint32_t cap, head, count;
    int stopping;
    int nthreads;         /* as asked; kh_threadpool_threads reports it even before the start */
    int started;          /* threads running (guarded by start_mu) */
    atomic_int live;      /* 1 once started: submit's fast path reads only this */
    uv_mutex_t start_mu;  /* held while starting the threads, and by free while joining */
    uv_thread_t *threads;
    kh_threadpool_init_cb init;
    kh_threadpool_close_cb close;
    void *ud;
    int next_index; /* guarded by mu: the index each thread takes at start */
};

static void thread_main(void *arg)
{
    kh_threadpool *p = arg;
    uv_mutex_lock(&p->mu);
    int index = p->next_index++;
    uv_mutex_unlock(&p->mu);
    char name[16];
    snprintf(name, sizeof name, "pool%d", index);
    kh_log_set_thread_name(name);
    void *state = p->init ? p->init(p->ud, index) : NULL;
    for (;;) {
        uv_mutex_lock(&p->mu);
        while (p->count == 0 && !p->stopping)
            uv_cond_wait(&p->cv, &p->mu);
        if (p->count == 0 && p->stopping) {
            uv_mutex_unlock(&p->mu);
            break;
        }
        kh_job *j = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->count--;
        uv_mutex_unlock(&p->mu);
        j->started_ns = uv_hrtime();
        if (!atomic_load(&j->abandoned))
            j->run(j, state);
        j->done_ns = uv_hrtime();
        kh_chan_post(j->reply_to, &j->msg); /* disposes of it if the owner is gone */
    }
    if (p->close)
        p->close(p->ud, state);
}

kh_threadpool *kh_threadpool_new(int nthreads, uint32_t capacity, kh_threadpool_init_cb init,
                                 kh_threadpool_close_cb close, void *ud)
{
    if (nthreads < 1 || capacity < 1)
        return NULL;
    kh_threadpool *p = kh_xcalloc(1, sizeof *p);
    p->cap = capacity;
    p->ring = kh_xcalloc(capacity, sizeof *p->ring);
    p->init = init;
    p->close = close;
    p->ud = ud;
    p->nthreads = nthreads;
    atomic_init(&p->live, 0);
    uv_mutex_init(&p->mu);
    uv_cond_init(&p->cv);
    uv_mutex_init(&p->start_mu);
    return p;
}

/* Starts the threads once. 0 when they run; KH_ECLOSED when the pool is stopping; KH_ENOMEM
 * when not one could be created (the next submit tries again). */
static int start_threads(kh_threadpool *p)
{
    int r = 0;
    uv_mutex_lock(&p->start_mu);
    if (atomic_load_explicit(&p->live, memory_order_acquire))
        goto out;
    uv_mutex_lock(&p->mu);
    int stopping = p->stopping;
    uv_mutex_unlock(&p->mu);
    if (stopping) {
        r = KH_ECLOSED;
        goto out;
    }
    if (p->threads == NULL)
        p->threads = kh_xcalloc((size_t)p->nthreads, sizeof *p->threads);
    for (int i = p->started; i < p->nthreads; i++) {
        if (uv_thread_create(&p->threads[i], thread_main, p) != 0)
            break;
        p->started++;
    }
    if (p->started == 0) {
        KH_LOG_ERROR("pool: cannot start a thread");
        r = KH_ENOMEM;
        goto out;
    }
    if (p->started < p->nthreads)
        KH_LOG_WARN("pool: started %d of %d threads", p->started, p->nthreads);
    atomic_store_explicit(&p->live, 1, memory_order_release);
out:
    uv_mutex_unlock(&p->start_mu);
    return r;
}

int kh_threadpool_submit(kh_threadpool *p, kh_job *j)
{
    if (KH_UNLIKELY(!atomic_load_explicit(&p->live, memory_order_acquire))) {
        int r = start_threads(p);
        if (r != 0)
            return r;
    }
    j->queued_ns = uv_hrtime();
    uv_mutex_lock(&p->mu);
    if (p->stopping) {
        uv_mutex_unlock(&p->mu);
        return KH_ECLOSED;
    }
    if (p->count == p->cap) {
        uv_mutex_unlock(&p->mu);
        return KH_EFULL;
    }
    p->ring[(p->head + p->count) % p->cap] = j;
    p->count++;
    uv_cond_signal(&p->cv);
    uv_mutex_unlock(&p->mu);
    return 0;
}

uint32_t kh_threadpool_pending(kh_threadpool *p)
{
    uv_mutex_lock(&p->mu);
    uint32_t n = p->count;
    uv_mutex_unlock(&p->mu);
    return n;
}

int kh_threadpool_threads(const kh_threadpool *p)
{
    return p->nthreads;
}

int kh_threadpool_started(kh_threadpool *p)
{
    uv_mutex_lock(&p->start_mu);
    int n = p->started;
    uv_mutex_unlock(&p->start_mu);
    return n;
}

void kh_threadpool_free(kh_threadpool *p)
{
    if (p == NULL)
        return;
    /* start_mu first: a submit starting the threads finishes, and none starts after this */
    uv_mutex_lock(&p->start_mu);
    uv_mutex_lock(&p->mu);
    p->stopping = 1;
    /* queued jobs never start: dispose of them here */
    while (p->count) {
        kh_job *j = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->count--;
        if (j->msg.dispose)
            j->msg.dispose(&j->msg);
    }
    uv_cond_broadcast(&p->cv);
    uv_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) /* none when no job ever came */
        uv_thread_join(&p->threads[i]);
    uv_mutex_unlock(&p->start_mu);
    uv_mutex_destroy(&p->start_mu);
    uv_cond_destroy(&p->cv);
    uv_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->ring);
    free(p);
}
