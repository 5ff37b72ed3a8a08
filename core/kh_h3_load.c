/* kh_h3_load.c: the binary's side of khamsin-h3.so (kh_h3_module.h): loads the module only
 * for --http3, checks it was built with this binary, hands it the TLS module's certificate and
 * key, registers h3 with kh_proto (so TCP responses advertise it with Alt-Svc) and forwards
 * the workers' open/close.
 * Owns:  the module handle and table (set once on the main thread, before any worker starts;
 *        read-only afterwards).
 * In:    main.c (kh_h3_setup, kh_h3_teardown), kh_worker.c (kh_h3_worker_open/close).
 * Out:   the same calls into the module; a message naming every path tried when it cannot load.
 * Never: runs for a server without --http3 (so none of ngtcp2, nghttp3, GnuTLS is mapped);
 *        unloads the module.
 * Where the module is looked for, first match wins (as khamsin-tls.so, kh_tls_load.c):
 *   $KHAMSIN_H3_MODULE; dirname(/proc/self/exe)/khamsin-h3.so; ../lib/khamsin/khamsin-h3.so;
 *   ../lib/lua/5.1/khamsin/khamsin-h3.so. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kh_conn.h"
#include "kh_h3_module.h"
#include "kh_log.h"
#include "kh_proto.h"
#include "kh_stream.h"
#include "kh_tls.h"
#include "kh_worker.h"

#ifndef KH_VERSION
#define KH_VERSION "0.0.0"
#endif

static const kh_h3_module_vt *h3;

static int try_load(const char *path, char *err, size_t errlen)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s", e ? e : path);
        return 0;
    }
    kh_h3_module_entry_fn entry = (kh_h3_module_entry_fn)dlsym(h, KH_H3_MODULE_ENTRY);
    const kh_h3_module_vt *vt = entry ? entry() : NULL;
    if (vt == NULL) {
        snprintf(err, errlen, "%s: no %s(): not a khamsin HTTP/3 module", path,
                 KH_H3_MODULE_ENTRY);
        return -1;
    }
    if (vt->abi != KH_H3_MODULE_ABI || vt->vt_size != sizeof *vt ||
        vt->conn_size != sizeof(kh_conn) || vt->worker_size != sizeof(kh_worker) ||
        vt->stream_size != sizeof(kh_stream) || strcmp(vt->version, KH_VERSION) != 0) {
        snprintf(err, errlen, "%s: built for another khamsin (%s, abi %u), this is %s (abi %d): "
                 "rebuild or reinstall both together", path, vt->version, vt->abi, KH_VERSION,
                 KH_H3_MODULE_ABI);
        return -1;
    }
    h3 = vt;
    return 1;
}

static int load(char *err, size_t errlen)
{
    if (h3)
        return 0;
    char why[600];
    const char *env = getenv("KHAMSIN_H3_MODULE");
    if (env && *env) {
        if (try_load(env, why, sizeof why) > 0)
            return 0;
        snprintf(err, errlen, "--http3 needs the module %s (KHAMSIN_H3_MODULE), which did not "
                 "load: %s", env, why);
        return -1;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(err, errlen, "--http3 needs %s: cannot find the binary's directory; set "
                 "KHAMSIN_H3_MODULE to the module's path", KH_H3_MODULE_FILE);
        return -1;
    }
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    static const char *const rel[] = {"/" KH_H3_MODULE_FILE, "/../lib/khamsin/" KH_H3_MODULE_FILE,
                                      "/../lib/lua/5.1/khamsin/" KH_H3_MODULE_FILE};
    char tried[1400] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s%s", exe, rel[i]);
        int r = try_load(path, why, sizeof why);
        if (r > 0)
            return 0;
        if (r < 0) {
            snprintf(err, errlen, "HTTP/3 module unusable: %s", why);
            return -1;
        }
        if (used < sizeof tried)
            used += (size_t)snprintf(tried + used, sizeof tried - used, "%s%s", i ? "; " : "", why);
    }
    snprintf(err, errlen, "--http3 needs the module %s, which did not load (%s); build it, "
             "install it, or set KHAMSIN_H3_MODULE to its path", KH_H3_MODULE_FILE, tried);
    return -1;
}

kh_h3_ctx *kh_h3_setup(kh_tls_ctx *tls, char *err, size_t errlen)
{
    if (load(err, errlen) != 0)
        return NULL;
    kh_h3_opts o = {0};
    char *cert = NULL, *key = NULL;
    if (kh_tls_ctx_export_pem(tls, &cert, &o.cert_len, &key, &o.key_len) != 0) {
        snprintf(err, errlen, "--http3: cannot export the TLS certificate and key");
        return NULL;
    }
    o.cert_pem = cert;
    o.key_pem = key;
    kh_h3_ctx *ctx = h3->ctx_new(&o, err, errlen);
    kh_tls_pem_free(cert, o.cert_len);
    kh_tls_pem_free(key, o.key_len);
    if (ctx == NULL)
        return NULL;
    static const kh_proto p = {.name = "h3", .transport = KH_PROTO_QUIC, .alpn = "h3",
                               .alt_svc_max_age = 86400};
    kh_proto_register(&p);
    KH_LOG_DEBUG("http3: %s", h3->versions());
    return ctx;
}

void kh_h3_teardown(kh_h3_ctx *ctx)
{
    if (ctx)
        h3->ctx_free(ctx);
}

int kh_h3_worker_open(kh_worker *w, char *err, size_t errlen)
{
    if (w->cfg->h3 == NULL)
        return 0;
    return h3->worker_open(w, w->cfg->h3, err, errlen);
}

void kh_h3_worker_close(kh_worker *w)
{
    if (w->cfg->h3)
        h3->worker_close(w);
}
