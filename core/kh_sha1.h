/* kh_sha1.h: SHA-1 (FIPS 180-4) of our own, for the WebSocket handshake only (RFC 6455 §4.2.2:
 * Sec-WebSocket-Accept = base64(SHA-1(key + GUID))). SHA-1 is broken for collisions; the
 * handshake uses it as a fixed, public transform, never for security, and nothing else should.
 * Owns:  nothing (the caller's context on its stack).
 * Never: allocates. */
#ifndef KH_SHA1_H
#define KH_SHA1_H

#include <stddef.h>
#include <stdint.h>

#define KH_SHA1_LEN 20

typedef struct kh_sha1_ctx {
    uint32_t h[5];
    uint64_t bytes;
    uint8_t block[64];
    size_t fill;
} kh_sha1_ctx;

void kh_sha1_init(kh_sha1_ctx *c);
void kh_sha1_update(kh_sha1_ctx *c, const void *p, size_t n);
void kh_sha1_final(kh_sha1_ctx *c, uint8_t out[KH_SHA1_LEN]);
void kh_sha1(const void *p, size_t n, uint8_t out[KH_SHA1_LEN]);

#endif
