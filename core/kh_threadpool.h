/* kh_threadpool.h: a bounded job queue served by M pthreads, each with opaque state of its own.
 * Owns:  the queue (bounded: capacity jobs at most), the threads and their states (made by
 *        init_thread on the pool thread, freed there by close_thread).
 * In:    kh_threadpool_submit from worker threads; never blocks: a full queue is KH_EFULL.
 * Out:   each job's run() on a pool thread, then the job posted to its reply mailbox (kh_chan),
 *        where the owning worker receives it. A job whose owner gave up (abandoned) still runs
 *        or is skipped, and is still posted back: only the owner frees jobs it receives.
 * Never: touches a worker's loop; shares a job with two threads at once (ownership moves from
 *        the submitter to the queue, to one pool thread, to the reply mailbox). */
#ifndef KH_THREADPOOL_H
#define KH_THREADPOOL_H

#include <stdatomic.h>
#include <stdint.h>

#include "kh_chan.h"

typedef struct kh_threadpool kh_threadpool;
typedef struct kh_job kh_job;

struct kh_job {
    kh_chan_msg msg; /* first: the job travels back as a mailbox message (msg.dispose) */
    void (*run)(kh_job *j, void *thread_state);
    kh_chan *reply_to;
    atomic_int abandoned; /* set by the owner: skip run() if not started, drop the result */
    uint64_t queued_ns, started_ns, done_ns; /* uv_hrtime stamps, for the bench and the log */
};

typedef void *(*kh_threadpool_init_cb)(void *ud, int index);
typedef void (*kh_threadpool_close_cb)(void *ud, void *thread_state);

/* A pool of nthreads threads, started by the first kh_threadpool_submit (not here: start-up
 * does not pay for threads an app may never use); each calls init_thread(ud, i) first (a NULL
 * state is allowed). capacity bounds the jobs queued and not yet started. Returns NULL on bad
 * arguments. */
kh_threadpool *kh_threadpool_new(int nthreads, uint32_t capacity, kh_threadpool_init_cb init,
                                 kh_threadpool_close_cb close, void *ud);
/* Any thread. 0: queued (the pool owns j until it is posted to j->reply_to). KH_EFULL: the
 * queue is full; KH_ECLOSED: the pool is stopping; KH_ENOMEM: no thread could be started (the
 * first submit starts them and may wait for that, as may a submit racing with it); on error the
 * caller still owns j. */
int kh_threadpool_submit(kh_threadpool *p, kh_job *j);
/* Jobs queued and not yet started (for tests and stats). */
uint32_t kh_threadpool_pending(kh_threadpool *p);
int kh_threadpool_threads(const kh_threadpool *p);
/* Threads running: 0 until the first submit (for tests). */
int kh_threadpool_started(kh_threadpool *p);
/* Stops: refuses new jobs, disposes of queued ones (msg.dispose), lets running ones finish and
 * post back, joins the threads if they were ever started (each frees its state) and frees the
 * pool. */
void kh_threadpool_free(kh_threadpool *p);

#endif
