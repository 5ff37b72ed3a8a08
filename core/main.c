/* main.c: the khamsin command: CLI, listening sockets (made by kh_listen.c), workers, signals.
 * Owns:  the only process-wide state (config, workers array), all of it read-only for workers.
 * In:    argv, signals.
 * Out:   started workers; exit status 0 after a graceful stop, 1 when start-up fails, 2 on a
 *        usage error, 3 (KH_EXIT_FORCED) when a second stop signal or a worker stalled past the
 *        grace period ends it, 4 (KH_EXIT_STALL) when a worker stalled past stall_exit_ms.
 * Threads: the main thread parses, binds, then runs worker 0 itself (workers 1..N-1 get threads);
 *        each worker serves as soon as it has loaded the app, worker 0 too (see loads_check);
 *        signals and the watchdog run on the supervisor thread (created before worker 0 loads);
 *        it also steers new connections away from a stalled worker (reuseport BPF), hears
 *        SIGHUP, and in --dev watches the app's files (kh_watch.c): both reload every worker
 *        (kh_worker_reload_all); the outcome is logged by the worker that finishes last. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "kh_app.h"
#include "kh_h3_module.h"
#include "kh_limits.h"
#include "kh_listen.h"
#include "kh_log.h"
#include "kh_proto.h"
#include "kh_shdict.h"
#include "kh_threadpool.h"
#include "kh_tls.h"
#include "kh_watch.h"
#include "kh_worker.h"

extern const kh_app_vt kh_lua_app; /* lua/kh_lua.h: the one thing main knows of the binding */

#ifndef KH_VERSION
#define KH_VERSION "0.0.0"
#endif

static kh_config cfg;
static kh_worker *workers;
static _Atomic uint32_t code_epoch; /* cfg.code_epoch */

/* Exit codes besides 0 (graceful stop), 1 (start-up failed) and 2 (usage): */
#define KH_EXIT_FORCED 3 /* a second SIGTERM/SIGINT, or a worker still stalled after --grace */
#define KH_EXIT_STALL 4  /* a worker stalled past stall_exit_ms */
/* After the first stop signal, the process exits with KH_EXIT_FORCED if some worker has not
 * stopped this long after the grace period: a worker stops by itself at the end of --grace, so
 * one that has not is stalled. */
#define STOP_MARGIN_MS 1000

/* The watchdog (design.md §4: "a worker heartbeat checked by the main thread"), on the
 * supervisor thread. Each tick (a quarter of the shortest stall limit, 10 to 250 ms) it reads
 * every worker's kh_worker_watch without locks, and:
 *  - stall_report_ms: logs a stalled loop with what it runs ("in GET /spin"), and again when
 *    the loop turns again (its heartbeat stamp moved);
 *  - stall_shed_ms: steers new connections away from the stalled worker (below) until it runs
 *    again;
 *  - handler_interrupt_ms: asks the app to interrupt the slice (kh_worker_interrupt; what Lua
 *    code can be interrupted is in lua/kh_lua_sched.c), again every handler_interrupt_ms while
 *    the same slice runs on;
 *  - stall_exit_ms: logs the worker and what it runs, and _exits with KH_EXIT_STALL, so that a
 *    process manager restarts khamsin (a plain exit code: no core dump, nothing to flush but
 *    log lines, which are written one write(2) each).
 *
 * Shedding. A stalled worker cannot run its own loop, so the supervisor acts on its listening
 * socket. Two ways were probed on Linux 6.x (a test program, three SO_REUSEPORT listeners and
 * 60 connections): (a) a classic BPF program attached to the reuseport group with
 * SO_ATTACH_REUSEPORT_CBPF returns the index of the socket that gets a new connection (the
 * order in which the sockets joined the group, i.e. listen() order: bind_listen listens in
 * worker order, so index = worker id); it steered 60 of 60 away from the excluded socket, and
 * connections already queued on it stayed there until accepted. (b) shutdown(fd, SHUT_RD) on
 * the stalled worker's listener takes it out of the group (listen() again puts it back), but
 * resets the connections queued on it (4 of 20 queued clients were reset in the probe). (a)
 * loses nothing, so it is the one used: the program draws a random number (SKF_AD_RANDOM) and
 * returns healthy[random % healthy_count]; it is attached on any socket of each group, replaced
 * when the set of stalled workers changes, and detached (SO_DETACH_REUSEPORT_BPF, Linux 5.14;
 * older kernels get a program that returns an out-of-range index, which the kernel answers with
 * its own hash choice) when every worker runs again, so that the kernel's hash picks again.
 * Connections the kernel had already queued on the stalled worker's socket stay queued until
 * it runs again (or until the process exits, which resets them). With one worker, or when
 * every worker is stalled, there is nowhere to steer to. From the first stop signal on the
 * program is detached and left alone: the workers close their listeners, which reorders the
 * group. The fds come from kh_worker_listener_fd, whose contract (open and in the group while
 * the worker serves) is the accept path's.
 *
 * Signals. The first SIGTERM/SIGINT starts the graceful stop; a worker stalled at that moment
 * is named, with a hint. A second SIGTERM/SIGINT while some worker has not stopped logs, for
 * each such worker, "worker N stalled N ms in GET /route: exiting now" (or that it is still
 * finishing its requests) and _exits with KH_EXIT_FORCED at once; so does the end of the grace
 * period plus STOP_MARGIN_MS with a worker still running. */
typedef struct watch {
    int reported;      /* the stall was logged */
    int shed;          /* left out of the steering program */
    uint64_t alive_ms; /* heartbeat stamp when the stall was seen: it moves once the loop turns */
    uint64_t since_ms; /* when the stall began (a lower bound) */
    uint64_t irq_seq, irq_at_ms; /* the last interrupt asked: slice and time */
    int irq_count;
} watch;
static watch *watches;
static int stopping;
static uint64_t stop_deadline_ms;
static int steering;      /* a program is attached to the reuseport groups */
static int steer_broken;  /* attaching failed once: shedding is off */
static uv_async_t supervisor_quit;
static uv_async_t loads_async; /* kh_config.loaded_async: a worker's load ended */
static int loads_settled;      /* every worker has loaded (the 'listening' lines are out), or one failed */
static int load_failed;        /* a worker failed to load once worker 0 served: the exit code is 1 */

#ifndef SO_DETACH_REUSEPORT_BPF
#define SO_DETACH_REUSEPORT_BPF 68
#endif

static uint64_t now_ms(void)
{
    return uv_hrtime() / 1000000u;
}

/* Attaches prog (or detaches, prog NULL) on every reuseport group. Returns 0 or an errno. */
static int steer_set(struct sock_fprog *prog)
{
    for (int l = 0; l < cfg.num_listens; l++) {
        int fd = kh_worker_listener_fd(&workers[0], l);
        int r;
        if (prog) {
            r = setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, prog, sizeof *prog);
        } else {
            int zero = 0;
            r = setsockopt(fd, SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, &zero, sizeof zero);
            if (r != 0 && errno != ENOENT) {
                /* before Linux 5.14: an index past the group falls back to the kernel's hash */
                struct sock_filter any[] = {BPF_STMT(BPF_RET | BPF_K, 0xffffffffu)};
                struct sock_fprog p = {1, any};
                r = setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &p, sizeof p);
            } else {
                r = 0;
            }
        }
        if (r != 0)
            return errno;
    }
    return 0;
}

/* New connections to the workers that are not shed (see above). Returns how many get them (0:
 * every worker is stalled, or steering is off). */
static int steer(void)
{
    if (steer_broken || stopping)
        return 0;
    int nh = 0;
    int *healthy = kh_xcalloc((size_t)cfg.workers, sizeof(int));
    for (int i = 0; i < cfg.workers; i++)
        if (!watches[i].shed)
            healthy[nh++] = i;
    int err = 0;
    if (nh == cfg.workers || nh == 0) {
        if (steering)
            err = steer_set(NULL);
        steering = 0;
    } else {
        /* A = random % nh; then one "jeq k / ret healthy[k]" pair per healthy worker */
        size_t n = 2 + 2 * (size_t)(nh - 1) + 1;
        struct sock_filter *code = kh_xcalloc(n, sizeof *code);
        size_t pc = 0;
        code[pc++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                                  (uint32_t)(SKF_AD_OFF + SKF_AD_RANDOM));
        code[pc++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, (uint32_t)nh);
        for (int k = 0; k < nh - 1; k++) {
            code[pc++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)k, 0, 1);
            code[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, (uint32_t)healthy[k]);
        }
        code[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, (uint32_t)healthy[nh - 1]);
        struct sock_fprog prog = {(unsigned short)pc, code};
        err = steer_set(&prog);
        steering = err == 0;
        free(code);
    }
    free(healthy);
    if (err) {
        steer_broken = 1;
        KH_LOG_WARN("cannot steer new connections away from a stalled worker (reuseport BPF: "
                    "%s): stall_shed_ms is off",
                    strerror(err));
        return 0;
    }
    return nh;
}

static const char *stall_what(const kh_worker_stall *st)
{
    return st->what[0] ? st->what : "C code (not in a Lua slice)";
}

/* Any worker that has not stopped: a line each, then _exit(KH_EXIT_FORCED). */
static void forced_exit(const char *why)
{
    uint64_t now = now_ms();
    int left = 0;
    for (int i = 0; i < cfg.workers; i++) {
        kh_worker_stall st;
        kh_worker_watch(&workers[i], now, &st);
        if (st.done)
            continue;
        left++;
        if (st.loading)
            KH_LOG_ERROR("worker %d is still loading the app: exiting now (%s; exit code %d)", i,
                         why, KH_EXIT_FORCED);
        else if (st.stalled_ms >= 2 * workers[i].heartbeat_ms)
            KH_LOG_ERROR("worker %d stalled %llu ms in %s: exiting now (%s; exit code %d)", i,
                         (unsigned long long)st.stalled_ms, stall_what(&st), why, KH_EXIT_FORCED);
        else
            KH_LOG_ERROR("worker %d is still finishing its requests: exiting now (%s; exit code "
                         "%d)",
                         i, why, KH_EXIT_FORCED);
    }
    if (left == 0)
        return; /* every worker has stopped: main is about to exit 0 */
    _exit(KH_EXIT_FORCED);
}

static void watchdog_cb(uv_timer_t *t)
{
    (void)t;
    const kh_limits *lim = &cfg.limits;
    uint64_t now = now_ms();
    for (int i = 0; i < cfg.workers; i++) {
        watch *wt = &watches[i];
        kh_worker_stall st;
        kh_worker_watch(&workers[i], now, &st);
        if (st.done || st.loading)
            continue;
        if ((wt->reported || wt->shed) && st.alive_ms != wt->alive_ms) {
            if (wt->reported)
                KH_LOG_WARN("w%d: event loop running again after a stall of %llu ms", i,
                            (unsigned long long)(now - wt->since_ms));
            int was_shed = wt->shed;
            wt->reported = wt->shed = 0;
            if (was_shed) {
                steer(); /* before the line: a client that reads it finds it done */
                KH_LOG_INFO("w%d: takes new connections again", i);
            }
        }
        if (!wt->reported && !wt->shed) {
            wt->alive_ms = st.alive_ms;
            wt->since_ms = now - st.stalled_ms;
        }
        if (!wt->reported && st.stalled_ms >= lim->stall_report_ms) {
            wt->reported = 1;
            KH_LOG_WARN("w%d: event loop stalled for %llu ms in %s (blocking code in a handler? "
                        "use k.blocking)",
                        i, (unsigned long long)st.stalled_ms, stall_what(&st));
        }
        if (!wt->shed && !stopping && cfg.workers > 1 && !steer_broken &&
            st.stalled_ms >= lim->stall_shed_ms) {
            wt->shed = 1;
            if (steer() > 0)
                KH_LOG_WARN("w%d: no new connections while stalled (%llu ms in %s; over "
                            "stall_shed_ms=%llu): the other workers take them",
                            i, (unsigned long long)st.stalled_ms, stall_what(&st),
                            (unsigned long long)lim->stall_shed_ms);
            else if (!steer_broken)
                KH_LOG_WARN("w%d: stalled %llu ms in %s, and so is every other worker: new "
                            "connections wait",
                            i, (unsigned long long)st.stalled_ms, stall_what(&st));
        }
        if (lim->handler_interrupt_ms && st.slice_ms >= lim->handler_interrupt_ms &&
            (st.slice_seq != wt->irq_seq || now - wt->irq_at_ms >= lim->handler_interrupt_ms)) {
            if (st.slice_seq != wt->irq_seq)
                wt->irq_count = 0;
            else if (++wt->irq_count == 1)
                KH_LOG_WARN("w%d: %s still runs %llu ms after it was interrupted: a loop the JIT "
                            "compiled (not under jit.off) or C code cannot be interrupted, or "
                            "the handler caught the error (then it is raised until it ends)",
                            i, stall_what(&st), (unsigned long long)st.slice_ms);
            wt->irq_seq = st.slice_seq;
            wt->irq_at_ms = now;
            kh_worker_interrupt(&workers[i], st.slice_seq, st.slice_ms);
        }
        if (lim->stall_exit_ms && st.stalled_ms >= lim->stall_exit_ms) {
            KH_LOG_ERROR("worker %d stalled %llu ms in %s: over stall_exit_ms=%llu, exiting (exit "
                         "code %d) so that a process manager restarts khamsin",
                         i, (unsigned long long)st.stalled_ms, stall_what(&st),
                         (unsigned long long)lim->stall_exit_ms, KH_EXIT_STALL);
            _exit(KH_EXIT_STALL);
        }
    }
    if (stopping && now >= stop_deadline_ms)
        forced_exit("still running after the grace period");
}

/* The graceful stop of every worker: the first stop signal, or a worker that failed to load. */
static void stop_all(void)
{
    stopping = 1;
    /* before the workers close their listeners, which reorders the reuseport groups */
    if (steering && steer_set(NULL) == 0)
        steering = 0;
    for (int i = 0; i < cfg.workers; i++)
        kh_worker_request_stop(&workers[i]);
    stop_deadline_ms = now_ms() + cfg.grace_ms + STOP_MARGIN_MS;
}

static void on_signal(int signum)
{
    const char *name = signum == SIGINT ? "SIGINT" : "SIGTERM";
    if (stopping) {
        char why[64];
        snprintf(why, sizeof why, "second stop signal, %s", name);
        forced_exit(why);
        return;
    }
    KH_LOG_INFO("%s: stopping (grace %llu ms)", name, (unsigned long long)cfg.grace_ms);
    stop_all();
    uint64_t now = now_ms();
    uint64_t named = cfg.limits.stall_report_ms < cfg.limits.stall_shed_ms
                         ? cfg.limits.stall_report_ms
                         : cfg.limits.stall_shed_ms;
    for (int i = 0; i < cfg.workers; i++) {
        kh_worker_stall st;
        kh_worker_watch(&workers[i], now, &st);
        if (!st.done && !st.loading && st.stalled_ms >= named)
            KH_LOG_WARN("w%d is stalled %llu ms in %s: it stops only once it runs again; a "
                        "second SIGTERM or SIGINT exits at once (exit code %d)",
                        i, (unsigned long long)st.stalled_ms, stall_what(&st), KH_EXIT_FORCED);
    }
}

/* The 'listening' lines and the 'serving' line: once every worker has loaded. */
static void log_serving(void)
{
    for (int i = 0; i < cfg.num_listens; i++) {
        const kh_listen_addr *l = &cfg.listens[i];
        const char *kind = l->tls ? "tls" : "tcp";
        for (int quic = 0; quic < 2; quic++) {
            if (quic && l->udp_fds == NULL)
                break;
            if (l->family == AF_INET6)
                KH_LOG_INFO("listening on [%s]:%d (%s)", l->host, l->port, quic ? "quic" : kind);
            else
                KH_LOG_INFO("listening on %s:%d (%s)", l->host, l->port, quic ? "quic" : kind);
        }
    }
    KH_LOG_INFO("khamsin %s: %d worker%s serving %s%s", KH_VERSION, cfg.workers,
                cfg.workers == 1 ? "" : "s", cfg.script, cfg.dev ? " (dev)" : "");
}

/* Start-up with several workers. Each worker serves as soon as it has loaded the app: workers
 * 1..N-1 on their threads, and worker 0, on the main thread, without waiting for the others
 * (it did until 2026-12: with the workers loading side by side on one core, as
 * bench/startup.sh pins them, a first connection on worker 0's socket waited for every load).
 * The rule stays: if any worker fails to load, the server exits 1 with its error. A failure
 * known before worker 0 serves takes main's failure path (nothing served). One that comes
 * later (kh_config.loaded_async wakes main's loop, on the supervisor thread, which calls this)
 * prints the error and stops every worker as the first SIGTERM would: what a worker already
 * answered stays answered, requests in flight finish within --grace, new connections are
 * refused (the listeners close), and the exit code is 1. The 'listening' lines, which a
 * process manager or a spec may wait for, still mean that every worker has loaded. Main's
 * thread calls this once before the go; the supervisor's loop only after it. */
static void loads_check(void)
{
    if (loads_settled)
        return;
    int pending = 0;
    for (int i = 1; i < cfg.workers; i++) {
        int st = kh_worker_load_state(&workers[i]);
        if (st < 0) {
            loads_settled = load_failed = 1;
            fprintf(stderr, "khamsin: %s\n", workers[i].load_err);
            KH_LOG_ERROR("worker %d failed to load the app: stopping (exit code 1)", i);
            if (!stopping)
                stop_all();
            return;
        }
        pending |= st == 0;
    }
    if (pending)
        return;
    loads_settled = 1;
    log_serving();
}

static void loads_async_cb(uv_async_t *a)
{
    (void)a;
    loads_check();
}

static void supervisor_quit_cb(uv_async_t *a)
{
    uv_stop(a->loop);
}

/* ---- hot reload: SIGHUP, and the --dev file watch ---- */

static kh_watch *dev_watch;
static uv_async_t dev_refresh; /* a reload ended: the app may load other files now */
static const char *why_reload;  /* "SIGHUP" | "file change": supervisor thread only */

/* On the worker that finished last. */
static void reload_done(const kh_reload_result *r, void *ud)
{
    (void)ud;
    if (r->workers == 0)
        KH_LOG_INFO("reload: no worker is serving");
    else if (r->ok == r->workers)
        KH_LOG_INFO("reload: generation %u on %d worker%s", r->gen, r->workers,
                    r->workers == 1 ? "" : "s");
    else if (r->ok == 0)
        KH_LOG_ERROR("reload failed: %s (the running code keeps serving)", r->err);
    else
        KH_LOG_ERROR("reload: generation %u on %d of %d workers; reload failed on the others: %s",
                     r->gen, r->ok, r->workers, r->err);
    if (cfg.dev)
        uv_async_send(&dev_refresh);
}

static void reload_all(void)
{
    if (stopping)
        return;
    KH_LOG_INFO("reload (%s)", why_reload);
    kh_worker_reload_all(&cfg, reload_done, NULL);
}

static void on_sighup(void)
{
    why_reload = "SIGHUP";
    reload_all();
}

static void dev_changed(void *ud)
{
    (void)ud;
    why_reload = "file change";
    reload_all();
}

/* The directories of the files worker 0's current instance loaded, and the app's own. */
static void dev_watch_update(void)
{
    char *files = kh_worker_loaded_files(&workers[0]);
    char dir[1024];
    const char *slash = strrchr(cfg.script, '/');
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - cfg.script), cfg.script);
    else
        snprintf(dir, sizeof dir, ".");
    int n = kh_watch_set(dev_watch, files, dir[0] ? dir : "/");
    KH_LOG_DEBUG("dev: watching %d director%s", n, n == 1 ? "y" : "ies");
    free(files);
}

static void dev_refresh_cb(uv_async_t *a)
{
    (void)a;
    dev_watch_update();
}

/* The supervisor: main's own loop (signals, the watchdog) on a thread of its own, since the
 * main thread runs worker 0. No worker's stall may keep it from starting, so main creates it
 * before worker 0 loads the app (in parallel with that load where there are cores to spare),
 * with a small stack; it waits for main's go (supervisor_go: the workers are ready and main's
 * loop is set up, the stop signals' handlers installed) and runs that loop. Before the handlers
 * are installed (just before the 'listening' lines) a stop signal has its default action (the
 * process ends at once); after, it waits in libuv's signal pipe until the loop runs. Earlier versions started it from worker
 * 0's loop 50 ms after it began to serve, to keep a thread start off the way to the first
 * answer; but a first request that stalled worker 0 then left the process without a watchdog,
 * and with SIGTERM and SIGINT ignored. It runs until main has joined every worker's thread
 * (supervisor_quit), so that a second signal is heard while a stalled worker keeps the stop
 * from finishing. */
#define SUPERVISOR_STACK (256 * 1024)
static uv_thread_t supervisor;
static int supervisor_started;
static uv_sem_t supervisor_go;
static int supervisor_abort; /* set before the go: start-up failed, return at once */

/* The stop and reload signals (SIGTERM, SIGINT, SIGHUP), heard on main's loop: a plain
 * sigaction handler counts each signal and wakes the loop with uv_async_send (async-signal-safe),
 * and signals_cb, on the supervisor thread, acts on every signal counted, in the order TERM,
 * INT, HUP. libuv's uv_signal_t does the same through a pipe, but takes 5 syscalls to install
 * each handler (its global lock is a pipe read and written, with every signal blocked around
 * it) and as many to remove it: 15 on the way to the first answer where these take 3
 * (bench/lib/startupcounts.py). As with libuv, the handler runs on whichever thread the kernel
 * picks, with every signal blocked and SA_RESTART, and closing restores the default actions. */
static const int stop_signals[3] = {SIGTERM, SIGINT, SIGHUP};
static _Atomic unsigned signals_seen[3];
static uv_async_t signals_async;

static void signals_handler(int signum)
{
    int saved = errno;
    for (int i = 0; i < 3; i++)
        if (stop_signals[i] == signum)
            atomic_fetch_add(&signals_seen[i], 1); /* seq_cst: seen by signals_cb */
    uv_async_send(&signals_async);
    errno = saved;
}

static void signals_cb(uv_async_t *a)
{
    (void)a;
    for (int i = 0; i < 3; i++)
        for (unsigned n = atomic_exchange(&signals_seen[i], 0); n > 0; n--) {
            if (stop_signals[i] == SIGHUP)
                on_sighup();
            else
                on_signal(stop_signals[i]);
        }
}

/* the handlers (handler) or the default actions (SIG_DFL, when main's loop closes) */
static void signals_set(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    for (int i = 0; i < 3; i++)
        (void)sigaction(stop_signals[i], &sa, NULL);
}

static void supervisor_main(void *arg)
{
    (void)arg;
    kh_log_set_thread_name("main");
    uv_sem_wait(&supervisor_go);
    if (supervisor_abort)
        return;
    if (cfg.dev) {
        dev_watch = kh_watch_new(uv_default_loop(), 50, dev_changed, NULL);
        dev_watch_update();
    }
    uv_run(uv_default_loop(), UV_RUN_DEFAULT);
    kh_watch_free(dev_watch); /* main's loop runs once more after the join: frees the handles */
    dev_watch = NULL;
}

static void start_supervisor(void)
{
    uv_thread_options_t opt = {UV_THREAD_HAS_STACK_SIZE, SUPERVISOR_STACK};
    if (uv_thread_create_ex(&supervisor, &opt, supervisor_main, NULL) == 0) {
        supervisor_started = 1;
        return;
    }
    KH_LOG_ERROR("cannot start the supervisor thread: SIGTERM and SIGINT end the process at once "
                 "(no graceful stop), and a stalled worker is not watched");
}

static void *pool_init(void *ud, int index)
{
    const kh_config *c = ud;
    return c->app->pool_thread_init ? c->app->pool_thread_init(c, index) : NULL;
}

static void pool_close(void *ud, void *state)
{
    const kh_config *c = ud;
    if (c->app->pool_thread_close)
        c->app->pool_thread_close(state);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: khamsin [options] app.lua\n"
            "\n"
            "  --listen [SCHEME://]HOST:PORT\n"
            "                         listen address (repeatable; IPv6 as [::1]:8080; port 0 picks a\n"
            "                         free port, logged as 'listening on HOST:PORT (tcp|tls)').\n"
            "                         SCHEME tls:// (or https://) is a TLS listener, tcp:// (or\n"
            "                         http://) a cleartext one; without a scheme the listener is TLS\n"
            "                         when a certificate is configured, cleartext otherwise. So\n"
            "                         --listen :8080 --listen tls://:8443 --tls-cert c --tls-key k\n"
            "                         serves both. Default 0.0.0.0:8080\n"
            "  --tls-cert PEM         certificate chain (leaf first; ECDSA or RSA) for TLS listeners;\n"
            "  --tls-key PEM          and its private key. Repeatable in pairs: the certificate whose\n"
            "                         names match the client's SNI is used, the first pair otherwise\n"
            "  --tls-self-signed      generate an in-memory P-256 certificate for localhost and log the\n"
            "                         base64 SHA-256 of its public key (Chromium's\n"
            "                         --ignore-certificate-errors-spki-list takes it)\n"
            "  --tls12                also accept TLS 1.2 (default: TLS 1.3 only)\n"
            "  --http3                also serve HTTP/3 (QUIC) on each TLS listener's port (UDP),\n"
            "                         advertised to TCP clients with Alt-Svc (module khamsin-h3.so)\n"
            "  --workers N            worker threads, each with its own loop and Lua state\n"
            "                         (default: number of cores; --dev: 1)\n"
            "  --dev                  development mode: error pages with the traceback and source,\n"
            "                         one worker, and a reload when a Lua file of the app changes\n"
            "  --grace SECONDS        graceful-stop period for in-flight requests (default 5)\n"
            "  --access-log PATH|-    access log in combined format ('-' = stdout)\n"
            "  --access-log-format combined|extended\n"
            "                         extended: combined + request time (s) + \"request id\"\n"
            "  --log-level LEVEL      error | warn | info | debug (default info)\n"
            "  --pool-threads N       k.blocking threads, each with its own Lua state (default:\n"
            "                         number of cores); --pool-queue N jobs queued per thread\n"
            "  --limit NAME=VALUE     set a limit (repeatable); also --NAME-WITH-DASHES VALUE\n"
            "  --print-limits         print every limit with its value and range, then exit\n"
            "  --version, --help\n"
            "\n"
            "SIGTERM or SIGINT stops gracefully (exit 0); a second one exits at once (exit 3), as\n"
            "does a worker still stalled after --grace. Exit 4: a worker stalled past\n"
            "stall_exit_ms. Exit 1: start-up failed; 2: usage. SIGHUP reloads the app in every\n"
            "worker (connections stay; a failed load leaves the running code serving).\n");
}

/* "127.0.0.1:8080", "[::1]:0", ":8080" (all IPv4 addresses), "8080", each optionally after
 * "tls://" / "https://" (la->tls = 1) or "tcp://" / "http://" (0); no scheme leaves -1. */
static int parse_listen(const char *arg, kh_listen_addr *la)
{
    const char *colon;
    memset(la, 0, sizeof *la);
    la->tls = -1;
    static const struct {
        const char *prefix;
        int tls;
    } schemes[] = {{"tls://", 1}, {"https://", 1}, {"tcp://", 0}, {"http://", 0}};
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        size_t n = strlen(schemes[i].prefix);
        if (strncmp(arg, schemes[i].prefix, n) == 0) {
            la->tls = schemes[i].tls;
            arg += n;
            break;
        }
    }
    if (arg[0] == '[') {
        const char *end = strchr(arg, ']');
        if (!end || end[1] != ':' || (size_t)(end - arg - 1) >= sizeof la->host)
            return -1;
        memcpy(la->host, arg + 1, (size_t)(end - arg - 1));
        la->family = AF_INET6;
        colon = end + 1;
    } else {
        colon = strrchr(arg, ':');
        if (colon == NULL) {
            snprintf(la->host, sizeof la->host, "0.0.0.0");
            colon = arg - 1;
        } else {
            size_t n = (size_t)(colon - arg);
            if (n >= sizeof la->host)
                return -1;
            memcpy(la->host, arg, n);
            if (n == 0)
                snprintf(la->host, sizeof la->host, "0.0.0.0");
        }
        la->family = AF_INET;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || end == colon + 1 || port < 0 || port > 65535)
        return -1;
    la->port = (int)port;
    return 0;
}

/* Start-up (bench/startup.sh): on the VMs measured a page fault taken by trapping costs 12-30 us,
 * and a page made present by MADV_POPULATE_WRITE 0.5-3 us (bench/lib/prefault_cost.c). From exec to
 * the first answer the main thread touches page after page of two regions it can name here:
 * its stack, ~28 KiB below main's frame (7 faults), and malloc's first heap, the 132 KiB that
 * glibc takes with brk on the first malloc and that worker 0's load fills (10 faults). Both are
 * made present now, with one call each: 41 pages; PARTS=counts bench/startup.sh, exec -> the
 * first request in Lua: 112 -> 102 faults (the rest of the 17 come after it). Where it does
 * not apply (a kernel before 5.14: EINVAL; a malloc that does not use brk, as under ASan) the
 * pages fault in as before. */
#define KH_PREFAULT_STACK (32 * 1024)
#define KH_PREFAULT_HEAP_MAX (256 * 1024)
static void prefault_main_thread(void)
{
#ifdef MADV_POPULATE_WRITE
    char here;
    uintptr_t sp = (uintptr_t)&here & ~(uintptr_t)4095;
    /* the kernel maps 128 KiB of stack below the arguments at exec: this stays inside it */
    (void)madvise((void *)(sp - KH_PREFAULT_STACK), KH_PREFAULT_STACK, MADV_POPULATE_WRITE);
    void *p = malloc(1); /* glibc sets its heap up (brk) on the first call */
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095, brk = (uintptr_t)sbrk(0);
    if (p && a < brk && brk - a <= KH_PREFAULT_HEAP_MAX)
        (void)madvise((void *)a, brk - a, MADV_POPULATE_WRITE);
    free(p);
#endif
}

/* The code and constants of the way to the first answer: the engine's, libuv's and LuaJIT's
 * .text, then their .rodata (the next segment starts with it), which the link puts in one run
 * of pages from kh_cold_text_end to kh_cold_rodata_start, apart from the libraries no start-up
 * runs (cmake/khamsin-startup.ld, KH_STARTUP_LAYOUT: nghttp2 and the compressors). The start-up
 * touches nearly every 64 KiB block of it, each a trapping fault that maps the block's pages
 * (~12 of them after main, 12-18 us each on this VM), so the run is made present with one
 * MADV_POPULATE_READ instead: 248 pages of code in 25-45 us against 175-320 us for 16 faults
 * (bench/lib/populate_read_cost.c). Without the layout (the symbols are then absent), or where
 * the advice is unknown (a kernel before 5.14), nothing is done. */
extern const char kh_cold_text_end[] __attribute__((weak));
extern const char kh_cold_rodata_start[] __attribute__((weak));
static void prefault_code(void)
{
#ifdef MADV_POPULATE_READ
    uintptr_t a = (uintptr_t)kh_cold_text_end, e = (uintptr_t)kh_cold_rodata_start;
    if (a && e > a)
        (void)madvise((void *)(a & ~(uintptr_t)4095), e - (a & ~(uintptr_t)4095), MADV_POPULATE_READ);
#endif
}

int main(int argc, char **argv)
{
    prefault_code();
    prefault_main_thread();
    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, SIG_IGN); /* a reload asked before the supervisor listens does nothing */
    kh_limits_init(&cfg.limits);
    cfg.workers = 0;
    cfg.grace_ms = 5000;
    cfg.access_log_fd = -1;
    cfg.app = &kh_lua_app;
    int print_limits = 0;
    const char *access_log = NULL;
    kh_listen_addr listens[64];
    int nlisten = 0;
    const char *tls_certs[16], *tls_keys[16];
    int ncert = 0, nkey = 0;
    kh_tls_opts tls_opts = {0};
    int http3 = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
#define NEED_VALUE()                                                                               \
    do {                                                                                           \
        if (i + 1 >= argc) {                                                                       \
            fprintf(stderr, "khamsin: %s needs a value\n", a);                                     \
            return 2;                                                                              \
        }                                                                                          \
        v = argv[++i];                                                                             \
    } while (0)
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("khamsin %s (libuv %s)\n", KH_VERSION, uv_version_string());
            return 0;
        } else if (strcmp(a, "--listen") == 0) {
            NEED_VALUE();
            if (nlisten == (int)(sizeof listens / sizeof listens[0]) ||
                parse_listen(v, &listens[nlisten]) != 0) {
                fprintf(stderr, "khamsin: --listen %s: expected HOST:PORT or [IPV6]:PORT\n", v);
                return 2;
            }
            nlisten++;
        } else if (strcmp(a, "--tls-cert") == 0 || strcmp(a, "--tls-key") == 0) {
            NEED_VALUE();
            int is_cert = a[6] == 'c';
            if ((is_cert ? ncert : nkey) == 16) {
                fprintf(stderr, "khamsin: %s: at most 16\n", a);
                return 2;
            }
            if (is_cert)
                tls_certs[ncert++] = v;
            else
                tls_keys[nkey++] = v;
        } else if (strcmp(a, "--tls-self-signed") == 0) {
            tls_opts.self_signed = 1;
        } else if (strcmp(a, "--tls12") == 0) {
            tls_opts.tls12 = 1;
        } else if (strcmp(a, "--http3") == 0) {
            http3 = 1;
        } else if (strcmp(a, "--workers") == 0) {
            NEED_VALUE();
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1024) {
                fprintf(stderr, "khamsin: --workers %s: expected 1 to 1024\n", v);
                return 2;
            }
            cfg.workers = (int)n;
        } else if (strcmp(a, "--dev") == 0) {
            cfg.dev = 1;
        } else if (strcmp(a, "--grace") == 0) {
            NEED_VALUE();
            char *end;
            double g = strtod(v, &end);
            if (*end || g < 0 || g > 3600) {
                fprintf(stderr, "khamsin: --grace %s: expected seconds from 0 to 3600\n", v);
                return 2;
            }
            cfg.grace_ms = (uint64_t)(g * 1000);
        } else if (strcmp(a, "--access-log") == 0) {
            NEED_VALUE();
            access_log = v;
        } else if (strcmp(a, "--access-log-format") == 0) {
            NEED_VALUE();
            if (strcmp(v, "combined") != 0 && strcmp(v, "extended") != 0) {
                fprintf(stderr, "khamsin: --access-log-format %s: expected combined or extended\n", v);
                return 2;
            }
            cfg.access_log_extended = strcmp(v, "extended") == 0;
        } else if (strcmp(a, "--log-level") == 0) {
            NEED_VALUE();
            int lv = kh_log_parse_level(v);
            if (lv < 0) {
                fprintf(stderr, "khamsin: --log-level %s: expected error, warn, info or debug\n", v);
                return 2;
            }
            kh_log_level = lv;
        } else if (strcmp(a, "--print-limits") == 0) {
            print_limits = 1;
        } else if (strcmp(a, "--limit") == 0) {
            NEED_VALUE();
            char name[64], err[256];
            const char *eq = strchr(v, '=');
            if (!eq || (size_t)(eq - v) >= sizeof name) {
                fprintf(stderr, "khamsin: --limit %s: expected NAME=VALUE\n", v);
                return 2;
            }
            memcpy(name, v, (size_t)(eq - v));
            name[eq - v] = '\0';
            if (kh_limits_set(&cfg.limits, name, eq + 1, err, sizeof err) != 0) {
                fprintf(stderr, "khamsin: %s\n", err);
                return 2;
            }
        } else if (strncmp(a, "--", 2) == 0 && kh_limits_is_name(a + 2)) {
            NEED_VALUE();
            char err[256];
            if (kh_limits_set(&cfg.limits, a + 2, v, err, sizeof err) != 0) {
                fprintf(stderr, "khamsin: %s\n", err);
                return 2;
            }
        } else if (a[0] == '-') {
            fprintf(stderr, "khamsin: unknown option %s (see --help)\n", a);
            return 2;
        } else if (cfg.script == NULL) {
            cfg.script = a;
        } else {
            fprintf(stderr, "khamsin: one script only (got %s and %s)\n", cfg.script, a);
            return 2;
        }
#undef NEED_VALUE
    }
    if (print_limits) {
        kh_limits_print(&cfg.limits, stdout);
        return 0;
    }
    if (cfg.script == NULL) {
        usage(stderr);
        return 2;
    }
    if (access(cfg.script, R_OK) != 0) {
        fprintf(stderr, "khamsin: cannot read %s: %s\n", cfg.script, strerror(errno));
        return 1;
    }
    if (cfg.workers == 0)
        cfg.workers = cfg.dev ? 1 : (int)uv_available_parallelism();
    if (nlisten == 0)
        parse_listen("0.0.0.0:8080", &listens[nlisten++]);
    if (ncert != nkey) {
        fprintf(stderr, "khamsin: %d --tls-cert but %d --tls-key: give them in pairs\n", ncert,
                nkey);
        return 2;
    }
    if (ncert && tls_opts.self_signed) {
        fprintf(stderr, "khamsin: --tls-self-signed and --tls-cert exclude each other\n");
        return 2;
    }
    int have_cert = ncert > 0 || tls_opts.self_signed;
    int any_tls = 0;
    for (int i = 0; i < nlisten; i++) {
        if (listens[i].tls < 0)
            listens[i].tls = have_cert;
        if (listens[i].tls && !have_cert) {
            fprintf(stderr, "khamsin: --listen tls://%s:%d needs --tls-cert and --tls-key, or "
                            "--tls-self-signed\n", listens[i].host, listens[i].port);
            return 2;
        }
        any_tls |= listens[i].tls;
    }
    if (any_tls) {
        /* Certificates load here, on the main thread, before any worker runs (design.md §4). */
        char err[1024];
        tls_opts.certs = tls_certs;
        tls_opts.keys = tls_keys;
        tls_opts.num_certs = ncert;
        tls_opts.ticket_rotate_s = cfg.limits.tls_ticket_rotate_s;
        tls_opts.own_records = (int)cfg.limits.tls_own_records;
        cfg.tls = kh_tls_ctx_new(&tls_opts, err, sizeof err);
        if (cfg.tls == NULL) {
            fprintf(stderr, "khamsin: %s\n", err);
            return 1;
        }
        if (tls_opts.self_signed)
            KH_LOG_INFO("tls: self-signed certificate for localhost, 127.0.0.1, ::1; "
                        "SPKI sha256 %s", kh_tls_ctx_spki_sha256(cfg.tls));
        if (http3) {
            /* the same certificate and key as TLS over TCP (kh_tls_ctx_export_pem) */
            cfg.h3 = kh_h3_setup(cfg.tls, err, sizeof err);
            if (cfg.h3 == NULL) {
                fprintf(stderr, "khamsin: %s\n", err);
                return 1;
            }
        }
    } else if (http3) {
        fprintf(stderr, "khamsin: --http3 needs a TLS listener (--tls-cert and --tls-key, or "
                        "--tls-self-signed)\n");
        return 2;
    }
    if (access_log) {
        if (strcmp(access_log, "-") == 0) {
            cfg.access_log_fd = 1;
        } else {
            cfg.access_log_fd = open(access_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            if (cfg.access_log_fd < 0) {
                fprintf(stderr, "khamsin: --access-log %s: %s\n", access_log, strerror(errno));
                return 1;
            }
        }
    }
    for (int i = 0; i < nlisten; i++) {
        if (kh_listen_pair(&listens[i], cfg.workers, cfg.h3 && listens[i].tls) != 0) {
            for (int j = 0; j <= i; j++)
                kh_listen_close(&listens[j], cfg.workers);
            return 1;
        }
    }
    for (int i = 0; i < nlisten; i++)
        if (listens[i].udp_fds) /* after kh_h3_setup registered h3 with kh_proto */
            kh_proto_alt_svc(listens[i].port, listens[i].alt_svc, sizeof listens[i].alt_svc);
    cfg.listens = listens;
    cfg.num_listens = nlisten;

    workers = calloc((size_t)cfg.workers, sizeof *workers);
    watches = calloc((size_t)cfg.workers, sizeof *watches);
    cfg.all = workers;
    cfg.code_epoch = &code_epoch;
    cfg.shdicts = kh_shdict_reg_new();
    int nthreads = cfg.limits.pool_threads ? (int)cfg.limits.pool_threads
                                           : (int)uv_available_parallelism();
    /* its threads (and their Lua states) start with the first k.blocking, not here */
    cfg.pool = kh_threadpool_new(nthreads, (uint32_t)(cfg.limits.pool_queue * (uint64_t)nthreads),
                                 pool_init, pool_close, &cfg);
    if (cfg.pool == NULL) {
        fprintf(stderr, "khamsin: cannot make a pool of %d threads\n", nthreads);
        return 1;
    }
    /* Worker 0 runs on this thread; the others get threads of their own, started first so that
     * on a machine with cores to spare they load the app while this thread loads worker 0.
     * A thread start costs ~0.3 ms and ~10 page faults on a small VM: with one worker, that
     * was all on the way to the first answer. */
    uv_loop_t *loop = uv_default_loop();
    if (cfg.workers > 1) { /* before the workers start: they send it when their load ends */
        uv_async_init(loop, &loads_async, loads_async_cb);
        cfg.loaded_async = &loads_async;
    }
    int failed = 0;
    for (int i = 1; i < cfg.workers; i++) {
        if (kh_worker_start(&workers[i], i, &cfg) != 0) {
            fprintf(stderr, "khamsin: cannot start worker %d\n", i);
            failed = 1;
            break;
        }
    }
    uv_sem_init(&supervisor_go, 0);
    start_supervisor();
    if (!failed && kh_worker_load_here(&workers[0], 0, &cfg) != 0) {
        fprintf(stderr, "khamsin: %s\n", workers[0].load_err);
        failed = 1;
    }
    kh_log_set_thread_name("main");
    /* no wait for the other workers (loads_check): a failure already known is handled here */
    for (int i = 1; !failed && i < cfg.workers; i++) {
        if (workers[i].started && kh_worker_load_state(&workers[i]) < 0) {
            fprintf(stderr, "khamsin: %s\n", workers[i].load_err);
            failed = 1;
        }
    }
    if (failed) {
        for (int i = 0; i < cfg.workers; i++)
            if (workers[i].started)
                kh_worker_request_stop(&workers[i]);
        if (workers[0].started)
            kh_worker_run_here(&workers[0]); /* until it has closed what it opened */
        for (int i = 0; i < cfg.workers; i++)
            kh_worker_join(&workers[i]);
        if (supervisor_started) { /* it only waits for the go */
            supervisor_abort = 1;
            uv_sem_post(&supervisor_go);
            uv_thread_join(&supervisor);
        }
        uv_sem_destroy(&supervisor_go);
        if (cfg.loaded_async) { /* the workers are joined: nothing sends it any more */
            uv_close((uv_handle_t *)&loads_async, NULL);
            uv_run(loop, UV_RUN_DEFAULT);
        }
        kh_threadpool_free(cfg.pool);
        for (int i = 0; i < cfg.workers; i++)
            if (workers[i].started)
                kh_chan_destroy(&workers[i].inbox);
        kh_shdict_reg_free(cfg.shdicts);
        free(workers);
        free(watches);
        for (int i = 0; i < nlisten; i++)
            kh_listen_close(&listens[i], cfg.workers);
        kh_h3_teardown(cfg.h3);
        kh_tls_ctx_free(cfg.tls);
        return 1;
    }
    /* The stop signals are heard from before the first 'listening' line: a supervisor (or a
     * spec) that stops the server as soon as it reads that line gets the graceful stop, not the
     * default action (exit 143). The handlers are installed here; the supervisor thread runs
     * main's loop, which delivers them, from the go below. */
    uv_async_init(loop, &signals_async, signals_cb);
    signals_set(signals_handler);
    loads_check(); /* the 'listening' lines now if every worker has loaded, else later */

    uv_async_init(loop, &supervisor_quit, supervisor_quit_cb);
    uv_async_init(loop, &dev_refresh, dev_refresh_cb);
    uv_unref((uv_handle_t *)&dev_refresh);
    uv_timer_t watchdog;
    uv_timer_init(loop, &watchdog);
    const kh_limits *lim = &cfg.limits;
    uint64_t every = lim->stall_report_ms < lim->stall_shed_ms ? lim->stall_report_ms
                                                               : lim->stall_shed_ms;
    if (lim->stall_exit_ms && lim->stall_exit_ms < every)
        every = lim->stall_exit_ms;
    if (lim->handler_interrupt_ms && lim->handler_interrupt_ms < every)
        every = lim->handler_interrupt_ms;
    every /= 4;
    every = every < 10 ? 10 : every > 250 ? 250 : every;
    uv_timer_start(&watchdog, watchdog_cb, every, every);
    uv_unref((uv_handle_t *)&watchdog);
    /* main's loop above (signals, watchdog) is run by the supervisor thread from now on */
    uv_sem_post(&supervisor_go);
    kh_worker_run_here(&workers[0]); /* until a stop signal has stopped every worker */
    kh_log_set_thread_name("main");
    /* the supervisor watches (and hears signals) until every worker's thread has ended; their
     * memory stays until it has gone too */
    for (int i = 0; i < cfg.workers; i++)
        kh_worker_join_thread(&workers[i]);
    if (supervisor_started) {
        uv_async_send(&supervisor_quit);
        uv_thread_join(&supervisor);
    }
    uv_sem_destroy(&supervisor_go);

    for (int i = 0; i < cfg.workers; i++)
        kh_worker_join(&workers[i]);
    /* workers are gone: late pool results are disposed of by their posters */
    kh_threadpool_free(cfg.pool);
    for (int i = 0; i < cfg.workers; i++)
        kh_chan_destroy(&workers[i].inbox);
    kh_shdict_reg_free(cfg.shdicts);
    free(watches);
    uv_close((uv_handle_t *)&watchdog, NULL);
    uv_close((uv_handle_t *)&supervisor_quit, NULL);
    if (cfg.loaded_async)
        uv_close((uv_handle_t *)&loads_async, NULL);
    signals_set(SIG_DFL); /* before its async handle goes: no handler sends to it after */
    uv_close((uv_handle_t *)&signals_async, NULL);
    uv_close((uv_handle_t *)&dev_refresh, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    for (int i = 0; i < nlisten; i++) {
        /* the workers closed their TCP listeners and their duplicates of the UDP sockets; the
         * UDP sockets themselves stayed in their reuseport group until every worker had
         * stopped (kh_quic.c), so they close only now */
        for (int j = 0; listens[i].udp_fds && j < cfg.workers; j++)
            if (listens[i].udp_fds[j] >= 0)
                close(listens[i].udp_fds[j]);
        free(listens[i].fds);
        free(listens[i].udp_fds);
    }
    free(workers);
    kh_h3_teardown(cfg.h3);
    kh_tls_ctx_free(cfg.tls);
    KH_LOG_INFO("stopped");
    return load_failed ? 1 : 0;
}
