/* kh_proto.c: the protocol registry (see kh_proto.h).
 * Owns:  the built-in table (h2, then http/1.1: the order of preference for ALPN) and the
 *        registered entries, copied in by kh_proto_register.
 * In:    lookups from kh_tls (ALPN), kh_h1 (preface, Upgrade), the sinks (Alt-Svc).
 * Out:   c->proto set and the protocol started.
 * Never: holds per-connection state. */
#include "kh_proto.h"

#include <stdio.h>
#include <string.h>

#include "kh_conn.h"
#include "kh_h1.h"
#include "kh_h2.h"

static const kh_proto builtin[] = {
    {.name = "h2", .transport = KH_PROTO_TCP, .alpn = "h2", .vt = &kh_h2_proto, .start = kh_h2_start,
     .preface = KH_H2_PREFACE, .preface_len = KH_H2_PREFACE_LEN, .upgrade_token = "h2c",
     .upgrade = kh_h2_upgrade},
    {.name = "http/1.1", .transport = KH_PROTO_TCP, .alpn = "http/1.1", .vt = &kh_h1_proto, .start = kh_h1_start},
};

static kh_proto registered[KH_PROTO_MAX];
static size_t num_registered;

int kh_proto_register(const kh_proto *p)
{
    if (num_registered == KH_PROTO_MAX)
        return -1;
    registered[num_registered++] = *p;
    return 0;
}

void kh_proto_unregister_all(void)
{
    num_registered = 0;
}

/* Every entry, built-in first: i in [0, count()). */
static size_t count(void)
{
    return KH_ARRAY_LEN(builtin) + num_registered;
}

static const kh_proto *at(size_t i)
{
    return i < KH_ARRAY_LEN(builtin) ? &builtin[i] : &registered[i - KH_ARRAY_LEN(builtin)];
}

size_t kh_proto_alpn_wire(unsigned char *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < count(); i++) {
        const kh_proto *p = at(i);
        if (p->transport != KH_PROTO_TCP || p->alpn == NULL || p->start == NULL)
            continue;
        size_t len = strlen(p->alpn);
        if (n + 1 + len > cap)
            break;
        out[n++] = (unsigned char)len;
        memcpy(out + n, p->alpn, len);
        n += len;
    }
    return n;
}

void kh_proto_start(kh_conn *c, const char *alpn, size_t len)
{
    for (size_t i = 0; i < count() && len; i++) {
        const kh_proto *p = at(i);
        if (p->transport == KH_PROTO_TCP && p->start && p->alpn && strlen(p->alpn) == len &&
            memcmp(p->alpn, alpn, len) == 0) {
            c->proto = p->vt;
            p->start(c);
            return;
        }
    }
    c->proto = &kh_h1_proto;
    kh_h1_start(c); /* cleartext, or no ALPN in the ClientHello */
}

int kh_proto_sniff(kh_conn *c, const char *p, size_t n)
{
    int maybe = 0;
    for (size_t i = 0; i < count(); i++) {
        const kh_proto *e = at(i);
        if (e->transport != KH_PROTO_TCP || e->preface == NULL)
            continue;
        size_t k = KH_MIN(n, e->preface_len);
        if (memcmp(p, e->preface, k) != 0)
            continue;
        if (k < e->preface_len) {
            maybe = 1;
            continue;
        }
        c->proto = e->vt;
        e->start(c);
        return 1;
    }
    return maybe ? -1 : 0;
}

const kh_proto *kh_proto_by_upgrade(const char *token, size_t len)
{
    for (size_t i = 0; i < count(); i++) {
        const kh_proto *p = at(i);
        if (p->upgrade_token && p->upgrade && strlen(p->upgrade_token) == len &&
            memcmp(p->upgrade_token, token, len) == 0)
            return p;
    }
    return NULL;
}

size_t kh_proto_alt_svc(int port, char *out, size_t cap)
{
    size_t n = 0;
    if (cap)
        out[0] = '\0';
    for (size_t i = 0; i < count(); i++) {
        const kh_proto *p = at(i);
        if (p->transport != KH_PROTO_QUIC || p->alpn == NULL)
            continue;
        int k = snprintf(out + n, cap - n, "%s%s=\":%d\"; ma=%u", n ? ", " : "", p->alpn, port,
                         p->alt_svc_max_age);
        if (k < 0 || (size_t)k >= cap - n)
            break;
        n += (size_t)k;
    }
    return n;
}
