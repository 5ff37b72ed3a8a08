/* fuzz_ws.c: libFuzzer target for the WebSocket codec (kh_ws.c), permessage-deflate
 * (kh_ws_deflate.c) and the handshake helpers (kh_ws_handshake.c).
 * Owns:  exact-size heap copies of the input (ASan sees any read past the end).
 * In:    data[0]: bit 0 deflate negotiated, bit 1 pause after each message, bits 2-7 the size
 *        of the chunks the stream is fed in (0: whole); data[1..] the client's bytes.
 * Out:   a trap on any broken property:
 *        - fed whole and fed in chunks, the session gives the same messages (count and a hash),
 *          the same server frames, the same result and close code;
 *        - no message is longer than max_message; a text message is valid UTF-8;
 *        - KH_WS_CLOSED always comes with a close code the RFC allows us to send, or 1005;
 *        - the negotiation of the same bytes as an extension offer writes a NUL-terminated
 *          answer within the buffer; key/version/token helpers read within bounds.
 * Never: keeps state between inputs (zlib streams are made and ended per input). */
#include "kh_ws.h"
#include "kh_ws_deflate.h"
#include "kh_ws_handshake.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

#define MAX_MSG 4096

typedef struct obs {
    uint64_t msgs, hash, sent, shash;
    int pause;
    z_stream inf;
} obs;

static uint64_t mix(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

/* a session and what its callbacks record into (kh_ws.h: no user pointer per session) */
typedef struct sess {
    kh_ws_conn w;
    void *ud;
} sess;

static int on_message(kh_ws_conn *ws, int binary, const uint8_t *p, size_t n)
{
    void *ud = ((sess *)ws)->ud;
    obs *o = ud;
    CHECK(n <= MAX_MSG);
    if (!binary) {
        uint32_t s = 0;
        CHECK(kh_ws_utf8(&s, p, n) == 0 && s == 0);
    }
    o->msgs++;
    o->hash = mix(o->hash ^ (uint64_t)binary, p, n);
    return o->pause;
}

static void on_send(kh_ws_conn *ws, const uint8_t *h, size_t hl, const uint8_t *p, size_t n)
{
    void *ud = ((sess *)ws)->ud;
    obs *o = ud;
    CHECK(hl >= 2 && hl <= KH_WS_HDR_MAX && n <= 125);
    o->sent++;
    o->shash = mix(mix(o->shash, h, hl), p, n);
}

static int on_inflate(kh_ws_conn *ws, const uint8_t *in, size_t n, uint64_t max, uint8_t **out,
                      size_t *outlen)
{
    void *ud = ((sess *)ws)->ud;
    obs *o = ud;
    int r = kh_ws_inflate_msg(&o->inf, in, n, max, out, outlen);
    if (r == 0)
        CHECK(*outlen <= max);
    return r;
}

static const kh_ws_cfg CFG = {{on_message, on_send, NULL, on_inflate}, MAX_MSG, MAX_MSG / 2};

static void session(const uint8_t *data, size_t size, int deflate, int pause, size_t chunk, obs *o,
                    int *rc_out, unsigned *code_out)
{
    memset(o, 0, sizeof *o);
    o->pause = pause;
    if (deflate)
        CHECK(kh_ws_inflater_init(&o->inf) == 0);
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    sess ss = {.ud = o};
    kh_ws_conn_init(&ss.w, &CFG, deflate);
    size_t pos = 0;
    int rc = KH_WS_OK;
    while (pos < size) {
        size_t len = chunk ? (size - pos < chunk ? size - pos : chunk) : size - pos, used = 0;
        rc = kh_ws_conn_feed(&ss.w, buf + pos, len, &used);
        CHECK(used <= len);
        if (rc == KH_WS_CLOSED)
            break;
        CHECK(rc == KH_WS_PAUSED || used == len);
        pos += used;
    }
    if (rc == KH_WS_CLOSED)
        CHECK(ss.w.close_code == KH_WS_CLOSE_NO_STATUS || kh_ws_close_code_ok(ss.w.close_code));
    *rc_out = rc;
    *code_out = ss.w.close_code;
    kh_ws_conn_free(&ss.w);
    if (deflate)
        inflateEnd(&o->inf);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int deflate = data[0] & 1, pause = (data[0] >> 1) & 1;
    size_t chunk = data[0] >> 2;
    data++;
    size--;

    obs a, b;
    int ra, rb;
    unsigned ca, cb;
    session(data, size, deflate, pause, 0, &a, &ra, &ca);
    session(data, size, deflate, pause, chunk ? chunk : 1, &b, &rb, &cb);
    CHECK(ra == rb && ca == cb);
    CHECK(a.msgs == b.msgs && a.hash == b.hash && a.sent == b.sent && a.shash == b.shash);

    /* the same bytes as handshake header values */
    char *s = malloc(size ? size : 1);
    memcpy(s, data, size);
    char resp[512];
    kh_ws_pmd pmd;
    size_t rl = kh_ws_pmd_negotiate(s, size, &pmd, resp, sizeof resp);
    CHECK(rl < sizeof resp);
    if (rl) {
        CHECK(resp[rl] == 0 && pmd.server_max_window_bits >= 9 && pmd.server_max_window_bits <= 15);
    }
    (void)kh_ws_key_ok(s, size);
    (void)kh_ws_version_ok(s, size);
    (void)kh_ws_has_token(s, size, "websocket");
    if (kh_ws_key_ok(s, size)) {
        char acc[KH_WS_ACCEPT_LEN];
        kh_ws_accept(s, size, acc);
        CHECK(acc[KH_WS_ACCEPT_LEN - 1] == '=');
    }
    free(s);
    return 0;
}
