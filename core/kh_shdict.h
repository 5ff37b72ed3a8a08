/* kh_shdict.h: a dictionary shared by every worker (OpenResty's ngx.shared.DICT, simplified).
 * Owns:  one arena of `bytes`, allocated when the dict is made, from which its entries are carved
 *        (a buddy allocator: an entry takes the power of two at or above its 80-byte header +
 *        key + value, at least 128 bytes); one mutex, held for one operation; a per-process
 *        registry of dicts by name.
 * In:    get/set/add/replace/incr/delete/ttl/expire/keys from any worker thread; keys and
 *        values are copied in.
 * Out:   copies of values (strings into a caller-owned buffer); no pointer into the dict ever
 *        leaves a call.
 * When full: set, add and incr evict entries until a block is free: expired ones first, then the
 *        least recently used (a get or a write makes an entry recent). An entry larger than the
 *        largest block (the largest power of two <= bytes) is refused with KH_ENOMEM ("no
 *        memory" in Lua), and nothing is evicted.
 * TTL:   per entry, in milliseconds on the monotonic clock (0: never expires), set by set/add/
 *        replace/incr (on creation) and changed by expire; an expired entry reads as absent and
 *        is reclaimed lazily (when a lookup, a key walk or an eviction scan meets it). */
#ifndef KH_SHDICT_H
#define KH_SHDICT_H

#include <stddef.h>
#include <stdint.h>

typedef struct kh_shdict kh_shdict;
typedef struct kh_shdict_reg kh_shdict_reg;

enum { KH_SHDICT_NIL = 0, KH_SHDICT_BOOL = 1, KH_SHDICT_NUMBER = 2, KH_SHDICT_STRING = 3 };

/* kh_shdict_set's modes. */
enum { KH_SHDICT_SET = 0, KH_SHDICT_ADD = 1, KH_SHDICT_REPLACE = 2 };

/* Results besides 0 and KH_ENOMEM / KH_EINVAL. */
enum { KH_SHDICT_EXISTS = 1, KH_SHDICT_NOT_FOUND = 2, KH_SHDICT_NOT_NUMBER = 3 };

typedef struct kh_shdict_value {
    int type;        /* KH_SHDICT_* */
    double num;      /* NUMBER; BOOL as 0 / 1 */
    const char *str; /* STRING, for set; for get it points into the caller's buffer */
    size_t len;
} kh_shdict_value;

#define KH_SHDICT_MIN_BYTES 4096

kh_shdict *kh_shdict_new(const char *name, size_t bytes);
void kh_shdict_free(kh_shdict *d);
const char *kh_shdict_name(const kh_shdict *d);
size_t kh_shdict_capacity(const kh_shdict *d);

/* 0 and *out filled (a string copied into *buf, grown with realloc as needed; the caller frees
 * it), or KH_SHDICT_NOT_FOUND (absent or expired). */
int kh_shdict_get(kh_shdict *d, const char *key, size_t klen, kh_shdict_value *out, char **buf,
                  size_t *bufcap);
/* Stores v (type NIL deletes) with ttl_ms (0: never expires). mode KH_SHDICT_ADD: only when
 * absent (else KH_SHDICT_EXISTS); KH_SHDICT_REPLACE: only when present (else
 * KH_SHDICT_NOT_FOUND). Returns 0, one of those, or KH_ENOMEM (larger than the budget).
 * *evicted counts entries pushed out. */
int kh_shdict_set(kh_shdict *d, const char *key, size_t klen, const kh_shdict_value *v,
                  uint64_t ttl_ms, int mode, int *evicted);
/* Adds delta to a number. Absent: KH_SHDICT_NOT_FOUND unless has_init, then init + delta is
 * stored with ttl_ms. A non-number: KH_SHDICT_NOT_NUMBER. The new value in *result. */
int kh_shdict_incr(kh_shdict *d, const char *key, size_t klen, double delta, int has_init,
                   double init, uint64_t ttl_ms, double *result);
/* 0, or KH_SHDICT_NOT_FOUND. */
int kh_shdict_delete(kh_shdict *d, const char *key, size_t klen);
/* The time left before key expires in *left_ms (0: it never expires); KH_SHDICT_NOT_FOUND when
 * absent or expired. */
int kh_shdict_ttl(kh_shdict *d, const char *key, size_t klen, uint64_t *left_ms);
/* Sets key to expire ttl_ms from now (0: never); KH_SHDICT_NOT_FOUND when absent or expired. */
int kh_shdict_expire(kh_shdict *d, const char *key, size_t klen, uint64_t ttl_ms);
/* Copies up to max (0: all) live keys, most recently used first, into *buf (grown with realloc;
 * the caller frees it) as a 4-byte native length then the bytes, each; *len is the bytes
 * written. Expired entries met on the way are reclaimed. Returns the number of keys. The lock
 * is held for the whole walk: a dict of many entries makes it long (OpenResty's advice holds:
 * call it with a bound). */
size_t kh_shdict_keys(kh_shdict *d, size_t max, char **buf, size_t *bufcap, size_t *len);
/* Removes every entry. */
void kh_shdict_flush_all(kh_shdict *d);
/* Live (unexpired) entries, and bytes of the arena in use (whole blocks). */
size_t kh_shdict_count(kh_shdict *d);
size_t kh_shdict_used(kh_shdict *d);

/* The per-process registry (made by main, read by every worker). */
kh_shdict_reg *kh_shdict_reg_new(void);
void kh_shdict_reg_free(kh_shdict_reg *r);
/* Finds or creates name with that budget. Declaring it again with another size is an error
 * (-1, message in err); every worker loads the same script, so they all agree. */
kh_shdict *kh_shdict_declare(kh_shdict_reg *r, const char *name, size_t bytes, char *err,
                             size_t errlen);
kh_shdict *kh_shdict_find(kh_shdict_reg *r, const char *name);

#endif
