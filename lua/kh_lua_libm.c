/* kh_lua_libm.c: libm, opened on the first call of one of its functions instead of at exec
 *        (KH_LAZY_LIBM builds, off by default: see CMakeLists.txt for what it changes).
 * Owns:  one resolved pointer per function (the libm handle is never closed).
 * In:    calls from LuaJIT (math.sin, math.log, x ^ y on the interpreter's slow path, its IR call
 *        table when a trace calls them) and from brotli's encoder (log2), linked statically
 *        (KH_STATIC_DEPS) against these definitions instead of libm.so.6's.
 * Out:   the same results: each function calls libm's own, as the dynamic loader resolves it
 *        (with its ifunc choice: the FMA / AVX2 variant on a CPU that has them).
 * Why:   a cleartext server calls none of them between exec and its first answer, yet ld.so
 *        mapped and relocated libm at every exec (bench/startup.sh PARTS=counts: 10 page
 *        faults, 9 syscalls and ~35,000 instructions). The first call pays a dlopen, once per
 *        process.
 * Only the functions the binary takes from libm alone are here (frexp, ldexp, modf are in libc
 * too); one that LuaJIT or brotli starts to need keeps libm in DT_NEEDED, which
 * `readelf -d khamsin` shows. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* (no <math.h>: these definitions are the functions it declares) */

static void *libm_sym(const char *name)
{
    /* dlopen is thread-safe and returns the same handle when several threads race here */
    void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    void *p = h ? dlsym(h, name) : NULL;
    if (p == NULL) {
        fprintf(stderr, "khamsin: cannot resolve %s in libm.so.6: %s\n", name, dlerror());
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
