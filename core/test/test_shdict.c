/* test_shdict.c: kh_shdict: get/set/add/replace/incr/delete, TTL (ttl, expire, lazy reclaim),
 * keys (most recent first, bounded), LRU eviction within the budget,
 * refusal of an entry larger than the budget, the registry, and 4 threads hammering one key. */
#include <uv.h>

#include "kh_err.h"
#include "kh_shdict.h"
#include "kh_test.h"

static kh_shdict_value str(const char *s)
{
    kh_shdict_value v = {KH_SHDICT_STRING, 0, s, strlen(s)};
    return v;
}

static kh_shdict_value num(double n)
{
    kh_shdict_value v = {KH_SHDICT_NUMBER, n, NULL, 0};
    return v;
}

static kh_shdict *shared;

static void hammer(void *arg)
{
    double out;
    for (int i = 0; i < 10000; i++)
        kh_shdict_incr(shared, "hits", 4, 1, 1, 0, 0, &out);
}

int main(void)
{
    char *buf = NULL;
    size_t cap = 0;
    kh_shdict_value v;
    kh_shdict *d = kh_shdict_new("t", 8192);

    kh_subtest("get / set / add / delete");
    kh_is_int(kh_shdict_get(d, "a", 1, &v, &buf, &cap), KH_SHDICT_NOT_FOUND, "absent");
    kh_shdict_value s = str("hello");
    kh_is_int(kh_shdict_set(d, "a", 1, &s, 0, 0, NULL), 0, "set");
    kh_is_int(kh_shdict_get(d, "a", 1, &v, &buf, &cap), 0, "get");
    kh_is_int(v.type, KH_SHDICT_STRING, "a string");
    kh_is_str(v.str, v.len, "hello", "the value");
    kh_is_int(kh_shdict_set(d, "a", 1, &s, 0, 1, NULL), KH_SHDICT_EXISTS, "add on a key: exists");
    kh_shdict_value b = {KH_SHDICT_BOOL, 1, NULL, 0};
    kh_is_int(kh_shdict_set(d, "b", 1, &b, 0, 1, NULL), 0, "add on a new key");
    kh_shdict_get(d, "b", 1, &v, &buf, &cap);
    kh_ok(v.type == KH_SHDICT_BOOL && v.num == 1, "a boolean");
    kh_is_int(kh_shdict_delete(d, "a", 1), 0, "delete");
    kh_is_int(kh_shdict_delete(d, "a", 1), KH_SHDICT_NOT_FOUND, "delete again: not found");
    kh_shdict_value nil = {KH_SHDICT_NIL, 0, NULL, 0};
    kh_shdict_set(d, "b", 1, &nil, 0, 0, NULL);
    kh_is_int(kh_shdict_get(d, "b", 1, &v, &buf, &cap), KH_SHDICT_NOT_FOUND, "set nil deletes");

    kh_subtest("incr");
    double out = 0;
    kh_is_int(kh_shdict_incr(d, "n", 1, 1, 0, 0, 0, &out), KH_SHDICT_NOT_FOUND,
              "no init: not found");
    kh_is_int(kh_shdict_incr(d, "n", 1, 5, 1, 10, 0, &out), 0, "with init");
    kh_ok(out == 15, "init + delta = 15");
    kh_shdict_incr(d, "n", 1, -3, 0, 0, 0, &out);
    kh_ok(out == 12, "12 after -3");
    kh_shdict_set(d, "s", 1, &s, 0, 0, NULL);
    kh_is_int(kh_shdict_incr(d, "s", 1, 1, 0, 0, 0, &out), KH_SHDICT_NOT_NUMBER, "not a number");

    kh_subtest("ttl");
    kh_shdict_value t = num(1);
    kh_shdict_set(d, "ttl", 3, &t, 30, 0, NULL);
    kh_is_int(kh_shdict_get(d, "ttl", 3, &v, &buf, &cap), 0, "present before its ttl");
    uv_sleep(60);
    kh_is_int(kh_shdict_get(d, "ttl", 3, &v, &buf, &cap), KH_SHDICT_NOT_FOUND, "gone after");
    kh_is_int(kh_shdict_set(d, "ttl", 3, &t, 0, 1, NULL), 0, "add succeeds on an expired key");

    kh_subtest("replace, ttl, expire");
    kh_shdict_flush_all(d);
    kh_shdict_value r1 = str("one"), r2 = str("two");
    kh_is_int(kh_shdict_set(d, "r", 1, &r1, 0, KH_SHDICT_REPLACE, NULL), KH_SHDICT_NOT_FOUND,
              "replace on an absent key: not found");
    kh_is_int(kh_shdict_get(d, "r", 1, &v, &buf, &cap), KH_SHDICT_NOT_FOUND, "and nothing stored");
    kh_shdict_set(d, "r", 1, &r1, 0, KH_SHDICT_SET, NULL);
    kh_is_int(kh_shdict_set(d, "r", 1, &r2, 5000, KH_SHDICT_REPLACE, NULL), 0, "replace on a key");
    kh_shdict_get(d, "r", 1, &v, &buf, &cap);
    kh_is_str(v.str, v.len, "two", "replaced");
    uint64_t left = 12345;
    kh_is_int(kh_shdict_ttl(d, "r", 1, &left), 0, "ttl of a key");
    kh_ok(left > 0 && left <= 5000, "its ttl is what replace gave it (%llu ms)", (unsigned long long)left);
    kh_shdict_expire(d, "r", 1, 1);
    uv_sleep(30);
    kh_is_int(kh_shdict_set(d, "r", 1, &r1, 0, KH_SHDICT_REPLACE, NULL), KH_SHDICT_NOT_FOUND,
              "replace on an expired key: not found");
    kh_is_int(kh_shdict_ttl(d, "r", 1, &left), KH_SHDICT_NOT_FOUND, "ttl of an expired key");
    kh_shdict_set(d, "p", 1, &r1, 0, KH_SHDICT_SET, NULL);
    kh_is_int(kh_shdict_ttl(d, "p", 1, &left), 0, "ttl of a key without expiry");
    kh_is_int((int)left, 0, "is 0");
    kh_is_int(kh_shdict_expire(d, "p", 1, 5000), 0, "expire sets a ttl");
    kh_shdict_ttl(d, "p", 1, &left);
    kh_ok(left > 0 && left <= 5000, "now %llu ms", (unsigned long long)left);
    kh_is_int(kh_shdict_expire(d, "p", 1, 0), 0, "expire 0 removes it");
    kh_shdict_ttl(d, "p", 1, &left);
    kh_is_int((int)left, 0, "never expires again");
    kh_is_int(kh_shdict_expire(d, "zz", 2, 5), KH_SHDICT_NOT_FOUND, "expire on an absent key");
    kh_shdict_expire(d, "p", 1, 10);
    uv_sleep(30);
    kh_is_int(kh_shdict_get(d, "p", 1, &v, &buf, &cap), KH_SHDICT_NOT_FOUND, "gone after expire's ttl");
    double got;
    kh_shdict_incr(d, "c", 1, 1, 1, 0, 5000, &got);
    kh_is_int(kh_shdict_ttl(d, "c", 1, &left), 0, "incr with init sets the ttl");
    kh_ok(left > 0 && left <= 5000, "%llu ms", (unsigned long long)left);

    kh_subtest("keys");
    kh_shdict_flush_all(d);
    for (int i = 0; i < 5; i++) {
        char k[8];
        snprintf(k, sizeof k, "k%d", i);
        kh_shdict_set(d, k, strlen(k), &r1, i == 2 ? 5000 : 0, KH_SHDICT_SET, NULL);
    }
    char *kb = NULL;
    size_t kcap = 0, klen;
    kh_is_int((int)kh_shdict_keys(d, 0, &kb, &kcap, &klen), 5, "all 5 keys");
    uint32_t l0;
    memcpy(&l0, kb, sizeof l0);
    kh_is_str(kb + sizeof l0, l0, "k4", "most recent first");
    kh_is_int((int)kh_shdict_keys(d, 2, &kb, &kcap, &klen), 2, "max 2: 2 keys");
    kh_is_int((int)klen, 2 * (4 + 2), "2 length-prefixed keys");
    size_t used_before = kh_shdict_used(d);
    kh_shdict_expire(d, "k2", 2, 1);
    uv_sleep(30);
    kh_is_int((int)kh_shdict_keys(d, 0, &kb, &kcap, &klen), 4, "an expired key is not listed");
    kh_ok(kh_shdict_used(d) < used_before, "and its block is reclaimed by the walk");
    kh_shdict_flush_all(d);
    kh_is_int((int)kh_shdict_keys(d, 0, &kb, &kcap, &klen), 0, "empty dict: no keys");
    free(kb);

    kh_subtest("budget: LRU eviction, refusal of a too-large entry");
    kh_shdict_flush_all(d);
    kh_is_int((int)kh_shdict_used(d), 0, "flushed");
    char key[16], big[200];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kh_shdict_value bv = str(big);
    int total_evicted = 0;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "k%d", i);
        int ev = 0;
        kh_is_int(kh_shdict_set(d, key, strlen(key), &bv, 0, 0, &ev), 0, "set %s", key);
        total_evicted += ev;
        if (i == 5) /* k0 read: it becomes recent and survives the first evictions */
            kh_shdict_get(d, "k0", 2, &v, &buf, &cap);
    }
    kh_ok(kh_shdict_used(d) <= 8192, "used %zu <= budget 8192", kh_shdict_used(d));
    kh_ok(total_evicted > 50, "older entries were evicted (%d)", total_evicted);
    kh_is_int(kh_shdict_get(d, "k99", 3, &v, &buf, &cap), 0, "the newest entry is there");
    kh_is_int(kh_shdict_get(d, "k1", 2, &v, &buf, &cap), KH_SHDICT_NOT_FOUND, "k1 was evicted");
    char *huge = malloc(10000);
    memset(huge, 'y', 9999);
    huge[9999] = '\0';
    kh_shdict_value hv = str(huge);
    size_t before = kh_shdict_count(d);
    kh_is_int(kh_shdict_set(d, "huge", 4, &hv, 0, 0, NULL), KH_ENOMEM,
              "larger than the budget: KH_ENOMEM");
    kh_is_int((int)kh_shdict_count(d), (int)before, "and nothing was evicted for it");
    free(huge);

    kh_subtest("the arena: freed blocks merge back; a budget that is not a power of two");
    kh_shdict_flush_all(d);
    kh_is_int((int)kh_shdict_used(d), 0, "flush frees every block");
    char *most = malloc(8001);
    memset(most, 'z', 8000);
    most[8000] = '\0';
    kh_shdict_value mv = str(most);
    kh_is_int(kh_shdict_set(d, "most", 4, &mv, 0, 0, NULL), 0,
              "after the flush the whole 8192-byte block is one again");
    kh_is_int((int)kh_shdict_used(d), 8192, "it takes the whole arena");
    int ev = 0;
    kh_is_int(kh_shdict_set(d, "x", 1, &s, 0, 0, &ev), 0, "a small entry evicts it");
    kh_is_int(ev, 1, "one eviction");
    kh_shdict_free(d);
    kh_shdict *odd = kh_shdict_new("odd", 12288); /* 8192 + 4096 */
    most[6000] = '\0';
    kh_shdict_value six = str(most);
    kh_is_int(kh_shdict_set(odd, "a", 1, &six, 0, 0, NULL), 0, "6000 bytes in the 8192 block");
    most[3000] = '\0';
    kh_shdict_value three = str(most);
    kh_is_int(kh_shdict_set(odd, "b", 1, &three, 0, 0, &ev), 0, "3000 bytes in the 4096 block");
    kh_is_int(ev, 0, "without evicting");
    kh_is_int((int)kh_shdict_count(odd), 2, "both there");
    kh_is_int(kh_shdict_set(odd, "c", 1, &six, 0, 0, &ev), 0, "another 6000 bytes");
    kh_is_int(kh_shdict_get(odd, "a", 1, &v, &buf, &cap), KH_SHDICT_NOT_FOUND, "evicted the LRU 'a'");
    kh_is_int(kh_shdict_get(odd, "b", 1, &v, &buf, &cap), 0, "'b' stays: its block was not needed");
    kh_shdict_free(odd);
    free(most);

    kh_subtest("registry and threads");
    kh_shdict_reg *r = kh_shdict_reg_new();
    char err[200];
    shared = kh_shdict_declare(r, "hits", 65536, err, sizeof err);
    kh_ok(shared != NULL, "declared");
    kh_ok(kh_shdict_declare(r, "hits", 65536, err, sizeof err) == shared, "same size: same dict");
    kh_ok(kh_shdict_declare(r, "hits", 1 << 20, err, sizeof err) == NULL, "another size: refused");
    kh_ok(strstr(err, "already declared") != NULL, "with a message: %s", err);
    kh_ok(kh_shdict_find(r, "hits") == shared, "find");
    kh_ok(kh_shdict_find(r, "nope") == NULL, "find unknown: NULL");
    uv_thread_t th[4];
    for (int i = 0; i < 4; i++)
        uv_thread_create(&th[i], hammer, NULL);
    for (int i = 0; i < 4; i++)
        uv_thread_join(&th[i]);
    kh_shdict_get(shared, "hits", 4, &v, &buf, &cap);
    kh_ok(v.num == 40000, "4 threads x 10000 incr = %g", v.num);
    kh_shdict_reg_free(r);
    free(buf);
    return kh_test_done();
}
