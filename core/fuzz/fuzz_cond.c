/* fuzz_cond.c: libFuzzer target for kh_cond (HTTP-dates, entity-tag lists).
 * Owns:  exact-size heap copies of the input (ASan sees any read past a slice).
 * In:    data[0] = the split point between an entity-tag list and an entity-tag; the rest the
 *        bytes; the whole rest is also parsed as an HTTP-date.
 * Out:   a trap on any broken property:
 *        - a date is -1 or from year 0 to 9999, and an accepted IMF-fixdate formats back to itself (but
 *          for second 60, a leap second, which rolls over);
 *        - a strong match implies a weak one; "*" always matches;
 *        - kh_cond_not_modified with If-None-Match is kh_cond_etag_match's weak verdict.
 * Never: keeps state between inputs. */
#include "kh_cond.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t n = size - 1, split = data[0] % (n + 1);
    char *all = malloc(n ? n : 1);
    memcpy(all, data + 1, n);
    int64_t t = kh_cond_parse_date(all, n);
    CHECK(t == -1 || (t >= -62167219200LL && t <= 253402300799LL));
    if (t >= 0 && n == 29 && memcmp(all + 23, "60", 2) != 0) { /* a leap second rolls over */
        time_t tt = (time_t)t;
        struct tm tm;
        gmtime_r(&tt, &tm);
        char back[64];
        strftime(back, sizeof back, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        /* the day name is checked for being a day name, not for being the right one */
        CHECK(memcmp(back + 4, all + 4, 25) == 0);
    }
    char *list = malloc(split ? split : 1), *tag = malloc(n - split ? n - split : 1);
    memcpy(list, all, split);
    memcpy(tag, all + split, n - split);
    kh_str l = {list, split}, e = {tag, n - split};
    int weak = kh_cond_etag_match(l, e, 1), strong = kh_cond_etag_match(l, e, 0);
    CHECK(!strong || weak);
    CHECK(kh_cond_etag_match((kh_str){"*", 1}, e, 0));
    CHECK(kh_cond_not_modified(l, (kh_str){NULL, 0}, e, (kh_str){NULL, 0}) == weak);
    free(list);
    free(tag);
    free(all);
    return 0;
}
