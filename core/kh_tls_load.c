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
 * Where the module is looked for (kh_modload.c, shared with kh_h3_load.c): $KHAMSIN_TLS_MODULE,
 *   else next to the binary, ../lib/khamsin/, ../lib/lua/5.1/khamsin/ (a LuaRocks tree).
 * The functions below carry kh_tls_* names although this file is kh_tls_load.c: they are the
 * kh_tls.h interface the rest of core calls, unchanged whether TLS is built in or loaded. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kh_conn.h"
#include "kh_log.h"
#include "kh_modload.h"
#include "kh_tls.h"
#include "kh_tls_module.h"
#include "kh_worker.h"

#ifndef KH_VERSION
#define KH_VERSION "0.0.0"
#endif

static const kh_tls_module_vt *tls;
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

/* The table khamsin-tls.so returned: built with this binary? */
static int check(const void *t, const char *path, char *err, size_t errlen)
{
    const kh_tls_module_vt *vt = t;
    if (vt->abi != KH_TLS_MODULE_ABI || vt->vt_size != sizeof *vt ||
        vt->conn_size != sizeof(kh_conn) || vt->worker_size != sizeof(kh_worker) ||
        strcmp(vt->version, KH_VERSION) != 0) {
        snprintf(err, errlen, "%s: built for another khamsin (%s, abi %u), this is %s (abi %d): "
                 "rebuild or reinstall both together", path, vt->version, vt->abi, KH_VERSION,
                 KH_TLS_MODULE_ABI);
        return -1;
    }
    return 0;
}

/* 0 when the module is loaded; -1 with a message naming every path tried. */
static int load_locked(char *err, size_t errlen)
{
    static const kh_modload_spec m = {
        .file = KH_TLS_MODULE_FILE,
        .env = "KHAMSIN_TLS_MODULE",
        .entry = KH_TLS_MODULE_ENTRY,
        .needs = "TLS",
        .kind = "TLS",
        .build_hint = "build it (the khamsin target builds it), install it",
        .log = "tls",
        .check = check,
    };
    if (tls == NULL)
        tls = kh_modload(&m, err, errlen);
    return tls ? 0 : -1;
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
