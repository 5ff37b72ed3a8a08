/* kh_reqid.c: see kh_reqid.h. */
#include "kh_reqid.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "kh_worker.h"

static uv_once_t prefix_once = UV_ONCE_INIT;
static char prefix[9];

static void make_prefix(void)
{
    unsigned char r[4] = {0};
    if (uv_random(NULL, NULL, r, sizeof r, 0, NULL) != 0) {
        uint64_t t = uv_hrtime(); /* no entropy source: still differs from run to run */
        memcpy(r, &t, sizeof r);
    }
    snprintf(prefix, sizeof prefix, "%02x%02x%02x%02x", r[0], r[1], r[2], r[3]);
}

int kh_reqid_sane(const char *v, size_t len)
{
    if (len == 0 || len > KH_REQID_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)v[i] < 0x21 || (unsigned char)v[i] > 0x7e)
            return 0;
    return 1;
}

/* "<prefix>-<wid>-<sid>" at out (room for 8 + 2 + 2 * 20 bytes); returns its length. */
static size_t make_id(uint64_t wid, uint64_t sid, char *out)
{
    uv_once(&prefix_once, make_prefix);
    memcpy(out, prefix, 8);
    size_t n = 8;
    out[n++] = '-';
    n = (size_t)(kh_put_u64(out + n, wid) - out);
    out[n++] = '-';
    return (size_t)(kh_put_u64(out + n, sid) - out);
}

const kh_header *kh_reqid_client(const kh_stream *s)
{
    const kh_header *h = kh_stream_header(s, "x-request-id", 12);
    return h && kh_reqid_sane(h->value.ptr, h->value.len) ? h : NULL;
}

size_t kh_reqid(const kh_stream *s, char *out)
{
    const kh_header *h = kh_reqid_client(s);
    if (h) {
        memcpy(out, h->value.ptr, h->value.len);
        return h->value.len;
    }
    kh_worker *w = s->worker;
    if (w == NULL) /* a stream outside a worker (unit tests): worker 0 */
        return make_id(0, s->id, out);
    /* "<prefix>-<worker>-" is the same for every id a worker makes: kept in the worker, the
     * per-id work is one copy and one number (the uv_once and the worker's number per id:
     * 5,354 -> 5,334 instructions per h1 hello request, REQUESTS=20000 CONNS=64
     * bench/callgrind.sh) */
    if (w->reqid_prefix_len == 0)
        w->reqid_prefix_len = (uint8_t)(make_id((uint64_t)w->id, 0, w->reqid_prefix) - 1);
    memcpy(out, w->reqid_prefix, sizeof w->reqid_prefix);
    return (size_t)(kh_put_u64(out + w->reqid_prefix_len, s->id) - out);
}
