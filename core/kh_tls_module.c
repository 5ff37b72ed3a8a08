/* kh_tls_module.c: the one exported symbol of khamsin-tls.so (see kh_tls_module.h).
 * Owns:  the table of the module's kh_tls.h functions; with KH_STATIC_OPENSSL, the provider that
 *        stands in for OpenSSL's default one (filt_init: the same, minus unused ciphers and
 *        decoders) and its filtered algorithm lists, set once when it is loaded.
 * In:    a call from kh_tls_load.c right after dlopen.
 * Out:   the table; every other symbol of the module stays hidden (-fvisibility=hidden), so the
 *        module's kh_tls_* never clash with the binary's kh_tls_* trampolines.
 * Start-up: OpenSSL is initialised here, once, without reading openssl.cnf unless OPENSSL_CONF
 * names one: the config scan cost ~1.7 M instructions (of ~27 M for a TLS listener's start-up,
 * bench/startup.sh) and khamsin sets its own protocol, cipher and group policy on every
 * SSL_CTX, so the system file only changed what we overrode anyway. Nor its error strings:
 * kh_tls_err_strings loads them when an error is formatted (see kh_tls_module.h). Nor, with
 * KH_STATIC_OPENSSL and no OPENSSL_CONF, the legacy cipher table and the ciphers and decoders of
 * the default provider that nothing here uses (below: 16.7 M -> 11.4 M instructions to the
 * first answer over TLS). */
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

#ifdef KH_STATIC_OPENSSL
/* ---- OpenSSL's default provider, minus the ciphers nothing here fetches ----
 * The first fetch of any cipher (the DRBG's, at the first random bytes) builds an EVP_CIPHER,
 * its names and its store entry for every cipher the provider offers: 124 in OpenSSL 3.0's
 * default provider, ~2.9 M instructions and their heap pages at every start-up with a TLS
 * listener (bench/startup.sh). This provider is the default one, initialised by its own init
 * function (linked from libcrypto.a, hence KH_STATIC_OPENSSL only), with every operation
 * passed through except the cipher list, which keeps what libssl's cipher suites, the DRBG,
 * the ticket callback and the record layer use (keep_ciphers: libssl marks a suite whose
 * cipher it cannot fetch as unavailable, so every suite that was available still is). It is
 * loaded into the default library context instead of the default provider, which OpenSSL then
 * does not load; with OPENSSL_CONF set the configuration decides the providers, as before.
 * The algorithms keep their "provider=default" properties. */
#include <openssl/core_dispatch.h>
#include <openssl/provider.h>
#include <strings.h>

/* libcrypto.a's own (providers/defltprov.c), not in its public headers */
int ossl_default_provider_init(const OSSL_CORE_HANDLE *handle, const OSSL_DISPATCH *in,
                               const OSSL_DISPATCH **out, void **provctx);

/* Any of an algorithm's names matching one of these keeps it (case-insensitive). */
static const char *const keep_ciphers[] = {
    /* the TLS 1.3 suites (and our record layer), TLS 1.2's AEAD suites */
    "AES-128-GCM", "AES-256-GCM", "ChaCha20-Poly1305", "AES-128-CCM", "AES-256-CCM",
    "ARIA-128-GCM", "ARIA-256-GCM",
    /* TLS 1.2's CBC suites (the outbound client offers OpenSSL's default list) and the
     * stitched implementations libssl prefers for them; the ticket key's AES-256-CBC */
    "AES-128-CBC", "AES-256-CBC", "AES-128-CBC-HMAC-SHA1", "AES-256-CBC-HMAC-SHA1",
    "AES-128-CBC-HMAC-SHA256", "AES-256-CBC-HMAC-SHA256", "CAMELLIA-128-CBC",
    "CAMELLIA-256-CBC", "DES-EDE3-CBC", "NULL",
    /* the CTR-DRBG (AES-256 by default, any AES size if configured): CTR and ECB */
    "AES-128-CTR", "AES-192-CTR", "AES-256-CTR", "AES-128-ECB", "AES-192-ECB", "AES-256-ECB",
    /* the rest of AES's common modes and sizes, ChaCha20 alone */
    "AES-192-CBC", "AES-192-GCM", "AES-192-CCM", "ChaCha20",
};

/* Decoders nothing here asks for: DH and X9.42 DH parameters and keys (khamsin reads no DH
 * file; TLS 1.2's DHE takes its numbers from the handshake, not through a decoder), SM2 keys,
 * Microsoft's MSBLOB and PVK formats. Every OSSL_DECODER_CTX set up for a key (the
 * certificate's public key, a private key not read by ec_key_read) builds and tries them all. */
static const char *const drop_decoders[] = {"DH", "DHX", "SM2"};
static const char *const drop_decoder_inputs[] = {"input=msblob", "input=pvk"};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static OSSL_FUNC_provider_query_operation_fn *dflt_query;
static OSSL_FUNC_provider_teardown_fn *dflt_teardown;
static OSSL_ALGORITHM *ciphers, *decoders; /* the kept ones, then an all-NULL entry */
static OSSL_DISPATCH filt_out[16];

/* 1 when one of the ':'-separated `names` is in `list` (case-insensitive). */
static int name_in(const char *names, const char *const *list, size_t n)
{
    for (const char *p = names; *p;) {
        size_t len = strcspn(p, ":");
        for (size_t i = 0; i < n; i++)
            if (strlen(list[i]) == len && strncasecmp(p, list[i], len) == 0)
                return 1;
        p += len + (p[len] == ':');
    }
    return 0;
}

static int kept(int op, const OSSL_ALGORITHM *a)
{
    if (op == OSSL_OP_CIPHER)
        return name_in(a->algorithm_names, keep_ciphers, N_OF(keep_ciphers));
    if (name_in(a->algorithm_names, drop_decoders, N_OF(drop_decoders)))
        return 0;
    for (size_t i = 0; a->property_definition && i < N_OF(drop_decoder_inputs); i++)
        if (strstr(a->property_definition, drop_decoder_inputs[i]))
            return 0;
    return 1;
}

/* The default provider's list for `op` (its lists are static: no_cache 0), filtered. */
static OSSL_ALGORITHM *filter(void *provctx, int op)
{
    int no_cache = 0;
    const OSSL_ALGORITHM *all = dflt_query(provctx, op, &no_cache);
    size_t total = 0, k = 0;
    while (all && all[total].algorithm_names)
        total++;
    OSSL_ALGORITHM *out = all && !no_cache ? calloc(total + 1, sizeof *out) : NULL;
    for (size_t i = 0; out && i < total; i++)
        if (kept(op, &all[i]))
            out[k++] = all[i];
    return out;
}

static const OSSL_ALGORITHM *filt_query(void *provctx, int op, int *no_cache)
{
    if (op == OSSL_OP_CIPHER || op == OSSL_OP_DECODER) {
        *no_cache = 0;
        return op == OSSL_OP_CIPHER ? ciphers : decoders;
    }
    return dflt_query(provctx, op, no_cache);
}

static void filt_teardown(void *provctx)
{
    if (dflt_teardown)
        dflt_teardown(provctx);
    free(ciphers);
    free(decoders);
    ciphers = decoders = NULL;
}

static int filt_init(const OSSL_CORE_HANDLE *handle, const OSSL_DISPATCH *in,
                     const OSSL_DISPATCH **out, void **provctx)
{
    const OSSL_DISPATCH *d;
    size_t n = 0;
    if (!ossl_default_provider_init(handle, in, &d, provctx))
        return 0;
    for (; d->function_id != 0 && n < N_OF(filt_out) - 1; d++, n++) {
        filt_out[n] = *d;
        if (d->function_id == OSSL_FUNC_PROVIDER_QUERY_OPERATION) {
            dflt_query = OSSL_FUNC_provider_query_operation(d);
            filt_out[n].function = (void (*)(void))filt_query;
        } else if (d->function_id == OSSL_FUNC_PROVIDER_TEARDOWN) {
            dflt_teardown = OSSL_FUNC_provider_teardown(d);
            filt_out[n].function = (void (*)(void))filt_teardown;
        }
    }
    filt_out[n] = (OSSL_DISPATCH){0, NULL};
    if (d->function_id != 0 || dflt_query == NULL ||
        (ciphers = filter(*provctx, OSSL_OP_CIPHER)) == NULL ||
        (decoders = filter(*provctx, OSSL_OP_DECODER)) == NULL) {
        filt_teardown(*provctx);
        return 0;
    }
    *out = filt_out;
    return 1;
}

static OSSL_PROVIDER *filt_prov;

/* OPENSSL_cleanup's first step (an OPENSSL_atexit handler): our reference goes, so the
 * provider is freed with the library context. */
static void provider_unload(void)
{
    OSSL_PROVIDER_unload(filt_prov);
    filt_prov = NULL;
}

/* 1 when the filtered provider stands in for the default one; 0: OpenSSL's own choice. */
static int provider_load(void)
{
    if (OSSL_PROVIDER_add_builtin(NULL, "khamsin-default", filt_init) != 1 ||
        (filt_prov = OSSL_PROVIDER_load(NULL, "khamsin-default")) == NULL)
        return 0;
    if (OPENSSL_atexit(provider_unload) != 1) {
        provider_unload();
        return 0;
    }
    return 1;
}
#endif

const kh_tls_module_vt *kh_tls_module_get(void)
{
    const char *conf = getenv("OPENSSL_CONF");
    int use_conf = conf && *conf;
    uint64_t flags = use_conf ? OPENSSL_INIT_LOAD_CONFIG : OPENSSL_INIT_NO_LOAD_CONFIG;
    flags |= OPENSSL_INIT_NO_LOAD_CRYPTO_STRINGS | OPENSSL_INIT_NO_LOAD_SSL_STRINGS;
#ifdef KH_STATIC_OPENSSL
    /* Nor the legacy cipher table (EVP_add_cipher of every built-in EVP_CIPHER): OpenSSL 3.0
     * copies every name in it into the name map of algorithms at the first fetch (~1.6 M
     * instructions, another 0.3 M to build it). Ciphers are fetched from the provider by name
     * (libssl, kh_tls13.c, the DRBG; a legacy EVP_aes_256_cbc() is fetched by its name when a
     * context is initialised with it), so what goes is EVP_get_cipherbyname() and the legacy
     * NID of a fetched cipher (NID_undef: only OpenSSL's kTLS looks at it, and our connections
     * never use kTLS: their BIO is not a socket). The digests' table stays: certificate
     * verification looks digests up by NID. */
    if (!use_conf)
        flags |= OPENSSL_INIT_NO_ADD_ALL_CIPHERS;
#endif
    if (OPENSSL_init_ssl(flags, NULL) != 1)
        return NULL;
#ifdef KH_STATIC_OPENSSL
    if (!use_conf && !provider_load())
        ERR_clear_error(); /* the default provider is then loaded on first use, as without */
#endif
    return &vt;
}
