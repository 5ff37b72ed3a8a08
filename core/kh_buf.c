/* kh_buf.c: see kh_buf.h. */
#include "kh_buf.h"

void kh_bufcache_init(kh_bufcache *c, size_t max_blocks)
{
    c->blocks = kh_xcalloc(max_blocks ? max_blocks : 1, sizeof(void *));
    c->count = 0;
    c->max = max_blocks;
}

void kh_bufcache_destroy(kh_bufcache *c)
{
    for (size_t i = 0; i < c->count; i++)
        free(c->blocks[i]);
    free(c->blocks);
    c->blocks = NULL;
    c->count = 0;
}

char *kh_buf_reserve(kh_buf *b, kh_bufcache *c, size_t extra)
{
    if (b->cap - b->len >= extra)
        return b->base + b->len;
    size_t need = b->len + extra;
    if (b->base == NULL && need <= KH_BUF_BLOCK) {
        b->base = (c && c->count) ? c->blocks[--c->count] : kh_xmalloc(KH_BUF_BLOCK);
        b->cap = KH_BUF_BLOCK;
        return b->base + b->len;
    }
    size_t cap = b->cap ? b->cap : KH_BUF_BLOCK;
    while (cap < need)
        cap *= 2;
    b->base = kh_xrealloc(b->base, cap);
    b->cap = cap;
    return b->base + b->len;
}

void kh_buf_append(kh_buf *b, kh_bufcache *c, const void *p, size_t n)
{
    if (n == 0)
        return;
    memcpy(kh_buf_reserve(b, c, n), p, n);
    b->len += n;
}

void kh_buf_consume(kh_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->base, b->base + n, b->len - n);
    b->len -= n;
}

void kh_buf_release(kh_buf *b, kh_bufcache *c)
{
    if (b->base) {
        if (c && b->cap == KH_BUF_BLOCK && c->count < c->max)
            c->blocks[c->count++] = b->base;
        else
            free(b->base);
    }
    b->base = NULL;
    b->len = b->cap = 0;
}
