/* kh_slab.h: a per-worker allocator of objects of one size (kh_conn, kh_stream, compact
 * streams), carved from blocks of about 16 KiB, so that an object costs its size: no malloc
 * chunk header, no rounding to 16 (memory per idle WebSocket, issue 10 item 8: a 448-byte
 * kh_conn was a 464-byte malloc chunk, a 264-byte compact stream a 272-byte one).
 * Owns:  its blocks (malloc), each holding as many objects as fit in 16 KiB, handed out in
 *        address order so that only the pages of objects handed out are touched; a free list.
 * In:    kh_slab_alloc / kh_slab_free from one thread (the worker's loop).
 * Out:   objects, 8-byte aligned (the size is rounded up to 8), uninitialised.
 * Never: hands a block back to malloc before kh_slab_destroy (the worker's end): a pool that
 *        keeps objects for stale-pointer checks (streams and their generations) may rely on
 *        that. Under ASan a freed object and the unused end of a block are poisoned, so a use
 *        after kh_slab_free is still reported. */
#ifndef KH_SLAB_H
#define KH_SLAB_H

#include <stddef.h>

typedef struct kh_slab {
    size_t size;  /* of one object (rounded up to 8); 0 until the first allocation */
    void *free;   /* freed objects, linked through their first word */
    char *next;   /* the newest block's unused objects */
    char *end;
    void *blocks; /* every block, linked through its first word */
} kh_slab;

/* A zeroed kh_slab is ready. Every call on one slab passes the same size. */
void *kh_slab_alloc(kh_slab *s, size_t size);
void kh_slab_free(kh_slab *s, void *p);
/* Frees every block (every object, in use or not). The slab is zeroed, ready again. */
void kh_slab_destroy(kh_slab *s);

#endif
