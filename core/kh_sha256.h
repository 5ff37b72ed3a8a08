/* kh_sha256.h: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) of our own, for signed cookies
 * (k.sign / k.unsign): core/ does not depend on OpenSSL, which lives in the optional TLS module.
 * Owns:  nothing (the caller's context on its stack).
 * Also:  a constant-time comparison of two equal-length byte strings, and base64url (RFC 4648
 *        §5, no padding) encoding and decoding. */
#ifndef KH_SHA256_H
#define KH_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define KH_SHA256_LEN 32

typedef struct kh_sha256_ctx {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t fill;
} kh_sha256_ctx;

void kh_sha256_init(kh_sha256_ctx *c);
void kh_sha256_update(kh_sha256_ctx *c, const void *p, size_t n);
void kh_sha256_final(kh_sha256_ctx *c, uint8_t out[KH_SHA256_LEN]);
void kh_sha256(const void *p, size_t n, uint8_t out[KH_SHA256_LEN]);
void kh_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen,
                    uint8_t out[KH_SHA256_LEN]);
/* 1 when a and b (n bytes each) are equal; the time depends on n only. */
int kh_ct_equal(const void *a, const void *b, size_t n);
/* Writes ceil(n * 4 / 3) characters (no '=' padding) to out; returns that length. */
size_t kh_base64url_encode(const uint8_t *p, size_t n, char *out);
/* Decodes s (no padding, no whitespace) into out (room for n * 3 / 4 bytes). Returns the length,
 * or -1 when s holds a character outside the alphabet or has an impossible length. */
long kh_base64url_decode(const char *s, size_t n, uint8_t *out);

#endif
