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
 * Where the module is looked for (kh_modload.c, shared with kh_tls_load.c): $KHAMSIN_H3_MODULE,
 *   else next to the binary, ../lib/khamsin/, ../lib/lua/5.1/khamsin/ (a LuaRocks tree). */
#include <stdio.h>
#include <string.h>

#include "kh_conn.h"
#include "kh_h3_module.h"
#include "kh_log.h"
#include "kh_modload.h"
#include "kh_proto.h"
#include "kh_stream.h"
#include "kh_tls.h"
#include "kh_worker.h"

#ifndef KH_VERSION
#define KH_VERSION "0.0.0"
#endif

static const kh_h3_module_vt *h3;

/* The table khamsin-h3.so returned: built with this binary? */
static int check(const void *t, const char *path, char *err, size_t errlen)
{
    const kh_h3_module_vt *vt = t;
    if (vt->abi != KH_H3_MODULE_ABI || vt->vt_size != sizeof *vt ||
        vt->conn_size != sizeof(kh_conn) || vt->worker_size != sizeof(kh_worker) ||
        vt->stream_size != sizeof(kh_stream) || strcmp(vt->version, KH_VERSION) != 0) {
        snprintf(err, errlen, "%s: built for another khamsin (%s, abi %u), this is %s (abi %d): "
                 "rebuild or reinstall both together", path, vt->version, vt->abi, KH_VERSION,
                 KH_H3_MODULE_ABI);
        return -1;
    }
    return 0;
}

static int load(char *err, size_t errlen)
{
    static const kh_modload_spec m = {
        .file = KH_H3_MODULE_FILE,
        .env = "KHAMSIN_H3_MODULE",
        .entry = KH_H3_MODULE_ENTRY,
        .needs = "--http3",
        .kind = "HTTP/3",
        .build_hint = "build it, install it",
        .log = "http3",
        .check = check,
    };
    if (h3 == NULL)
        h3 = kh_modload(&m, err, errlen);
    return h3 ? 0 : -1;
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
