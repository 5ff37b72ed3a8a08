/* kh_sha1.c: SHA-1 (FIPS 180-4 §6.1). See kh_sha1.h. Tested with the FIPS 180-4 examples and
 * RFC 6455's handshake example (core/test/test_ws.c). */
#include "kh_sha1.h"

#include <string.h>

#define ROL(x, n) (((x) << (n)) | ((x) >> (32 - (n))))

static void compress(uint32_t h[5], const uint8_t b[64])
{
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 |
               (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = ROL(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (bb & c) | (~bb & d);
            k = 0x5a827999;
        } else if (i < 40) {
            f = bb ^ c ^ d;
            k = 0x6ed9eba1;
        } else if (i < 60) {
            f = (bb & c) | (bb & d) | (c & d);
            k = 0x8f1bbcdc;
        } else {
            f = bb ^ c ^ d;
            k = 0xca62c1d6;
        }
        uint32_t t = ROL(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = ROL(bb, 30);
        bb = a;
        a = t;
    }
    h[0] += a;
    h[1] += bb;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void kh_sha1_init(kh_sha1_ctx *c)
{
    static const uint32_t iv[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};
    memcpy(c->h, iv, sizeof iv);
    c->bytes = 0;
    c->fill = 0;
}

void kh_sha1_update(kh_sha1_ctx *c, const void *p, size_t n)
{
    const uint8_t *s = p;
    c->bytes += n;
    if (c->fill) {
        size_t take = 64 - c->fill < n ? 64 - c->fill : n;
        memcpy(c->block + c->fill, s, take);
        c->fill += take;
        s += take;
        n -= take;
        if (c->fill < 64)
            return;
        compress(c->h, c->block);
        c->fill = 0;
    }
    while (n >= 64) {
        compress(c->h, s);
        s += 64;
        n -= 64;
    }
    memcpy(c->block, s, n);
    c->fill = n;
}

void kh_sha1_final(kh_sha1_ctx *c, uint8_t out[KH_SHA1_LEN])
{
    uint64_t bits = c->bytes * 8;
    c->block[c->fill++] = 0x80;
    if (c->fill > 56) {
        memset(c->block + c->fill, 0, 64 - c->fill);
        compress(c->h, c->block);
        c->fill = 0;
    }
    memset(c->block + c->fill, 0, 56 - c->fill);
    for (int i = 0; i < 8; i++)
        c->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    compress(c->h, c->block);
    for (int i = 0; i < 5; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    memset(c, 0, sizeof *c);
}

void kh_sha1(const void *p, size_t n, uint8_t out[KH_SHA1_LEN])
{
    kh_sha1_ctx c;
    kh_sha1_init(&c);
    kh_sha1_update(&c, p, n);
    kh_sha1_final(&c, out);
}
