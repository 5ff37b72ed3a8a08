/* test_common.c: unit tests for the inline helpers of kh_common.h (TAP): kh_put_u64 against
 * printf's decimal at every length boundary (9..10, 99..100, ... 10^19 and UINT64_MAX) and a
 * spread of pseudo-random values.
 * Owns:  -
 * In:    -
 * Out:   TAP lines; exit status 0 when every assertion holds.
 * Never: lets a write past the digits pass: the byte after the returned end is checked. */
#include "kh_common.h"
#include "kh_test.h"

#include <inttypes.h>

static int put_matches(uint64_t v)
{
    char got[32], want[32];
    memset(got, '#', sizeof got);
    char *end = kh_put_u64(got, v);
    int n = snprintf(want, sizeof want, "%" PRIu64, v);
    return end - got == n && memcmp(got, want, (size_t)n) == 0 && *end == '#';
}

int main(void)
{
    int all = 1;
    uint64_t p = 1;
    for (int i = 0; i < 20; i++) { /* each power of ten, and its neighbours */
        all &= put_matches(p) & put_matches(p - 1) & put_matches(p + 1);
        if (i < 19)
            p *= 10;
    }
    kh_ok(all, "kh_put_u64: 10^k - 1, 10^k, 10^k + 1 for k = 0..19");
    kh_ok(put_matches(0) && put_matches(UINT64_MAX) && put_matches(UINT64_MAX - 1),
          "kh_put_u64: 0, UINT64_MAX - 1, UINT64_MAX");
    uint64_t x = 0x9e3779b97f4a7c15u;
    all = 1;
    for (int i = 0; i < 100000; i++) { /* xorshift: every length, all digit pairs */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        all &= put_matches(x >> (i % 64));
    }
    kh_ok(all, "kh_put_u64: 100,000 pseudo-random values of every length");
    char buf[20];
    kh_ok(kh_put_u64(buf, 200) - buf == 3 && memcmp(buf, "200", 3) == 0, "kh_put_u64: 200");
    return kh_test_done();
}
