/* kh_tls_load.c: kh_tls.h in the binary: loads khamsin-tls.so on first use and forwards every
 * call to it (see kh_tls_module.h for why TLS lives in a module).
 * Owns:  the module handle and its table: set once, under load_mu, either on the main thread
 *        (kh_tls_ctx_new, before any worker starts) or by the first worker that makes an
 *        outbound TLS connection (kh_tls_client_new: the module is then loaded even when the
 *        server has no TLS listener). Read-only afterwards: a worker reads it without a lock
 *        once its own kh_tls_client_new (which takes load_mu) has seen it set.
 * In:    kh_tls.h calls from main.c and kh_conn.c.
 * Out:   the same calls into the module; a message naming every path tried when it cannot load.
 * Never: loads the module for a server without a TLS listener until the app makes a TLS
 *        connection; unloads it (OpenSSL registers atexit handlers).
 * Where the module is looked for, first match wins:
 *   1. $KHAMSIN_TLS_MODULE, a path to the file (then nothing else is tried);
 *   2. next to the binary: dirname(/proc/self/exe)/khamsin-tls.so (the build tree);
 *   3. the installed layout: dirname(/proc/self/exe)/../lib/khamsin/khamsin-tls.so;
 *   4. a LuaRocks tree (khamsin.rockspec): dirname(/proc/self/exe)/../lib/lua/5.1/khamsin/
 *      khamsin-tls.so (LuaRocks moves the rock's lib/ files to <tree>/lib/lua/5.1).
 * The functions below carry kh_tls_* names although this file is kh_tls_load.c: they are the
 * kh_tls.h interface the rest of core calls, unchanged whether TLS is built in or loaded. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kh_conn.h"
#include "kh_log.h"
#include "kh_tls.h"
#include "kh_tls_module.h"
#include "kh_worker.h"

#ifndef KH_VERSION
#define KH_VERSION "0.0.0"
#endif

static const kh_tls_module_vt *tls;
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

/* Opens one candidate. Returns 1 when loaded, 0 when the file cannot be opened (err gets why,
 * the caller tries the next path), -1 when it opened but is not a module we can use. */
static int try_load(const char *path, char *err, size_t errlen)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s", e ? e : path);
        return 0;
    }
    kh_tls_module_entry_fn entry = (kh_tls_module_entry_fn)dlsym(h, KH_TLS_MODULE_ENTRY);
    const kh_tls_module_vt *vt = entry ? entry() : NULL;
    if (vt == NULL) {
        snprintf(err, errlen, "%s: no %s(): not a khamsin TLS module", path, KH_TLS_MODULE_ENTRY);
        return -1;
    }
    if (vt->abi != KH_TLS_MODULE_ABI || vt->vt_size != sizeof *vt ||
        vt->conn_size != sizeof(kh_conn) || vt->worker_size != sizeof(kh_worker) ||
        strcmp(vt->version, KH_VERSION) != 0) {
        snprintf(err, errlen, "%s: built for another khamsin (%s, abi %u), this is %s (abi %d): "
                 "rebuild or reinstall both together", path, vt->version, vt->abi, KH_VERSION,
                 KH_TLS_MODULE_ABI);
        return -1;
    }
    KH_LOG_DEBUG("tls: loaded %s", path);
    tls = vt;
    return 1;
}

/* 0 when the module is loaded; -1 with a message naming every path tried. */
static int load_locked(char *err, size_t errlen)
{
    if (tls)
        return 0;
    char why[600];
    const char *env = getenv("KHAMSIN_TLS_MODULE");
    if (env && *env) {
        if (try_load(env, why, sizeof why) > 0)
            return 0;
        snprintf(err, errlen, "TLS needs the module %s (KHAMSIN_TLS_MODULE), which did not load: %s",
                 env, why);
        return -1;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(err, errlen, "TLS needs %s: cannot find the binary's directory (/proc/self/exe); "
                 "set KHAMSIN_TLS_MODULE to the module's path", KH_TLS_MODULE_FILE);
        return -1;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    *slash = '\0';
    static const char *const rel[] = {"/" KH_TLS_MODULE_FILE, "/../lib/khamsin/" KH_TLS_MODULE_FILE,
                                      "/../lib/lua/5.1/khamsin/" KH_TLS_MODULE_FILE};
    char tried[1400] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s%s", exe, rel[i]);
        int r = try_load(path, why, sizeof why);
        if (r > 0)
            return 0;
        if (r < 0) {
            snprintf(err, errlen, "TLS module unusable: %s", why);
            return -1;
        }
        if (used < sizeof tried)
            used += (size_t)snprintf(tried + used, sizeof tried - used, "%s%s", i ? "; " : "", why);
    }
    snprintf(err, errlen, "TLS needs the module %s, which did not load (%s); build it (the "
             "khamsin target builds it), install it, or set KHAMSIN_TLS_MODULE to its path",
             KH_TLS_MODULE_FILE, tried);
    return -1;
}

static int load(char *err, size_t errlen)
{
    pthread_mutex_lock(&load_mu);
    int r = load_locked(err, errlen);
    pthread_mutex_unlock(&load_mu);
    return r;
}

kh_tls_ctx *kh_tls_ctx_new(const kh_tls_opts *o, char *err, size_t errlen)
{
    if (load(err, errlen) != 0)
        return NULL;
    return tls->ctx_new(o, err, errlen);
}

const char *kh_tls_ctx_spki_sha256(const kh_tls_ctx *t)
{
    return tls->ctx_spki_sha256(t);
}

void kh_tls_ctx_free(kh_tls_ctx *t)
{
    if (t) /* main frees a NULL context on every stop: no module needed */
        tls->ctx_free(t);
}

kh_tls *kh_tls_new(kh_tls_ctx *t, kh_conn *c)
{
    return tls->conn_new(t, c);
}

void kh_tls_free(kh_tls *s, kh_bufcache *bufs)
{
    if (s) /* kh_conn frees c->tls on every close, cleartext ones included */
        tls->conn_free(s, bufs);
}

int kh_tls_read(kh_tls *s, const char *p, size_t n)
{
    return tls->read(s, p, n);
}

kh_buf *kh_tls_write(kh_tls *s, kh_buf *plain)
{
    return tls->write(s, plain);
}

int kh_tls_close_notify(kh_tls *s)
{
    return tls->close_notify(s);
}

int kh_tls_established(const kh_tls *s)
{
    return tls->established(s);
}

int kh_tls_ctx_export_pem(const kh_tls_ctx *t, char **chain, size_t *chain_len, char **key,
                          size_t *key_len)
{
    return tls->ctx_export_pem(t, chain, chain_len, key, key_len);
}

void kh_tls_pem_free(char *p, size_t len)
{
    if (p)
        tls->pem_free(p, len);
}

/* ---- the client side (kh_tls_client.h), from any worker ---- */

kh_tls_client *kh_tls_client_new(const kh_tls_client_opts *o, char *err, size_t errlen)
{
    if (load(err, errlen) != 0)
        return NULL;
    return tls->client_new(o, err, errlen);
}

void kh_tls_client_free(kh_tls_client *c)
{
    if (c)
        tls->client_free(c);
}

void kh_tls_client_feed(kh_tls_client *c, const char *p, size_t n)
{
    tls->client_feed(c, p, n);
}

int kh_tls_client_handshake(kh_tls_client *c, char *err, size_t errlen)
{
    return tls->client_handshake(c, err, errlen);
}

int kh_tls_client_read(kh_tls_client *c, char *out, size_t cap)
{
    return tls->client_read(c, out, cap);
}

int kh_tls_client_write(kh_tls_client *c, const char *p, size_t n)
{
    return tls->client_write(c, p, n);
}

size_t kh_tls_client_pending(kh_tls_client *c, char *out, size_t cap)
{
    return tls->client_pending(c, out, cap);
}

const char *kh_tls_client_alpn(kh_tls_client *c)
{
    return tls->client_alpn(c);
}
