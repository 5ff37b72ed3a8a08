/* kh_tls_module.c: the one exported symbol of khamsin-tls.so (see kh_tls_module.h).
 * Owns:  the table of the module's kh_tls.h functions.
 * In:    a call from kh_tls_load.c right after dlopen.
 * Out:   the table; every other symbol of the module stays hidden (-fvisibility=hidden), so the
 *        module's kh_tls_* never clash with the binary's kh_tls_* trampolines.
 * Start-up: OpenSSL is initialised here, once, without reading openssl.cnf unless OPENSSL_CONF
 * names one: the config scan cost ~1.7 M instructions (of ~27 M for a TLS listener's start-up,
 * bench/startup.sh) and khamsin sets its own protocol, cipher and group policy on every
 * SSL_CTX, so the system file only changed what we overrode anyway. Nor its error strings:
 * kh_tls_err_strings loads them when an error is formatted (see kh_tls_module.h). */
/* the per-library error string loaders are deprecated in 3.0, but the only way to load the
 * strings after OPENSSL_INIT_NO_LOAD_CRYPTO_STRINGS */
#define OPENSSL_SUPPRESS_DEPRECATED
#include "kh_tls_module.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdlib.h>

#include "kh_common.h"
#include "kh_conn.h"
#include "kh_worker.h"

#ifndef KH_VERSION
#define KH_VERSION "0.0.0"
#endif

static const kh_tls_module_vt vt = {
    .abi = KH_TLS_MODULE_ABI,
    .vt_size = sizeof(kh_tls_module_vt),
    .conn_size = sizeof(kh_conn),
    .worker_size = sizeof(kh_worker),
    .version = KH_VERSION,
    .ctx_new = kh_tls_ctx_new,
    .ctx_spki_sha256 = kh_tls_ctx_spki_sha256,
    .ctx_free = kh_tls_ctx_free,
    .conn_new = kh_tls_new,
    .conn_free = kh_tls_free,
    .read = kh_tls_read,
    .write = kh_tls_write,
    .close_notify = kh_tls_close_notify,
    .established = kh_tls_established,
    .ctx_export_pem = kh_tls_ctx_export_pem,
    .pem_free = kh_tls_pem_free,
    .client_new = kh_tls_client_new,
    .client_free = kh_tls_client_free,
    .client_feed = kh_tls_client_feed,
    .client_handshake = kh_tls_client_handshake,
    .client_read = kh_tls_client_read,
    .client_write = kh_tls_client_write,
    .client_pending = kh_tls_client_pending,
    .client_alpn = kh_tls_client_alpn,
};

KH_EXPORT const kh_tls_module_vt *kh_tls_module_get(void);

static pthread_once_t err_once = PTHREAD_ONCE_INIT;

static void err_strings_load(void)
{
    ERR_load_ERR_strings(); /* the library names and the reasons common to all */
    ERR_load_ASN1_strings();
    ERR_load_ASYNC_strings();
    ERR_load_BIO_strings();
    ERR_load_BN_strings();
    ERR_load_BUF_strings();
    ERR_load_CONF_strings();
    ERR_load_CRYPTO_strings();
    ERR_load_DH_strings();
    ERR_load_DSA_strings();
    ERR_load_EC_strings();
    ERR_load_EVP_strings();
    ERR_load_KDF_strings();
    ERR_load_OBJ_strings();
    ERR_load_PEM_strings();
    ERR_load_PKCS12_strings();
    ERR_load_PKCS7_strings();
    ERR_load_RAND_strings();
    ERR_load_RSA_strings();
    ERR_load_UI_strings();
    ERR_load_X509V3_strings();
    ERR_load_X509_strings();
    ERR_load_SSL_strings();
}

void kh_tls_err_strings(void)
{
    pthread_once(&err_once, err_strings_load);
}

const kh_tls_module_vt *kh_tls_module_get(void)
{
    const char *conf = getenv("OPENSSL_CONF");
    uint64_t flags = conf && *conf ? OPENSSL_INIT_LOAD_CONFIG : OPENSSL_INIT_NO_LOAD_CONFIG;
    flags |= OPENSSL_INIT_NO_LOAD_CRYPTO_STRINGS | OPENSSL_INIT_NO_LOAD_SSL_STRINGS;
    if (OPENSSL_init_ssl(flags, NULL) != 1)
        return NULL;
    return &vt;
}
