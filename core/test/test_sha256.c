/* test_sha256.c: kh_sha256 against FIPS 180-4's examples, kh_hmac_sha256 against RFC 4231's test
 * cases 1-7 (case 5, a truncated output, compares the first 16 bytes), kh_ct_equal, and
 * base64url (RFC 4648 §10 vectors, in the url alphabet, without padding). */
#include "kh_sha256.h"
#include "kh_test.h"

/* kh_is_str over a pointer (the macro tests it for NULL, which an array never is) */
static void is_str(const char *got, size_t n, const char *want, const char *what)
{
    kh_is_str(got, n, want, "%s", what);
}

static void hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static size_t unhex(const char *s, uint8_t *out)
{
    size_t n = strlen(s) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(s + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return n;
}

static void sha(const char *msg, size_t n, const char *want)
{
    uint8_t d[32];
    char h[65];
    kh_sha256(msg, n, d);
    hex(d, 32, h);
    char what[40];
    snprintf(what, sizeof what, "sha256 of %zu bytes", n);
    is_str(h, 64, want, what);
}

static void hmac(int tc, const char *key_hex, const char *data_hex, const char *want, size_t cmp)
{
    uint8_t key[200], data[200], d[32];
    char h[65];
    size_t kl = unhex(key_hex, key), dl = unhex(data_hex, data);
    kh_hmac_sha256(key, kl, data, dl, d);
    hex(d, cmp, h);
    char what[40];
    snprintf(what, sizeof what, "RFC 4231 test case %d", tc);
    is_str(h, cmp * 2, want, what);
}

static const char *hexs(const char *s)
{
    static char out[400];
    hex((const uint8_t *)s, strlen(s), out);
    return out;
}

int main(void)
{
    kh_subtest("sha256");
    sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha(m2, strlen(m2), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    static char mil[1000000];
    memset(mil, 'a', sizeof mil);
    sha(mil, sizeof mil, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* fed in odd pieces: the block buffering */
    kh_sha256_ctx c;
    uint8_t d[32];
    char h[65];
    kh_sha256_init(&c);
    for (size_t i = 0; i < sizeof mil;) {
        size_t n = (i % 7) * 13 + 1;
        if (n > sizeof mil - i)
            n = sizeof mil - i;
        kh_sha256_update(&c, mil + i, n);
        i += n;
    }
    kh_sha256_final(&c, d);
    hex(d, 32, h);
    is_str(h, 64, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
           "a million 'a' in uneven pieces");

    kh_subtest("hmac-sha256, RFC 4231");
    hmac(1, "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 32);
    hmac(2, "4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 32);
    hmac(3, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
         "dddddddddddd",
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 32);
    hmac(4, "0102030405060708090a0b0c0d0e0f10111213141516171819",
         "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
         "cdcdcdcdcdcd",
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b", 32);
    hmac(5, "0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", hexs("Test With Truncation"),
         "a3b6167473100ee06e0c796c2955552b", 16);
    char k131[263];
    memset(k131, 'a', 262);
    k131[262] = 0;
    hmac(6, k131, hexs("Test Using Larger Than Block-Size Key - Hash Key First"),
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 32);
    hmac(7, k131,
         hexs("This is a test using a larger than block-size key and a larger than block-size "
              "data. The key needs to be hashed before being used by the HMAC algorithm."),
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", 32);

    kh_subtest("constant-time compare");
    kh_ok(kh_ct_equal("abcdef", "abcdef", 6), "equal");
    kh_ok(!kh_ct_equal("abcdef", "abcdeg", 6), "last byte differs");
    kh_ok(!kh_ct_equal("xbcdef", "abcdef", 6), "first byte differs");
    kh_ok(kh_ct_equal("", "", 0), "empty");

    kh_subtest("base64url");
    static const char *vec[][2] = {{"", ""},         {"f", "Zg"},         {"fo", "Zm8"},
                                   {"foo", "Zm9v"},  {"foob", "Zm9vYg"},  {"fooba", "Zm9vYmE"},
                                   {"foobar", "Zm9vYmFy"}, {"\xfb\xff", "-_8"}};
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
        char out[32];
        uint8_t back[32];
        size_t n = kh_base64url_encode((const uint8_t *)vec[i][0], strlen(vec[i][0]), out);
        is_str(out, n, vec[i][1], "encode");
        long m = kh_base64url_decode(out, n, back);
        kh_ok(m >= 0, "decode '%s'", vec[i][1]);
        is_str((char *)back, m < 0 ? 0 : (size_t)m, vec[i][0], "decoded back");
    }
    uint8_t back[32];
    kh_is_int(kh_base64url_decode("Zm9v=", 5, back), -1, "padding refused");
    kh_is_int(kh_base64url_decode("Zm+v", 4, back), -1, "'+' (not url-safe) refused");
    kh_is_int(kh_base64url_decode("Z", 1, back), -1, "an impossible length refused");
    kh_is_int(kh_base64url_decode("Zh", 2, back), -1, "non-zero leftover bits refused");
    return kh_test_done();
}
