/* kh_quic_crypto.c: GnuTLS for QUIC through ngtcp2_crypto_gnutls (see kh_quic_crypto.h).
 * Owns:  gnutls credentials (from the PEM the TLS module exported, so QUIC presents the same
 *        certificate and key as TLS over TCP) and per-connection sessions.
 * In:    kh_quic.c's calls.
 * Out:   sessions attached to ngtcp2 connections (ngtcp2_conn_set_tls_native_handle).
 * Never: reads a file, or runs on a worker before the credentials exist. */
#include "kh_quic_crypto.h"

#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <stdio.h>
#include <stdlib.h>

/* TLS 1.3 only (RFC 9001 §4.2), no middlebox compatibility mode (§8.4) */
#define PRIORITY                                                                                   \
    "%DISABLE_TLS13_COMPAT_MODE:NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:"          \
    "+AES-256-GCM:+CHACHA20-POLY1305:+AES-128-CCM"

struct kh_quic_creds {
    gnutls_certificate_credentials_t cred;
    gnutls_priority_t prio;
};

kh_quic_creds *kh_quic_creds_new(const char *cert_pem, size_t cert_len, const char *key_pem,
                                 size_t key_len, char *err, size_t errlen)
{
    kh_quic_creds *c = calloc(1, sizeof *c);
    int r = c ? gnutls_certificate_allocate_credentials(&c->cred) : GNUTLS_E_MEMORY_ERROR;
    if (r == 0) {
        gnutls_datum_t cd = {(unsigned char *)cert_pem, (unsigned)cert_len};
        gnutls_datum_t kd = {(unsigned char *)key_pem, (unsigned)key_len};
        r = gnutls_certificate_set_x509_key_mem2(c->cred, &cd, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
        if (r > 0) /* the index of the pair */
            r = 0;
    }
    if (r == 0)
        r = gnutls_priority_init(&c->prio, PRIORITY, NULL);
    if (r != 0) {
        snprintf(err, errlen, "http3: GnuTLS cannot use the certificate: %s", gnutls_strerror(r));
        kh_quic_creds_free(c);
        return NULL;
    }
    return c;
}

void kh_quic_creds_free(kh_quic_creds *c)
{
    if (c == NULL)
        return;
    if (c->prio)
        gnutls_priority_deinit(c->prio);
    if (c->cred)
        gnutls_certificate_free_credentials(c->cred);
    free(c);
}

void *kh_quic_session_new(kh_quic_creds *c, ngtcp2_conn *qc, ngtcp2_crypto_conn_ref *ref)
{
    gnutls_session_t s;
    if (gnutls_init(&s, GNUTLS_SERVER | GNUTLS_ENABLE_EARLY_DATA | GNUTLS_NO_END_OF_EARLY_DATA) != 0)
        return NULL;
    gnutls_datum_t alpn = {(unsigned char *)"h3", 2};
    if (gnutls_priority_set(s, c->prio) != 0 ||
        gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, c->cred) != 0 ||
        ngtcp2_crypto_gnutls_configure_server_session(s) != 0 ||
        gnutls_alpn_set_protocols(s, &alpn, 1,
                                  GNUTLS_ALPN_MANDATORY | GNUTLS_ALPN_SERVER_PRECEDENCE) != 0) {
        gnutls_deinit(s);
        return NULL;
    }
    gnutls_session_set_ptr(s, ref);
    ngtcp2_conn_set_tls_native_handle(qc, s);
    return s;
}

void kh_quic_session_free(void *session)
{
    if (session)
        gnutls_deinit((gnutls_session_t)session);
}

void kh_quic_rand(uint8_t *p, size_t n)
{
    gnutls_rnd(GNUTLS_RND_RANDOM, p, n);
}

const char *kh_quic_crypto_version(void)
{
    return gnutls_check_version(NULL);
}
