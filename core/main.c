/* main.c: the khamsin command: CLI, listening sockets, workers, signals.
 * Owns:  the only process-wide state (config, workers array), all of it read-only for workers.
 * In:    argv, signals.
 * Out:   started workers; exit status 0 after a graceful stop, non-zero when start-up fails.
 * Threads: the main thread parses, binds, then runs worker 0 itself (workers 1..N-1 get threads);
 *        signals and the watchdog run on the supervisor thread, started once worker 0 serves. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "kh_app.h"
#include "kh_limits.h"
#include "kh_log.h"
#include "kh_shdict.h"
#include "kh_threadpool.h"
#include "kh_tls.h"
#include "kh_worker.h"

extern const kh_app_vt kh_lua_app; /* lua/kh_lua.h: the one thing main knows of the binding */

#ifndef KH_VERSION
#define KH_VERSION "0.0.0"
#endif

static kh_config cfg;
static kh_worker *workers;
static int stop_signals;

/* The watchdog (design.md §4: "a worker heartbeat checked by the main thread"): nothing can
 * preempt a Lua loop inside a compiled trace, but main can say which worker is stuck. */
typedef struct watch {
    uint64_t beats, changed_ms;
    int reported;
} watch;
static watch *watches;

static void watchdog_cb(uv_timer_t *t)
{
    uint64_t now = uv_now(t->loop);
    for (int i = 0; i < cfg.workers; i++) {
        watch *wt = &watches[i];
        uint64_t b = kh_worker_beats(&workers[i]);
        if (b != wt->beats) {
            if (wt->reported)
                KH_LOG_WARN("w%d: event loop running again after a stall of %llu ms", i,
                            (unsigned long long)(now - wt->changed_ms));
            wt->beats = b;
            wt->changed_ms = now;
            wt->reported = 0;
        } else if (!wt->reported && now - wt->changed_ms >= cfg.limits.stall_report_ms) {
            wt->reported = 1;
            KH_LOG_WARN("w%d: event loop stalled for %llu ms (blocking code in a handler? use "
                        "k.blocking)",
                        i, (unsigned long long)(now - wt->changed_ms));
        }
    }
}

/* The supervisor: main's own loop (signals, the watchdog) on a thread of its own, since the
 * main thread runs worker 0. It starts SUPERVISOR_DELAY_MS after worker 0 began to serve, not
 * before: where every thread shares one core, starting a thread (~0.3 ms) would delay the
 * first answers. A SIGTERM that comes earlier waits in libuv's signal pipe until then. */
#define SUPERVISOR_DELAY_MS 50
static uv_thread_t supervisor;
static int supervisor_started;

static void supervisor_main(void *arg)
{
    (void)arg;
    kh_log_set_thread_name("main");
    uv_run(uv_default_loop(), UV_RUN_DEFAULT);
}

/* On worker 0's loop (the main thread). */
static void start_supervisor_cb(uv_timer_t *t)
{
    uv_close((uv_handle_t *)t, NULL);
    if (uv_thread_create(&supervisor, supervisor_main, NULL) == 0) {
        supervisor_started = 1;
        return;
    }
    KH_LOG_ERROR("cannot start the supervisor thread: SIGTERM and SIGINT end the process at once "
                 "(no graceful stop), and a stalled worker is not reported");
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
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
            "  --workers N            worker threads, each with its own loop and Lua state\n"
            "                         (default: number of cores; --dev: 1)\n"
            "  --dev                  development mode: Lua tracebacks in 500 pages, one worker\n"
            "  --grace SECONDS        graceful-stop period for in-flight requests (default 5)\n"
            "  --access-log PATH|-    access log in combined format ('-' = stdout)\n"
            "  --access-log-format combined|extended\n"
            "                         extended: combined + request time (s) + \"request id\"\n"
            "  --log-level LEVEL      error | warn | info | debug (default info)\n"
            "  --pool-threads N       k.blocking threads, each with its own Lua state (default:\n"
            "                         number of cores); --pool-queue N jobs queued per thread\n"
            "  --limit NAME=VALUE     set a limit (repeatable); also --NAME-WITH-DASHES VALUE\n"
            "  --print-limits         print every limit with its value and range, then exit\n"
            "  --version, --help\n");
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

/* One SO_REUSEPORT socket per worker, all on the same port: the kernel spreads connections and
 * no accept lock is shared (libuv 1.44 has no UV_TCP_REUSEPORT, so the sockets are ours). They
 * listen from here on; each worker's uv_listen later only starts accepting. */
static int bind_listen(kh_listen_addr *la, int n)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    la->fds = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++)
        la->fds[i] = -1;
    for (int i = 0; i < n; i++) {
        int r;
        if (la->family == AF_INET6) {
            r = uv_ip6_addr(la->host, la->port, (struct sockaddr_in6 *)&ss);
            sl = sizeof(struct sockaddr_in6);
        } else {
            r = uv_ip4_addr(la->host, la->port, (struct sockaddr_in *)&ss);
            sl = sizeof(struct sockaddr_in);
        }
        if (r != 0) {
            fprintf(stderr, "khamsin: --listen %s: not an IP address\n", la->host);
            return -1;
        }
        int fd = socket(la->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        if (fd < 0)
            goto fail;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
            goto fail;
        if (la->family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        la->fds[i] = fd;
        if (bind(fd, (struct sockaddr *)&ss, sl) != 0)
            goto fail;
        /* Listen now, not when the worker calls uv_listen: while the workers load the app, the
         * kernel completes handshakes and queues connections, so a client that connects early is
         * answered as soon as its worker is up instead of being refused and retrying. */
        if (listen(fd, 4096) != 0)
            goto fail;
        if (la->port == 0) {
            struct sockaddr_storage got;
            socklen_t gl = sizeof got;
            getsockname(fd, (struct sockaddr *)&got, &gl);
            la->port = ntohs(la->family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                    : ((struct sockaddr_in *)&got)->sin_port);
        }
        continue;
    fail:
        fprintf(stderr, "khamsin: listen on %s:%d: %s\n", la->host, la->port, strerror(errno));
        return -1;
    }
    return 0;
}

static void on_signal(uv_signal_t *sig, int signum)
{
    stop_signals++;
    if (stop_signals == 1) {
        KH_LOG_INFO("%s: stopping (grace %llu ms)", signum == SIGINT ? "SIGINT" : "SIGTERM",
                    (unsigned long long)cfg.grace_ms);
        for (int i = 0; i < cfg.workers; i++)
            kh_worker_request_stop(&workers[i]);
        uv_stop(sig->loop);
    }
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
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
        if (bind_listen(&listens[i], cfg.workers) != 0) {
            for (int j = 0; j <= i; j++)
                free(listens[j].fds);
            return 1;
        }
    }
    cfg.listens = listens;
    cfg.num_listens = nlisten;

    workers = calloc((size_t)cfg.workers, sizeof *workers);
    watches = calloc((size_t)cfg.workers, sizeof *watches);
    cfg.all = workers;
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
    int failed = 0;
    for (int i = 1; i < cfg.workers; i++) {
        if (kh_worker_start(&workers[i], i, &cfg) != 0) {
            fprintf(stderr, "khamsin: cannot start worker %d\n", i);
            failed = 1;
            break;
        }
    }
    if (!failed && kh_worker_load_here(&workers[0], 0, &cfg) != 0) {
        fprintf(stderr, "khamsin: %s\n", workers[0].load_err);
        failed = 1;
    }
    kh_log_set_thread_name("main");
    for (int i = 1; i < cfg.workers; i++) {
        if (workers[i].started && kh_worker_wait_ready(&workers[i]) != 0) {
            if (!failed)
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
        kh_threadpool_free(cfg.pool);
        for (int i = 0; i < cfg.workers; i++)
            if (workers[i].started)
                kh_chan_destroy(&workers[i].inbox);
        kh_shdict_reg_free(cfg.shdicts);
        free(workers);
        free(watches);
        for (int i = 0; i < nlisten; i++) {
            for (int j = 0; j < cfg.workers; j++)
                if (listens[i].fds[j] >= 0)
                    close(listens[i].fds[j]);
            free(listens[i].fds);
        }
        kh_tls_ctx_free(cfg.tls);
        return 1;
    }
    for (int i = 0; i < nlisten; i++) {
        const char *kind = listens[i].tls ? "tls" : "tcp";
        if (listens[i].family == AF_INET6)
            KH_LOG_INFO("listening on [%s]:%d (%s)", listens[i].host, listens[i].port, kind);
        else
            KH_LOG_INFO("listening on %s:%d (%s)", listens[i].host, listens[i].port, kind);
    }
    KH_LOG_INFO("khamsin %s: %d worker%s serving %s%s", KH_VERSION, cfg.workers,
                cfg.workers == 1 ? "" : "s", cfg.script, cfg.dev ? " (dev)" : "");

    uv_loop_t *loop = uv_default_loop();
    uv_signal_t sigterm, sigint;
    uv_signal_init(loop, &sigterm);
    uv_signal_init(loop, &sigint);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_timer_t watchdog;
    uv_timer_init(loop, &watchdog);
    for (int i = 0; i < cfg.workers; i++)
        watches[i].changed_ms = uv_now(loop);
    uint64_t every = cfg.limits.stall_report_ms / 4;
    uv_timer_start(&watchdog, watchdog_cb, every, every);
    uv_unref((uv_handle_t *)&watchdog);
    /* main's loop above (signals, watchdog) is run by the supervisor thread, which worker 0's
     * loop starts a moment after it begins to serve */
    uv_timer_t later;
    uv_timer_init(&workers[0].loop, &later);
    uv_timer_start(&later, start_supervisor_cb, SUPERVISOR_DELAY_MS, 0);
    uv_unref((uv_handle_t *)&later);
    kh_worker_run_here(&workers[0]); /* until a stop signal has stopped every worker */
    kh_log_set_thread_name("main");
    if (!uv_is_closing((uv_handle_t *)&later)) { /* stopped before it fired: cannot happen today */
        uv_close((uv_handle_t *)&later, NULL);
        uv_run(&workers[0].loop, UV_RUN_DEFAULT);
    }
    if (supervisor_started)
        uv_thread_join(&supervisor);

    for (int i = 0; i < cfg.workers; i++)
        kh_worker_join(&workers[i]);
    /* workers are gone: late pool results are disposed of by their posters */
    kh_threadpool_free(cfg.pool);
    for (int i = 0; i < cfg.workers; i++)
        kh_chan_destroy(&workers[i].inbox);
    kh_shdict_reg_free(cfg.shdicts);
    free(watches);
    uv_close((uv_handle_t *)&watchdog, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
    uv_close((uv_handle_t *)&sigint, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    for (int i = 0; i < nlisten; i++)
        free(listens[i].fds);
    free(workers);
    kh_tls_ctx_free(cfg.tls);
    KH_LOG_INFO("stopped");
    return 0;
}
