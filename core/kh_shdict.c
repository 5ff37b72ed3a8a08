/* kh_shdict.c: see kh_shdict.h. A chained hash table plus an LRU list, behind one mutex. Entries
 * are malloc'd, but their bytes are counted against the fixed budget, so the dict's memory is
 * bounded by bytes + the bucket array. */
#include "kh_shdict.h"

#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "kh_common.h"
#include "kh_err.h"

typedef struct entry entry;
struct entry {
    entry *hnext;         /* bucket chain */
    entry *lprev, *lnext; /* LRU list: head is the most recent */
    uint64_t expires_ms;  /* 0: never */
    uint32_t hash;
    uint32_t klen;
    size_t vlen;
    int type;
    double num;
    /* followed by the key, then the string value (DATA(e)); no flexible array member, so the
     * LRU sentinel can be an entry inside struct kh_shdict */
};

#define DATA(e) ((char *)((e) + 1))

struct kh_shdict {
    uv_mutex_t mu;
    char name[64];
    size_t budget, used, count;
    entry **buckets;
    uint32_t nbuckets;
    entry lru;       /* sentinel */
    kh_shdict *next; /* registry link */
};

static uint64_t now_ms(void)
{
    return uv_hrtime() / 1000000u;
}

static uint32_t hash_key(const char *k, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)k[i];
        h *= 16777619u;
    }
    return h;
}

static size_t entry_cost(size_t klen, size_t vlen)
{
    return KH_SHDICT_ENTRY_OVERHEAD + klen + vlen;
}

kh_shdict *kh_shdict_new(const char *name, size_t bytes)
{
    if (bytes < KH_SHDICT_MIN_BYTES)
        bytes = KH_SHDICT_MIN_BYTES;
    kh_shdict *d = kh_xcalloc(1, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->budget = bytes;
    uint32_t nb = 64;
    while (nb < bytes / 256 && nb < (1u << 24))
        nb <<= 1;
    d->nbuckets = nb;
    d->buckets = kh_xcalloc(nb, sizeof *d->buckets);
    d->lru.lprev = d->lru.lnext = &d->lru;
    uv_mutex_init(&d->mu);
    return d;
}

static void unlink_entry(kh_shdict *d, entry *e)
{
    entry **pp = &d->buckets[e->hash & (d->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    e->lprev->lnext = e->lnext;
    e->lnext->lprev = e->lprev;
    d->used -= entry_cost(e->klen, e->vlen);
    d->count--;
    free(e);
}

static void touch(kh_shdict *d, entry *e)
{
    e->lprev->lnext = e->lnext;
    e->lnext->lprev = e->lprev;
    e->lnext = d->lru.lnext;
    e->lprev = &d->lru;
    d->lru.lnext->lprev = e;
    d->lru.lnext = e;
}

/* The live entry for key, or NULL; an expired one is removed on the way. */
static entry *lookup(kh_shdict *d, const char *k, size_t kl, uint32_t h, uint64_t now)
{
    for (entry *e = d->buckets[h & (d->nbuckets - 1)]; e; e = e->hnext) {
        if (e->hash == h && e->klen == kl && memcmp(DATA(e), k, kl) == 0) {
            if (e->expires_ms && e->expires_ms <= now) {
                unlink_entry(d, e);
                return NULL;
            }
            return e;
        }
    }
    return NULL;
}

/* Frees room for `need` more bytes: expired entries first (a scan from the LRU end of at most
 * 64 entries), then least recently used ones. */
static int make_room(kh_shdict *d, size_t need, uint64_t now)
{
    int evicted = 0;
    if (d->used + need <= d->budget)
        return 0;
    entry *e = d->lru.lprev;
    for (int i = 0; i < 64 && e != &d->lru && d->used + need > d->budget; i++) {
        entry *prev = e->lprev;
        if (e->expires_ms && e->expires_ms <= now)
            unlink_entry(d, e);
        e = prev;
    }
    while (d->used + need > d->budget && d->lru.lprev != &d->lru) {
        unlink_entry(d, d->lru.lprev);
        evicted++;
    }
    return evicted;
}

static void insert(kh_shdict *d, const char *k, size_t kl, uint32_t h, const kh_shdict_value *v,
                   uint64_t expires)
{
    size_t vlen = v->type == KH_SHDICT_STRING ? v->len : 0;
    entry *e = kh_xmalloc(sizeof *e + kl + vlen);
    e->hash = h;
    e->klen = (uint32_t)kl;
    e->vlen = vlen;
    e->type = v->type;
    e->num = v->num;
    e->expires_ms = expires;
    memcpy(DATA(e), k, kl);
    if (vlen)
        memcpy(DATA(e) + kl, v->str, vlen);
    uint32_t b = h & (d->nbuckets - 1);
    e->hnext = d->buckets[b];
    d->buckets[b] = e;
    e->lnext = d->lru.lnext;
    e->lprev = &d->lru;
    d->lru.lnext->lprev = e;
    d->lru.lnext = e;
    d->used += entry_cost(kl, vlen);
    d->count++;
}

int kh_shdict_get(kh_shdict *d, const char *key, size_t klen, kh_shdict_value *out, char **buf,
                  size_t *bufcap)
{
    uint32_t h = hash_key(key, klen);
    uv_mutex_lock(&d->mu);
    entry *e = lookup(d, key, klen, h, now_ms());
    if (e == NULL) {
        uv_mutex_unlock(&d->mu);
        out->type = KH_SHDICT_NIL;
        return KH_SHDICT_NOT_FOUND;
    }
    touch(d, e);
    out->type = e->type;
    out->num = e->num;
    out->len = e->vlen;
    out->str = NULL;
    if (e->type == KH_SHDICT_STRING) {
        if (*bufcap < e->vlen + 1) {
            *buf = kh_xrealloc(*buf, e->vlen + 1);
            *bufcap = e->vlen + 1;
        }
        memcpy(*buf, DATA(e) + e->klen, e->vlen);
        out->str = *buf;
    }
    uv_mutex_unlock(&d->mu);
    return 0;
}

int kh_shdict_set(kh_shdict *d, const char *key, size_t klen, const kh_shdict_value *v,
                  uint64_t ttl_ms, int add, int *evicted)
{
    if (evicted)
        *evicted = 0;
    size_t vlen = v->type == KH_SHDICT_STRING ? v->len : 0;
    size_t cost = entry_cost(klen, vlen);
    uint32_t h = hash_key(key, klen);
    uint64_t now = now_ms();
    uv_mutex_lock(&d->mu);
    entry *e = lookup(d, key, klen, h, now);
    if (e && add) {
        uv_mutex_unlock(&d->mu);
        return KH_SHDICT_EXISTS;
    }
    if (v->type == KH_SHDICT_NIL) {
        if (e)
            unlink_entry(d, e);
        uv_mutex_unlock(&d->mu);
        return 0;
    }
    if (cost > d->budget) {
        uv_mutex_unlock(&d->mu);
        return KH_ENOMEM;
    }
    if (e)
        unlink_entry(d, e);
    int n = make_room(d, cost, now);
    if (evicted)
        *evicted = n;
    insert(d, key, klen, h, v, ttl_ms ? now + ttl_ms : 0);
    uv_mutex_unlock(&d->mu);
    return 0;
}

int kh_shdict_incr(kh_shdict *d, const char *key, size_t klen, double delta, int has_init,
                   double init, uint64_t ttl_ms, double *result)
{
    uint32_t h = hash_key(key, klen);
    uint64_t now = now_ms();
    uv_mutex_lock(&d->mu);
    entry *e = lookup(d, key, klen, h, now);
    int r = 0;
    if (e) {
        if (e->type != KH_SHDICT_NUMBER) {
            r = KH_SHDICT_NOT_NUMBER;
        } else {
            e->num += delta;
            *result = e->num;
            touch(d, e);
        }
    } else if (!has_init) {
        r = KH_SHDICT_NOT_FOUND;
    } else {
        size_t cost = entry_cost(klen, 0);
        if (cost > d->budget) {
            r = KH_ENOMEM;
        } else {
            make_room(d, cost, now);
            kh_shdict_value v = {KH_SHDICT_NUMBER, init + delta, NULL, 0};
            insert(d, key, klen, h, &v, ttl_ms ? now + ttl_ms : 0);
            *result = v.num;
        }
    }
    uv_mutex_unlock(&d->mu);
    return r;
}

int kh_shdict_delete(kh_shdict *d, const char *key, size_t klen)
{
    uint32_t h = hash_key(key, klen);
    uv_mutex_lock(&d->mu);
    entry *e = lookup(d, key, klen, h, now_ms());
    if (e)
        unlink_entry(d, e);
    uv_mutex_unlock(&d->mu);
    return e ? 0 : KH_SHDICT_NOT_FOUND;
}

static void flush_locked(kh_shdict *d)
{
    while (d->lru.lnext != &d->lru)
        unlink_entry(d, d->lru.lnext);
}

void kh_shdict_flush_all(kh_shdict *d)
{
    uv_mutex_lock(&d->mu);
    flush_locked(d);
    uv_mutex_unlock(&d->mu);
}

size_t kh_shdict_count(kh_shdict *d)
{
    uint64_t now = now_ms();
    uv_mutex_lock(&d->mu);
    size_t n = 0;
    for (entry *e = d->lru.lnext; e != &d->lru; e = e->lnext)
        if (!(e->expires_ms && e->expires_ms <= now))
            n++;
    uv_mutex_unlock(&d->mu);
    return n;
}

size_t kh_shdict_used(kh_shdict *d)
{
    uv_mutex_lock(&d->mu);
    size_t n = d->used;
    uv_mutex_unlock(&d->mu);
    return n;
}

const char *kh_shdict_name(const kh_shdict *d)
{
    return d->name;
}

size_t kh_shdict_capacity(const kh_shdict *d)
{
    return d->budget;
}

void kh_shdict_free(kh_shdict *d)
{
    if (d == NULL)
        return;
    flush_locked(d);
    uv_mutex_destroy(&d->mu);
    free(d->buckets);
    free(d);
}

struct kh_shdict_reg {
    uv_mutex_t mu;
    kh_shdict *head;
};

kh_shdict_reg *kh_shdict_reg_new(void)
{
    kh_shdict_reg *r = kh_xcalloc(1, sizeof *r);
    uv_mutex_init(&r->mu);
    return r;
}

void kh_shdict_reg_free(kh_shdict_reg *r)
{
    if (r == NULL)
        return;
    while (r->head) {
        kh_shdict *d = r->head;
        r->head = d->next;
        kh_shdict_free(d);
    }
    uv_mutex_destroy(&r->mu);
    free(r);
}

static kh_shdict *find_locked(kh_shdict_reg *r, const char *name)
{
    for (kh_shdict *d = r->head; d; d = d->next)
        if (strcmp(d->name, name) == 0)
            return d;
    return NULL;
}

kh_shdict *kh_shdict_declare(kh_shdict_reg *r, const char *name, size_t bytes, char *err,
                             size_t errlen)
{
    if (name[0] == '\0' || strlen(name) >= 64) {
        snprintf(err, errlen, "shared dict name must be 1 to 63 bytes");
        return NULL;
    }
    if (bytes < KH_SHDICT_MIN_BYTES)
        bytes = KH_SHDICT_MIN_BYTES;
    uv_mutex_lock(&r->mu);
    kh_shdict *d = find_locked(r, name);
    if (d && d->budget != bytes) {
        snprintf(err, errlen, "shared dict '%s' already declared with %zu bytes (not %zu)", name,
                 d->budget, bytes);
        d = NULL;
    } else if (d == NULL) {
        d = kh_shdict_new(name, bytes);
        d->next = r->head;
        r->head = d;
    }
    uv_mutex_unlock(&r->mu);
    return d;
}

kh_shdict *kh_shdict_find(kh_shdict_reg *r, const char *name)
{
    uv_mutex_lock(&r->mu);
    kh_shdict *d = find_locked(r, name);
    uv_mutex_unlock(&r->mu);
    return d;
}
