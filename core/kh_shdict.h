/* kh_shdict.h: a dictionary shared by every worker (OpenResty's ngx.shared.DICT, simplified).
 * Owns:  one arena of `bytes`, allocated when the dict is made, from which its entries are carved
 *        (a buddy allocator: an entry takes the power of two at or above its 80-byte header +
 *        key + value, at least 128 bytes); one mutex, held for one operation; a per-process
 *        registry of dicts by name.
 * In:    get/set/add/incr/delete from any worker thread; keys and values are copied in.
 * Out:   copies of values (strings into a caller-owned buffer); no pointer into the dict ever
 *        leaves a call.
 * When full: set, add and incr evict entries until a block is free: expired ones first, then the
 *        least recently used (a get or a write makes an entry recent). An entry larger than the
 *        largest block (the largest power of two <= bytes) is refused with KH_ENOMEM ("no
 *        memory" in Lua), and nothing is evicted.
 * TTL:   per entry, in milliseconds on the monotonic clock (0: never expires); an expired entry
 *        reads as absent and is reclaimed lazily. */
#ifndef KH_SHDICT_H
#define KH_SHDICT_H

#include <stddef.h>
#include <stdint.h>

typedef struct kh_shdict kh_shdict;
typedef struct kh_shdict_reg kh_shdict_reg;

enum { KH_SHDICT_NIL = 0, KH_SHDICT_BOOL = 1, KH_SHDICT_NUMBER = 2, KH_SHDICT_STRING = 3 };

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
/* Stores v (type NIL deletes). add: only when absent (else KH_SHDICT_EXISTS). Returns 0,
 * KH_SHDICT_EXISTS, or KH_ENOMEM (larger than the budget). *evicted counts entries pushed out. */
int kh_shdict_set(kh_shdict *d, const char *key, size_t klen, const kh_shdict_value *v,
                  uint64_t ttl_ms, int add, int *evicted);
/* Adds delta to a number. Absent: KH_SHDICT_NOT_FOUND unless has_init, then init + delta is
 * stored with ttl_ms. A non-number: KH_SHDICT_NOT_NUMBER. The new value in *result. */
int kh_shdict_incr(kh_shdict *d, const char *key, size_t klen, double delta, int has_init,
                   double init, uint64_t ttl_ms, double *result);
/* 0, or KH_SHDICT_NOT_FOUND. */
int kh_shdict_delete(kh_shdict *d, const char *key, size_t klen);
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
