/* kh_dns.c: see kh_dns.h.
 * The cache is a small array searched linearly: a worker talks to a handful of upstreams, and
 * KH_DNS_CACHE entries (the oldest is replaced) keep a flood of distinct names from growing it.
 * No negative caching: a failed lookup is asked again next time. */
#include "kh_dns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_common.h"

#define KH_DNS_CACHE 64
#define KH_DNS_HOST_MAX 256

typedef struct entry {
    char host[KH_DNS_HOST_MAX];
    struct sockaddr_storage addrs[KH_DNS_MAX_ADDRS]; /* port 0 */
    int n;
    uint64_t expires; /* loop time, ms; 0: empty slot */
} entry;

struct kh_dns_req {
    uv_getaddrinfo_t gai;
    kh_dns *d;         /* NULL once orphaned (kh_dns_free) */
    kh_dns_cb cb;      /* NULL once cancelled */
    void *arg;
    int port;
    kh_dns_req *prev, *next;
    char host[KH_DNS_HOST_MAX];
};

struct kh_dns {
    uv_loop_t *loop;
    uint64_t cache_ms;
    entry cache[KH_DNS_CACHE];
    kh_dns_req *pending;
    uint64_t hits, lookups;
};

kh_dns *kh_dns_new(uv_loop_t *loop, uint64_t cache_ms)
{
    kh_dns *d = kh_xcalloc(1, sizeof *d);
    d->loop = loop;
    d->cache_ms = cache_ms;
    return d;
}

static void unlink_req(kh_dns_req *r)
{
    if (r->d == NULL)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        r->d->pending = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

void kh_dns_free(kh_dns *d)
{
    if (d == NULL)
        return;
    for (kh_dns_req *r = d->pending; r;) {
        kh_dns_req *next = r->next;
        r->d = NULL;
        r->cb = NULL;
        r->prev = r->next = NULL;
        uv_cancel((uv_req_t *)&r->gai);
        r = next;
    }
    free(d);
}

void kh_dns_counts(const kh_dns *d, uint64_t *hits, uint64_t *lookups)
{
    *hits = d ? d->hits : 0;
    *lookups = d ? d->lookups : 0;
}

static void set_port(struct sockaddr_storage *ss, int port)
{
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
}

static int copy_out(const struct sockaddr_storage *in, int n, int port,
                    struct sockaddr_storage *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = in[i];
        set_port(&out[i], port);
    }
    return n;
}

static int literal(const char *host, int port, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof *out);
    struct sockaddr_in *a4 = (struct sockaddr_in *)out;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        return 1;
    }
    /* "[::1]" as well as "::1" */
    char buf[64];
    size_t len = strlen(host);
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']' && len - 2 < sizeof buf) {
        memcpy(buf, host + 1, len - 2);
        buf[len - 2] = '\0';
        host = buf;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        return 1;
    }
    return 0;
}

static entry *find(kh_dns *d, const char *host, uint64_t now)
{
    for (int i = 0; i < KH_DNS_CACHE; i++) {
        entry *e = &d->cache[i];
        if (e->expires > now && strcmp(e->host, host) == 0)
            return e;
    }
    return NULL;
}

static void store(kh_dns *d, const char *host, const struct sockaddr_storage *a, int n)
{
    if (d->cache_ms == 0)
        return;
    uint64_t now = uv_now(d->loop);
    entry *slot = NULL;
    for (int i = 0; i < KH_DNS_CACHE; i++) {
        entry *e = &d->cache[i];
        if (strcmp(e->host, host) == 0 || e->expires <= now) {
            slot = e;
            break;
        }
        if (slot == NULL || e->expires < slot->expires)
            slot = e; /* the one that expires first */
    }
    snprintf(slot->host, sizeof slot->host, "%s", host);
    for (int i = 0; i < n; i++) {
        slot->addrs[i] = a[i];
        set_port(&slot->addrs[i], 0);
    }
    slot->n = n;
    slot->expires = now + d->cache_ms;
}

static void gai_cb(uv_getaddrinfo_t *g, int status, struct addrinfo *res)
{
    kh_dns_req *r = KH_CONTAINER_OF(g, kh_dns_req, gai);
    struct sockaddr_storage addrs[KH_DNS_MAX_ADDRS];
    int n = 0;
    if (status == 0) {
        /* IPv4 first: a service bound to 127.0.0.1 is reached when "localhost" also has ::1 */
        for (int pass = 0; pass < 2; pass++)
            for (struct addrinfo *ai = res; ai && n < KH_DNS_MAX_ADDRS; ai = ai->ai_next) {
                if ((pass == 0) != (ai->ai_family == AF_INET))
                    continue;
                if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
                    continue;
                memset(&addrs[n], 0, sizeof addrs[n]);
                memcpy(&addrs[n], ai->ai_addr, ai->ai_addrlen);
                set_port(&addrs[n], r->port);
                n++;
            }
        if (n == 0)
            status = UV_EAI_NONAME;
    }
    uv_freeaddrinfo(res);
    kh_dns *d = r->d;
    kh_dns_cb cb = r->cb;
    void *arg = r->arg;
    unlink_req(r);
    if (d && status == 0)
        store(d, r->host, addrs, n);
    free(r);
    if (cb)
        cb(arg, status, addrs, n);
}

int kh_dns_resolve(kh_dns *d, const char *host, int port, struct sockaddr_storage out[KH_DNS_MAX_ADDRS],
                   kh_dns_cb cb, void *arg, kh_dns_req **req)
{
    *req = NULL;
    if (literal(host, port, out))
        return 1;
    size_t len = strlen(host);
    if (len == 0 || len >= KH_DNS_HOST_MAX)
        return UV_EINVAL;
    entry *e = find(d, host, uv_now(d->loop));
    if (e) {
        d->hits++;
        return copy_out(e->addrs, e->n, port, out);
    }
    kh_dns_req *r = kh_xcalloc(1, sizeof *r);
    r->d = d;
    r->cb = cb;
    r->arg = arg;
    r->port = port;
    memcpy(r->host, host, len + 1);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    int rc = uv_getaddrinfo(d->loop, &r->gai, gai_cb, r->host, NULL, &hints);
    if (rc != 0) {
        free(r);
        return rc;
    }
    d->lookups++;
    r->next = d->pending;
    if (d->pending)
        d->pending->prev = r;
    d->pending = r;
    *req = r;
    return 0;
}

void kh_dns_cancel(kh_dns_req *r)
{
    if (r == NULL)
        return;
    r->cb = NULL;
    /* a lookup not yet started is dropped; one running finishes and is freed by gai_cb */
    uv_cancel((uv_req_t *)&r->gai);
}

static int private4(uint32_t a)
{
    return (a >> 24) == 10 || (a >> 24) == 127 || (a >> 24) == 0 || (a >> 20) == 0xac1 ||
           (a >> 16) == 0xc0a8 || (a >> 16) == 0xa9fe || (a >> 22) == (0x64400000u >> 22);
}

int kh_dns_is_private(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
        return private4(a);
    }
    if (sa->sa_family != AF_INET6)
        return 1;
    const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
    static const uint8_t zero[16];
    if (memcmp(b, zero, 15) == 0 && (b[15] == 0 || b[15] == 1))
        return 1; /* :: and ::1 */
    if ((b[0] & 0xfe) == 0xfc)
        return 1; /* fc00::/7 */
    if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80)
        return 1; /* fe80::/10 */
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(b, mapped, 12) == 0)
        return private4((uint32_t)b[12] << 24 | (uint32_t)b[13] << 16 | (uint32_t)b[14] << 8 |
                        b[15]);
    return 0;
}
