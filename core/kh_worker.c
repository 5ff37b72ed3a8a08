/* kh_worker.c: a worker, on its own thread or on main's (see kh_worker.h).
 * Owns:  the loop and everything on it; the order of a loop turn: I/O callbacks, then one
 *        flush pass over dirty connections (uv_prepare, redis's beforeSleep), then poll; the
 *        connection registry (kh_wconn: TCP and QUIC alike) and the timers: fixed-duration
 *        queues on one coarse tick, variable deadlines on a heap with its own uv_timer_t.
 * In:    listening fds, config, stop requests.
 * Out:   connections handed to kh_conn; app init through kh_app_vt; for the supervisor's
 *        watchdog, a heartbeat stamp and the app's slice bracket (kh_worker_watch), read
 *        without locks but for the slice's name, which is copied under `mu` while the app is
 *        open (worker_loop raises app_closing under `mu` before it closes the app); app
 *        instances (kh_app.h): built at load and at each reload (a worker-level mailbox
 *        message), retired ones closed from the prepare phase once unused. */
#include "kh_worker.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kh_conn.h"
#include "kh_err.h"
#include "kh_h3_module.h"
#include "kh_log.h"
#include "kh_out.h"
#include "kh_reqid.h"
#include "kh_router.h"
#include "kh_stream.h"

static void on_timeout_header(kh_timer *t) { kh__conn_on_timer(t, KH_TO_HEADER); }
static void on_timeout_idle(kh_timer *t) { kh__conn_on_timer(t, KH_TO_IDLE); }
static void on_timeout_body(kh_timer *t) { kh__conn_on_timer(t, KH_TO_BODY); }
static void on_timeout_write(kh_timer *t) { kh__conn_on_timer(t, KH_TO_WRITE); }
static void on_timeout_linger(kh_timer *t) { kh__conn_on_timer(t, KH_TO_LINGER); }
static void on_timeout_tls(kh_timer *t) { kh__conn_on_timer(t, KH_TO_TLS_HANDSHAKE); }
static void on_timeout_write_check(kh_timer *t) { kh__conn_on_timer(t, KH_TO_WRITE_CHECK); }
static void on_timeout_tunnel(kh_timer *t) { kh__conn_on_timer(t, KH_TO_TUNNEL); }

void kh_worker_flush_later(kh_worker *w, kh_wconn *wc)
{
    if (wc->in_flush) {
        wc->in_flush = KH_WCONN_FLUSH_DUE; /* DONE: due again */
        return;
    }
    wc->in_flush = KH_WCONN_FLUSH_DUE;
    wc->flush_next = NULL;
    *w->flush_tail = wc;
    w->flush_tail = &wc->flush_next;
}

static void unschedule(kh_worker *w, kh_wconn *wc)
{
    if (!wc->in_flush)
        return;
    kh_wconn **pp = &w->flush_head;
    while (*pp && *pp != wc)
        pp = &(*pp)->flush_next;
    if (*pp == NULL)
        return;
    *pp = wc->flush_next;
    if (w->flush_tail == &wc->flush_next)
        w->flush_tail = pp;
    wc->in_flush = 0;
}

void kh_worker_schedule_flush(kh_worker *w, kh_conn *c)
{
    kh_worker_flush_later(w, &c->wc);
}

void kh_worker_unschedule_flush(kh_worker *w, kh_conn *c)
{
    unschedule(w, &c->wc);
}

void kh_worker_conn_add(kh_worker *w, kh_wconn *wc, const kh_wconn_vt *vt)
{
    wc->vt = vt;
    wc->next = &w->conns;
    wc->prev = w->conns.prev;
    w->conns.prev->next = wc;
    w->conns.prev = wc;
    w->num_conns++;
}

void kh_worker_conn_remove(kh_worker *w, kh_wconn *wc)
{
    /* a close callback runs after this turn's flush pass, but the conn may have been queued
     * again since */
    unschedule(w, wc);
    if (wc->next) { /* (unit tests make connections outside the registry) */
        wc->prev->next = wc->next;
        wc->next->prev = wc->prev;
        wc->prev = wc->next = NULL;
    }
    w->num_conns--;
    kh_accept_on_conn_closed(w); /* a pause for want of fds or at the limit ends now */
    if (w->stopping && w->num_conns == 0)
        uv_async_send(&w->wakeup); /* let the worker finish its stop now */
}

int kh_worker_conn_room(const kh_worker *w)
{
    return !w->stopping && w->num_conns < w->limits->connections;
}

static void dtick_cb(uv_timer_t *t);

/* Arms dtick for the earliest variable deadline, when that changed. */
static void dtick_arm(kh_worker *w)
{
    uint64_t next = kh_dtimeq_next(&w->dtimeq);
    if (next == w->dtick_at)
        return;
    w->dtick_at = next;
    if (next == UINT64_MAX) {
        uv_timer_stop(&w->dtick);
        return;
    }
    uint64_t now = uv_now(&w->loop);
    uv_timer_start(&w->dtick, dtick_cb, next > now ? next - now : 0, 0);
}

static void dtick_cb(uv_timer_t *t)
{
    kh_worker *w = t->data;
    w->dtick_at = UINT64_MAX;
    kh_dtimeq_expire(&w->dtimeq, uv_now(&w->loop));
    dtick_arm(w);
}

void kh_worker_dtimer_set(kh_worker *w, kh_dtimer *t, uint64_t deadline_ms)
{
    kh_dtimer_set(&w->dtimeq, t, deadline_ms);
    dtick_arm(w);
}

void kh_worker_dtimer_cancel(kh_worker *w, kh_dtimer *t)
{
    kh_dtimer_cancel(&w->dtimeq, t);
    dtick_arm(w);
}

static void write_access_log(kh_worker *w)
{
    if (w->access_log.len == 0)
        return;
    /* One write per loop turn. A regular file does not block for long; a full pipe drops lines
     * rather than stall the loop (the fd is O_NONBLOCK when it is a pipe). */
    ssize_t n = write(w->cfg->access_log_fd, w->access_log.base, w->access_log.len);
    (void)n;
    w->access_log.len = 0;
    if (w->access_log.cap > 4 * KH_BUF_BLOCK)
        kh_buf_release(&w->access_log, NULL);
}

static void close_retired(kh_worker *w);

static void flush_cb(uv_prepare_t *p)
{
    kh_worker *w = p->data;
    if (w->retired_idle)
        close_retired(w);
    while (w->flush_head) {
        kh_wconn *wc = w->flush_head;
        w->flush_head = wc->flush_next;
        if (w->flush_head == NULL)
            w->flush_tail = &w->flush_head;
        int due = wc->in_flush == KH_WCONN_FLUSH_DUE;
        wc->in_flush = KH_WCONN_FLUSH_NO;
        if (due)
            wc->vt->flush(wc);
    }
    write_access_log(w);
}

/* ---- app instances ---- */

void kh_app_inst_retain(kh_app_inst *in)
{
    in->users++;
}

void kh_app_inst_release(kh_app_inst *in)
{
    if (--in->users == 0 && in->retired && !in->closed)
        in->w->retired_idle = 1; /* closed from the prepare phase, outside its callbacks */
}

kh_app_inst *kh_worker_inst_find(kh_worker *w, uint32_t gen)
{
    if (gen == 0 || (w->inst && w->inst->gen == gen))
        return w->inst && !w->inst->closed ? w->inst : NULL;
    for (kh_app_inst *in = w->retired; in; in = in->next)
        if (in->gen == gen)
            return in->closed ? NULL : in;
    return NULL;
}

/* Closes an instance's app state. The watchdog may be copying a slice name that is one of its
 * strings: that happens under mu, so the name is cleared under mu first. */
static void inst_close(kh_worker *w, kh_app_inst *in)
{
    if (in->closed)
        return;
    uv_mutex_lock(&w->mu);
    atomic_store_explicit(&w->slice_name, NULL, memory_order_release);
    uv_mutex_unlock(&w->mu);
    in->closed = 1;
    if (in->app)
        w->cfg->app->worker_close(in->app);
    in->app = NULL;
}

static void inst_free(kh_app_inst *in)
{
    if (in->router)
        kh_router_free(in->router);
    free(in);
}

static void close_retired(kh_worker *w)
{
    w->retired_idle = 0;
    kh_app_inst **pp = &w->retired;
    while (*pp) {
        kh_app_inst *in = *pp;
        if (in->users == 0) {
            uint32_t gen = in->gen;
            inst_close(w, in);
            *pp = in->next;
            inst_free(in);
            KH_LOG_INFO("reload: generation %u closed (its last user ended)", gen);
        } else {
            pp = &in->next;
        }
    }
}

/* Builds a new instance on this thread; 0, or -1 with the app's message in err. */
static kh_app_inst *inst_build(kh_worker *w, char *err, size_t errlen)
{
    kh_app_inst *in = kh_xcalloc(1, sizeof *in);
    in->w = w;
    in->gen = w->last_gen + 1;
    in->users = 1; /* the worker's, while it is the current one */
    in->router = kh_router_new();
    void *app = NULL;
    if (w->cfg->app->worker_init(w, in, &app, err, errlen) != 0) {
        inst_free(in);
        return NULL;
    }
    in->app = app;
    w->last_gen = in->gen;
    return in;
}

static void dev_files_update(kh_worker *w)
{
    const char *f = NULL;
    if (w->cfg->dev && w->cfg->app->loaded_files && w->app)
        f = w->cfg->app->loaded_files(w->app);
    char *copy = f ? strdup(f) : NULL;
    uv_mutex_lock(&w->mu);
    free(w->dev_files);
    w->dev_files = copy;
    uv_mutex_unlock(&w->mu);
}

char *kh_worker_loaded_files(kh_worker *w)
{
    uv_mutex_lock(&w->mu);
    char *copy = w->dev_files ? strdup(w->dev_files) : NULL;
    uv_mutex_unlock(&w->mu);
    return copy;
}

/* A reload request: one message per worker, all pointing at one batch. */
typedef struct reload_batch {
    uv_mutex_t mu;
    int pending;
    kh_reload_result r;
    void (*done)(const kh_reload_result *r, void *ud);
    void *ud;
} reload_batch;

typedef struct reload_msg {
    kh_chan_msg base;
    reload_batch *batch;
} reload_msg;

enum { KH_WMSG_RELOAD = KH_MSG_WORKER_BASE + 1 };

static void reload_report(reload_batch *b, int tried, int ok, uint32_t gen, const char *err)
{
    uv_mutex_lock(&b->mu);
    b->r.workers += tried;
    b->r.ok += ok;
    if (gen > b->r.gen)
        b->r.gen = gen;
    if (err && b->r.err[0] == '\0')
        snprintf(b->r.err, sizeof b->r.err, "%s", err);
    int last = --b->pending == 0;
    uv_mutex_unlock(&b->mu);
    if (!last)
        return;
    if (b->done)
        b->done(&b->r, b->ud);
    uv_mutex_destroy(&b->mu);
    free(b);
}

static void reload_dispose(kh_chan_msg *m)
{
    reload_msg *rm = (reload_msg *)m;
    reload_batch *b = rm->batch;
    free(rm);
    reload_report(b, 0, 0, 0, NULL); /* the worker has stopped: it does not count */
}

/* On the worker's thread: a new instance takes over new requests; the old one is retired. */
static void worker_reload(kh_worker *w, reload_msg *rm)
{
    reload_batch *b = rm->batch;
    free(rm);
    if (w->stopping || w->inst == NULL) {
        reload_report(b, 0, 0, 0, NULL);
        return;
    }
    char *err = kh_xmalloc(2048);
    err[0] = '\0';
    kh_app_inst *in = inst_build(w, err, 2048);
    if (in == NULL) {
        KH_LOG_DEBUG("reload failed: %s (generation %u keeps serving)", err, w->inst->gen);
        reload_report(b, 1, 0, 0, err);
        free(err);
        return;
    }
    free(err);
    kh_app_inst *old = w->inst;
    uv_mutex_lock(&w->mu); /* the supervisor's interrupt calls w->app under mu */
    w->inst = in;
    w->app = in->app;
    w->router = in->router;
    uv_mutex_unlock(&w->mu);
    old->retired = 1;
    old->next = w->retired;
    w->retired = old;
    if (w->cfg->app->retire)
        w->cfg->app->retire(old->app);
    KH_LOG_DEBUG("reload: generation %u serves; generation %u has %u users left", in->gen,
                 old->gen, old->users - 1);
    kh_app_inst_release(old); /* the worker's own */
    dev_files_update(w);
    reload_report(b, 1, 1, in->gen, NULL);
}

int kh_worker_reload_all(const kh_config *cfg, void (*done)(const kh_reload_result *r, void *ud),
                         void *ud)
{
    reload_batch *b = kh_xcalloc(1, sizeof *b);
    uv_mutex_init(&b->mu);
    b->pending = cfg->workers + 1; /* +1: ours, until every message is posted */
    b->done = done;
    b->ud = ud;
    if (cfg->code_epoch)
        atomic_fetch_add(cfg->code_epoch, 1);
    for (int i = 0; i < cfg->workers; i++) {
        reload_msg *m = kh_xcalloc(1, sizeof *m);
        m->base.type = KH_WMSG_RELOAD;
        m->base.dispose = reload_dispose;
        m->batch = b;
        kh_worker_post(cfg, i, &m->base);
    }
    reload_report(b, 0, 0, 0, NULL);
    return 0;
}

static void inbox_cb(kh_chan *ch, kh_chan_msg *m)
{
    kh_worker *w = ch->data;
    if (KH_MSG_IS_WORKER(m->type)) {
        if (m->type == KH_WMSG_RELOAD)
            worker_reload(w, (reload_msg *)m);
        else if (m->dispose)
            m->dispose(m);
        return;
    }
    /* an app message goes to the instance of its generation (0: the current one); one for an
     * instance closed since is disposed of */
    kh_app_inst *in = kh_worker_inst_find(w, m->gen);
    if (in && in->app && w->cfg->app->on_message)
        w->cfg->app->on_message(in->app, m);
    else if (m->dispose)
        m->dispose(m);
}

int kh_worker_post(const kh_config *cfg, int to, kh_chan_msg *m)
{
    if (to < 0 || to >= cfg->workers || cfg->all == NULL) {
        if (m->dispose)
            m->dispose(m);
        return KH_EINVAL;
    }
    return kh_chan_post(&cfg->all[to].inbox, m);
}

static void heartbeat_cb(uv_timer_t *t)
{
    kh_worker *w = t->data;
    atomic_store_explicit(&w->alive_ms, uv_hrtime() / 1000000u, memory_order_relaxed);
}

void kh_worker_watch(kh_worker *w, uint64_t now_ms, kh_worker_stall *st)
{
    memset(st, 0, sizeof *st);
    st->done = atomic_load_explicit(&w->done, memory_order_acquire);
    if (st->done)
        return;
    /* a worker that still loads the app has no loop turning yet: not a stall (main serves
     * with the others meanwhile); worker_loop stamps alive_ms when it begins */
    if (w->started && kh_worker_load_state(w) == 0) {
        st->loading = 1;
        return;
    }
    st->alive_ms = atomic_load_explicit(&w->alive_ms, memory_order_relaxed);
    uint64_t due = st->alive_ms + w->heartbeat_ms; /* the next heartbeat of a loop that turns */
    uint64_t late = now_ms > due ? now_ms - due : 0;
    uint64_t t0 = atomic_load_explicit(&w->slice_start_ns, memory_order_acquire);
    if (t0) {
        uint64_t t0_ms = t0 / 1000000u;
        st->slice_ms = now_ms > t0_ms ? now_ms - t0_ms : 0;
        st->slice_seq = atomic_load_explicit(&w->slice_seq, memory_order_relaxed);
        /* the name is the app's (a Lua string): copied only while the app state is open */
        uv_mutex_lock(&w->mu);
        const char *name = atomic_load_explicit(&w->slice_name, memory_order_acquire);
        if (!w->app_closing && name)
            snprintf(st->what, sizeof st->what, "%s", name);
        uv_mutex_unlock(&w->mu);
    }
    st->stalled_ms = st->slice_ms > late ? st->slice_ms : late;
}

int kh_worker_interrupt(kh_worker *w, uint64_t seq, uint64_t ms)
{
    int done = 0;
    uv_mutex_lock(&w->mu);
    if (!w->app_closing && w->app && w->cfg->app->interrupt) {
        w->cfg->app->interrupt(w->app, seq, ms);
        done = 1;
    }
    uv_mutex_unlock(&w->mu);
    return done;
}

int kh_worker_listener_fd(const kh_worker *w, int i)
{
    return w->cfg->listens[i].fds[w->id];
}

static void tick_cb(uv_timer_t *t)
{
    kh_worker *w = t->data;
    uint64_t now = uv_now(&w->loop);
    for (int k = 1; k < KH_TO__COUNT; k++)
        kh_timeq_expire(&w->timeq[k], now);
}

const char *kh_worker_date(kh_worker *w)
{
    time_t now = time(NULL);
    if ((uint64_t)now != w->date_sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(w->date, sizeof w->date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        memcpy(w->date_line, "Date: ", 6);
        memcpy(w->date_line + 6, w->date, 29);
        memcpy(w->date_line + 35, "\r\n", 3);
        w->date_sec = (uint64_t)now;
    }
    return w->date;
}

const char *kh_worker_date_line(kh_worker *w)
{
    kh_worker_date(w);
    return w->date_line;
}

/* nginx escapes '"', '\' and bytes outside printable ASCII as \xHH in access logs. */
static void log_escaped(kh_buf *b, kh_str s)
{
    if (s.len == 0) {
        kh_buf_append(b, NULL, "-", 1);
        return;
    }
    char *out = kh_buf_reserve(b, NULL, s.len * 4);
    size_t o = 0;
    for (size_t i = 0; i < s.len; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch < 0x20 || ch >= 0x7f || ch == '"' || ch == '\\') {
            static const char hex[] = "0123456789ABCDEF";
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        } else {
            out[o++] = (char)ch;
        }
    }
    b->len += o;
}

void kh_worker_access_log(kh_worker *w, const kh_stream *s)
{
    if (w->cfg->access_log_fd < 0)
        return;
    char addr[64], head[256];
    kh_addr_format(&s->peer, addr, sizeof addr);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char when[40];
    strftime(when, sizeof when, "%d/%b/%Y:%H:%M:%S +0000", &tm);
    kh_buf *b = &w->access_log;
    int n = snprintf(head, sizeof head, "%s - - [%s] \"", addr, when);
    kh_buf_append(b, NULL, head, (size_t)n);
    log_escaped(b, s->method);
    kh_buf_append(b, NULL, " ", 1);
    log_escaped(b, kh_stream_target(s));
    n = snprintf(head, sizeof head, " HTTP/%d.%d\" %d %llu \"", s->version_major,
                 s->version_minor, s->status, (unsigned long long)s->bytes_sent);
    kh_buf_append(b, NULL, head, (size_t)n);
    const kh_header *h = kh_stream_header(s, "referer", 7);
    log_escaped(b, h ? h->value : (kh_str){NULL, 0});
    kh_buf_append(b, NULL, "\" \"", 3);
    h = kh_stream_header(s, "user-agent", 10);
    log_escaped(b, h ? h->value : (kh_str){NULL, 0});
    if (w->cfg->access_log_extended) {
        /* nginx's $request_time (seconds, ms resolution) and the request id (kh_reqid.h) */
        uint64_t ms = uv_now(&w->loop) - s->start_ms;
        char id[KH_REQID_MAX];
        size_t il = kh_reqid(s, id);
        n = snprintf(head, sizeof head, "\" %llu.%03llu \"", (unsigned long long)(ms / 1000),
                     (unsigned long long)(ms % 1000));
        kh_buf_append(b, NULL, head, (size_t)n);
        log_escaped(b, (kh_str){id, il});
    }
    kh_buf_append(b, NULL, "\"\n", 2);
}

/* The stop walks go over the registry, so a QUIC connection takes part like a TCP one. Each
 * call may free its own entry (never another), hence `next` is read first. */
static void close_all(kh_worker *w)
{
    for (kh_wconn *wc = w->conns.next, *next; wc != &w->conns; wc = next) {
        next = wc->next;
        wc->vt->close(wc);
    }
}

static void shutdown_all(kh_worker *w)
{
    for (kh_wconn *wc = w->conns.next, *next; wc != &w->conns; wc = next) {
        next = wc->next;
        wc->vt->shutdown(wc);
    }
}

static void finish_stop(kh_worker *w)
{
    /* Everything left on the loop is ours: close it and let uv_run return. */
    close_all(w);
    kh_accept_close(w);
    kh_h3_worker_close(w); /* its connections were closed just above */
    kh_out_reg_close(w); /* idle pooled outbound connections; busy ones close with their owner */
    if (!uv_is_closing((uv_handle_t *)&w->flush_prepare)) {
        /* one last flush for anything queued */
        flush_cb(&w->flush_prepare);
        uv_close((uv_handle_t *)&w->flush_prepare, NULL);
        uv_close((uv_handle_t *)&w->tick, NULL);
        uv_close((uv_handle_t *)&w->grace, NULL);
        uv_close((uv_handle_t *)&w->wakeup, NULL);
        uv_close((uv_handle_t *)&w->heartbeat, NULL);
        uv_close((uv_handle_t *)&w->dtick, NULL);
    }
}

static void grace_cb(uv_timer_t *t)
{
    kh_worker *w = t->data;
    if (w->num_conns)
        KH_LOG_WARN("grace period over: closing %llu connections", (unsigned long long)w->num_conns);
    finish_stop(w);
}

static void wakeup_cb(uv_async_t *a)
{
    kh_worker *w = a->data;
    uv_mutex_lock(&w->mu);
    int stop = w->stop_requested;
    uv_mutex_unlock(&w->mu);
    if (!stop)
        return;
    if (!w->stopping) {
        w->stopping = 1;
        kh_accept_close(w);
        shutdown_all(w);
        uv_timer_start(&w->grace, grace_cb, w->cfg->grace_ms, 0);
    }
    if (w->num_conns == 0)
        finish_stop(w);
}

static void report_ready(kh_worker *w, int status)
{
    uv_mutex_lock(&w->mu);
    w->ready = status;
    uv_cond_signal(&w->cv);
    uv_mutex_unlock(&w->mu);
    if (w->cfg->loaded_async) /* main may serve already: it hears of this load on its loop */
        uv_async_send(w->cfg->loaded_async);
}

/* On the worker's thread: makes the app state and the listeners, then reports ready (1) or
 * failed (-1) to kh_worker_wait_ready. Returns 0 when the app failed to load (the loop only has
 * to close what was opened), 1 otherwise (the loop serves, or closes the app after a failed
 * listen). */
static int worker_load(kh_worker *w)
{
    char name[16];
    snprintf(name, sizeof name, "w%d", w->id);
    kh_log_set_thread_name(name);

    w->inst = inst_build(w, w->load_err, sizeof w->load_err);
    if (w->inst == NULL) {
        w->app = NULL;
        report_ready(w, -1);
        finish_stop(w);
        kh_chan_close(&w->inbox);
        return 0;
    }
    w->app = w->inst->app;
    w->router = w->inst->router;
    dev_files_update(w);

    if (kh_accept_open(w, w->load_err, sizeof w->load_err) == 0 &&
        kh_h3_worker_open(w, w->load_err, sizeof w->load_err) == 0) {
        /* stamped before the watchdog may look (it skips a loading worker): the load's time
         * is not a stall */
        atomic_store_explicit(&w->alive_ms, uv_hrtime() / 1000000u, memory_order_relaxed);
        report_ready(w, 1);
    } else {
        report_ready(w, -1);
        finish_stop(w);
    }
    return 1;
}

/* On the worker's thread: runs the loop until the worker has stopped, then closes the app. */
static void worker_loop(kh_worker *w, int loaded)
{
    char name[16];
    snprintf(name, sizeof name, "w%d", w->id);
    kh_log_set_thread_name(name);
    /* the app's load took its time: the watchdog counts from here */
    atomic_store_explicit(&w->alive_ms, uv_hrtime() / 1000000u, memory_order_relaxed);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    /* it serves no more: the watchdog stops looking (closing the app may take a while) */
    atomic_store_explicit(&w->done, 1, memory_order_release);
    if (!loaded)
        return;

    /* later posts are disposed of by their posters; what is queued is disposed of here */
    kh_chan_close(&w->inbox);
    /* the supervisor reads slice names and interrupts only under mu, while the app is open */
    uv_mutex_lock(&w->mu);
    w->app_closing = 1;
    uv_mutex_unlock(&w->mu);
    /* the current instance, then the retired ones still in use (their users are gone with the
     * connections); the structs stay until kh_worker_join (a late stream release reads them) */
    if (w->inst)
        inst_close(w, w->inst);
    for (kh_app_inst *in = w->retired; in; in = in->next)
        inst_close(w, in);
    w->app = NULL;
    /* close whatever the app left (its timers) and drain */
    kh_out_reg_close(w);
    close_all(w);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    kh_out_reg_free(w);
}

static void worker_main(void *arg)
{
    kh_worker *w = arg;
    worker_loop(w, worker_load(w));
}

/* The loop, its handles and the buffers, on the calling thread (main), before the worker runs. */
static int worker_prepare(kh_worker *w, int id, const kh_config *cfg)
{
    w->id = id;
    w->cfg = cfg;
    w->limits = &cfg->limits;
    uv_mutex_init(&w->mu);
    uv_cond_init(&w->cv);
    int r = uv_loop_init(&w->loop);
    if (r)
        return r;
    w->loop.data = w;
    uv_async_init(&w->loop, &w->wakeup, wakeup_cb);
    w->wakeup.data = w;
    r = kh_chan_init(&w->inbox, &w->loop, inbox_cb, w);
    if (r)
        return r;
    uv_timer_init(&w->loop, &w->heartbeat);
    w->heartbeat.data = w;
    /* a quarter of the shortest stall limit, at most 100 ms: the watchdog's error bound */
    const kh_limits *lim = &cfg->limits;
    uint64_t hb = lim->stall_report_ms;
    if (lim->stall_shed_ms < hb)
        hb = lim->stall_shed_ms;
    if (lim->stall_exit_ms && lim->stall_exit_ms < hb)
        hb = lim->stall_exit_ms;
    hb /= 4;
    w->heartbeat_ms = hb < 10 ? 10 : hb > 100 ? 100 : hb;
    atomic_store_explicit(&w->alive_ms, uv_hrtime() / 1000000u, memory_order_relaxed);
    uv_timer_start(&w->heartbeat, heartbeat_cb, w->heartbeat_ms, w->heartbeat_ms);
    uv_unref((uv_handle_t *)&w->heartbeat);
    w->flush_tail = &w->flush_head;
    w->conns.prev = w->conns.next = &w->conns;
    uv_timer_init(&w->loop, &w->dtick);
    w->dtick.data = w;
    w->dtick_at = UINT64_MAX;
    uv_prepare_init(&w->loop, &w->flush_prepare);
    w->flush_prepare.data = w;
    uv_prepare_start(&w->flush_prepare, flush_cb);
    uv_timer_init(&w->loop, &w->tick);
    w->tick.data = w;
    uv_timer_init(&w->loop, &w->grace);
    w->grace.data = w;
    uv_unref((uv_handle_t *)&w->grace);
    kh_accept_init(w);
    const kh_limits *l = &cfg->limits;
    kh_timeq_init(&w->timeq[KH_TO_HEADER], l->header_timeout_ms, on_timeout_header);
    kh_timeq_init(&w->timeq[KH_TO_IDLE], l->keepalive_timeout_ms, on_timeout_idle);
    kh_timeq_init(&w->timeq[KH_TO_BODY], l->body_timeout_ms, on_timeout_body);
    kh_timeq_init(&w->timeq[KH_TO_WRITE], l->write_timeout_ms, on_timeout_write);
    kh_timeq_init(&w->timeq[KH_TO_LINGER], l->lingering_close_ms, on_timeout_linger);
    kh_timeq_init(&w->timeq[KH_TO_TLS_HANDSHAKE], l->tls_handshake_timeout_ms, on_timeout_tls);
    /* a pending write is checked for progress four times per write_timeout_ms (kh_conn.c) */
    kh_timeq_init(&w->timeq[KH_TO_WRITE_CHECK], l->write_timeout_ms / 4, on_timeout_write_check);
    kh_timeq_init(&w->timeq[KH_TO_TUNNEL], l->tunnel_idle_timeout_ms, on_timeout_tunnel);
    /* One tick drives every timeout queue; a quarter of the shortest timeout keeps the error
     * within 25% without waking an idle worker more than a few times a second. */
    uint64_t shortest = UINT64_MAX;
    for (int k = 1; k < KH_TO__COUNT; k++)
        if (w->timeq[k].timeout_ms && w->timeq[k].timeout_ms < shortest)
            shortest = w->timeq[k].timeout_ms;
    uint64_t tick = shortest / 4;
    if (tick < 10)
        tick = 10;
    if (tick > 1000)
        tick = 1000;
    uv_timer_start(&w->tick, tick_cb, tick, tick);
    uv_unref((uv_handle_t *)&w->tick);
    kh_bufcache_init(&w->bufs, 256);
    w->read_slab = kh_xmalloc(65536);
    return 0;
}

int kh_worker_start(kh_worker *w, int id, const kh_config *cfg)
{
    int r = worker_prepare(w, id, cfg);
    if (r)
        return r;
    r = uv_thread_create(&w->thread, worker_main, w);
    if (r == 0)
        w->started = w->threaded = 1;
    return r;
}

int kh_worker_load_here(kh_worker *w, int id, const kh_config *cfg)
{
    int r = worker_prepare(w, id, cfg);
    if (r) {
        snprintf(w->load_err, sizeof w->load_err, "cannot start worker %d: %s", id, uv_strerror(r));
        w->ready = -1;
        return -1;
    }
    w->started = 1;
    w->loaded = worker_load(w);
    return w->ready > 0 ? 0 : -1;
}

void kh_worker_run_here(kh_worker *w)
{
    worker_loop(w, w->loaded);
}

int kh_worker_load_state(kh_worker *w)
{
    uv_mutex_lock(&w->mu);
    int r = w->ready;
    uv_mutex_unlock(&w->mu);
    return r;
}

int kh_worker_wait_ready(kh_worker *w)
{
    uv_mutex_lock(&w->mu);
    while (w->ready == 0)
        uv_cond_wait(&w->cv, &w->mu);
    int r = w->ready;
    uv_mutex_unlock(&w->mu);
    return r > 0 ? 0 : -1;
}

void kh_worker_request_stop(kh_worker *w)
{
    uv_mutex_lock(&w->mu);
    w->stop_requested = 1;
    uv_mutex_unlock(&w->mu);
    uv_async_send(&w->wakeup);
}

static void free_streams(kh_worker *w)
{
    /* the pools' streams, and every kh_conn (all closed by now), are in the slabs' blocks */
    w->stream_pool = w->compact_pool = NULL;
    kh_stream_arena_drain(w);
    kh_slab_destroy(&w->stream_slab);
    kh_slab_destroy(&w->compact_slab);
    kh_slab_destroy(&w->conn_slab);
}

void kh_worker_join_thread(kh_worker *w)
{
    if (w->started && w->threaded) {
        uv_thread_join(&w->thread);
        w->threaded = 0;
    }
}

void kh_worker_join(kh_worker *w)
{
    if (!w->started)
        return;
    kh_worker_join_thread(w);
    if (w->inst)
        inst_free(w->inst);
    w->inst = NULL;
    w->router = NULL;
    while (w->retired) {
        kh_app_inst *in = w->retired;
        w->retired = in->next;
        inst_free(in);
    }
    free(w->dev_files);
    w->dev_files = NULL;
    int r = uv_loop_close(&w->loop);
    if (r != 0)
        KH_LOG_DEBUG("w%d: loop close: %s", w->id, uv_strerror(r));
    free_streams(w);
    kh_accept_free(w);
    kh_dtimeq_free(&w->dtimeq);
    free(w->read_slab);
    kh_buf_release(&w->access_log, NULL);
    kh_bufcache_destroy(&w->bufs);
    uv_mutex_destroy(&w->mu);
    uv_cond_destroy(&w->cv);
}
