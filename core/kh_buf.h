/* kh_buf.h: growable byte buffers and a per-worker cache of fixed-size blocks.
 * Owns:  a kh_buf owns its bytes; whoever holds the kh_buf is the one owner (a conn's in/out buffer,
 *        a stream's body). kh_bufcache owns the idle blocks it keeps.
 * Never: is shared between threads (each worker has its own cache).
 * Why a cache: an idle keep-alive connection must hold no buffer (design.md §3), so every request
 * takes and returns one; recycling blocks of one size keeps that off malloc's slow paths. */
#ifndef KH_BUF_H
#define KH_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "kh_common.h"

#define KH_BUF_BLOCK 16384

typedef struct kh_bufcache {
    void **blocks;
    size_t count, max;
} kh_bufcache;

typedef struct kh_buf {
    char *base;
    size_t len, cap;
} kh_buf;

void kh_bufcache_init(kh_bufcache *c, size_t max_blocks);
void kh_bufcache_destroy(kh_bufcache *c);

/* Ensures room for `extra` more bytes (taking a block from the cache first); returns the write
 * position. Aborts on allocation failure (peer-driven growth is capped by the caller's limits). */
char *kh_buf_reserve(kh_buf *b, kh_bufcache *c, size_t extra);
void kh_buf_append(kh_buf *b, kh_bufcache *c, const void *p, size_t n);
/* Drops the first n bytes. */
void kh_buf_consume(kh_buf *b, size_t n);
/* Gives the memory back (to the cache if it is a plain block) and empties b. */
void kh_buf_release(kh_buf *b, kh_bufcache *c);

#endif
