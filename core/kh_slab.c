/* kh_slab.c: see kh_slab.h. */
#include "kh_slab.h"

#include <string.h>

#include "kh_asan.h"
#include "kh_common.h"

#define BLOCK_BYTES 16384
#define BLOCK_HEAD 16 /* the block list's link (16: objects as aligned as malloc's) */

static size_t block_objects(const kh_slab *s)
{
    size_t n = (BLOCK_BYTES - BLOCK_HEAD) / s->size;
    return n ? n : 1;
}

void *kh_slab_alloc(kh_slab *s, size_t size)
{
    void *p = s->free;
    if (p) {
#ifdef KH_ASAN
        ASAN_UNPOISON_MEMORY_REGION(p, s->size);
#endif
        memcpy(&s->free, p, sizeof(void *));
        return p;
    }
    if (KH_UNLIKELY(s->next == s->end)) {
        if (s->size == 0)
            s->size = (size + 7) & ~(size_t)7;
        /* exactly n objects after the head: no tail wasted but malloc's own rounding */
        size_t n = block_objects(s);
        char *b = kh_xmalloc(BLOCK_HEAD + n * s->size);
        memcpy(b, &s->blocks, sizeof(void *));
        s->blocks = b;
        s->next = b + BLOCK_HEAD;
        s->end = s->next + n * s->size;
#ifdef KH_ASAN
        ASAN_POISON_MEMORY_REGION(s->next, n * s->size);
#endif
    }
    p = s->next;
    s->next += s->size;
#ifdef KH_ASAN
    ASAN_UNPOISON_MEMORY_REGION(p, s->size);
#endif
    return p;
}

void kh_slab_free(kh_slab *s, void *p)
{
    memcpy(p, &s->free, sizeof(void *));
    s->free = p;
#ifdef KH_ASAN
    ASAN_POISON_MEMORY_REGION(p, s->size);
#endif
}

void kh_slab_destroy(kh_slab *s)
{
    while (s->blocks) {
        char *b = s->blocks;
        memcpy(&s->blocks, b, sizeof(void *));
#ifdef KH_ASAN
        ASAN_UNPOISON_MEMORY_REGION(b, BLOCK_HEAD + block_objects(s) * s->size);
#endif
        free(b);
    }
    memset(s, 0, sizeof *s);
}
