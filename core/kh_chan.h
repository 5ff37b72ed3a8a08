/* kh_chan.h: a cross-thread MPSC mailbox woken by uv_async_t.
 * Owns:  the messages queued in it (until they are handed to the receive callback, or disposed of
 *        when the mailbox is closed); a mutex held only for a list push or swap.
 * In:    kh_chan_post from any thread (pool threads, other workers).
 * Out:   the receive callback, on the owner loop's thread, once per message, in posting order.
 * Never: blocks a poster for longer than a push, or lets a message leak: a post to a closed
 *        mailbox disposes of the message at once (ownership always moves with the message). */
#ifndef KH_CHAN_H
#define KH_CHAN_H

#include <stdint.h>
#include <uv.h>

typedef struct kh_chan_msg kh_chan_msg;
typedef struct kh_chan kh_chan;

/* Message codes: the app's own (kh_app_vt.on_message) are below KH_MSG_WORKER_BASE; the worker's
 * (a reload request, ...) are from it up, handled by kh_worker itself, never passed to an app. */
#define KH_MSG_WORKER_BASE 0x10000
#define KH_MSG_IS_WORKER(type) ((type) >= KH_MSG_WORKER_BASE)

struct kh_chan_msg {
    kh_chan_msg *next;
    int type;                        /* the receiver's own codes (see KH_MSG_WORKER_BASE) */
    uint32_t gen;                    /* the app instance it is for (kh_app_inst.gen); 0: the
                                      * receiver's current one */
    void (*dispose)(kh_chan_msg *m); /* frees m when nobody will receive it */
};

typedef void (*kh_chan_cb)(kh_chan *ch, kh_chan_msg *m);

struct kh_chan {
    uv_async_t async;
    uv_mutex_t mu;
    kh_chan_msg *head, *tail; /* guarded by mu */
    int closed;               /* guarded by mu */
    kh_chan_cb cb;
    void *data;
    uint64_t received; /* owner thread only */
};

/* On the owner's loop, before or after it runs (uv_async_init is safe before uv_run). The async
 * handle is unref'd: a mailbox never keeps a loop alive. */
int kh_chan_init(kh_chan *ch, uv_loop_t *loop, kh_chan_cb cb, void *data);
/* Any thread. Returns 0, or KH_ECLOSED after disposing of m. */
int kh_chan_post(kh_chan *ch, kh_chan_msg *m);
/* Owner thread: refuses later posts, disposes of what is queued, closes the async handle. The
 * kh_chan memory must stay valid (posters may still lock it) until kh_chan_destroy. */
void kh_chan_close(kh_chan *ch);
/* Any thread, once no poster can reach ch any more (after every poster has stopped). */
void kh_chan_destroy(kh_chan *ch);
/* Owner thread: receives everything queued now (the async callback does the same). */
void kh_chan_drain(kh_chan *ch);

#endif
