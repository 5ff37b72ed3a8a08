/* kh_ws_deflate.c: permessage-deflate negotiation and per-message zlib. See kh_ws_deflate.h. */
#include "kh_ws_deflate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_space(char c)
{
    return c == ' ' || c == '\t';
}

static void trim(const char **s, const char **e)
{
    while (*s < *e && is_space(**s))
        (*s)++;
    while (*e > *s && is_space((*e)[-1]))
        (*e)--;
}

static int eq(const char *s, const char *e, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(e - s) != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lit[i])
            return 0;
    }
    return 1;
}

/* "8".."15", possibly quoted (§7.1: a quoted-string value must read as the token) */
static int bits_value(const char *s, const char *e)
{
    if (e - s >= 2 && *s == '"' && e[-1] == '"') {
        s++;
        e--;
    }
    if (e - s < 1 || e - s > 2)
        return -1;
    int v = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
    }
    if (e - s == 0 && v >= 8 && v <= 15)
        return v;
    return -1;
}

/* One offer [s, e): returns 1 when acceptable, with the server window in *sbits. */
static int offer(const char *s, const char *e, int *sbits)
{
    const char *semi = memchr(s, ';', (size_t)(e - s));
    const char *ne = semi ? semi : e, *ns = s;
    trim(&ns, &ne);
    if (!eq(ns, ne, "permessage-deflate"))
        return 0;
    int seen[4] = {0};
    *sbits = 15;
    while (semi) {
        const char *ps = semi + 1;
        semi = memchr(ps, ';', (size_t)(e - ps));
        const char *pe = semi ? semi : e;
        const char *eqs = memchr(ps, '=', (size_t)(pe - ps));
        const char *ks = ps, *ke = eqs ? eqs : pe;
        trim(&ks, &ke);
        const char *vs = eqs ? eqs + 1 : pe, *ve = pe;
        trim(&vs, &ve);
        int which;
        if (eq(ks, ke, "server_no_context_takeover"))
            which = 0;
        else if (eq(ks, ke, "client_no_context_takeover"))
            which = 1;
        else if (eq(ks, ke, "server_max_window_bits"))
            which = 2;
        else if (eq(ks, ke, "client_max_window_bits"))
            which = 3;
        else
            return 0;
        if (seen[which]++)
            return 0;
        if (which < 2 && eqs)
            return 0;
        if (which == 2) {
            int b = eqs ? bits_value(vs, ve) : -1;
            if (b < 9)
                return 0; /* a value is required; 8 cannot be honoured by zlib */
            *sbits = b;
        }
        if (which == 3 && eqs && bits_value(vs, ve) < 0)
            return 0;
    }
    return 1;
}

size_t kh_ws_pmd_negotiate(const char *v, size_t n, kh_ws_pmd *out, char *resp, size_t cap)
{
    const char *s = v, *end = v + n;
    while (s < end) {
        /* offers are split at ',' outside quotes */
        const char *e = s;
        int q = 0;
        while (e < end && (q || *e != ',')) {
            if (*e == '"')
                q = !q;
            e++;
        }
        int sbits;
        if (offer(s, e, &sbits)) {
            out->server_max_window_bits = sbits;
            int len;
            if (sbits < 15)
                len = snprintf(resp, cap,
                               "permessage-deflate; server_no_context_takeover; "
                               "client_no_context_takeover; server_max_window_bits=%d",
                               sbits);
            else
                len = snprintf(resp, cap, "permessage-deflate; server_no_context_takeover; "
                                          "client_no_context_takeover");
            return len > 0 && (size_t)len < cap ? (size_t)len : 0;
        }
        s = e < end ? e + 1 : e;
    }
    return 0;
}

int kh_ws_inflater_init(z_stream *z)
{
    memset(z, 0, sizeof *z);
    return inflateInit2(z, -15) == Z_OK ? 0 : -1;
}

int kh_ws_deflater_init(z_stream *z, int window_bits)
{
    memset(z, 0, sizeof *z);
    /* memLevel 8 is zlib's default; the state is per worker, not per socket */
    return deflateInit2(z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -window_bits, 8,
                        Z_DEFAULT_STRATEGY) == Z_OK
               ? 0
               : -1;
}

int kh_ws_inflate_msg(z_stream *z, const uint8_t *in, size_t n, uint64_t max, uint8_t **out,
                      size_t *outlen)
{
    static const uint8_t tail[4] = {0x00, 0x00, 0xff, 0xff};
    size_t cap = n * 4 + 64, len = 0;
    if (cap > max + 1)
        cap = (size_t)max + 1; /* one byte more than max tells "too big" from "exactly max" */
    uint8_t *b = malloc(cap);
    if (!b)
        return 1011;
    inflateReset(z);
    for (int part = 0; part < 2; part++) {
        z->next_in = (Bytef *)(part ? tail : in);
        z->avail_in = (uInt)(part ? 4 : n);
        for (;;) {
            if (len == cap) {
                if (cap > max) {
                    free(b);
                    return 1009;
                }
                size_t nc = cap * 2 > max + 1 ? (size_t)max + 1 : cap * 2;
                uint8_t *nb = realloc(b, nc);
                if (!nb) {
                    free(b);
                    return 1011;
                }
                b = nb;
                cap = nc;
            }
            z->next_out = b + len;
            z->avail_out = (uInt)(cap - len);
            int r = inflate(z, Z_SYNC_FLUSH);
            len = cap - z->avail_out;
            if (r == Z_STREAM_END)
                goto done; /* a final block (BFINAL): the message ends there */
            if (r == Z_BUF_ERROR && z->avail_out == 0)
                continue; /* wants more room */
            if (r != Z_OK && r != Z_BUF_ERROR) {
                free(b);
                return 1007;
            }
            if (z->avail_in == 0 && z->avail_out > 0)
                break;
        }
    }
done:
    if (len > max) {
        free(b);
        return 1009;
    }
    *out = b;
    *outlen = len;
    return 0;
}

int kh_ws_deflate_msg(z_stream *z, const uint8_t *in, size_t n, uint8_t **out, size_t *outlen)
{
    size_t cap = deflateBound(z, (uLong)n) + 16, len = 0;
    uint8_t *b = malloc(cap);
    if (!b)
        return -1;
    deflateReset(z);
    z->next_in = (Bytef *)in;
    z->avail_in = (uInt)n;
    for (;;) {
        z->next_out = b + len;
        z->avail_out = (uInt)(cap - len);
        int r = deflate(z, Z_SYNC_FLUSH);
        len = cap - z->avail_out;
        if (r != Z_OK && r != Z_BUF_ERROR) {
            free(b);
            return -1;
        }
        if (z->avail_in == 0 && z->avail_out > 0)
            break;
        uint8_t *nb = realloc(b, cap * 2);
        if (!nb) {
            free(b);
            return -1;
        }
        b = nb;
        cap *= 2;
    }
    if (len >= 4 && memcmp(b + len - 4, "\x00\x00\xff\xff", 4) == 0)
        len -= 4;
    if (len == 0) /* an empty message still needs a valid block (§7.2.3.6) */
        b[len++] = 0x00;
    *out = b;
    *outlen = len;
    return 0;
}
