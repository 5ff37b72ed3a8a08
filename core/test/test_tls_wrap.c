/* test_tls_wrap.c: kh_tls_wrap.c's replacements give OpenSSL's answers. Linked like
 * khamsin-tls.so (libssl.a, libcrypto.a, the same --wrap options, KH_OPENSSL_WRAP in
 * CMakeLists.txt): the fork id is the caller's pid in a child too, and two children forked from
 * one parent draw different random bytes (each reseeds, as with getpid()); a fetched algorithm
 * comes back as the same object and still works, a property query or an unknown name still go
 * to OpenSSL; a key manager's names come in OpenSSL's order, from the cache as at first. */
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <sys/wait.h>

#include "kh_test.h"

int openssl_get_fork_id(void); /* libcrypto's internal, wrapped */
int __real_EVP_KEYMGMT_names_do_all(const EVP_KEYMGMT *k, void (*fn)(const char *, void *),
                                    void *data);

/* 16 random bytes drawn in a forked child, through a pipe; 0 on success */
static int child_bytes(unsigned char out[16], int *child_id)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char b[16 + sizeof(int)];
        int id = openssl_get_fork_id() == (int)getpid() ? 1 : 0;
        memcpy(b + 16, &id, sizeof id);
        _exit(RAND_bytes(b, 16) == 1 && write(p[1], b, sizeof b) == (ssize_t)sizeof b ? 0 : 1);
    }
    close(p[1]);
    unsigned char b[16 + sizeof(int)];
    ssize_t n = read(p[0], b, sizeof b);
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (n != (ssize_t)sizeof b || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    memcpy(out, b, 16);
    memcpy(child_id, b + 16, sizeof(int));
    return 0;
}

static void test_fork_id(void)
{
    unsigned char parent[16], a[16], b[16];
    int ida = 0, idb = 0;
    kh_ok(openssl_get_fork_id() == (int)getpid(), "the fork id is the pid");
    kh_ok(openssl_get_fork_id() == (int)getpid(), "the fork id is the pid, from the cache");
    kh_ok(RAND_bytes(parent, sizeof parent) == 1, "the parent's DRBG is set up");
    kh_ok(child_bytes(a, &ida) == 0 && child_bytes(b, &idb) == 0, "two children drew bytes");
    kh_ok(ida == 1 && idb == 1, "a child's fork id is its own pid");
    kh_ok(memcmp(a, b, 16) != 0, "two children of one parent draw different bytes");
    kh_ok(memcmp(a, parent, 16) != 0 && memcmp(b, parent, 16) != 0, "and not the parent's");
    kh_ok(openssl_get_fork_id() == (int)getpid(), "the parent's fork id is still its pid");
}

static int sha256_abc_ok(const EVP_MD *md)
{
    static const unsigned char want[4] = {0xba, 0x78, 0x16, 0xbf}; /* FIPS 180-2, "abc" */
    unsigned char out[32];
    unsigned int len = 0;
    return md && EVP_Digest("abc", 3, out, &len, md, NULL) == 1 && len == 32 &&
           memcmp(out, want, 4) == 0;
}

static void test_fetch(void)
{
    EVP_MD *a = EVP_MD_fetch(NULL, "SHA256", NULL), *b = EVP_MD_fetch(NULL, "SHA256", NULL);
    kh_ok(a && a == b, "a fetched digest comes back as the same object");
    kh_ok(sha256_abc_ok(a) && sha256_abc_ok(b), "and works");
    EVP_MD_free(a);
    EVP_MD_free(b);
    EVP_MD *c = EVP_MD_fetch(NULL, "SHA256", NULL);
    kh_ok(sha256_abc_ok(c), "still works once the callers' references are gone");
    EVP_MD_free(c);
    EVP_MD *q = EVP_MD_fetch(NULL, "SHA256", "provider=nosuchprovider");
    kh_ok(q == NULL, "a property query goes to OpenSSL (no such provider: nothing)");
    EVP_MD_free(q);
    kh_ok(EVP_MD_fetch(NULL, "NO-SUCH-DIGEST", NULL) == NULL &&
              EVP_MD_fetch(NULL, "NO-SUCH-DIGEST", NULL) == NULL,
          "an unknown name is not found, twice");
    EVP_KDF *k1 = EVP_KDF_fetch(NULL, "TLS13-KDF", NULL), *k2 = EVP_KDF_fetch(NULL, "TLS13-KDF", NULL);
    kh_ok(k1 && k1 == k2, "a KDF too");
    EVP_KDF_free(k1);
    EVP_KDF_free(k2);
    EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
    unsigned char out[32];
    size_t len = 0;
    kh_ok(m && EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, "k", 1, (const unsigned char *)"m",
                         1, out, sizeof out, &len) != NULL && len == 32,
          "a MAC too, and EVP_Q_mac through it");
    EVP_MAC_free(m);
}

typedef struct names {
    char s[512];
} names;

static void add_name(const char *name, void *arg)
{
    names *n = arg;
    size_t l = strlen(n->s);
    snprintf(n->s + l, sizeof n->s - l, "%s%s", l ? "," : "", name);
}

static void test_names(void)
{
    static const char *types[] = {"EC", "X25519", "RSA"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        EVP_KEYMGMT *k = EVP_KEYMGMT_fetch(NULL, types[i], NULL);
        names real = {{0}}, first = {{0}}, again = {{0}};
        int ok = k && __real_EVP_KEYMGMT_names_do_all(k, add_name, &real) == 1 &&
                 EVP_KEYMGMT_names_do_all(k, add_name, &first) == 1 &&
                 EVP_KEYMGMT_names_do_all(k, add_name, &again) == 1;
        kh_ok(ok && real.s[0] && strcmp(real.s, first.s) == 0 && strcmp(real.s, again.s) == 0,
              "%s key manager: the same names in the same order (%s / %s / %s)", types[i],
              real.s, first.s, again.s);
        EVP_KEYMGMT_free(k);
    }
    /* what the names are for: an EVP_PKEY_CTX maps them to a legacy type */
    EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_from_name(NULL, "X25519", NULL);
    EVP_PKEY *pk = NULL;
    kh_ok(pc && EVP_PKEY_keygen_init(pc) == 1 && EVP_PKEY_keygen(pc, &pk) == 1 &&
              EVP_PKEY_get_id(pk) == EVP_PKEY_X25519,
          "an X25519 key made through a cached key manager has the X25519 type");
    EVP_PKEY_free(pk);
    EVP_PKEY_CTX_free(pc);
}

int main(void)
{
    test_fork_id();
    test_fetch();
    test_names();
    return kh_test_done();
}
