/* kh_ws.c: the RFC 6455 frame parser, session and encoder. See kh_ws.h. Tested by
 * core/test/test_ws.c (every input also fed one byte at a time) and fuzzed by
 * core/fuzz/fuzz_ws.c. */
#include "kh_ws.h"

#include <stdlib.h>
#include <string.h>

/* a message assembled from several frames or inputs */
typedef struct kh_ws_msg {
    size_t len, cap;
    uint8_t data[];
} kh_ws_msg;

void kh_ws_parser_init(kh_ws_parser *p, int rsv1_ok)
{
    memset(p, 0, sizeof *p);
    p->rsv1_ok = (uint8_t)!!rsv1_ok;
}

static size_t header_need(const uint8_t *h, size_t fill)
{
    if (fill < 2)
        return 2;
    size_t n = 2 + 4; /* a client frame is always masked (checked before this counts) */
    uint8_t l7 = h[1] & 0x7f;
    if (l7 == 126)
        n += 2;
    else if (l7 == 127)
        n += 8;
    return n;
}

/* Checks a complete header and sets up the payload. Returns 0 or a negative close code. */
static int header_done(kh_ws_parser *p, uint64_t max_frame)
{
    const uint8_t *h = p->hdr;
    uint8_t op = h[0] & 0x0f, fin = h[0] >> 7, rsv1 = (h[0] >> 6) & 1;
    if (h[0] & 0x30)
        return -KH_WS_CLOSE_PROTOCOL; /* RSV2/RSV3: no extension defines them */
    uint8_t l7 = h[1] & 0x7f;
    uint64_t len = l7;
    size_t k = 2;
    if (l7 == 126) {
        len = (uint64_t)h[2] << 8 | h[3];
        k = 4;
        if (len < 126)
            return -KH_WS_CLOSE_PROTOCOL; /* §5.2: the minimal number of bytes */
    } else if (l7 == 127) {
        len = 0;
        for (int i = 0; i < 8; i++)
            len = len << 8 | h[2 + i];
        k = 10;
        if (len >> 63 || len <= 0xffff)
            return -KH_WS_CLOSE_PROTOCOL;
    }
    memcpy(p->mask, h + k, 4);
    if (op >= 0x8) {
        if (op > KH_WS_OP_PONG || !fin || len > 125 || rsv1)
            return -KH_WS_CLOSE_PROTOCOL; /* §5.5: control frames are small and whole */
    } else if (op == KH_WS_OP_CONT) {
        if (!p->in_message || rsv1)
            return -KH_WS_CLOSE_PROTOCOL; /* RFC 7692 §6.1: RSV1 only on the first frame */
        if (fin)
            p->in_message = 0;
    } else if (op == KH_WS_OP_TEXT || op == KH_WS_OP_BINARY) {
        if (p->in_message || (rsv1 && !p->rsv1_ok))
            return -KH_WS_CLOSE_PROTOCOL;
        p->in_message = !fin;
    } else {
        return -KH_WS_CLOSE_PROTOCOL; /* reserved opcodes 3-7 */
    }
    if (len > max_frame)
        return -KH_WS_CLOSE_TOO_BIG;
    p->opcode = op;
    p->fin = fin;
    p->rsv1 = rsv1;
    p->left = len;
    p->mask_off = 0;
    p->first = 1;
    p->in_payload = 1;
    return 0;
}

static void unmask(uint8_t *b, size_t n, const uint8_t m[4], uint8_t *off)
{
    size_t i = 0;
    uint8_t o = *off;
    while (i < n && o) { /* align the key to the data */
        b[i++] ^= m[o];
        o = (o + 1) & 3;
    }
    if (n - i >= 8) {
        uint8_t m8[8] = {m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3]};
        uint64_t k;
        memcpy(&k, m8, 8);
        for (; n - i >= 8; i += 8) {
            uint64_t v;
            memcpy(&v, b + i, 8);
            v ^= k;
            memcpy(b + i, &v, 8);
        }
    }
    for (; i < n; i++) {
        b[i] ^= m[o];
        o = (o + 1) & 3;
    }
    *off = o;
}

int kh_ws_parse(kh_ws_parser *p, uint64_t max_frame, uint8_t *buf, size_t n, size_t *used,
                kh_ws_chunk *c)
{
    size_t i = 0;
    while (!p->in_payload) {
        if (i == n) {
            *used = i;
            return 0;
        }
        p->hdr[p->hdr_fill++] = buf[i++];
        if (p->hdr_fill == 2 && !(p->hdr[1] & 0x80)) {
            *used = i;
            return -KH_WS_CLOSE_PROTOCOL; /* §5.1: a client masks every frame */
        }
        if (p->hdr_fill == header_need(p->hdr, p->hdr_fill)) {
            p->hdr_fill = 0;
            int r = header_done(p, max_frame);
            if (r < 0) {
                *used = i;
                return r;
            }
        }
    }
    /* a frame with an empty payload gives one empty chunk, so its end is seen */
    size_t take = n - i < p->left ? n - i : (size_t)p->left;
    if (take == 0 && p->left) {
        *used = i;
        return 0;
    }
    unmask(buf + i, take, p->mask, &p->mask_off);
    c->data = buf + i;
    c->len = take;
    c->opcode = p->opcode;
    c->fin = p->fin;
    c->rsv1 = p->rsv1;
    c->frame_first = p->first;
    p->first = 0;
    p->left -= take;
    c->frame_end = p->left == 0;
    if (c->frame_end)
        p->in_payload = 0;
    *used = i + take;
    return 1;
}

size_t kh_ws_frame_header(uint8_t hdr[KH_WS_HDR_MAX], int opcode, int fin, int rsv1, uint64_t len)
{
    hdr[0] = (uint8_t)((fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) | (opcode & 0x0f));
    if (len < 126) {
        hdr[1] = (uint8_t)len;
        return 2;
    }
    if (len <= 0xffff) {
        hdr[1] = 126;
        hdr[2] = (uint8_t)(len >> 8);
        hdr[3] = (uint8_t)len;
        return 4;
    }
    hdr[1] = 127;
    for (int i = 0; i < 8; i++)
        hdr[2 + i] = (uint8_t)(len >> (56 - 8 * i));
    return 10;
}

int kh_ws_close_code_ok(unsigned code)
{
    if (code >= 3000 && code <= 4999)
        return 1;
    return code >= 1000 && code <= 1014 && code != 1004 && code != 1005 && code != 1006;
}

/* state: bits 0-1 the continuation bytes still needed, bits 8-15 / 16-23 the range allowed for
 * the next one (narrower than 80-BF after E0, ED, F0, F4). */
int kh_ws_utf8(uint32_t *state, const uint8_t *p, size_t n)
{
    uint32_t s = *state;
    size_t i = 0;
    while (i < n) {
        if (s == 0) {
            /* ASCII eight bytes at a time */
            while (n - i >= 8) {
                uint64_t v;
                memcpy(&v, p + i, 8);
                if (v & 0x8080808080808080ULL)
                    break;
                i += 8;
            }
            if (i == n)
                break;
            uint8_t b = p[i++];
            if (b < 0x80)
                continue;
            uint32_t need, lo = 0x80, hi = 0xbf;
            if (b >= 0xc2 && b <= 0xdf)
                need = 1;
            else if (b >= 0xe0 && b <= 0xef) {
                need = 2;
                if (b == 0xe0)
                    lo = 0xa0; /* overlong */
                else if (b == 0xed)
                    hi = 0x9f; /* surrogates */
            } else if (b >= 0xf0 && b <= 0xf4) {
                need = 3;
                if (b == 0xf0)
                    lo = 0x90;
                else if (b == 0xf4)
                    hi = 0x8f; /* above U+10FFFF */
            } else {
                *state = s;
                return -1;
            }
            s = need | lo << 8 | hi << 16;
        } else {
            uint8_t b = p[i++];
            uint32_t lo = (s >> 8) & 0xff, hi = (s >> 16) & 0xff;
            if (b < lo || b > hi) {
                *state = s;
                return -1;
            }
            uint32_t need = (s & 3) - 1;
            s = need ? (need | 0x80 << 8 | 0xbf << 16) : 0;
        }
    }
    *state = s;
    return 0;
}

/* ---- session ---- */

void kh_ws_conn_init(kh_ws_conn *w, const kh_ws_cfg *cfg, int deflate)
{
    memset(w, 0, sizeof *w);
    kh_ws_parser_init(&w->p, deflate && cfg->cb.inflate);
    w->cfg = cfg;
}

static void msg_free(kh_ws_conn *w)
{
    free(w->msg);
    w->msg = NULL;
}

void kh_ws_conn_free(kh_ws_conn *w)
{
    msg_free(w);
    free(w->ctl);
    w->ctl = NULL;
}

static void send_frame(kh_ws_conn *w, int op, const uint8_t *p, size_t n)
{
    uint8_t hdr[KH_WS_HDR_MAX];
    size_t hl = kh_ws_frame_header(hdr, op, 1, 0, n);
    w->cfg->cb.send(w, hdr, hl, p, n);
}

static void send_close(kh_ws_conn *w, unsigned code, const uint8_t *reason, size_t n)
{
    uint8_t b[125];
    size_t len = 0;
    if (code) {
        b[0] = (uint8_t)(code >> 8);
        b[1] = (uint8_t)code;
        if (n > 123)
            n = 123;
        if (n)
            memcpy(b + 2, reason, n);
        len = 2 + n;
    }
    w->close_sent = 1;
    send_frame(w, KH_WS_OP_CLOSE, b, len);
}

/* The peer broke the protocol: close with code, stop reading. */
static int fail(kh_ws_conn *w, unsigned code)
{
    if (!w->close_sent)
        send_close(w, code, NULL, 0);
    w->closed = 1;
    w->close_code = (uint16_t)code;
    kh_ws_conn_free(w);
    return KH_WS_CLOSED;
}

void kh_ws_conn_close(kh_ws_conn *w, unsigned code, const char *reason, size_t n)
{
    if (w->close_sent || w->closed)
        return;
    if (n > 123) { /* cut on a character boundary, so the reason stays valid UTF-8 */
        n = 123;
        while (n && (reason[n] & 0xc0) == 0x80)
            n--;
    }
    send_close(w, code, (const uint8_t *)reason, n);
}

/* A whole control frame's payload p[0..n) (the input's, or w->ctl). Returns KH_WS_OK or
 * KH_WS_CLOSED. */
static int control(kh_ws_conn *w, int op, const uint8_t *p, size_t n)
{
    if (op == KH_WS_OP_PING) {
        if (!w->close_sent)
            send_frame(w, KH_WS_OP_PONG, p, n); /* §5.5.3: same payload */
        return KH_WS_OK;
    }
    if (op == KH_WS_OP_PONG) {
        if (w->cfg->cb.pong)
            w->cfg->cb.pong(w, p, n);
        return KH_WS_OK;
    }
    /* close */
    unsigned code = KH_WS_CLOSE_NO_STATUS;
    if (n == 1)
        return fail(w, KH_WS_CLOSE_PROTOCOL);
    if (n >= 2) {
        code = (unsigned)p[0] << 8 | p[1];
        if (!kh_ws_close_code_ok(code))
            return fail(w, KH_WS_CLOSE_PROTOCOL);
        uint32_t u = 0;
        if (kh_ws_utf8(&u, p + 2, n - 2u) < 0 || u)
            return fail(w, KH_WS_CLOSE_INVALID_DATA);
    }
    w->close_received = 1;
    if (!w->close_sent) /* §5.5.1: echo the status code */
        send_close(w, code == KH_WS_CLOSE_NO_STATUS ? 0 : code, NULL, 0);
    w->closed = 1;
    w->close_code = (uint16_t)code;
    kh_ws_conn_free(w);
    return KH_WS_CLOSED;
}

static int append(kh_ws_conn *w, const uint8_t *p, size_t n)
{
    if (n == 0)
        return 0;
    kh_ws_msg *m = w->msg;
    size_t len = m ? m->len : 0, have = m ? m->cap : 0;
    uint64_t max = w->cfg->max_message;
    if (n > max - len)
        return -1;
    if (len + n > have) {
        size_t cap = have ? have : 256;
        while (cap < len + n)
            cap *= 2;
        if (cap > max)
            cap = (size_t)max;
        m = realloc(m, sizeof *m + cap);
        if (!m)
            return -1;
        m->len = len;
        m->cap = cap;
        w->msg = m;
    }
    memcpy(m->data + len, p, n);
    m->len = len + n;
    return 0;
}

/* The message is complete: inflate it, check its text, hand it over. Returns 0 (go on), 1
 * (pause) or a negative close code. */
static int deliver(kh_ws_conn *w, const uint8_t *p, size_t n)
{
    int binary = w->msg_op == KH_WS_OP_BINARY, r;
    uint8_t *inflated = NULL;
    if (w->msg_deflated) {
        size_t outlen = 0;
        r = w->cfg->cb.inflate(w, p, n, w->cfg->max_message, &inflated, &outlen);
        if (r)
            return -r;
        p = inflated;
        n = outlen;
        if (!binary) {
            uint32_t u = 0;
            if (kh_ws_utf8(&u, p, n) < 0 || u) {
                free(inflated);
                return -KH_WS_CLOSE_INVALID_DATA;
            }
        }
    } else if (!binary && w->utf8) {
        return -KH_WS_CLOSE_INVALID_DATA; /* ends inside a character */
    }
    w->msg_op = 0;
    r = w->cfg->cb.message(w, binary, p, n);
    free(inflated);
    msg_free(w);
    return r ? 1 : 0;
}

int kh_ws_conn_feed(kh_ws_conn *w, uint8_t *buf, size_t n, size_t *used)
{
    size_t pos = 0;
    kh_ws_chunk c;
    if (w->closed) {
        *used = n;
        return KH_WS_CLOSED;
    }
    while (pos < n) {
        size_t u = 0;
        int r = kh_ws_parse(&w->p, w->cfg->max_frame, buf + pos, n - pos, &u, &c);
        pos += u;
        if (r == 0)
            break;
        if (r < 0) {
            *used = n;
            return fail(w, (unsigned)-r);
        }
        if (c.opcode >= 0x8) {
            int st = KH_WS_OK;
            if (c.frame_first && c.frame_end) { /* whole in this input: no copy */
                st = control(w, c.opcode, c.data, c.len);
            } else {
                if (c.frame_first)
                    w->ctl_len = 0;
                if (w->ctl == NULL && (w->ctl = malloc(125)) == NULL) {
                    *used = n;
                    return fail(w, KH_WS_CLOSE_INTERNAL);
                }
                memcpy(w->ctl + w->ctl_len, c.data, c.len);
                w->ctl_len = (uint8_t)(w->ctl_len + c.len);
                if (c.frame_end) {
                    /* control() may free w->ctl (close): it reads a copy on the stack */
                    uint8_t b[125];
                    size_t len = w->ctl_len;
                    memcpy(b, w->ctl, len);
                    free(w->ctl);
                    w->ctl = NULL;
                    st = control(w, c.opcode, b, len);
                }
            }
            if (st == KH_WS_CLOSED) {
                *used = n;
                return KH_WS_CLOSED;
            }
            continue;
        }
        if (c.frame_first && c.opcode != KH_WS_OP_CONT) {
            w->msg_op = c.opcode;
            w->msg_deflated = c.rsv1;
            w->utf8 = 0;
            if (w->msg)
                w->msg->len = 0;
        }
        if (w->close_sent)
            continue; /* closing: data is dropped until the peer's close frame */
        int last = c.frame_end && c.fin, text = w->msg_op == KH_WS_OP_TEXT;
        if (last && c.frame_first && (w->msg == NULL || w->msg->len == 0) && !w->msg_deflated) {
            /* the whole message is in buf: no copy */
            if (text && (kh_ws_utf8(&w->utf8, c.data, c.len) < 0 || w->utf8))
                r = -KH_WS_CLOSE_INVALID_DATA;
            else
                r = deliver(w, c.data, c.len);
        } else {
            if (append(w, c.data, c.len) < 0) {
                *used = n;
                return fail(w, KH_WS_CLOSE_TOO_BIG);
            }
            /* fail fast: invalid text is refused in the fragment that holds it */
            if (text && !w->msg_deflated && kh_ws_utf8(&w->utf8, c.data, c.len) < 0)
                r = -KH_WS_CLOSE_INVALID_DATA;
            else
                r = !last ? 0 : w->msg ? deliver(w, w->msg->data, w->msg->len)
                                       : deliver(w, NULL, 0); /* (empty fragments only) */
        }
        if (r < 0) {
            *used = n;
            return fail(w, (unsigned)-r);
        }
        if (r == 1) {
            *used = pos;
            return KH_WS_PAUSED;
        }
    }
    *used = pos;
    return KH_WS_OK;
}
