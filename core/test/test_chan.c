/* test_chan.c: kh_chan: order, coalesced wakeups from many threads, post after close disposes. */
#include <uv.h>

#include "kh_chan.h"
#include "kh_err.h"
#include "kh_test.h"

typedef struct msg {
    kh_chan_msg base;
    int from, seq;
} msg;

static int received, disposed, out_of_order;
static int last_seq[8];

static void dispose(kh_chan_msg *m)
{
    disposed++;
    free(m);
}

static void on_msg(kh_chan *ch, kh_chan_msg *m)
{
    msg *x = (msg *)m;
    if (x->seq != last_seq[x->from] + 1)
        out_of_order++;
    last_seq[x->from] = x->seq;
    received++;
    free(m);
    if (received == 4 * 10000)
        uv_stop(ch->async.loop);
}

static kh_chan ch;

static void poster(void *arg)
{
    int from = (int)(intptr_t)arg;
    for (int i = 1; i <= 10000; i++) {
        msg *m = malloc(sizeof *m);
        m->base.type = 1;
        m->base.dispose = dispose;
        m->from = from;
        m->seq = i;
        kh_chan_post(&ch, &m->base);
    }
}

static void guard_cb(uv_timer_t *t)
{
    uv_stop(t->loop);
}

int main(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    kh_is_int(kh_chan_init(&ch, &loop, on_msg, NULL), 0, "init");

    kh_subtest("4 threads x 10000 messages");
    uv_thread_t th[4];
    for (int i = 0; i < 4; i++)
        uv_thread_create(&th[i], poster, (void *)(intptr_t)i);
    uv_timer_t guard;
    uv_timer_init(&loop, &guard);
    uv_timer_start(&guard, guard_cb, 10000, 0);
    /* the async is unref'd; the guard timer keeps the loop running until all arrived */
    uv_run(&loop, UV_RUN_DEFAULT);
    for (int i = 0; i < 4; i++)
        uv_thread_join(&th[i]);
    kh_chan_drain(&ch);
    kh_is_int(received, 40000, "every message received");
    kh_is_int(out_of_order, 0, "per-sender order kept");
    kh_is_int(disposed, 0, "nothing disposed while open");
    kh_ok(ch.received == 40000, "received counter");

    kh_subtest("close disposes of queued and later messages");
    msg *a = malloc(sizeof *a);
    a->base.dispose = dispose;
    a->from = 5;
    a->seq = 1;
    kh_is_int(kh_chan_post(&ch, &a->base), 0, "queued before close");
    kh_chan_close(&ch);
    kh_is_int(disposed, 1, "the queued message was disposed of");
    msg *b = malloc(sizeof *b);
    b->base.dispose = dispose;
    kh_is_int(kh_chan_post(&ch, &b->base), KH_ECLOSED, "post after close: KH_ECLOSED");
    kh_is_int(disposed, 2, "and the message was disposed of");
    uv_close((uv_handle_t *)&guard, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    kh_chan_destroy(&ch);
    kh_is_int(uv_loop_close(&loop), 0, "loop closes: no handle left");
    return kh_test_done();
}
