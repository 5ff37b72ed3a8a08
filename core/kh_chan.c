/* kh_chan.c: see kh_chan.h. A mutex-protected singly linked list: posters push at the tail under
 * the lock, the owner swaps the whole list out under the lock and walks it without it, so the
 * lock is never held while a message is handled. */
#include "kh_chan.h"

#include "kh_err.h"

static void async_cb(uv_async_t *a)
{
    kh_chan_drain(a->data);
}

int kh_chan_init(kh_chan *ch, uv_loop_t *loop, kh_chan_cb cb, void *data)
{
    ch->head = ch->tail = NULL;
    ch->closed = 0;
    ch->cb = cb;
    ch->data = data;
    ch->received = 0;
    int r = uv_mutex_init(&ch->mu);
    if (r != 0)
        return r;
    r = uv_async_init(loop, &ch->async, async_cb);
    if (r != 0) {
        uv_mutex_destroy(&ch->mu);
        return r;
    }
    ch->async.data = ch;
    uv_unref((uv_handle_t *)&ch->async);
    return 0;
}

int kh_chan_post(kh_chan *ch, kh_chan_msg *m)
{
    m->next = NULL;
    uv_mutex_lock(&ch->mu);
    if (ch->closed) {
        uv_mutex_unlock(&ch->mu);
        if (m->dispose)
            m->dispose(m);
        return KH_ECLOSED;
    }
    int was_empty = ch->head == NULL;
    if (ch->tail)
        ch->tail->next = m;
    else
        ch->head = m;
    ch->tail = m;
    /* uv_async_send coalesces; sending under the lock keeps close from racing the handle */
    if (was_empty)
        uv_async_send(&ch->async);
    uv_mutex_unlock(&ch->mu);
    return 0;
}

void kh_chan_drain(kh_chan *ch)
{
    uv_mutex_lock(&ch->mu);
    kh_chan_msg *m = ch->head;
    ch->head = ch->tail = NULL;
    uv_mutex_unlock(&ch->mu);
    while (m) {
        kh_chan_msg *next = m->next;
        ch->received++;
        ch->cb(ch, m);
        m = next;
    }
}

void kh_chan_close(kh_chan *ch)
{
    uv_mutex_lock(&ch->mu);
    if (ch->closed) {
        uv_mutex_unlock(&ch->mu);
        return;
    }
    ch->closed = 1;
    kh_chan_msg *m = ch->head;
    ch->head = ch->tail = NULL;
    uv_mutex_unlock(&ch->mu);
    while (m) {
        kh_chan_msg *next = m->next;
        if (m->dispose)
            m->dispose(m);
        m = next;
    }
    uv_close((uv_handle_t *)&ch->async, NULL);
}

void kh_chan_destroy(kh_chan *ch)
{
    uv_mutex_destroy(&ch->mu);
}
