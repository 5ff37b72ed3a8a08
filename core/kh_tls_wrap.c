/* kh_tls_wrap.c: link-time replacements for a few OpenSSL 3.0 internals that a TLS 1.3 handshake
 * calls many times over and that cost far more than their answer. KH_STATIC_OPENSSL only: the
 * module is then built with KH_WRAP_OPENSSL and linked with -Wl,--wrap=SYMBOL for each
 * (CMakeLists.txt), so every call to SYMBOL from another object file of libssl.a or libcrypto.a,
 * and from ours, comes here; __real_SYMBOL is OpenSSL's own.
 * Owns:  the process's fork id, filled once and read without a lock afterwards.
 * In:    OpenSSL's calls.   Out: the same answers OpenSSL's functions give.
 * Never: holds client state: what is cached is the process id.
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
 * getpid(), a real system call in glibc >= 2.25: about 8 per full handshake (server random,
 * session id, key share, ECDSA nonce, ticket IV and nonce, ...), 1.6 % of the server's CPU
 * under `s_time -new` (perf). Here it is the id read once and read again in the child of every
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

#endif
