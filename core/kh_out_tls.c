/* kh_out_tls.c: TLS on an outbound connection, through kh_tls_client (khamsin-tls.so, loaded on
 * first use): the settings kept with the connection (and spelled in its pool key), the
 * handshake as an operation (kh_out_tls, or after the connect when the target asks), and the
 * ciphertext moved between the socket and the TLS client (tls_drain: records in, plaintext to
 * the input buffer; flush_tls: records out).
 * Owns:  the kh_tls_client of a connection (kh_out.c frees it with the connection).
 * Never: includes OpenSSL (only khamsin-tls.so does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_common.h"
#include "kh_err.h"
#include "kh_out_int.h"

static void copy_tls_opts(kh_out *o, const kh_out_tls_opts *t);

void kh__out_tls_fields_of(const char *host, const kh_out_tls_opts *t, tls_fields *f)
{
    snprintf(f->sni, sizeof f->sni, "%s", t->server_name && *t->server_name ? t->server_name : host);
    /* "[::1]" -> "::1" for the name check */
    size_t l = strlen(f->sni);
    if (l >= 2 && f->sni[0] == '[' && f->sni[l - 1] == ']') {
        memmove(f->sni, f->sni + 1, l - 2);
        f->sni[l - 2] = '\0';
    }
    f->verify = t->verify;
    snprintf(f->ca, sizeof f->ca, "%s", t->ca_file ? t->ca_file : "");
    snprintf(f->alpn, sizeof f->alpn, "%s", t->alpn ? t->alpn : "");
}

static void copy_tls_opts(kh_out *o, const kh_out_tls_opts *t)
{
    tls_fields f;
    kh__out_tls_fields_of(o->host, t, &f);
    memcpy(o->sni, f.sni, sizeof o->sni);
    memcpy(o->ca, f.ca, sizeof o->ca);
    memcpy(o->alpn, f.alpn, sizeof o->alpn);
    o->verify = f.verify;
}

/* Moves the TLS client's ciphertext to the socket. */
int kh__out_flush_tls(kh_out *o)
{
    char buf[READ_CHUNK];
    size_t n;
    while ((n = kh_tls_client_pending(o->tls, buf, sizeof buf)) > 0) {
        int r = kh__out_send_raw(o, buf, n);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Decrypts what the TLS client holds into `in`. */
void kh__out_tls_drain(kh_out *o)
{
    for (;;) {
        char *p = kh__out_in_reserve(o, READ_CHUNK);
        int n = kh_tls_client_read(o->tls, p, o->in_cap - o->in_len);
        if (n > 0) {
            o->in_len += (size_t)n;
            continue;
        }
        if (n == -1)
            o->eof = 1;
        else if (n < -1) {
            o->rerr = KH_EPROTO;
            snprintf(o->errmsg, sizeof o->errmsg, "tls: bad record from the peer");
        }
        break;
    }
    if (kh__out_flush_tls(o) < 0)
        o->rerr = UV_EPIPE;
}

int kh__out_tls_begin(kh_out *o)
{
    unsigned char wire[128];
    size_t wl = 0;
    const char *p = o->alpn;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0 && n < 256 && wl + 1 + n <= sizeof wire) {
            wire[wl++] = (unsigned char)n;
            memcpy(wire + wl, p, n);
            wl += n;
        }
        p += n + (e ? 1 : 0);
    }
    kh_tls_client_opts co = {
        .server_name = o->sni,
        .verify = o->verify,
        .ca_file = o->ca[0] ? o->ca : NULL,
        .alpn_wire = wl ? wire : NULL,
        .alpn_len = wl,
    };
    o->tls = kh_tls_client_new(&co, o->errmsg, sizeof o->errmsg);
    if (o->tls == NULL)
        return KH_EPROTO;
    o->state = S_HANDSHAKE;
    kh__out_tls_step(o);
    return 0;
}

/* Advances the handshake; ends the operation when it is done or failed. */
void kh__out_tls_step(kh_out *o)
{
    int r = kh_tls_client_handshake(o->tls, o->errmsg, sizeof o->errmsg);
    int f = kh__out_flush_tls(o);
    if (r < 0 || f < 0) {
        o->state = S_OPEN;
        kh__out_op_done(o, r < 0 ? KH_EPROTO : f);
        return;
    }
    if (r == 1) {
        o->state = S_OPEN;
        snprintf(o->alpn_sel, sizeof o->alpn_sel, "%s", kh_tls_client_alpn(o->tls));
        o->errmsg[0] = '\0';
        kh__out_tls_drain(o); /* application data that came with the last handshake flight */
        kh__out_op_done(o, 0);
        return;
    }
    int s = kh__out_start_reading(o);
    if (s < 0) {
        o->state = S_OPEN;
        kh__out_op_done(o, s);
    }
}

int kh_out_tls(kh_out *o, const kh_out_tls_opts *t, uint64_t timeout_ms, kh_out_cb cb, void *arg)
{
    if (o->state != S_OPEN || o->broken)
        return UV_ENOTCONN;
    if (o->op != OP_NONE)
        return UV_EBUSY;
    if (o->tls) {
        /* a pooled TLS connection: already done, if it was made for the same settings */
        tls_fields probe;
        kh__out_tls_fields_of(o->host, t, &probe);
        if (strcmp(probe.sni, o->sni) == 0 && probe.verify == o->verify &&
            strcmp(probe.ca, o->ca) == 0 && strcmp(probe.alpn, o->alpn) == 0)
            return 1;
        snprintf(o->errmsg, sizeof o->errmsg, "tls: the connection already speaks TLS with "
                 "other settings");
        return UV_EINVAL;
    }
    copy_tls_opts(o, t);
    o->want_tls = 1;
    if (o->pool == NULL)
        kh__out_make_key(o, NULL);
    kh__out_start_op(o, OP_TLS, timeout_ms, cb, arg);
    int r = kh__out_tls_begin(o);
    if (r < 0)
        return kh__out_start_failed(o, r);
    if (o->op == OP_NONE) /* cannot happen: the first flight always waits for the server */
        return o->broken ? KH_EPROTO : 1;
    return 0;
}

int kh_out_tls_preload(int verify, const char *ca_file, char *err, size_t errlen)
{
    kh_tls_client_opts co = {.server_name = "localhost", .verify = verify, .ca_file = ca_file};
    kh_tls_client *c = kh_tls_client_new(&co, err, errlen);
    if (c == NULL)
        return -1;
    kh_tls_client_free(c);
    return 0;
}
