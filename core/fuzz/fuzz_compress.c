/* fuzz_compress.c: libFuzzer target for kh_compress (the Accept-Encoding parser, the type list,
 * the gzip encoder).
 * Owns:  exact-size heap copies of the input.
 * In:    data[0] picks the split: an Accept-Encoding value, then a Content-Type; the whole input
 *        is also a body, encoded in two flushed writes.
 * Out:   a trap on any broken property:
 *        - negotiate returns a known coding, and one the header does not refuse: appending
 *          ", <that coding>;q=0" (the last of a repeated coding wins) changes the answer;
 *        - the gzip stream of the body (a flush after the first part, then the finish) inflates
 *          back to the body.
 * Never: keeps state between inputs. */
#include "kh_compress.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    size_t n = size - 1, split = data[0] % (n + 1);
    char *ae = malloc(split + 32), *ct = malloc(n - split + 1);
    memcpy(ae, data + 1, split);
    memcpy(ct, data + 1 + split, n - split);
    int c = kh_compress_negotiate((kh_str){ae, split});
    CHECK(c >= KH_CODING_NONE && c <= KH_CODING_ZSTD);
    if (c != KH_CODING_NONE) {
        const char *name = kh_compress_name(c);
        size_t k = split;
        memcpy(ae + k, ", ", 2);
        k += 2;
        memcpy(ae + k, name, strlen(name));
        k += strlen(name);
        memcpy(ae + k, ";q=0", 4);
        k += 4;
        CHECK(kh_compress_negotiate((kh_str){ae, k}) != c);
    }
    (void)kh_compress_type_ok((kh_str){ct, n - split});

    kh_limits l;
    kh_limits_init(&l);
    l.compress_gzip_level = 1;
    kh_compress *z = kh_compress_new(KH_CODING_GZIP, &l, -1);
    CHECK(z != NULL);
    CHECK(kh_compress_write(z, (const char *)data + 1, split, 0) == 0);
    CHECK(kh_compress_write(z, (const char *)data + 1 + split, n - split, 1) == 0);
    size_t zl;
    const char *zo = kh_compress_out(z, &zl);
    char *back = malloc(n + 1);
    z_stream s = {0};
    CHECK(inflateInit2(&s, 15 + 16) == Z_OK);
    s.next_in = (Bytef *)(uintptr_t)zo;
    s.avail_in = (uInt)zl;
    s.next_out = (Bytef *)back;
    s.avail_out = (uInt)(n + 1);
    CHECK(inflate(&s, Z_FINISH) == Z_STREAM_END);
    CHECK(s.total_out == n && memcmp(back, data + 1, n) == 0);
    inflateEnd(&s);
    kh_compress_free(z);
    free(back);
    free(ae);
    free(ct);
    return 0;
}
