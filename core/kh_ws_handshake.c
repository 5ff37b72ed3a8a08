/* kh_ws_handshake.c: see kh_ws_handshake.h. */
#include "kh_ws_handshake.h"

#include "kh_sha1.h"

#include <string.h>

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '+' || c == '/';
}

int kh_ws_key_ok(const char *key, size_t n)
{
    if (n != 24 || key[22] != '=' || key[23] != '=')
        return 0;
    for (size_t i = 0; i < 22; i++)
        if (!b64char(key[i]))
            return 0;
    /* 16 bytes leave the last character's low 4 bits zero: A, Q, g or w */
    return strchr("AQgw", key[21]) != NULL;
}

void kh_ws_accept(const char *key, size_t n, char out[KH_WS_ACCEPT_LEN])
{
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    uint8_t d[KH_SHA1_LEN + 1];
    kh_sha1_ctx c;
    kh_sha1_init(&c);
    kh_sha1_update(&c, key, n);
    kh_sha1_update(&c, guid, sizeof guid - 1);
    kh_sha1_final(&c, d);
    d[KH_SHA1_LEN] = 0;
    size_t o = 0;
    for (size_t i = 0; i < 21; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
        out[o++] = B64[v >> 18];
        out[o++] = B64[(v >> 12) & 63];
        out[o++] = B64[(v >> 6) & 63];
        out[o++] = B64[v & 63];
    }
    out[KH_WS_ACCEPT_LEN - 1] = '='; /* 20 bytes: one pad character */
}

int kh_ws_version_ok(const char *v, size_t n)
{
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    return n == 2 && v[0] == '1' && v[1] == '3';
}

int kh_ws_has_token(const char *v, size_t n, const char *token)
{
    size_t tl = strlen(token), i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t s = i;
        while (i < n && v[i] != ',')
            i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e - s == tl) {
            size_t k = 0;
            for (; k < tl; k++) {
                char c = v[s + k];
                if (c >= 'A' && c <= 'Z')
                    c = (char)(c - 'A' + 'a');
                if (c != token[k])
                    break;
            }
            if (k == tl)
                return 1;
        }
    }
    return 0;
}
