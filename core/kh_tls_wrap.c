/* kh_tls_wrap.c: link-time replacements for a few OpenSSL 3.0 internals that a TLS 1.3 handshake
 * calls many times over and that cost far more than their answer. KH_STATIC_OPENSSL only: the
 * module is then built with KH_WRAP_OPENSSL and linked with -Wl,--wrap=SYMBOL for each
 * (CMakeLists.txt), so every call to SYMBOL from another object file of libssl.a or libcrypto.a,
 * and from ours, comes here; __real_SYMBOL is OpenSSL's own.
 * Owns:  the process's fork id, the fetched algorithms and the key managers' names (below), each
 *        written once and read without a lock afterwards; unit.tls_wrap tests all three.
 * In:    OpenSSL's calls.   Out: the same answers OpenSSL's functions give.
 * Never: holds client state: what is kept is the process id, algorithm method objects and
 *        algorithm names.
 *
 * Figures: bench/tls-callgrind.sh (instructions per handshake) and native `perf record -e
 * cpu-clock` of the server while `openssl s_time -new` runs (share of the server's CPU,
 * kernel included). */
#ifdef KH_WRAP_OPENSSL
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* openssl_get_fork_id: OpenSSL 3.0's DRBG compares it with the id it saw last on every
 * generate call (fork detection: a child must not repeat its parent's random bytes), and it is
 * getpid(), a real system call in glibc >= 2.25: 6 per full handshake and 5 per resumed one
 * (server random, session id, key share, ECDSA nonce, ticket IV, ...; of 19.0 and 18.0 system
 * calls per connection, PARTS=syscalls bench/tls.sh), 1.6 % of the server's CPU under
 * `s_time -new` (perf). Here it is the id read once and read again in the child of every
 * fork(): pthread_atfork runs fork_child there before any of its code, so a child still sees an
 * id of its own at its first generate and reseeds, as with getpid(). (A child made by vfork or
 * posix_spawn runs no atfork handler, but only execs.) */
static _Atomic int fork_id;

static void fork_child(void)
{
    atomic_store_explicit(&fork_id, 0, memory_order_relaxed);
}

static void fork_id_init(void)
{
    pthread_atfork(NULL, NULL, fork_child);
}

int __wrap_openssl_get_fork_id(void);
int __wrap_openssl_get_fork_id(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    int id = atomic_load_explicit(&fork_id, memory_order_relaxed);
    if (id == 0) {
        pthread_once(&once, fork_id_init);
        id = (int)getpid();
        atomic_store_explicit(&fork_id, id, memory_order_relaxed);
    }
    return id;
}

/* ---------------------------------------------------------------------------------------- */
/* EVP_MD_fetch, EVP_MAC_fetch, EVP_KDF_fetch, EVP_CIPHER_fetch, EVP_KEYMGMT_fetch,
 * EVP_SIGNATURE_fetch: OpenSSL 3.0 fetches algorithms by name over and over during a handshake,
 * ~60 times in a full one: libssl's HKDF-Expand-Label fetches the TLS13-KDF every time (17), the
 * HMAC and HKDF implementations fetch their digest by name whenever they are given one (26),
 * EVP_Q_mac fetches HMAC (5), every EVP_PKEY_CTX its key manager (6), the ECDSA signature its
 * implementation. Each is a name-map lookup (a case-insensitive hash under a read lock)
 * and a lookup in the method store's cache (another hash, another lock), about 2,600
 * instructions: ~160 K per handshake, 3.7 % of the server's CPU (perf). The answer for a name
 * never changes while the set of providers does not, so the first answer for each name is kept
 * (one reference held) and handed out again with a new reference, as OpenSSL's own method
 * cache does.
 * Kept only for the default library context (NULL, or the global default that the providers
 * pass) with no property query (NULL), the case of every call above; anything else goes to
 * OpenSSL. khamsin loads its providers before the first fetch and never after (it sets no
 * per-thread default context either), so a kept answer cannot go stale; an OPENSSL_CONF that
 * loads providers does so at start-up too. Lock-free reads: a slot is written once, under
 * fetch_mu, before the count that covers it is published (release). The references go at
 * OPENSSL_cleanup (an OPENSSL_atexit handler registered after the provider's, so it runs
 * before the provider is unloaded). */
#define FETCH_SLOTS 24
#define FETCH_NAME 32

typedef struct fetch_cache {
    _Atomic int n;
    struct {
        char name[FETCH_NAME];
        void *m;
    } slot[FETCH_SLOTS];
} fetch_cache;

static pthread_mutex_t fetch_mu = PTHREAD_MUTEX_INITIALIZER;
static int fetch_atexit; /* under fetch_mu */

static void *fetch_get(fetch_cache *c, OSSL_LIB_CTX *ctx, const char *name, const char *props,
                       int (*up_ref)(void *))
{
    if (props != NULL || name == NULL || (ctx != NULL && ctx != OSSL_LIB_CTX_get0_global_default()))
        return NULL;
    int n = atomic_load_explicit(&c->n, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        if (strcmp(c->slot[i].name, name) == 0)
            return up_ref(c->slot[i].m) == 1 ? c->slot[i].m : NULL;
    }
    return NULL;
}

static void fetch_free_all(void);

static void fetch_put(fetch_cache *c, OSSL_LIB_CTX *ctx, const char *name, const char *props,
                      void *m, int (*up_ref)(void *))
{
    if (m == NULL || props != NULL || name == NULL || strlen(name) >= FETCH_NAME ||
        (ctx != NULL && ctx != OSSL_LIB_CTX_get0_global_default()))
        return;
    pthread_mutex_lock(&fetch_mu);
    int n = atomic_load_explicit(&c->n, memory_order_relaxed), i;
    for (i = 0; i < n && strcmp(c->slot[i].name, name) != 0; i++)
        ;
    if (i == n && n < FETCH_SLOTS && (fetch_atexit || (fetch_atexit = OPENSSL_atexit(fetch_free_all)))
        && up_ref(m) == 1) {
        strcpy(c->slot[n].name, name);
        c->slot[n].m = m;
        atomic_store_explicit(&c->n, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&fetch_mu);
}

static fetch_cache md_cache, mac_cache, kdf_cache, cipher_cache, keymgmt_cache, sig_cache;

/* the typed up_ref and free functions, for the generic cache */
static int md_up(void *m) { return EVP_MD_up_ref(m); }
static int mac_up(void *m) { return EVP_MAC_up_ref(m); }
static int kdf_up(void *m) { return EVP_KDF_up_ref(m); }
static int cipher_up(void *m) { return EVP_CIPHER_up_ref(m); }
static int keymgmt_up(void *m) { return EVP_KEYMGMT_up_ref(m); }
static int sig_up(void *m) { return EVP_SIGNATURE_up_ref(m); }

static void fetch_free_all(void)
{
    pthread_mutex_lock(&fetch_mu);
    for (int i = 0; i < md_cache.n; i++)
        EVP_MD_free(md_cache.slot[i].m);
    for (int i = 0; i < mac_cache.n; i++)
        EVP_MAC_free(mac_cache.slot[i].m);
    for (int i = 0; i < kdf_cache.n; i++)
        EVP_KDF_free(kdf_cache.slot[i].m);
    for (int i = 0; i < cipher_cache.n; i++)
        EVP_CIPHER_free(cipher_cache.slot[i].m);
    for (int i = 0; i < keymgmt_cache.n; i++)
        EVP_KEYMGMT_free(keymgmt_cache.slot[i].m);
    for (int i = 0; i < sig_cache.n; i++)
        EVP_SIGNATURE_free(sig_cache.slot[i].m);
    md_cache.n = mac_cache.n = kdf_cache.n = cipher_cache.n = keymgmt_cache.n = sig_cache.n = 0;
    pthread_mutex_unlock(&fetch_mu);
}

#define KH_WRAP_FETCH(TYPE, FN, CACHE, UP)                                                     \
    TYPE *__real_##FN(OSSL_LIB_CTX *ctx, const char *name, const char *props);                 \
    TYPE *__wrap_##FN(OSSL_LIB_CTX *ctx, const char *name, const char *props);                 \
    TYPE *__wrap_##FN(OSSL_LIB_CTX *ctx, const char *name, const char *props)                  \
    {                                                                                          \
        TYPE *m = fetch_get(&CACHE, ctx, name, props, UP);                                     \
        if (m == NULL) {                                                                       \
            m = __real_##FN(ctx, name, props);                                                 \
            fetch_put(&CACHE, ctx, name, props, m, UP);                                        \
        }                                                                                      \
        return m;                                                                              \
    }

KH_WRAP_FETCH(EVP_MD, EVP_MD_fetch, md_cache, md_up)
KH_WRAP_FETCH(EVP_MAC, EVP_MAC_fetch, mac_cache, mac_up)
KH_WRAP_FETCH(EVP_KDF, EVP_KDF_fetch, kdf_cache, kdf_up)
KH_WRAP_FETCH(EVP_CIPHER, EVP_CIPHER_fetch, cipher_cache, cipher_up)
KH_WRAP_FETCH(EVP_KEYMGMT, EVP_KEYMGMT_fetch, keymgmt_cache, keymgmt_up)
KH_WRAP_FETCH(EVP_SIGNATURE, EVP_SIGNATURE_fetch, sig_cache, sig_up)
/* ---------------------------------------------------------------------------------------- */
/* EVP_KEYMGMT_names_do_all: every EVP_PKEY_CTX (int_ctx_new: 6 a full handshake, for the key
 * share, the X25519 derivation, the ECDSA signature...) and EVP_PKEY_set_type_by_keymgmt (2)
 * ask for the names of their key manager, to map them to a legacy key type. OpenSSL 3.0 keeps
 * no list of names per algorithm: it walks its whole name map (hundreds of entries, under a
 * read lock) to collect the few that have the algorithm's number, ~32 K instructions a call;
 * 2.8 % of the server's CPU under s_time -new (perf). The names of a key manager are kept here
 * after its first walk, in the map's order, and the callback is given the same names in the
 * same order as OpenSSL's walk would give it.
 * Keyed by the key manager's provider and first name (EVP_KEYMGMT_get0_name: one algorithm of
 * one provider). The list could only grow if a provider registered new aliases for an existing
 * algorithm later: khamsin loads its providers at start-up, and the key managers' names are all
 * registered together at the first key-manager fetch; the default provider's other operations
 * (signatures, encoders, decoders) add no alias to a key type's names. Lists that do not fit
 * (NAMES_MAX names of NAME_MAX_LEN bytes) are not kept. */
#define NAMES_SLOTS 16
#define NAMES_MAX 8
#define NAME_MAX_LEN 48

typedef struct names_slot {
    const OSSL_PROVIDER *prov;
    char type[NAME_MAX_LEN];
    int n;
    char name[NAMES_MAX][NAME_MAX_LEN];
} names_slot;

static struct {
    _Atomic int n;
    names_slot slot[NAMES_SLOTS];
} names_cache;

typedef struct names_collect {
    names_slot s;
    int overflow;
} names_collect;

static void names_add(const char *name, void *arg)
{
    names_collect *c = arg;
    if (c->s.n == NAMES_MAX || strlen(name) >= NAME_MAX_LEN) {
        c->overflow = 1;
        return;
    }
    strcpy(c->s.name[c->s.n++], name);
}

int __real_EVP_KEYMGMT_names_do_all(const EVP_KEYMGMT *k, void (*fn)(const char *, void *),
                                    void *data);
int __wrap_EVP_KEYMGMT_names_do_all(const EVP_KEYMGMT *k, void (*fn)(const char *, void *),
                                    void *data);
int __wrap_EVP_KEYMGMT_names_do_all(const EVP_KEYMGMT *k, void (*fn)(const char *, void *),
                                    void *data)
{
    const OSSL_PROVIDER *prov = EVP_KEYMGMT_get0_provider(k);
    const char *type = EVP_KEYMGMT_get0_name(k);
    if (prov == NULL || type == NULL || strlen(type) >= NAME_MAX_LEN)
        return __real_EVP_KEYMGMT_names_do_all(k, fn, data);
    int n = atomic_load_explicit(&names_cache.n, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        const names_slot *s = &names_cache.slot[i];
        if (s->prov == prov && strcmp(s->type, type) == 0) {
            for (int j = 0; j < s->n; j++)
                fn(s->name[j], data); /* kept for good: a callback may keep the address */
            return 1;
        }
    }
    names_collect c = {.s = {.prov = prov}};
    strcpy(c.s.type, type);
    if (__real_EVP_KEYMGMT_names_do_all(k, names_add, &c) != 1 || c.overflow || c.s.n == 0)
        return __real_EVP_KEYMGMT_names_do_all(k, fn, data);
    pthread_mutex_lock(&fetch_mu);
    n = atomic_load_explicit(&names_cache.n, memory_order_relaxed);
    int i;
    for (i = 0; i < n && !(names_cache.slot[i].prov == prov &&
                           strcmp(names_cache.slot[i].type, type) == 0); i++)
        ;
    if (i == n && n < NAMES_SLOTS) {
        names_cache.slot[n] = c.s;
        atomic_store_explicit(&names_cache.n, ++n, memory_order_release);
    }
    pthread_mutex_unlock(&fetch_mu);
    if (i == n) /* the cache is full */
        return __real_EVP_KEYMGMT_names_do_all(k, fn, data);
    /* from the slot, never from `c`: a callback may keep a name's address (find_ameth does),
     * as OpenSSL's names live as long as its name map */
    for (int j = 0; j < names_cache.slot[i].n; j++)
        fn(names_cache.slot[i].name[j], data);
    return 1;
}
#endif
