/* kh_tls_client.c: TLS client for outbound connections, in khamsin-tls.so (see kh_tls_client.h).
 * Owns:  per connection: the SSL and its two memory BIOs; per process: the client SSL_CTXs,
 *        one per (verify, ca_file), made under ctx_mu on first use, read-only afterwards (an
 *        SSL_CTX may be shared by threads once set up), freed at exit with the process.
 * In:    ciphertext from kh_out; plaintext to encrypt.
 * Out:   plaintext; ciphertext for kh_out to write; the verify error in words.
 * Never: touches a socket or the loop.
 * Certificates: verify=1 checks the chain against the system store (OpenSSL's default paths:
 * /usr/lib/ssl/certs, SSL_CERT_FILE / SSL_CERT_DIR) or ca_file, and the name with
 * SSL_set1_host (an IP literal against the certificate's IP SANs). Loading the store reads
 * files: it happens once per process, on the worker that first connects with TLS. */
#include "kh_tls_client.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "kh_tls_module.h"

struct kh_tls_client {
    SSL *ssl;
    BIO *rbio, *wbio; /* network side: ciphertext in, ciphertext out */
    int verify;
    char alpn[32];
};

typedef struct cctx {
    int verify;
    char *ca_file;
    SSL_CTX *ctx;
    struct cctx *next;
} cctx;

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static cctx *ctxs;

static const char *ssl_err(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (e == 0) {
        snprintf(buf, len, "unknown error");
    } else {
        kh_tls_err_strings(); /* not loaded at start-up (kh_tls_module.h) */
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}

static SSL_CTX *get_ctx(int verify, const char *ca_file, char *err, size_t errlen)
{
    pthread_mutex_lock(&ctx_mu);
    for (cctx *c = ctxs; c; c = c->next) {
        if (c->verify == verify && ((c->ca_file == NULL && ca_file == NULL) ||
                                    (c->ca_file && ca_file && strcmp(c->ca_file, ca_file) == 0))) {
            pthread_mutex_unlock(&ctx_mu);
            return c->ctx;
        }
    }
    char e[200];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        snprintf(err, errlen, "tls: %s", ssl_err(e, sizeof e));
        pthread_mutex_unlock(&ctx_mu);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (verify) {
        int ok = ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                         : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1) {
            snprintf(err, errlen, "tls: cannot load the CA certificates%s%s: %s",
                     ca_file ? " of " : "", ca_file ? ca_file : "", ssl_err(e, sizeof e));
            SSL_CTX_free(ctx);
            pthread_mutex_unlock(&ctx_mu);
            return NULL;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    cctx *c = calloc(1, sizeof *c);
    if (c == NULL) {
        SSL_CTX_free(ctx);
        pthread_mutex_unlock(&ctx_mu);
        snprintf(err, errlen, "tls: out of memory");
        return NULL;
    }
    c->verify = verify;
    c->ca_file = ca_file ? strdup(ca_file) : NULL;
    c->ctx = ctx;
    c->next = ctxs;
    ctxs = c;
    pthread_mutex_unlock(&ctx_mu);
    return ctx;
}

static int is_ip(const char *s)
{
    unsigned char b[16];
    return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

kh_tls_client *kh_tls_client_new(const kh_tls_client_opts *o, char *err, size_t errlen)
{
    SSL_CTX *ctx = get_ctx(o->verify, o->ca_file, err, errlen);
    if (ctx == NULL)
        return NULL;
    char e[200];
    kh_tls_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "tls: out of memory");
        return NULL;
    }
    c->verify = o->verify;
    c->ssl = SSL_new(ctx);
    c->rbio = BIO_new(BIO_s_mem());
    c->wbio = BIO_new(BIO_s_mem());
    if (c->ssl == NULL || c->rbio == NULL || c->wbio == NULL) {
        snprintf(err, errlen, "tls: %s", ssl_err(e, sizeof e));
        goto fail;
    }
    SSL_set_bio(c->ssl, c->rbio, c->wbio); /* the SSL owns them now */
    SSL_set_connect_state(c->ssl);
    const char *name = o->server_name;
    if (name && *name) {
        if (!is_ip(name))
            SSL_set_tlsext_host_name(c->ssl, name);
        if (o->verify) {
            int ok = is_ip(name) ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), name)
                                 : SSL_set1_host(c->ssl, name);
            if (ok != 1) {
                snprintf(err, errlen, "tls: cannot check the name %s: %s", name,
                         ssl_err(e, sizeof e));
                goto fail;
            }
        }
    }
    if (o->alpn_wire && o->alpn_len &&
        SSL_set_alpn_protos(c->ssl, o->alpn_wire, (unsigned)o->alpn_len) != 0) {
        snprintf(err, errlen, "tls: bad ALPN list");
        goto fail;
    }
    return c;
fail:
    if (c->ssl)
        SSL_free(c->ssl);
    else {
        BIO_free(c->rbio);
        BIO_free(c->wbio);
    }
    free(c);
    return NULL;
}

void kh_tls_client_free(kh_tls_client *c)
{
    if (c == NULL)
        return;
    SSL_free(c->ssl);
    free(c);
}

void kh_tls_client_feed(kh_tls_client *c, const char *p, size_t n)
{
    BIO_write(c->rbio, p, (int)n);
}

int kh_tls_client_handshake(kh_tls_client *c, char *err, size_t errlen)
{
    ERR_clear_error();
    int r = SSL_do_handshake(c->ssl);
    if (r == 1) {
        const unsigned char *a = NULL;
        unsigned al = 0;
        SSL_get0_alpn_selected(c->ssl, &a, &al);
        if (a && al < sizeof c->alpn) {
            memcpy(c->alpn, a, al);
            c->alpn[al] = '\0';
        }
        return 1;
    }
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    long v = SSL_get_verify_result(c->ssl);
    if (c->verify && v != X509_V_OK) {
        snprintf(err, errlen, "tls: certificate verify failed: %s",
                 X509_verify_cert_error_string(v));
        ERR_clear_error();
        return -1;
    }
    char b[200];
    snprintf(err, errlen, "tls: handshake failed: %s", ssl_err(b, sizeof b));
    return -1;
}

int kh_tls_client_read(kh_tls_client *c, char *out, size_t cap)
{
    if (cap == 0)
        return 0;
    ERR_clear_error();
    int r = SSL_read(c->ssl, out, cap > INT32_MAX ? INT32_MAX : (int)cap);
    if (r > 0)
        return r;
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    if (e == SSL_ERROR_ZERO_RETURN)
        return -1;
    ERR_clear_error();
    return -2;
}

int kh_tls_client_write(kh_tls_client *c, const char *p, size_t n)
{
    while (n > 0) {
        ERR_clear_error();
        int chunk = n > (1u << 30) ? (1 << 30) : (int)n;
        int r = SSL_write(c->ssl, p, chunk);
        if (r <= 0) {
            ERR_clear_error();
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

size_t kh_tls_client_pending(kh_tls_client *c, char *out, size_t cap)
{
    int r = BIO_read(c->wbio, out, cap > INT32_MAX ? INT32_MAX : (int)cap);
    return r > 0 ? (size_t)r : 0;
}

const char *kh_tls_client_alpn(kh_tls_client *c)
{
    return c->alpn;
}
