/* test_slab.c: kh_slab (kh_slab.h): objects are distinct, aligned and packed without a header,
 * freed ones come back first, blocks are added as needed and all freed by destroy; under ASan
 * a freed object is poisoned (a use after free is still reported). */
#include <stdint.h>
#include <string.h>

#include "kh_asan.h"
#include "kh_slab.h"
#include "kh_test.h"

#define N 2000

static void run(size_t size)
{
    static unsigned char *p[N];
    kh_slab s = {0};
    int aligned = 1, distinct = 1, packed = 0;
    for (int i = 0; i < N; i++) {
        p[i] = kh_slab_alloc(&s, size);
        memset(p[i], (int)(i & 0xff), size); /* all of it is ours (ASan checks) */
        aligned &= ((uintptr_t)p[i] & 7) == 0;
        if (i && p[i] == p[i - 1] + s.size)
            packed++;
    }
    for (int i = 0; i < N; i++)
        distinct &= p[i][0] == (unsigned char)(i & 0xff) && p[i][size - 1] == (unsigned char)(i & 0xff);
    kh_is_int(s.size, (size + 7) & ~(size_t)7, "size %zu: rounded up to 8 only", size);
    kh_ok(aligned, "size %zu: 8-byte aligned", size);
    kh_ok(distinct, "size %zu: no two objects overlap", size);
    /* only a block boundary breaks the run: about one per 16 KiB */
    kh_ok(packed >= N - 1 - (int)(N * s.size / 16000 + 1), "size %zu: back to back in a block (%d of %d)",
          size, packed, N - 1);
    kh_slab_free(&s, p[10]);
    kh_slab_free(&s, p[20]);
#ifdef KH_ASAN
    kh_ok(__asan_address_is_poisoned(p[10]) && __asan_address_is_poisoned(p[20] + size - 1),
          "size %zu: a freed object is poisoned", size);
#endif
    void *a = kh_slab_alloc(&s, size), *b = kh_slab_alloc(&s, size);
    kh_ok(a == p[20] && b == p[10], "size %zu: the freed ones come back first (last freed first)",
          size);
    memset(a, 0, size);
    void *c = kh_slab_alloc(&s, size);
    kh_ok(c != p[10] && c != p[20], "size %zu: then a new one", size);
    kh_slab_destroy(&s);
    kh_ok(s.blocks == NULL && s.free == NULL && s.size == 0, "size %zu: destroy leaves it empty",
          size);
}

int main(void)
{
    run(440); /* kh_conn */
    run(232); /* a compact stream */
    run(13);
    run(20000); /* bigger than a block: one per block */
    return kh_test_done();
}
