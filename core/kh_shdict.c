/* kh_shdict.c: see kh_shdict.h. A chained hash table plus an LRU list, behind one mutex, over
 * one arena of `bytes` allocated when the dict is made: entries are carved from it by a buddy
 * allocator (blocks of 2^k bytes, k >= 7, split on demand and merged with their free buddy when
 * freed). Nothing else is allocated per entry, so the dict's memory is fixed: the arena plus the
 * bucket array. An entry takes the power of two above its header + key + value. */
#include "kh_shdict.h"

#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "kh_common.h"
#include "kh_err.h"

#define MIN_ORDER 7 /* 128-byte blocks: the entry header fits */
#define MAX_ORDERS 48

typedef struct blkhdr {
    uint8_t order; /* the block is 2^order bytes */
    uint8_t free;  /* on a free list */
} blkhdr;

typedef struct fblk fblk;
struct fblk { /* a free block */
    blkhdr h;
    fblk *prev, *next;
};

typedef struct entry entry;
struct entry {
    blkhdr h;             /* first: every block starts with it */
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

_Static_assert(sizeof(entry) + 16 <= (1u << MIN_ORDER) && sizeof(fblk) <= sizeof(entry),
               "an entry header and a short key fit the smallest block");

#define DATA(e) ((char *)((e) + 1))

struct kh_shdict {
    uv_mutex_t mu;
    char name[64];
    size_t budget, used, count;
    char *arena;
    size_t arena_len;
    int max_order;             /* the largest top-level block */
    fblk *freel[MAX_ORDERS];   /* free blocks by order */
    entry **buckets;
    uint32_t nbuckets;
    entry lru;       /* sentinel */
    kh_shdict *next; /* registry link */
};

/* ---- buddy allocator over d->arena ---- */

static void free_push(kh_shdict *d, fblk *b, int order)
{
    b->h.order = (uint8_t)order;
    b->h.free = 1;
    b->prev = NULL;
    b->next = d->freel[order];
    if (b->next)
        b->next->prev = b;
    d->freel[order] = b;
}

static void free_unlink(kh_shdict *d, fblk *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        d->freel[b->h.order] = b->next;
    if (b->next)
        b->next->prev = b->prev;
    b->h.free = 0;
}

static int order_for(size_t n)
{
    int o = MIN_ORDER;
    while (o < MAX_ORDERS - 1 && ((size_t)1 << o) < n)
        o++;
    return o;
}

static void *blk_alloc(kh_shdict *d, int order)
{
    int o = order;
    while (o <= d->max_order && d->freel[o] == NULL)
        o++;
    if (o > d->max_order)
        return NULL;
    fblk *b = d->freel[o];
    free_unlink(d, b);
    while (o > order) { /* split: keep the lower half, free the upper one */
        o--;
        free_push(d, (fblk *)((char *)b + ((size_t)1 << o)), o);
    }
    b->h.order = (uint8_t)order;
    b->h.free = 0;
    d->used += (size_t)1 << order;
    return b;
}

static void blk_free(kh_shdict *d, void *p)
{
    fblk *b = p;
    int o = b->h.order;
    d->used -= (size_t)1 << o;
    for (;;) {
        size_t off = (size_t)((char *)b - d->arena);
        size_t buddy_off = off ^ ((size_t)1 << o);
        if (o >= d->max_order || buddy_off + ((size_t)1 << o) > d->arena_len)
            break;
        fblk *buddy = (fblk *)(d->arena + buddy_off);
        if (!buddy->h.free || buddy->h.order != o)
            break;
        free_unlink(d, buddy);
        if (buddy_off < off)
            b = buddy;
        o++;
    }
    free_push(d, b, o);
}

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
    return (size_t)1 << order_for(sizeof(entry) + klen + vlen);
}

kh_shdict *kh_shdict_new(const char *name, size_t bytes)
{
    if (bytes < KH_SHDICT_MIN_BYTES)
        bytes = KH_SHDICT_MIN_BYTES;
    kh_shdict *d = kh_xcalloc(1, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->budget = bytes;
    d->arena = kh_xmalloc(bytes);
    d->arena_len = bytes;
    /* top-level blocks in decreasing powers of two from offset 0: each is aligned to its size */
    size_t off = 0;
    d->max_order = MIN_ORDER;
    for (int o = MAX_ORDERS - 1; o >= MIN_ORDER; o--) {
        while (bytes - off >= ((size_t)1 << o)) {
            if (o > d->max_order)
                d->max_order = o;
            free_push(d, (fblk *)(d->arena + off), o);
            off += (size_t)1 << o;
        }
    }
    d->arena_len = off; /* a tail below 128 bytes is not used */
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
    d->count--;
    blk_free(d, e);
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

/* A block for a new entry of `cost` bytes: evicts expired entries (a scan of at most 64 from
 * the LRU end), then the least recently used ones, until the allocator finds one. */
static entry *alloc_entry(kh_shdict *d, size_t cost, uint64_t now, int *evicted)
{
    int order = order_for(cost);
    entry *e = blk_alloc(d, order);
    if (e)
        return e;
    entry *x = d->lru.lprev;
    for (int i = 0; i < 64 && x != &d->lru; i++) {
        entry *prev = x->lprev;
        if (x->expires_ms && x->expires_ms <= now)
            unlink_entry(d, x);
        x = prev;
    }
    while ((e = blk_alloc(d, order)) == NULL && d->lru.lprev != &d->lru) {
        unlink_entry(d, d->lru.lprev);
        if (evicted)
            (*evicted)++;
    }
    return e;
}

static void insert(kh_shdict *d, entry *e, const char *k, size_t kl, uint32_t h,
                   const kh_shdict_value *v, uint64_t expires)
{
    size_t vlen = v->type == KH_SHDICT_STRING ? v->len : 0;
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
                  uint64_t ttl_ms, int mode, int *evicted)
{
    if (evicted)
        *evicted = 0;
    size_t vlen = v->type == KH_SHDICT_STRING ? v->len : 0;
    size_t cost = entry_cost(klen, vlen);
    uint32_t h = hash_key(key, klen);
    uint64_t now = now_ms();
    uv_mutex_lock(&d->mu);
    entry *e = lookup(d, key, klen, h, now);
    if (e && mode == KH_SHDICT_ADD) {
        uv_mutex_unlock(&d->mu);
        return KH_SHDICT_EXISTS;
    }
    if (e == NULL && mode == KH_SHDICT_REPLACE) {
        uv_mutex_unlock(&d->mu);
        return KH_SHDICT_NOT_FOUND;
    }
    if (v->type == KH_SHDICT_NIL) {
        if (e)
            unlink_entry(d, e);
        uv_mutex_unlock(&d->mu);
        return 0;
    }
    if (cost > ((size_t)1 << d->max_order)) {
        uv_mutex_unlock(&d->mu);
        return KH_ENOMEM;
    }
    if (e)
        unlink_entry(d, e);
    entry *ne = alloc_entry(d, cost, now, evicted);
    if (ne == NULL) {
        uv_mutex_unlock(&d->mu);
        return KH_ENOMEM;
    }
    insert(d, ne, key, klen, h, v, ttl_ms ? now + ttl_ms : 0);
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
        entry *ne = cost > ((size_t)1 << d->max_order) ? NULL : alloc_entry(d, cost, now, NULL);
        if (ne == NULL) {
            r = KH_ENOMEM;
        } else {
            kh_shdict_value v = {KH_SHDICT_NUMBER, init + delta, NULL, 0};
            insert(d, ne, key, klen, h, &v, ttl_ms ? now + ttl_ms : 0);
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

int kh_shdict_ttl(kh_shdict *d, const char *key, size_t klen, uint64_t *left_ms)
{
    uint32_t h = hash_key(key, klen);
    uint64_t now = now_ms();
    uv_mutex_lock(&d->mu);
    entry *e = lookup(d, key, klen, h, now);
    if (e)
        *left_ms = e->expires_ms ? e->expires_ms - now : 0;
    uv_mutex_unlock(&d->mu);
    return e ? 0 : KH_SHDICT_NOT_FOUND;
}

int kh_shdict_expire(kh_shdict *d, const char *key, size_t klen, uint64_t ttl_ms)
{
    uint32_t h = hash_key(key, klen);
    uint64_t now = now_ms();
    uv_mutex_lock(&d->mu);
    entry *e = lookup(d, key, klen, h, now);
    if (e)
        e->expires_ms = ttl_ms ? now + ttl_ms : 0;
    uv_mutex_unlock(&d->mu);
    return e ? 0 : KH_SHDICT_NOT_FOUND;
}

size_t kh_shdict_keys(kh_shdict *d, size_t max, char **buf, size_t *bufcap, size_t *len)
{
    uint64_t now = now_ms();
    size_t n = 0, o = 0;
    uv_mutex_lock(&d->mu);
    for (entry *e = d->lru.lnext; e != &d->lru && (max == 0 || n < max);) {
        entry *next = e->lnext;
        if (e->expires_ms && e->expires_ms <= now) {
            unlink_entry(d, e); /* reclaimed on the way */
        } else {
            size_t need = o + sizeof(uint32_t) + e->klen;
            if (*bufcap < need) {
                size_t cap = *bufcap ? *bufcap : 1024;
                while (cap < need)
                    cap *= 2;
                *buf = kh_xrealloc(*buf, cap);
                *bufcap = cap;
            }
            uint32_t kl = e->klen;
            memcpy(*buf + o, &kl, sizeof kl);
            memcpy(*buf + o + sizeof kl, DATA(e), kl);
            o = need;
            n++;
        }
        e = next;
    }
    uv_mutex_unlock(&d->mu);
    *len = o;
    return n;
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
    free(d->arena);
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
