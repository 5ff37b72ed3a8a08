/* kh_lua_libm.c: libm, opened on the first call of one of its functions instead of at exec
 *        (KH_LAZY_LIBM builds, the default with KH_STATIC_DEPS: see CMakeLists.txt).
 * Owns:  one resolved pointer per function, and libm's handle (never closed).
 * In:    calls from LuaJIT (math.sin, math.log, x ^ y on the interpreter's slow path, its IR call
 *        table when a trace calls them) and from brotli's encoder (log2), linked statically
 *        (KH_STATIC_DEPS) against these definitions instead of libm.so.6's; and every dlopen
 *        and dlsym the binary makes (LuaJIT's ffi.C, ffi.load, package.loadlib, C modules;
 *        core's module loader), which the link sends here (--wrap=dlopen,--wrap=dlsym).
 * Out:   the same results: each function calls libm's own, as the dynamic loader resolves it
 *        (with its ifunc choice: the FMA / AVX2 variant on a CPU that has them); and the same
 *        symbols seen as when libm was loaded at exec: libm is opened RTLD_GLOBAL before any
 *        other library is opened (a C module that calls floor without linking libm leans on
 *        the process's), and on a failed lookup in the default namespace (ffi.C.floor), which
 *        is then retried once libm is there.
 * Why:   a cleartext server calls none of them between exec and its first answer, yet ld.so
 *        mapped and relocated libm at every exec (bench/startup.sh PARTS=counts: 10 page
 *        faults, 9 syscalls and ~35,000 instructions). The first call pays a dlopen, once per
 *        process.
 * Only the functions the binary takes from libm alone are here (frexp, ldexp, modf are in libc
 * too); one that LuaJIT or brotli starts to need keeps libm in DT_NEEDED, which
 * `readelf -d khamsin` shows. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* (no <math.h>: these definitions are the functions it declares) */

/* the linker's names for the real functions (--wrap) */
void *__real_dlopen(const char *file, int mode);
void *__real_dlsym(void *restrict handle, const char *restrict name);
void *__wrap_dlopen(const char *file, int mode);
void *__wrap_dlsym(void *restrict handle, const char *restrict name);

/* KH_LIBC_PATH builds name it by its path, in libc's directory: no search (CMakeLists.txt) */
#ifndef KH_LIBM_PATH
#define KH_LIBM_PATH "libm.so.6"
#endif

static _Atomic(void *) libm_handle;

/* libm in the process's global scope, as ld.so put it there at exec before KH_LAZY_LIBM */
static void *libm_global(void)
{
    void *h = atomic_load_explicit(&libm_handle, memory_order_acquire);
    if (h == NULL) {
        /* dlopen is thread-safe and returns the same handle when several threads race here */
        h = __real_dlopen(KH_LIBM_PATH, RTLD_NOW | RTLD_GLOBAL);
        if (h != NULL)
            atomic_store_explicit(&libm_handle, h, memory_order_release);
    }
    return h;
}

void *__wrap_dlopen(const char *file, int mode)
{
    if (file != NULL) /* (dlopen(NULL) is the program itself) */
        (void)libm_global();
    return __real_dlopen(file, mode);
}

void *__wrap_dlsym(void *restrict handle, const char *restrict name)
{
    void *p = __real_dlsym(handle, name);
    if (p == NULL && handle == RTLD_DEFAULT &&
        atomic_load_explicit(&libm_handle, memory_order_acquire) == NULL &&
        libm_global() != NULL) {
        (void)dlerror(); /* the first lookup's failure is not the answer */
        p = __real_dlsym(handle, name);
    }
    return p;
}

static void *libm_sym(const char *name)
{
    void *h = libm_global();
    void *p = h ? __real_dlsym(h, name) : NULL;
    if (p == NULL) {
        fprintf(stderr, "khamsin: cannot resolve %s in " KH_LIBM_PATH ": %s\n", name, dlerror());
        abort();
    }
    return p;
}

typedef double (*kh_fn1)(double);
typedef double (*kh_fn2)(double, double);

#define KH_LIBM1(name)                                                                             \
    double name(double x)                                                                          \
    {                                                                                              \
        static _Atomic(kh_fn1) fn;                                                                 \
        kh_fn1 f = atomic_load_explicit(&fn, memory_order_acquire);                                \
        if (f == NULL) {                                                                           \
            f = (kh_fn1)libm_sym(#name);                                                           \
            atomic_store_explicit(&fn, f, memory_order_release);                                   \
        }                                                                                          \
        return f(x);                                                                               \
    }
#define KH_LIBM2(name)                                                                             \
    double name(double x, double y)                                                                \
    {                                                                                              \
        static _Atomic(kh_fn2) fn;                                                                 \
        kh_fn2 f = atomic_load_explicit(&fn, memory_order_acquire);                                \
        if (f == NULL) {                                                                           \
            f = (kh_fn2)libm_sym(#name);                                                           \
            atomic_store_explicit(&fn, f, memory_order_release);                                   \
        }                                                                                          \
        return f(x, y);                                                                            \
    }

double acos(double), asin(double), atan(double), cos(double), cosh(double), exp(double),
    log(double), log10(double), log2(double), sin(double), sinh(double), sqrt(double),
    tan(double), tanh(double), atan2(double, double), fmod(double, double), pow(double, double);

KH_LIBM1(acos)
KH_LIBM1(asin)
KH_LIBM1(atan)
KH_LIBM1(cos)
KH_LIBM1(cosh)
KH_LIBM1(exp)
KH_LIBM1(log)
KH_LIBM1(log10)
KH_LIBM1(log2)
KH_LIBM1(sin)
KH_LIBM1(sinh)
KH_LIBM1(sqrt)
KH_LIBM1(tan)
KH_LIBM1(tanh)
KH_LIBM2(atan2)
KH_LIBM2(fmod)
KH_LIBM2(pow)
