/* kh_lua_state.c: a worker's lua_State: libraries, module path (khamsin's own modules come from
 * the bytecode built in, kh_lua_modules.c, when there is some), the app script.
 * Owns:  the lua_State of one app instance (created and closed on the worker's thread; a reload
 *        makes another one beside it, kh_app.h), and in --dev the list of files it loaded.
 * In:    worker_init / retire / worker_close from core (kh_app_vt).
 * Out:   routes in the worker's router (through khamsin.core.route); load errors as file:line.
 * Path:  app dir, then $KHAMSIN_LUA_PATH, or the source tree's lua/ (a dev build, while it
 *        exists), or the installed Lua dir (relative to the binary in a KH_RELOCATABLE build:
 *        bin/../share/lua/5.1, as in a LuaRocks tree). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kh_log.h"
#include "kh_lua.h"
#include "kh_lua_internal.h"
#include "kh_lua_modules.h"

/* LuaJIT (as Lua 5.1) paces its incremental collector by allocation checks, not by bytes: a
 * check past the threshold does one step (GCSTEPSIZE x stepmul: ~2,000 units of work, what 1 KiB
 * of small allocations pays) and carries the rest of the debt to the next check. A string C
 * pushes in one allocation, a request body chunk of up to body_window (256 KiB), pays for 1 KiB
 * of it; a loop that moves such chunks (a proxied upload) makes few other checks, and the
 * collector falls behind by as much as the chunks are big, i.e. by timing.
 * spec/http_client_mux_spec.lua's proxy, 50 MB h2c upload (mostly 256 KiB chunks), ASan build:
 * 2 GC cycles, Lua heap up to 36 MB, VmHWM +15..28 MB from run to run (its bound: 25 MB).
 * This pays the string's debt at Lua 5.2's per-byte pace (steps for its size in KiB) once the
 * heap is past what it was when the last cycle a call here finished, plus as much again and at
 * least KH_LUA_GC_SLACK_KB: the collector's own pause (200%) alone made a 50 MB upload's GC
 * work 9x (bench: 100 MB of uploads to a body_reader loop under callgrind, GC functions 7.9 M
 * instructions before, 71 M with 2x, 22.7 M with 1 MiB of slack, 6.9 M with 4 MiB); with it,
 * that spec's heap peaks near 5 MB. */
#define KH_LUA_GC_BIG 4096
#define KH_LUA_GC_SLACK_KB 4096
void kh__lua_gc_paid(kh_lua *K, lua_State *L, size_t n)
{
    if (n < KH_LUA_GC_BIG)
        return;
    int kb = lua_gc(L, LUA_GCCOUNT, 0);
    if (kb < K->gc_live_kb)
        K->gc_live_kb = kb; /* a cycle of the collector's own ended since: the heap is less */
    int slack = K->gc_live_kb > KH_LUA_GC_SLACK_KB ? K->gc_live_kb : KH_LUA_GC_SLACK_KB;
    if (kb - K->gc_live_kb < slack)
        return;
    size_t steps = n >> 10;
    if (lua_gc(L, LUA_GCSTEP, steps > INT32_MAX ? INT32_MAX : (int)steps))
        K->gc_live_kb = lua_gc(L, LUA_GCCOUNT, 0); /* a cycle ended */
}

/* buf: room for a path relative to the binary (KH_RELOCATABLE builds) */
static const char *lua_dir(char *buf, size_t len)
{
    const char *env = getenv("KHAMSIN_LUA_PATH");
    if (env && *env)
        return env;
#ifdef KH_LUA_SRC_DIR
    /* a build tree finds its sources; an installed binary its installed modules */
    struct stat st;
    if (stat(KH_LUA_SRC_DIR "/khamsin.lua", &st) == 0)
        return KH_LUA_SRC_DIR;
#endif
#ifdef KH_LUA_INSTALL_DIR
    /* relative (a KH_RELOCATABLE build, e.g. a LuaRocks tree): against the binary's directory */
    const char *inst = KH_LUA_INSTALL_DIR;
    if (inst[0] == '/')
        return inst;
    char exe[900];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = n > 0 ? (exe[n] = '\0', strrchr(exe, '/')) : NULL;
    if (slash == NULL)
        return inst;
    *slash = '\0';
    snprintf(buf, len, "%s/%s", exe, inst);
    return buf;
#else
    (void)buf;
    (void)len;
    return ".";
#endif
}

void kh__lua_set_path(lua_State *L, const char *script)
{
    char appdir[1024];
    const char *slash = strrchr(script, '/');
    if (slash)
        snprintf(appdir, sizeof appdir, "%.*s", (int)(slash - script), script);
    else
        snprintf(appdir, sizeof appdir, ".");
    char dirbuf[1024];
    const char *dir = lua_dir(dirbuf, sizeof dirbuf);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s/?.lua;%s/?/init.lua;%s", appdir, appdir, dir,
                    dir, lua_tostring(L, -1));
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
}

static int traceback(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    /* an error object with __tostring (k.fail's, an abort) reads as what it says */
    if (msg == NULL && luaL_callmeta(L, 1, "__tostring") && lua_isstring(L, -1))
        msg = lua_tostring(L, -1);
    luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
    return 1;
}

/* --dev: the files the app loaded, for the file watch: the script, then every module of
 * package.loaded found on package.path (khamsin's built-in modules are not files). */
static char *loaded_files_list(lua_State *L, const char *script)
{
    static const char code[] =
        "local script = ...\n"
        "local out, seen = { script }, { [script] = true }\n"
        "local search = package.searchpath\n"
        "if search then\n"
        "  for name in pairs(package.loaded) do\n"
        "    if type(name) == 'string' then\n"
        "      local f = search(name, package.path)\n"
        "      if f and not seen[f] then seen[f] = true; out[#out + 1] = f end\n"
        "    end\n"
        "  end\n"
        "end\n"
        "return table.concat(out, '\\n') .. '\\n'\n";
    int base = lua_gettop(L);
    char *r = NULL;
    if (luaL_loadbuffer(L, code, sizeof code - 1, "=khamsin.dev_files") == 0) {
        lua_pushstring(L, script);
        if (lua_pcall(L, 1, 1, 0) == 0 && lua_isstring(L, -1))
            r = strdup(lua_tostring(L, -1));
    }
    lua_settop(L, base);
    return r;
}

/* Start-up of a state (what the first answer waits for; bench/startup.sh). LuaJIT's own
 * allocator (lj_alloc.c, a dlmalloc) takes its first 128 KiB (DEFAULT_GRANULARITY) of anonymous
 * memory in luaL_newstate and keeps its own state at the start of it: that state is the `ud`
 * lua_getallocf returns. A worker's state fills all of it while khamsin's modules and the app
 * load (~170 KiB allocated by the first request of a hello-world app), one page fault per 4 KiB
 * page touched; faulting the rest in with one MADV_POPULATE_WRITE costs about half as much per
 * page on the VMs measured (12.5 us a fault, 6.7 us a populated page: 27 fewer faults from exec
 * to the first answer). Where that does not hold (LuaJIT with the system allocator: no ud; a
 * kernel before 5.14: EINVAL) the pages fault in as before.
 * The state outgrows that arena by ~50 KiB, which came from a second 128 KiB segment the
 * allocator maps when a request does not fit, page fault by page fault (16 of them). So that
 * segment is made now: one allocation bigger than what is left of the first arena (and below
 * the allocator's 128 KiB threshold for a mapping of its own) makes the allocator map it, and is
 * freed. Then the allocator serves small requests from its free chunk first and from its top
 * last (dlmalloc), and which is which depends on where the kernel put the segment: just below
 * the first arena (what Linux does, top-down; the segments merge) leaves the new 128 KiB as the
 * free chunk and the first arena's rest as the top; just above, or apart, the first arena's
 * rest is used first and the new segment is (or extends) the top. The 128 KiB used first and the
 * first KH_LUA_POPULATE_NEXT bytes of the other are populated: 48 pages, about what a small
 * app's state touches by its first request (bench/startup.sh PARTS=counts). */
#define KH_LUA_ARENA (128 * 1024)
#define KH_LUA_POPULATE_NEXT (64 * 1024)
static void populate_arenas(lua_State *L)
{
#ifdef MADV_POPULATE_WRITE
    void *ud = NULL;
    lua_Alloc f = lua_getallocf(L, &ud);
    uintptr_t a = (uintptr_t)ud;
    if (a == 0 || (a & 4095) > 64) /* not a state just past a page-aligned mapping's start */
        return;
    uintptr_t arena = a & ~(uintptr_t)4095;
    size_t n = KH_LUA_ARENA - 8 * 1024; /* more than is left after the state's own ~12 KiB */
    void *p = f(ud, NULL, 0, n);
    uintptr_t pa = (uintptr_t)p, first = arena, next = 0;
    if (p && (pa & ~(uintptr_t)4095) + KH_LUA_ARENA == arena) {
        first = pa & ~(uintptr_t)4095; /* just below, merged: the new 128 KiB is used first */
        next = arena;
    } else if (p && pa + n > arena + KH_LUA_ARENA) { /* above or apart: the new one is the top */
        next = pa >= arena + KH_LUA_ARENA ? pa & ~(uintptr_t)4095 : arena + KH_LUA_ARENA;
    } /* else: it fit in the first arena (a smaller state), no memory, or a segment apart below
       * (the first arena's rest is used first): the first arena only */
    if (madvise((void *)first, KH_LUA_ARENA, MADV_POPULATE_WRITE) == 0 && next)
        (void)madvise((void *)next, KH_LUA_POPULATE_NEXT, MADV_POPULATE_WRITE);
    if (p)
        f(ud, p, n, 0);
#else
    (void)L;
#endif
}

/* KH_STARTUP_STEPS (a CMake option, off: nothing of it is compiled in otherwise) times each
 * step of worker_init on the wall clock and writes "startup-step NAME MS" on stderr, for
 * bench/startup.sh PARTS=steps: the instruction counts (PARTS=ir) say what a step does, this
 * what it costs here, where one page fault takes as long as ~40,000 instructions (12.5 us
 * measured on these VMs, bench/README.md, start-up). */
#ifdef KH_STARTUP_STEPS
#include <time.h>
static double step_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}
static void step_mark(double *t, const char *name)
{
    double now = step_ms();
    fprintf(stderr, "startup-step %s %.4f\n", name, now - *t);
    *t = step_ms(); /* the write is not the next step's */
}
#define STEP_START(t) double t = step_ms()
#define STEP(t, name) step_mark(&(t), name)
#else
#define STEP_START(t) ((void)0)
#define STEP(t, name) ((void)0)
#endif

static void state_free(kh_lua *K)
{
    kh__lua_close_timers(K);
    kh__lua_irq_put(K); /* first: the interrupt's signal handler forgets this state */
    lua_close(K->L);
    free(K->sh_buf);
    free(K);
}

static int worker_init(kh_worker *w, kh_app_inst *inst, void **app, char *err, size_t errlen)
{
    kh_lua *K = kh_xcalloc(1, sizeof *K);
    K->w = w;
    K->inst = inst;
    K->router = inst->router;
    K->irq = kh__lua_irq_get();
    K->dev = w->cfg->dev;
    K->run_ref = LUA_NOREF;
    STEP_START(t);
    lua_State *L = luaL_newstate();
    if (L == NULL) {
        snprintf(err, errlen, "cannot create a Lua state");
        kh__lua_irq_put(K);
        free(K);
        return -1;
    }
    K->L = L;
    STEP(t, "luaL_newstate");
    populate_arenas(L);
    STEP(t, "populate_arenas");
    /* No collection while khamsin sets its own part of the state up (the libraries, the core
     * functions, khamsin.coroutine, then khamsin itself with khamsin.request, .response and
     * .errors): it makes next to no garbage, and the incremental steps that a young heap's low
     * threshold triggered cost ~180,000 of the ~1.25 M instructions from exec to the first
     * request; khamsin's own modules, when they loaded under the app's require, ran one more
     * cycle (~70,000). Restarted before the app's script runs, with the threshold a finished
     * cycle would have set (LuaJIT: total * pause, i.e. twice the heap). khamsin is loaded
     * before the app's script, as it would be by the app's first require "khamsin" (and by the
     * runner's just after the script, for an app that does not require it): the same modules
     * load, from the same path, only earlier, so they see Lua's own globals even where the app
     * replaced one before its require. */
    lua_gc(L, LUA_GCSTOP, 0);
    luaL_openlibs(L);
    STEP(t, "luaL_openlibs");
    kh__lua_set_path(L, w->cfg->script);
    kh__lua_modules_preload(L);
    kh__lua_open_core(L, K);
    STEP(t, "path+preload+core_table");
    K->live.live_next = K->live.live_prev = &K->live;
    K->event_ref = LUA_NOREF;
    /* user coroutines pass the engine's waits upward (khamsin/coroutine.lua): installed
     * before the script runs, so every coroutine it makes can wait */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "khamsin.coroutine");
    if (lua_pcall(L, 1, 0, 0) != 0) {
        snprintf(err, errlen, "loading khamsin.coroutine: %s", lua_tostring(L, -1));
        state_free(K);
        return -1;
    }
    STEP(t, "require_khamsin.coroutine");
    lua_getglobal(L, "require");
    lua_pushliteral(L, "khamsin");
    if (lua_pcall(L, 1, 0, 0) != 0) {
        snprintf(err, errlen, "loading khamsin: %s", lua_tostring(L, -1));
        state_free(K);
        return -1;
    }
    STEP(t, "require_khamsin");
    lua_gc(L, LUA_GCRESTART, -1);

    lua_pushcfunction(L, traceback);
    int tb = lua_gettop(L);
    /* luaL_loadfile names the chunk "@path", so syntax errors read "path:line: message" */
    if (luaL_loadfile(L, w->cfg->script) != 0 || lua_pcall(L, 0, 0, tb) != 0) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        state_free(K);
        return -1;
    }
    STEP(t, "app_script");
    lua_settop(L, 0);
    /* the runner is resolved once: dispatch pushes it by ref */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "khamsin");
    if (lua_pcall(L, 1, 1, 0) != 0) {
        snprintf(err, errlen, "loading khamsin: %s", lua_tostring(L, -1));
        state_free(K);
        return -1;
    }
    lua_getfield(L, -1, "_run");
    if (!lua_isfunction(L, -1)) {
        snprintf(err, errlen, "khamsin._run is missing");
        state_free(K);
        return -1;
    }
    K->run_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "_event");
    if (!lua_isfunction(L, -1)) {
        snprintf(err, errlen, "khamsin._event is missing");
        state_free(K);
        return -1;
    }
    K->event_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 0);
    STEP(t, "runner_refs");
    if (K->dev)
        K->files = loaded_files_list(L, w->cfg->script);
    *app = K;
    return 0;
}

/* A reload replaced K: its timers and subscriptions stop; requests, deferred replies and
 * sleeping callbacks in flight go on until they end (then core closes it). */
static void worker_retire(void *app)
{
    kh_lua *K = app;
    K->retired = 1;
    kh__lua_retire_timers(K);
}

static const char *worker_loaded_files(void *app)
{
    return ((kh_lua *)app)->files;
}

static void worker_close(void *app)
{
    kh_lua *K = app;
    if (K == NULL)
        return;
    kh__lua_close_defers(K);
    kh__lua_close_cos(K);
    kh__lua_close_timers(K); /* before lua_close: timer handles' __gc look at them */
    kh__lua_irq_put(K);      /* the interrupt's signal handler forgets this state */
    lua_close(K->L);
    free(K->files);
    free(K->sh_buf);
    free(K);
}

const kh_app_vt kh_lua_app = {
    .worker_init = worker_init,
    .worker_close = worker_close,
    .retire = worker_retire,
    .loaded_files = worker_loaded_files,
    .dispatch = kh__lua_dispatch,
    .on_body = kh__lua_on_body,
    .on_abort = kh__lua_on_abort,
    .on_drain = kh__lua_on_drain,
    .on_message = kh__lua_on_message,
    .pool_thread_init = kh__lua_pool_init,
    .pool_thread_close = kh__lua_pool_close,
    .interrupt = kh__lua_interrupt,
};
