/* fuzz_tls13.c: libFuzzer target for the TLS 1.3 record layer (kh_tls13_read).
 * Random bytes almost never authenticate, so the input mostly describes records that a mirror
 * of the peer seals with the right keys; the reader then sees valid AEAD with hostile insides
 * (padding, types, KeyUpdates, alerts, oversize plaintext), mixed with raw garbage, fed in cuts.
 * Owns:  per input: both ends' record states and their buffers, freed before returning.
 * In:    byte 0: suite; byte 1: cut size (0: all at once); then items:
 *          T L1 L2 ...  : a record of inner type T (0 = the content carries its own type and
 *                         padding) with (L1 | L2 << 8) % 16700 bytes of content taken cyclically
 *                         from the input;
 *          0xFE R       : a real KeyUpdate from the peer (request_update = R & 1), keys switched;
 *          0xFD R S     : the same KeyUpdate split across two handshake records after its
 *                         (S % 4 + 1)th byte (RFC 8446 §5.1), then keys switched;
 *          0xFF L ...   : L raw bytes put on the wire unprotected.
 * Out:   a trap on a broken property:
 *        - the verdict is 0, 1 or KH_EPROTO, and nothing is accepted after a non-zero verdict;
 *        - the plaintext delivered starts with the application data of the records before the
 *          first record that is not plain application data, and is itself a prefix of all the
 *          application data sealed (nothing but application data ever reaches `plain`);
 *        - with only application data (inner plaintext at most 2^14 + 1 bytes, padding included;
 *          at most 32 empty records in a row) and KeyUpdates, whole or split (at most 32 in a
 *          row), on the wire, the verdict is 0 and every byte is delivered;
 *        - whatever the reader sends back (KeyUpdate answers, alerts) opens with the peer's keys.
 * Never: keeps state between inputs (the algorithm table is fetched once). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kh_err.h"
#include "kh_tls13.h"

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static kh_tls13_algs *algs;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint16_t suites[3] = {0x1301, 0x1302, 0x1303};
    uint8_t cs[48], ss[48];
    if (algs == NULL)
        algs = kh_tls13_algs_new();
    CHECK(algs != NULL);
    if (size < 2)
        return 0;
    uint16_t suite = suites[data[0] % 3];
    size_t slen = suite == 0x1302 ? 48 : 32, cut = data[1];
    memset(cs, 0x11, sizeof cs);
    memset(ss, 0x22, sizeof ss);
    kh_tls13 peer, me;
    CHECK(kh_tls13_init(&peer, algs, suite, ss, cs, slen, 0) == 0); /* the client: writes with cs */
    CHECK(kh_tls13_init(&me, algs, suite, cs, ss, slen, 0) == 0);
    kh_bufcache bufs;
    kh_bufcache_init(&bufs, 4);
    kh_buf wire = {0}, all_app = {0}, plain = {0}, back = {0}, peer_plain = {0}, peer_out = {0};
    size_t first_app_len = 0; /* application data before the first record that is not */
    int clean = 1;            /* only application data and KeyUpdates so far */
    int key_updates = 0;      /* in a row: more than 32 is a flood the reader refuses */
    int empty = 0;            /* empty application-data records in a row: likewise */
    char *content = malloc(16700);
    size_t i = 2, k = 0;
    while (i < size) {
        uint8_t t = data[i++];
        if (t == 0xFE) {
            int req = i < size ? data[i++] & 1 : 0;
            kh_tls13_send_key_update(&peer, req, &wire, &bufs);
            if (++key_updates > 32)
                clean = 0;
            empty = 0;
            continue;
        }
        if (t == 0xFD) {
            int req = i < size ? data[i++] & 1 : 0;
            size_t at = (i < size ? data[i++] : 0) % 4 + 1;
            const char msg[5] = {24, 0, 0, 1, (char)req};
            kh_buf scratch = {0};
            kh_tls13_seal(&peer, 22, msg, at, &wire, &bufs);
            kh_tls13_seal(&peer, 22, msg + at, 5 - at, &wire, &bufs);
            kh_tls13_send_key_update(&peer, 0, &scratch, &bufs); /* only to switch the key */
            kh_buf_release(&scratch, &bufs);
            if (++key_updates > 32)
                clean = 0;
            empty = 0;
            continue;
        }
        if (t == 0xFF) {
            size_t l = i < size ? data[i++] : 0;
            l = KH_MIN(l, size - i);
            kh_buf_append(&wire, &bufs, data + i, l);
            i += l;
            clean = 0;
            continue;
        }
        size_t l1 = i < size ? data[i++] : 0, l2 = i < size ? data[i++] : 0;
        size_t len = (l1 | l2 << 8) % 16700;
        for (size_t j = 0; j < len; j++)
            content[j] = (char)data[(k++) % size];
        kh_tls13_seal(&peer, t, content, len, &wire, &bufs);
        /* what the reader will find: the last non-zero byte of content || t is the type */
        size_t n = len + 1;
        const uint8_t *u = (const uint8_t *)content;
        while (n > 0 && (n == len + 1 ? t : u[n - 1]) == 0)
            n--;
        int is_app = n > 0 && (n == len + 1 ? t : u[n - 1]) == 23 && len + 1 <= 16385;
        if (is_app) {
            if (n - 1 > 0)
                key_updates = empty = 0;
            else if (++empty > 32)
                clean = 0;
            kh_buf_append(&all_app, &bufs, content, n - 1);
            if (clean)
                first_app_len = all_app.len;
        } else {
            clean = 0;
        }
    }
    /* feed the wire in cuts */
    int verdict = 0;
    size_t off = 0, plain_at_end = 0;
    while (off < wire.len) {
        size_t m = cut ? KH_MIN((size_t)cut, wire.len - off) : wire.len - off;
        int r = kh_tls13_read(&me, wire.base + off, m, &plain, &back, &bufs);
        CHECK(r == 0 || r == 1 || r == KH_EPROTO);
        if (verdict != 0) {
            CHECK(r == 0 && plain.len == plain_at_end); /* ignored after the end */
        } else {
            verdict = r;
            plain_at_end = plain.len;
        }
        off += m;
    }
    CHECK(plain.len >= first_app_len && plain.len <= all_app.len);
    CHECK(plain.len == 0 || memcmp(plain.base, all_app.base, plain.len) == 0);
    if (clean) {
        CHECK(verdict == 0);
        CHECK(plain.len == all_app.len);
    }
    /* our answers open under the peer's keys: KeyUpdates are accepted (0), an alert ends it */
    if (back.len) {
        int r = kh_tls13_read(&peer, back.base, back.len, &peer_plain, &peer_out, &bufs);
        CHECK(r == 0 || (r == KH_EPROTO && !peer.alert_sent) || r == 1);
        CHECK(peer_plain.len == 0);
    }
    free(content);
    kh_buf_release(&wire, &bufs);
    kh_buf_release(&all_app, &bufs);
    kh_buf_release(&plain, &bufs);
    kh_buf_release(&back, &bufs);
    kh_buf_release(&peer_plain, &bufs);
    kh_buf_release(&peer_out, &bufs);
    kh_tls13_free(&peer, &bufs);
    kh_tls13_free(&me, &bufs);
    kh_bufcache_destroy(&bufs);
    return 0;
}
