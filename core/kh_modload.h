/* kh_modload.h: finding and opening one of khamsin's modules (khamsin-tls.so, khamsin-h3.so),
 * shared by their loaders kh_tls_load.c and kh_h3_load.c.
 * Owns:  nothing (a module, once opened, is never closed: its handle is dropped).
 * In:    a description of the module (file, environment variable, entry symbol, words for the
 *        messages) and a check of the table its entry returns.
 * Out:   the table, or NULL and a message naming every path tried.
 * Where the module is looked for, first match wins:
 *   1. $<env>, a path to the file (then nothing else is tried);
 *   2. next to the binary: dirname(/proc/self/exe)/<file> (the build tree);
 *   3. the installed layout: dirname(/proc/self/exe)/../lib/khamsin/<file>;
 *   4. a LuaRocks tree (khamsin.rockspec): dirname(/proc/self/exe)/../lib/lua/5.1/khamsin/<file>
 *      (LuaRocks moves the rock's lib/ files to <tree>/lib/lua/5.1). */
#ifndef KH_MODLOAD_H
#define KH_MODLOAD_H

#include <stddef.h>

typedef struct kh_modload_spec {
    const char *file;       /* "khamsin-tls.so" */
    const char *env;        /* "KHAMSIN_TLS_MODULE" */
    const char *entry;      /* the symbol returning the module's table */
    const char *needs;      /* who needs it, for the messages: "TLS", "--http3" */
    const char *kind;       /* "TLS", "HTTP/3": "not a khamsin TLS module", "TLS module unusable" */
    const char *build_hint; /* how to get it: "build it, install it" */
    const char *log;        /* the debug line "<log>: loaded <path>": "tls", "http3" */
    /* The table the entry returned: 0 when this binary can use it, else -1 and why in err. */
    int (*check)(const void *vt, const char *path, char *err, size_t errlen);
} kh_modload_spec;

/* The module's table, or NULL with the reason in err. Not thread-safe: the caller serializes. */
const void *kh_modload(const kh_modload_spec *m, char *err, size_t errlen);

#endif
