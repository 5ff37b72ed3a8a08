/* kh_tls.c: TLS transport on OpenSSL 3.0 (see kh_tls.h).
 * Owns:  the SSL_CTXs (built on the main thread, read-only afterwards; their keylog-free twins
 *        built once by a worker, kh_tls_ctx.quiet), the ticket key ring (the
 *        one mutable thing the workers share, behind ticket_mu), each connection's SSL (until a
 *        TLS 1.3 handshake is done: then its kh_tls13 record layer) and its pending ciphertext.
 * In:    certificate files or --tls-self-signed at start-up; ciphertext and plaintext from kh_conn.
 * Out:   ciphertext for kh_conn to write; plaintext in c->in; kh_proto_start after ALPN.
 * Never: blocks, touches the socket, or logs peer garbage above DEBUG.
 *
 * I/O goes through a BIO of our own rather than BIO_s_mem: its read side hands OpenSSL the bytes
 * lent from the worker's read slab (no copy, nothing kept once they are consumed), and its write
 * side appends to a kh_buf from the worker's block cache that the conn's write op takes over.
 * A BIO_s_mem pair would keep its grown BUF_MEM for the life of an idle connection (h2o does the
 * same for the same reason). */
#include "kh_tls.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include <openssl/core_names.h>
#include <openssl/decoder.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <uv.h>

#include "kh_conn.h"
#include "kh_err.h"
#include "kh_log.h"
#include "kh_proto.h"
#include "kh_tls13.h"
#include "kh_tls_module.h"

/* Session tickets (RFC 8446 §4.6.1): one AES-256-CBC + HMAC-SHA256 key encrypts new tickets for
 * ticket_rotate_s, then only decrypts for as long, so a ticket is accepted for at most
 * 2 * ticket_rotate_s and a stolen key exposes a bounded window. Every resumption gets a fresh
 * ticket under the current key (ticket_cb returns 2), as nginx does. */
typedef struct ticket_key {
    unsigned char name[16];
    unsigned char aes[32];
    unsigned char hmac[32];
    uint64_t created; /* monotonic seconds */
} ticket_key;

struct kh_tls_ctx {
    SSL_CTX **ctxs; /* [0] is the default; SNI (RFC 6066 §3) may switch to another */
    /* With our record layer, ctxs[i] have the keylog callback, and quiet[i] is its twin without
     * it (same settings, certificate, chain and key). Once the twins exist (quiet_ready), a
     * handshake starts on quiet[i] and moves to ctxs[i] when its certificate is sent (info_cb),
     * so OpenSSL formats only the secrets we take (see keylog_cb). The twins are built by the
     * first worker that closes a TLS connection (quiet_build: ~1.1 M instructions, once), not
     * at start-up or during the first exchange, which they would slow by as much; until then
     * handshakes take the keylog path all the way, which costs more but works the same. */
    SSL_CTX **quiet;
    _Atomic int quiet_ready; /* 1: quiet[] is complete (release/acquire); -1: cannot be built */
    uv_mutex_t quiet_mu;     /* one builder */
    int tls12;
    X509 **certs;   /* borrowed from each ctx, for the SNI match */
    int n;
    char spki[64]; /* computed on first use (kh_tls_ctx_spki_sha256): start-up skips it */
    unsigned char alpn[64]; /* ALPN ids we serve, wire format, in our preference order */
    size_t alpn_len;
    BIO_METHOD *bio_method;
    kh_tls13_algs *algs; /* NULL: OpenSSL keeps every connection's record layer */
    uint64_t rotate_s;
    /* AES-256-CBC for the tickets, fetched once: EVP_aes_256_cbc() is a legacy cipher that
     * every EVP_EncryptInit_ex fetches from the provider by name again (~2.6 K instructions a
     * ticket); NULL: that path. */
    EVP_CIPHER *ticket_cipher;
    uv_mutex_t ticket_mu; /* guards keys[]: held for a copy, never across crypto */
    ticket_key keys[2];   /* [0] encrypts, [1] the previous one still decrypts */
};

/* The application traffic secrets, from OpenSSL's keylog callback during the handshake. */
typedef struct hs_secrets {
    uint8_t client[KH_TLS13_MAX_SECRET];
    uint8_t server[KH_TLS13_MAX_SECRET];
    uint8_t have; /* bit 0: client, bit 1: server */
    uint8_t len;
} hs_secrets;

struct kh_tls {
    SSL *ssl;         /* NULL once a TLS 1.3 connection is handed to `rec` */
    kh_tls_ctx *t;
    kh_conn *c;
    const char *in_p; /* ciphertext lent for the current kh_tls_read */
    size_t in_n;
    kh_buf cipher;    /* ciphertext waiting to be written */
    hs_secrets *hs;   /* during the handshake only */
    kh_tls13 rec;     /* the record layer after the handshake (when ssl is NULL) */
    uint8_t quiet;     /* started on a quiet twin, not yet moved back (info_cb) */
    uint8_t established;
    uint8_t failed;
    uint8_t closed;   /* close_notify queued */
};

static uint64_t mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec;
}

/* The first OpenSSL error on this thread's queue, then an empty queue. */
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

/* ---------------------------------------------------------------------------------------- */
/* the connection BIO */

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static int bio_destroy(BIO *b)
{
    BIO_set_data(b, NULL);
    return 1;
}

static int bio_read(BIO *b, char *out, int len)
{
    kh_tls *s = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (s == NULL || s->in_n == 0) {
        BIO_set_retry_read(b);
        return -1;
    }
    size_t n = KH_MIN(s->in_n, (size_t)len);
    memcpy(out, s->in_p, n);
    s->in_p += n;
    s->in_n -= n;
    return (int)n;
}

static int bio_write(BIO *b, const char *p, int len)
{
    kh_tls *s = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (s == NULL || len < 0)
        return -1;
    kh_buf_append(&s->cipher, &s->c->w->bufs, p, (size_t)len);
    return len;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    /* Writes land in memory at once, so a flush has nothing to do; every other control
     * (kTLS, pending counts, ...) is unsupported. */
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* callbacks run during handshakes, on worker threads: they read the ctx, and lock only for
 * the ticket keys */

static int alpn_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned int inlen, void *arg)
{
    kh_tls_ctx *t = arg;
    unsigned char *sel;
    /* Our preference order wins; no common protocol is a fatal no_application_protocol alert
     * (RFC 7301 §3.2). A client that offers no ALPN at all never gets here: it gets HTTP/1.1. */
    if (SSL_select_next_proto(&sel, outlen, t->alpn, (unsigned)t->alpn_len, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

static int sni_cb(SSL *ssl, int *alert, void *arg)
{
    kh_tls_ctx *t = arg;
    const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    if (name == NULL || t->n < 2)
        return SSL_TLSEXT_ERR_OK;
    for (int i = 0; i < t->n; i++) {
        if (X509_check_host(t->certs[i], name, strlen(name), 0, NULL) == 1) {
            const kh_tls *s = SSL_get_app_data(ssl);
            if (i > 0)
                SSL_set_SSL_CTX(ssl, s && s->quiet ? t->quiet[i] : t->ctxs[i]);
            break;
        }
    }
    return SSL_TLSEXT_ERR_OK; /* no match: the default certificate */
}

static void ticket_key_new(ticket_key *k, uint64_t now)
{
    if (RAND_bytes(k->name, sizeof k->name) != 1 || RAND_bytes(k->aes, sizeof k->aes) != 1 ||
        RAND_bytes(k->hmac, sizeof k->hmac) != 1) {
        KH_LOG_ERROR("tls: RAND_bytes failed: session tickets keep the previous key");
        return;
    }
    k->created = now;
}

static int ticket_cb(SSL *ssl, unsigned char name[16], unsigned char *iv, EVP_CIPHER_CTX *ectx,
                     EVP_MAC_CTX *hctx, int enc)
{
    kh_tls_ctx *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    ticket_key k;
    int which = 0;
    uint64_t now = mono_s();
    uv_mutex_lock(&t->ticket_mu);
    if (enc) {
        if (now - t->keys[0].created >= t->rotate_s) {
            t->keys[1] = t->keys[0];
            ticket_key_new(&t->keys[0], now);
        }
        k = t->keys[0];
    } else {
        which = -1;
        for (int i = 0; i < 2; i++) {
            if (t->keys[i].created && now - t->keys[i].created < 2 * t->rotate_s &&
                memcmp(name, t->keys[i].name, 16) == 0) {
                k = t->keys[i];
                which = i;
                break;
            }
        }
    }
    uv_mutex_unlock(&t->ticket_mu);
    if (which < 0)
        return 0; /* unknown or expired key: a full handshake */
    int ok;
    const EVP_CIPHER *cipher = t->ticket_cipher ? t->ticket_cipher : EVP_aes_256_cbc();
    if (enc) {
        memcpy(name, k.name, 16);
        ok = RAND_bytes(iv, 16) == 1 && EVP_EncryptInit_ex(ectx, cipher, NULL, k.aes, iv) == 1;
    } else {
        ok = EVP_DecryptInit_ex(ectx, cipher, NULL, k.aes, iv) == 1;
    }
    OSSL_PARAM params[3];
    params[0] = OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, k.hmac, sizeof k.hmac);
    params[1] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0);
    params[2] = OSSL_PARAM_construct_end();
    ok = ok && EVP_MAC_CTX_set_params(hctx, params) == 1;
    OPENSSL_cleanse(&k, sizeof k);
    if (!ok)
        return -1;
    /* Decrypting, 2 = valid, and send a fresh ticket: browsers (BoringSSL, NSS) use a TLS 1.3
     * ticket once, so without one a resumed connection leaves them nothing to resume the next
     * time (every other handshake would be full). It costs ~0.17 M instructions per resumed
     * handshake (bench/tls-callgrind.sh); nginx renews the same way. The new ticket is under
     * the current key, so a session lives on only while it keeps coming back. */
    return enc ? 1 : 2;
}

static int unhex(const char *h, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char ch = h[2 * i + j];
            int d = ch >= '0' && ch <= '9' ? ch - '0'
                    : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                    : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
            if (d < 0)
                return -1;
            v = v * 16 + d;
        }
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* OpenSSL 3.0 has no API that returns the traffic secrets; its key log (the NSS format:
 * "LABEL <client random hex> <secret hex>") is the public way out. We keep the two application
 * traffic secrets for the hand-off to our record layer, and nothing is written anywhere.
 * OpenSSL formats each line byte by byte with sprintf (~56 K instructions a line through glibc,
 * ~4.6 K through __wrap___sprintf_chk below, before the callback can look at its label) and logs
 * five per TLS 1.3 handshake: the two handshake
 * traffic secrets, EXPORTER_SECRET, then the two we want. A connection starts on a quiet twin
 * ctx without the callback (kh_tls_ctx.quiet), so the handshake secrets (logged right after
 * ServerHello) are never formatted; info_cb moves it to the ctx with the callback once the
 * certificate is sent, in time for the server's application secret (logged with
 * EXPORTER_SECRET, which comes first in the same OpenSSL function and cannot be skipped) and the
 * client's. Three lines instead of five: ~110 K instructions less per handshake through glibc's
 * sprintf, ~9 K through the wrapper (bench/tls-callgrind.sh). */
static void keylog_cb(const SSL *ssl, const char *line)
{
    kh_tls *s = SSL_get_app_data(ssl);
    int which;
    if (s == NULL)
        return;
    if (strncmp(line, "CLIENT_TRAFFIC_SECRET_0 ", 24) == 0)
        which = 0;
    else if (strncmp(line, "SERVER_TRAFFIC_SECRET_0 ", 24) == 0)
        which = 1;
    else
        return;
    const char *sp = strchr(line + 24, ' ');
    if (sp == NULL)
        return;
    size_t hexlen = strlen(sp + 1);
    if (hexlen % 2 || hexlen / 2 > KH_TLS13_MAX_SECRET || hexlen == 0)
        return;
    if (s->hs == NULL)
        s->hs = kh_xcalloc(1, sizeof *s->hs);
    if (s->hs->len && s->hs->len != hexlen / 2)
        return;
    if (unhex(sp + 1, hexlen / 2, which ? s->hs->server : s->hs->client) == 0) {
        s->hs->len = (uint8_t)(hexlen / 2);
        s->hs->have |= (uint8_t)(1u << which);
    }
}

#ifdef KH_WRAP_SPRINTF_CHK
/* OpenSSL 3.0 formats each key-log line (nss_keylog_int) one byte at a time with
 * sprintf(cursor, "%02x", byte): 96 or 112 calls a line, 160 K of the ~177 K instructions the
 * three lines of a handshake cost (glibc's vsprintf sets up a whole stream per call). libssl.a is
 * built with _FORTIFY_SOURCE, so those calls are to __sprintf_chk, and khamsin-tls.so is linked
 * with --wrap=__sprintf_chk (CMakeLists.txt, only with KH_STATIC_OPENSSL on glibc): every call
 * in the module (OpenSSL's and ours) comes here. Exactly "%02x" with a byte is written directly;
 * anything else goes to glibc's own __vsprintf_chk, unchanged. The output is the same bytes;
 * the fortify check is kept (a buffer too small for the result aborts, as glibc's does). */
int __wrap___sprintf_chk(char *s, int flag, size_t slen, const char *fmt, ...);
int __vsprintf_chk(char *s, int flag, size_t slen, const char *fmt, va_list ap);
void __chk_fail(void) __attribute__((noreturn));

int __wrap___sprintf_chk(char *s, int flag, size_t slen, const char *fmt, ...)
{
    static const char hex[] = "0123456789abcdef";
    va_list ap;
    int r;
    va_start(ap, fmt);
    if (fmt[0] == '%' && fmt[1] == '0' && fmt[2] == '2' && fmt[3] == 'x' && fmt[4] == '\0') {
        unsigned v = va_arg(ap, unsigned);
        if (v <= 0xff) {
            va_end(ap);
            if (slen < 3)
                __chk_fail();
            s[0] = hex[v >> 4];
            s[1] = hex[v & 15];
            s[2] = '\0';
            return 2;
        }
        va_end(ap);
        va_start(ap, fmt); /* more than two digits: glibc's, from the first argument */
    }
    r = __vsprintf_chk(s, flag, slen, fmt, ap);
    va_end(ap);
    return r;
}
#endif

/* Called before each state transition (SSL_CB_ACCEPT_LOOP) with the state whose message was
 * just written: after CertificateVerify (full handshake) or EncryptedExtensions (resumed: no
 * certificate), only Finished is left before the application secrets, and nothing reads the
 * certificate any more, so SSL_set_SSL_CTX (which replaces the SSL's copy of it, as SNI does)
 * is safe. A state we do not expect means no switch: no secrets, so OpenSSL keeps the record
 * layer (hand_off says why), slower to idle but correct. */
static void info_cb(const SSL *cssl, int where, int ret)
{
    (void)ret;
    SSL *ssl = (SSL *)cssl; /* the callback's const is OpenSSL's; the SSL is ours */
    kh_tls *s = SSL_get_app_data(ssl);
    if (!(where & SSL_CB_ACCEPT_LOOP) || s == NULL || !s->quiet)
        return;
    OSSL_HANDSHAKE_STATE st = SSL_get_state(ssl);
    if (st != TLS_ST_SW_CERT_VRFY &&
        !(st == TLS_ST_SW_ENCRYPTED_EXTENSIONS && SSL_session_reused(ssl)))
        return;
    kh_tls_ctx *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    SSL_CTX *cur = SSL_get_SSL_CTX(ssl);
    s->quiet = 0; /* one try */
    for (int i = 0; i < t->n; i++) {
        if (t->quiet[i] == cur) {
            SSL_set_SSL_CTX(ssl, t->ctxs[i]);
            break;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* start-up (main thread) */

/* TLS 1.3 suites: OpenSSL's default order (unless openssl.cnf set one) puts
 * TLS_AES_256_GCM_SHA384 first, and with SSL_OP_CIPHER_SERVER_PREFERENCE that is what every
 * client gets. We put TLS_AES_128_GCM_SHA256 first instead, as Mozilla's recommended server
 * configurations do: the whole key schedule (HKDF, the transcript hash, the Finished MACs, the
 * ticket's PSK, our hand-off's key derivation) then runs on SHA-256 instead of SHA-384: 138 K
 * fewer instructions per full handshake (2,846 K -> 2,708 K) and 146 K per resumed one
 * (bench/tls-callgrind.sh, valgrind hides SHA-NI; on a CPU with SHA-NI SHA-256 gains more).
 * AES-128-GCM is TLS 1.3's mandatory suite (RFC 8446 §9.1). A list that is not OpenSSL's
 * default (set in openssl.cnf's system_default) is left exactly as configured. */
static void prefer_aes128(SSL_CTX *ctx)
{
    static const char dflt[] = "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256";
    char cur[sizeof dflt + 1];
    size_t n = 0;
    STACK_OF(SSL_CIPHER) *sk = SSL_CTX_get_ciphers(ctx);
    for (int i = 0; i < sk_SSL_CIPHER_num(sk); i++) {
        const SSL_CIPHER *c = sk_SSL_CIPHER_value(sk, i);
        if (SSL_CIPHER_get_protocol_id(c) >> 8 != 0x13) /* TLS 1.3's are 0x13xx */
            continue;
        const char *name = SSL_CIPHER_get_name(c);
        size_t l = strlen(name);
        if (n + l + 1 >= sizeof cur)
            return; /* longer than the default list: not the default */
        if (n)
            cur[n++] = ':';
        memcpy(cur + n, name, l);
        n += l;
    }
    cur[n] = '\0';
    if (strcmp(cur, dflt) == 0 &&
        SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                                      "TLS_CHACHA20_POLY1305_SHA256") != 1)
        ERR_clear_error(); /* keeps OpenSSL's order */
}

static SSL_CTX *ctx_new(kh_tls_ctx *t)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, t->tls12 ? TLS1_2_VERSION : TLS1_3_VERSION);
    SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
    /* No renegotiation (a TLS 1.2 CPU DoS, and forbidden under h2 by RFC 9113 §9.2.1). */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_COMPRESSION);
    /* The 16 KiB record buffers go back after every read and write. */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    /* TLS 1.2 only: ephemeral ECDH with AEAD ciphers, which is also what RFC 9113 §9.2.2 asks
     * of h2. TLS 1.3 suites stay OpenSSL's defaults (all AEAD). */
    SSL_CTX_set_cipher_list(ctx, "ECDHE+AESGCM:ECDHE+CHACHA20");
    prefer_aes128(ctx);
    SSL_CTX_set1_groups_list(ctx, "X25519:P-256:P-384");
    /* Stateless tickets only: a server-side session cache would be mutable state shared by
     * all workers behind OpenSSL's lock. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"khamsin", 7);
    SSL_CTX_set_num_tickets(ctx, 1);
    SSL_CTX_set_timeout(ctx, (long)t->rotate_s);
    SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_cb);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_cb, t);
    SSL_CTX_set_tlsext_servername_callback(ctx, sni_cb);
    SSL_CTX_set_tlsext_servername_arg(ctx, t);
    SSL_CTX_set_app_data(ctx, t);
    if (t->algs)
        SSL_CTX_set_keylog_callback(ctx, keylog_cb);
    return ctx;
}

/* The quiet twin of `ctx` (see kh_tls_ctx.quiet): the same settings, certificate, chain and
 * key (shared, reference-counted: nothing is read from a file), without the keylog callback.
 * NULL on failure. */
static SSL_CTX *quiet_twin(kh_tls_ctx *t, SSL_CTX *ctx)
{
    SSL_CTX *tw = ctx_new(t);
    STACK_OF(X509) *chain = NULL;
    if (tw == NULL || SSL_CTX_use_certificate(tw, SSL_CTX_get0_certificate(ctx)) != 1 ||
        SSL_CTX_use_PrivateKey(tw, SSL_CTX_get0_privatekey(ctx)) != 1 ||
        SSL_CTX_get0_chain_certs(ctx, &chain) != 1 || (chain && SSL_CTX_set1_chain(tw, chain) != 1)) {
        SSL_CTX_free(tw);
        ERR_clear_error();
        return NULL;
    }
    SSL_CTX_set_keylog_callback(tw, NULL);
    SSL_CTX_set_mode(tw, SSL_CTX_get_mode(ctx));
    return tw;
}

/* SSL_MODE_NO_AUTO_CHAIN when automatic chain building can only find the certificate itself:
 * without a chain in the file, OpenSSL builds one for every handshake that sends the
 * certificate, from the chain store or the SSL_CTX's certificate store (X509_STORE_CTX_new,
 * _init, X509_verify_cert, _free: 0.6 % of the server's CPU under s_time -new, perf), and
 * khamsin loads neither (an OPENSSL_CONF could set a ChainCAFile: then the building stays).
 * With a chain in the file OpenSSL sends that one and builds nothing either way. */
static void no_auto_chain(SSL_CTX *ctx)
{
    X509_STORE *chain_store = NULL;
    X509_STORE *st = SSL_CTX_get_cert_store(ctx);
    if (SSL_CTX_get0_chain_cert_store(ctx, &chain_store) == 1 && chain_store == NULL &&
        (st == NULL || sk_X509_OBJECT_num(X509_STORE_get0_objects(st)) == 0))
        SSL_CTX_set_mode(ctx, SSL_MODE_NO_AUTO_CHAIN);
}

/* On a worker, after a handshake: builds the quiet twins once (whoever gets the lock first;
 * the others carry on with the keylog path meanwhile) and publishes them. */
static void quiet_build(kh_tls_ctx *t)
{
    if (atomic_load_explicit(&t->quiet_ready, memory_order_acquire) != 0 ||
        uv_mutex_trylock(&t->quiet_mu) != 0)
        return;
    int ok = atomic_load_explicit(&t->quiet_ready, memory_order_relaxed) == 0;
    for (int i = 0; ok && i < t->n; i++)
        ok = (t->quiet[i] = quiet_twin(t, t->ctxs[i])) != NULL;
    if (ok) {
        atomic_store_explicit(&t->quiet_ready, 1, memory_order_release);
        KH_LOG_DEBUG("tls: key-log-free SSL_CTX twins built (%d)", t->n);
    } else if (atomic_load_explicit(&t->quiet_ready, memory_order_relaxed) == 0) {
        KH_LOG_WARN("tls: cannot build the keylog-free SSL_CTX twins: every handshake formats "
                    "all its secrets (slower, same result)");
        atomic_store_explicit(&t->quiet_ready, -1, memory_order_release);
    }
    uv_mutex_unlock(&t->quiet_mu);
}

static int add_ext(X509 *x, int nid, const char *value)
{
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
    if (ext == NULL)
        return -1;
    int r = X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    return r == 1 ? 0 : -1;
}

/* EC keys through the legacy EC_KEY API, deprecated in 3.0 but the only way to parse SEC1 and
 * to hand a public key to a certificate without OpenSSL 3.0's decoders and encoders, whose
 * first use costs millions of instructions at start-up (they try every implementation the
 * default provider has). The keys kept (in the SSL_CTX) are provider-native (ec_native), as
 * before. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/* The provider-native EVP_PKEY of a legacy EC_KEY holding a private key, or NULL. */
static EVP_PKEY *ec_native(const EC_KEY *ec)
{
    EVP_PKEY *out = NULL;
    const EC_GROUP *g = EC_KEY_get0_group(ec);
    const char *curve = g ? OBJ_nid2sn(EC_GROUP_get_curve_name(g)) : NULL;
    unsigned char *pub = NULL;
    size_t publen = curve && EC_KEY_get0_public_key(ec) && EC_KEY_get0_private_key(ec)
                        ? EC_KEY_key2buf(ec, POINT_CONVERSION_UNCOMPRESSED, &pub, NULL) : 0;
    OSSL_PARAM_BLD *bld = publen ? OSSL_PARAM_BLD_new() : NULL;
    OSSL_PARAM *params = NULL;
    if (bld && OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, curve, 0) == 1 &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PRIV_KEY, EC_KEY_get0_private_key(ec)) == 1 &&
        OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, pub, publen) == 1 &&
        (params = OSSL_PARAM_BLD_to_param(bld)) != NULL) {
        EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
        if (pc == NULL || EVP_PKEY_fromdata_init(pc) != 1 ||
            EVP_PKEY_fromdata(pc, &out, EVP_PKEY_KEYPAIR, params) != 1) {
            EVP_PKEY_free(out);
            out = NULL;
        }
        EVP_PKEY_CTX_free(pc);
    }
    OSSL_PARAM_free(params); /* clears the private key's bytes */
    OSSL_PARAM_BLD_free(bld);
    OPENSSL_free(pub);
    return out;
}

/* An EC private key (PEM "PRIVATE KEY" holding id-ecPublicKey, or "EC PRIVATE KEY") without
 * OpenSSL 3.0's decoders: the PEM body, the PKCS#8 and SEC1 structures through the ASN.1
 * templates, then the key handed to the EC key manager as parameters (EVP_PKEY_fromdata), so
 * the SSL_CTX holds the same provider-native key as before. A decoder context is set up by
 * trying every decoder of the default provider against the wanted type: ~1.2 M instructions
 * for an ECDSA P-256 key, this ~0.1 M (bench/startup.sh). NULL for anything else (another key
 * type, an encrypted key, a curve the EC manager does not know): the caller takes the decoder
 * path, whose errors say why. EC_KEY is deprecated in 3.0 but is the only parser of SEC1 that
 * does not go through a decoder. */
static EVP_PKEY *ec_key_read(const char *path)
{
    char *name = NULL, *header = NULL;
    unsigned char *der = NULL;
    long len = 0;
    BIO *b = BIO_new_file(path, "r");
    int ok = b && PEM_read_bio(b, &name, &header, &der, &len) == 1;
    BIO_free(b);
    EC_KEY *ec = NULL;
    PKCS8_PRIV_KEY_INFO *p8 = NULL;
    if (ok && strcmp(name, "EC PRIVATE KEY") == 0) {
        const unsigned char *p = der;
        ec = d2i_ECPrivateKey(NULL, &p, len);
    } else if (ok && strcmp(name, "PRIVATE KEY") == 0) {
        const unsigned char *p = der, *pk;
        const ASN1_OBJECT *obj;
        const X509_ALGOR *alg;
        const void *pval;
        int pklen, ptype;
        p8 = d2i_PKCS8_PRIV_KEY_INFO(NULL, &p, len);
        if (p8 && PKCS8_pkey_get0(&obj, &pk, &pklen, &alg, p8) == 1 &&
            OBJ_obj2nid(obj) == NID_X9_62_id_ecPublicKey) {
            X509_ALGOR_get0(NULL, &ptype, &pval, alg);
            /* named curves only; the key inside may leave its parameters to the algorithm */
            if (ptype == V_ASN1_OBJECT && (ec = EC_KEY_new_by_curve_name(OBJ_obj2nid(pval))) &&
                d2i_ECPrivateKey(&ec, &pk, pklen) == NULL) {
                EC_KEY_free(ec); /* d2i frees *a only when it allocated it */
                ec = NULL;
            }
        }
    }
    EVP_PKEY *out = ec ? ec_native(ec) : NULL;
    EC_KEY_free(ec);
    PKCS8_PRIV_KEY_INFO_free(p8);
    if (der)
        OPENSSL_cleanse(der, (size_t)len);
    OPENSSL_free(der);
    OPENSSL_free(name);
    OPENSSL_free(header);
    ERR_clear_error();
    return out;
}
/* A fresh P-256 key, provider-native (returned: the certificate is signed with it and the
 * SSL_CTX holds it), and in *pub the same key as a legacy EVP_PKEY for X509_set_pubkey: given a
 * native key, X509_set_pubkey encodes the public key through an OSSL_ENCODER and decodes it
 * back through an OSSL_DECODER (~5.9 M instructions, the first use of both); given a legacy
 * one, the EC method's pub_encode (bench/startup.sh). NULL (and *pub NULL) on failure. */
static EVP_PKEY *ec_p256_gen(EVP_PKEY **pub)
{
    EC_KEY *ec = EC_KEY_new_by_curve_name(NID_X9_62_prime256v1);
    EVP_PKEY *pk = NULL;
    *pub = NULL;
    if (ec && EC_KEY_generate_key(ec) == 1 && (*pub = EVP_PKEY_new()) != NULL &&
        EVP_PKEY_set1_EC_KEY(*pub, ec) == 1)
        pk = ec_native(ec);
    EC_KEY_free(ec);
    if (pk == NULL) {
        EVP_PKEY_free(*pub);
        *pub = NULL;
    }
    return pk;
}
#pragma GCC diagnostic pop

/* A P-256 certificate for localhost, 127.0.0.1 and ::1, valid from an hour ago for 365 days
 * (its key lives only in this process, so a long validity exposes nothing; browsers cap leaf
 * certificates at 398 days, and testssl rates "expires in < 60 days" as a finding). */
static int self_signed(SSL_CTX *ctx, char *err, size_t errlen)
{
    char e[256];
    EVP_PKEY *pub, *pk = ec_p256_gen(&pub);
    X509 *x = X509_new();
    BIGNUM *serial = BN_new();
    int ok = pub && pk && x && serial && X509_set_version(x, 2) == 1 &&
             BN_rand(serial, 63, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
             BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(x)) != NULL &&
             X509_gmtime_adj(X509_getm_notBefore(x), -3600) != NULL &&
             X509_gmtime_adj(X509_getm_notAfter(x), 365L * 24 * 3600) != NULL &&
             X509_set_pubkey(x, pub) == 1 &&
             X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                                        (const unsigned char *)"localhost", -1, -1, 0) == 1 &&
             X509_set_issuer_name(x, X509_get_subject_name(x)) == 1 &&
             add_ext(x, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1,IP:::1") == 0 &&
             add_ext(x, NID_basic_constraints, "critical,CA:FALSE") == 0 &&
             add_ext(x, NID_key_usage, "critical,digitalSignature") == 0 &&
             add_ext(x, NID_ext_key_usage, "serverAuth") == 0 &&
             X509_sign(x, pk, EVP_sha256()) > 0 && SSL_CTX_use_certificate(ctx, x) == 1 &&
             SSL_CTX_use_PrivateKey(ctx, pk) == 1;
    if (!ok)
        snprintf(err, errlen, "--tls-self-signed: %s", ssl_err(e, sizeof e));
    BN_free(serial);
    X509_free(x);
    EVP_PKEY_free(pk);
    EVP_PKEY_free(pub);
    return ok ? 0 : -1;
}

/* The private key through the narrowest path that works: ec_key_read for an EC key, else a
 * decoder asked for the certificate's key type only: what SSL_CTX_use_PrivateKey_file does,
 * minus trying every key type OpenSSL knows (~4 M of the ~27 M instructions a TLS listener's
 * start-up took, bench/startup.sh). -1 when it did not work (the caller then takes OpenSSL's
 * path, whose error says why); its errors are cleared. */
static int use_key_narrow(SSL_CTX *ctx, const char *path)
{
    X509 *x = SSL_CTX_get0_certificate(ctx);
    const char *type = x ? EVP_PKEY_get0_type_name(X509_get0_pubkey(x)) : NULL;
    if (type == NULL)
        return -1;
    EVP_PKEY *pk = strcmp(type, "EC") == 0 ? ec_key_read(path) : NULL;
    OSSL_DECODER_CTX *dc = NULL;
    BIO *b = NULL;
    if (pk == NULL) {
        dc = OSSL_DECODER_CTX_new_for_pkey(&pk, "PEM", NULL, type, EVP_PKEY_KEYPAIR, NULL, NULL);
        b = BIO_new_file(path, "r");
        if (dc == NULL || b == NULL || OSSL_DECODER_from_bio(dc, b) != 1) {
            EVP_PKEY_free(pk);
            pk = NULL;
        }
    }
    int ok = pk && SSL_CTX_use_PrivateKey(ctx, pk) == 1;
    BIO_free(b);
    OSSL_DECODER_CTX_free(dc);
    EVP_PKEY_free(pk);
    if (!ok)
        ERR_clear_error();
    return ok ? 0 : -1;
}

static int load_pair(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen)
{
    char e[256];
    FILE *f;
    /* fopen first: "No such file or directory" says more than OpenSSL's "system lib". */
    if ((f = fopen(cert, "r")) == NULL) {
        snprintf(err, errlen, "--tls-cert %s: %s", cert, strerror(errno));
        return -1;
    }
    fclose(f);
    if ((f = fopen(key, "r")) == NULL) {
        snprintf(err, errlen, "--tls-key %s: %s", key, strerror(errno));
        return -1;
    }
    fclose(f);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(err, errlen, "--tls-cert %s: not a PEM certificate chain (%s)", cert,
                 ssl_err(e, sizeof e));
        return -1;
    }
    if (use_key_narrow(ctx, key) != 0 && SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        snprintf(err, errlen, "--tls-key %s: not a usable PEM private key for %s (%s)", key,
                 cert, ssl_err(e, sizeof e));
        return -1;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, errlen, "--tls-key %s does not match --tls-cert %s (%s)", key, cert,
                 ssl_err(e, sizeof e));
        return -1;
    }
    return 0;
}

/* The certificate's own SubjectPublicKeyInfo, re-encoded by the ASN.1 templates: i2d_PUBKEY
 * would go through OpenSSL 3's encoder fetch (~3.5 M instructions on the first call). */
static void spki_sha256(X509 *x, char *out, size_t outlen)
{
    unsigned char *der = NULL, md[32];
    int len = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(x), &der);
    out[0] = '\0';
    if (len <= 0 || outlen < 45)
        return;
    EVP_Digest(der, (size_t)len, md, NULL, EVP_sha256(), NULL);
    EVP_EncodeBlock((unsigned char *)out, md, 32);
    OPENSSL_free(der);
}

kh_tls_ctx *kh_tls_ctx_new(const kh_tls_opts *o, char *err, size_t errlen)
{
    kh_tls_ctx *t = kh_xcalloc(1, sizeof *t);
    int n = o->self_signed ? 1 : o->num_certs;
    t->rotate_s = o->ticket_rotate_s ? o->ticket_rotate_s : 3600;
    t->ticket_cipher = EVP_CIPHER_fetch(NULL, "AES-256-CBC", NULL);
    ERR_clear_error();
    uv_mutex_init(&t->ticket_mu);
    ticket_key_new(&t->keys[0], mono_s());
    t->alpn_len = kh_proto_alpn_wire(t->alpn, sizeof t->alpn);
    t->algs = o->own_records ? kh_tls13_algs_new() : NULL;
    if (o->own_records && t->algs == NULL)
        KH_LOG_WARN("tls: an AEAD or hash is missing from OpenSSL: its record layer stays in use "
                    "(about 8 KB more per connection)");
    t->ctxs = kh_xcalloc((size_t)n, sizeof(SSL_CTX *));
    t->quiet = kh_xcalloc((size_t)n, sizeof(SSL_CTX *));
    t->tls12 = o->tls12;
    uv_mutex_init(&t->quiet_mu);
    /* nothing to gain without our record layer: no keylog callback at all then */
    atomic_init(&t->quiet_ready, t->algs ? 0 : -1);
    t->certs = kh_xcalloc((size_t)n, sizeof(X509 *));
    t->bio_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "khamsin conn");
    if (t->bio_method == NULL || BIO_meth_set_write(t->bio_method, bio_write) != 1 ||
        BIO_meth_set_read(t->bio_method, bio_read) != 1 ||
        BIO_meth_set_ctrl(t->bio_method, bio_ctrl) != 1 ||
        BIO_meth_set_create(t->bio_method, bio_create) != 1 ||
        BIO_meth_set_destroy(t->bio_method, bio_destroy) != 1) {
        snprintf(err, errlen, "tls: cannot create the connection BIO");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        SSL_CTX *ctx = ctx_new(t);
        if (ctx == NULL) {
            snprintf(err, errlen, "tls: SSL_CTX_new failed");
            goto fail;
        }
        t->ctxs[t->n++] = ctx;
        if (o->self_signed ? self_signed(ctx, err, errlen)
                           : load_pair(ctx, o->certs[i], o->keys[i], err, errlen))
            goto fail;
        t->certs[i] = SSL_CTX_get0_certificate(ctx);
        no_auto_chain(ctx);
    }
    return t;
fail:
    kh_tls_ctx_free(t);
    return NULL;
}

const char *kh_tls_ctx_spki_sha256(const kh_tls_ctx *t)
{
    kh_tls_ctx *m = (kh_tls_ctx *)t; /* a cache filled on the main thread, before any worker */
    if (m->spki[0] == '\0')
        spki_sha256(m->certs[0], m->spki, sizeof m->spki);
    return t->spki;
}

/* A memory BIO's bytes as a malloc'd NUL-terminated string; frees the BIO. */
static char *bio_take(BIO *b, size_t *len)
{
    char *p = NULL;
    long n = BIO_get_mem_data(b, &p);
    char *out = NULL;
    if (n > 0) {
        out = kh_xmalloc((size_t)n + 1);
        memcpy(out, p, (size_t)n);
        out[n] = '\0';
        *len = (size_t)n;
    }
    BIO_free(b);
    return out;
}

int kh_tls_ctx_export_pem(const kh_tls_ctx *t, char **chain, size_t *chain_len, char **key,
                          size_t *key_len)
{
    *chain = *key = NULL;
    SSL_CTX *ctx = t->ctxs[0];
    STACK_OF(X509) *extra = NULL;
    BIO *cb = BIO_new(BIO_s_mem()), *kb = BIO_new(BIO_s_mem());
    int ok = cb && kb && PEM_write_bio_X509(cb, SSL_CTX_get0_certificate(ctx)) == 1 &&
             SSL_CTX_get0_chain_certs(ctx, &extra) == 1;
    for (int i = 0; ok && extra && i < sk_X509_num(extra); i++)
        ok = PEM_write_bio_X509(cb, sk_X509_value(extra, i)) == 1;
    ok = ok && PEM_write_bio_PrivateKey(kb, SSL_CTX_get0_privatekey(ctx), NULL, NULL, 0, NULL,
                                        NULL) == 1;
    if (!ok) {
        BIO_free(cb);
        BIO_free(kb);
        return -1;
    }
    *chain = bio_take(cb, chain_len);
    *key = bio_take(kb, key_len);
    if (*chain == NULL || *key == NULL) {
        kh_tls_pem_free(*chain, *chain_len);
        kh_tls_pem_free(*key, *key_len);
        *chain = *key = NULL;
        return -1;
    }
    return 0;
}

void kh_tls_pem_free(char *p, size_t len)
{
    if (p == NULL)
        return;
    OPENSSL_cleanse(p, len);
    free(p);
}

void kh_tls_ctx_free(kh_tls_ctx *t)
{
    if (t == NULL)
        return;
    for (int i = 0; i < t->n; i++) {
        SSL_CTX_free(t->ctxs[i]);
        SSL_CTX_free(t->quiet[i]);
    }
    free(t->ctxs);
    free(t->quiet);
    uv_mutex_destroy(&t->quiet_mu);
    free(t->certs);
    if (t->bio_method)
        BIO_meth_free(t->bio_method);
    kh_tls13_algs_free(t->algs);
    EVP_CIPHER_free(t->ticket_cipher);
    OPENSSL_cleanse(t->keys, sizeof t->keys);
    uv_mutex_destroy(&t->ticket_mu);
    free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* per connection (worker thread) */

kh_tls *kh_tls_new(kh_tls_ctx *t, kh_conn *c)
{
    kh_tls *s = kh_xcalloc(1, sizeof *s);
    s->c = c;
    s->t = t;
    s->quiet = atomic_load_explicit(&t->quiet_ready, memory_order_acquire) == 1;
    s->ssl = SSL_new(s->quiet ? t->quiet[0] : t->ctxs[0]);
    BIO *b = s->ssl ? BIO_new(t->bio_method) : NULL;
    if (b == NULL) {
        SSL_free(s->ssl);
        free(s);
        ERR_clear_error();
        return NULL;
    }
    BIO_set_data(b, s);
    SSL_set_app_data(s->ssl, s); /* for keylog_cb, sni_cb and info_cb */
    if (s->quiet)
        SSL_set_info_callback(s->ssl, info_cb);
    SSL_set_bio(s->ssl, b, b); /* one reference, used for both directions */
    SSL_set_accept_state(s->ssl);
    return s;
}

void kh_tls_free(kh_tls *s, kh_bufcache *bufs)
{
    if (s == NULL)
        return;
    /* after the first connection rather than during it: not in the way of its answer */
    if (s->established)
        quiet_build(s->t); /* once per process (see kh_tls_ctx.quiet) */
    if (s->ssl)
        SSL_free(s->ssl);
    else
        kh_tls13_free(&s->rec, bufs);
    if (s->hs) {
        OPENSSL_cleanse(s->hs, sizeof *s->hs);
        free(s->hs);
    }
    kh_buf_release(&s->cipher, bufs);
    free(s);
}

int kh_tls_established(const kh_tls *s)
{
    return s->established;
}

static int fail(kh_tls *s, const char *what, int ret)
{
    char e[256];
    int code = SSL_get_error(s->ssl, ret);
    s->failed = 1;
    if (code == SSL_ERROR_SYSCALL || code == SSL_ERROR_SSL)
        KH_LOG_DEBUG("c%u tls %s: %s", s->c->id, what, ssl_err(e, sizeof e));
    else
        KH_LOG_DEBUG("c%u tls %s: SSL_get_error %d", s->c->id, what, code);
    ERR_clear_error();
    return KH_EPROTO;
}

/* TLS 1.3 only: once the handshake is done, the traffic secrets, the suite and the number of
 * records OpenSSL already sent under the server's application key (its NewSessionTicket, written
 * by the SSL_do_handshake call that completed, so everything it appended since `sent_before`) are
 * all our record layer needs; the SSL object (~8 KB) goes. Anything unusual (TLS 1.2, a suite we
 * lack, bytes OpenSSL buffered) keeps OpenSSL's record layer: slower to idle, equally correct. */
static void hand_off(kh_tls *s, size_t sent_before)
{
    kh_tls_ctx *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(s->ssl));
    hs_secrets *hs = s->hs;
    const char *why = NULL;
    uint64_t records = 0;
    if (t->algs == NULL)
        why = "tls_own_records is 0, or OpenSSL lacks an algorithm";
    else if (SSL_version(s->ssl) != TLS1_3_VERSION)
        why = "not TLS 1.3";
    else if (hs == NULL || hs->have != 3)
        why = "no traffic secrets";
    else if (SSL_has_pending(s->ssl))
        why = "OpenSSL holds unread bytes";
    if (why == NULL) {
        const uint8_t *q = (const uint8_t *)s->cipher.base + sent_before;
        size_t left = s->cipher.len - sent_before;
        while (left >= 5 && q[0] == 23) {
            size_t len = 5 + ((size_t)q[3] << 8 | q[4]);
            if (len > left)
                break;
            records++;
            q += len;
            left -= len;
        }
        if (left != 0)
            why = "unexpected bytes after the handshake";
    }
    if (why == NULL) {
        uint16_t suite = SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(s->ssl));
        if (kh_tls13_init(&s->rec, t->algs, suite, hs->client, hs->server, hs->len, records))
            why = "a suite we do not implement";
    }
    if (hs) {
        OPENSSL_cleanse(hs, sizeof *hs);
        free(hs);
        s->hs = NULL;
    }
    if (why) {
        KH_LOG_DEBUG("c%u tls: OpenSSL keeps the record layer (%s)", s->c->id, why);
        return;
    }
    SSL_free(s->ssl);
    s->ssl = NULL;
}

/* Our record layer's verdict on a read: 0, 1 (close_notify) or KH_EPROTO with an alert queued. */
static int rec_read(kh_tls *s, const char *p, size_t n)
{
    kh_conn *c = s->c;
    int r = kh_tls13_read(&s->rec, p, n, &c->in, &s->cipher, &c->w->bufs);
    if (r < 0) {
        s->failed = 1;
        KH_LOG_DEBUG("c%u tls: alert %u %s", c->id, s->rec.alert,
                     s->rec.alert_sent ? "sent" : "received");
    }
    return r;
}

int kh_tls_read(kh_tls *s, const char *p, size_t n)
{
    kh_conn *c = s->c;
    int r = 0;
    if (s->failed || s->closed)
        return 0; /* draining before the close: the bytes are dropped */
    if (s->ssl == NULL) {
        r = rec_read(s, p, n); /* may queue a KeyUpdate answer or an alert */
        goto out;
    }
    s->in_p = p;
    s->in_n = n;
    if (!s->established) {
        size_t sent_before = s->cipher.len;
        int h = SSL_do_handshake(s->ssl);
        if (h != 1) {
            if (SSL_get_error(s->ssl, h) != SSL_ERROR_WANT_READ)
                r = fail(s, "handshake", h);
            goto out;
        }
        s->established = 1;
        const unsigned char *alpn = NULL;
        unsigned alen = 0;
        SSL_get0_alpn_selected(s->ssl, &alpn, &alen);
        KH_LOG_DEBUG("c%u tls: %s %s alpn=%.*s%s", c->id, SSL_get_version(s->ssl),
                     SSL_get_cipher_name(s->ssl), (int)alen, alpn ? (const char *)alpn : "",
                     SSL_session_reused(s->ssl) ? " resumed" : "");
        char proto[16];
        alen = KH_MIN(alen, (unsigned)sizeof proto);
        if (alen)
            memcpy(proto, alpn, alen); /* the SSL object (which owns alpn) may go now */
        hand_off(s, sent_before);
        kh_proto_start(c, proto, alen);
        if (c->flags & KH_CONN_F_CLOSING)
            goto out;
        if (s->ssl == NULL) {
            /* what followed the client's Finished in this read (often its first request) */
            r = rec_read(s, s->in_p, s->in_n);
            goto out;
        }
    }
    /* Decrypt everything this read brought into `in`; records cut by the read stay inside
     * OpenSSL until the rest arrives. */
    for (;;) {
        if (c->in.cap - c->in.len < 2048)
            kh_buf_reserve(&c->in, &c->w->bufs, KH_BUF_BLOCK);
        size_t room = KH_MIN(c->in.cap - c->in.len, (size_t)INT_MAX);
        int k = SSL_read(s->ssl, c->in.base + c->in.len, (int)room);
        if (k > 0) {
            c->in.len += (size_t)k;
            continue;
        }
        int code = SSL_get_error(s->ssl, k);
        if (code == SSL_ERROR_WANT_READ)
            break;
        if (code == SSL_ERROR_ZERO_RETURN) {
            r = 1; /* close_notify (RFC 8446 §6.1): the peer's end of data */
            break;
        }
        r = fail(s, "read", k);
        break;
    }
out:
    s->in_p = NULL;
    s->in_n = 0;
    if (c->in.len == 0)
        kh_buf_release(&c->in, &c->w->bufs);
    if (s->cipher.len)
        kh_worker_schedule_flush(c->w, c); /* handshake flight, tickets, KeyUpdate answers, alerts */
    return r;
}

kh_buf *kh_tls_write(kh_tls *s, kh_buf *plain)
{
    kh_bufcache *bufs = &s->c->w->bufs;
    if (plain->len && s->established && !s->failed && !s->closed) {
        if (s->ssl == NULL) {
            if (kh_tls13_write(&s->rec, plain->base, plain->len, &s->cipher, bufs)) {
                s->failed = 1;
                kh_buf_release(plain, bufs);
                return NULL;
            }
        } else {
            size_t off = 0;
            while (off < plain->len) {
                /* our BIO takes everything, so SSL_write writes it all (as 16 KiB records) */
                int k = SSL_write(s->ssl, plain->base + off,
                                  (int)KH_MIN(plain->len - off, (size_t)INT_MAX / 2));
                if (k <= 0) {
                    fail(s, "write", k);
                    kh_buf_release(plain, bufs);
                    return NULL;
                }
                off += (size_t)k;
            }
        }
    }
    /* Encrypted, or dropped after a failure or close_notify; an empty buffer that still holds a
     * block goes back too, so that nothing is kept for an idle connection. */
    if (plain->base && (s->established || s->failed))
        kh_buf_release(plain, bufs);
    return &s->cipher;
}

int kh_tls_close_notify(kh_tls *s)
{
    if (s->closed || !s->established || s->failed)
        return 0;
    s->closed = 1;
    size_t before = s->cipher.len;
    if (s->ssl == NULL) {
        kh_tls13_send_alert(&s->rec, KH_TLS_ALERT_CLOSE_NOTIFY, &s->cipher, &s->c->w->bufs);
    } else {
        SSL_shutdown(s->ssl); /* 0: ours is sent, the peer's is not awaited (RFC 8446 §6.1) */
        ERR_clear_error();
    }
    return s->cipher.len > before;
}
