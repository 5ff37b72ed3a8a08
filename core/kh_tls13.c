/* kh_tls13.c: TLS 1.3 record protection after the handshake (see kh_tls13.h).
 * Strictness: what RFC 8446 says a receiver MUST reject gets the alert it names. What it allows
 * is accepted, bounded: a KeyUpdate split across records (§5.1) is reassembled byte by byte
 * (its five bytes are all known in advance, so nothing is buffered), and runs of records that
 * carry no progress (empty records, user_canceled warnings, KeyUpdates) are capped as OpenSSL
 * caps them. */
#include "kh_tls13.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "kh_err.h"

#define REC_HEADER 5
#define TAG_LEN 16
#define MAX_PLAIN 16384                   /* 2^14 (RFC 8446 §5.1) */
/* TLSInnerPlaintext (content, type, padding) is at most 2^14 + 1 bytes (§5.4), so with our
 * suites' 16-byte tags a record's ciphertext is at most 2^14 + 17, inside §5.2's 2^14 + 256 */
#define MAX_INNER (MAX_PLAIN + 1)
#define TYPE_ALERT 21
#define TYPE_HANDSHAKE 22
#define TYPE_APPDATA 23
#define HS_KEY_UPDATE 24
/* KeyUpdates in a row with no application data between them before we call it a flood (each
 * costs us a key derivation); BoringSSL's kMaxKeyUpdates too. A client with that limit counts
 * ours the same way, so however many requests come while we are silent, we answer one
 * (on_handshake, RFC 8446 §4.6.3). */
#define MAX_KEY_UPDATES 32
/* Empty application-data records in a row (legal, and a way to make us decrypt for nothing):
 * the 33rd is refused, as OpenSSL's MAX_EMPTY_RECORDS does. */
#define MAX_EMPTY_RECORDS 32
/* user_canceled alerts in a row: the 5th is refused, as OpenSSL's MAX_WARN_ALERT_COUNT does. */
#define MAX_WARN_ALERTS 5
/* AES-GCM may protect 2^24.5 full-size records under one key (§5.5); we update after 2^24. */
#define REKEY_RECORDS (UINT64_C(1) << 24)

struct kh_tls13_suite {
    uint16_t id;
    uint8_t key_len;
    uint8_t hash_len;
    EVP_CIPHER *cipher;
    EVP_MD *md;
};

struct kh_tls13_algs {
    kh_tls13_suite suites[3];
};

kh_tls13_algs *kh_tls13_algs_new(void)
{
    static const struct {
        uint16_t id;
        uint8_t key_len, hash_len;
        const char *cipher, *md;
    } defs[3] = {
        {0x1301, 16, 32, "AES-128-GCM", "SHA256"},
        {0x1302, 32, 48, "AES-256-GCM", "SHA384"},
        {0x1303, 32, 32, "ChaCha20-Poly1305", "SHA256"},
    };
    kh_tls13_algs *a = kh_xcalloc(1, sizeof *a);
    for (int i = 0; i < 3; i++) {
        kh_tls13_suite *s = &a->suites[i];
        s->id = defs[i].id;
        s->key_len = defs[i].key_len;
        s->hash_len = defs[i].hash_len;
        s->cipher = EVP_CIPHER_fetch(NULL, defs[i].cipher, NULL);
        s->md = EVP_MD_fetch(NULL, defs[i].md, NULL);
        if (s->cipher == NULL || s->md == NULL) {
            kh_tls13_algs_free(a);
            return NULL;
        }
    }
    return a;
}

void kh_tls13_algs_free(kh_tls13_algs *a)
{
    if (a == NULL)
        return;
    for (int i = 0; i < 3; i++) {
        EVP_CIPHER_free(a->suites[i].cipher);
        EVP_MD_free(a->suites[i].md);
    }
    free(a);
}

/* HMAC (RFC 2104) over the suite's pre-fetched hash. OpenSSL 3.0's one-shot HMAC() fetches the
 * HMAC implementation and then the digest by name on every call, and each hand-off makes four. A
 * traffic secret (32 or 48 bytes) is never longer than the hash's block (64 or 128). */
static int hmac(const kh_tls13_suite *s, const uint8_t *key, const uint8_t *msg, size_t n,
                uint8_t *out)
{
    uint8_t pad[128], inner[EVP_MAX_MD_SIZE];
    size_t bs = (size_t)EVP_MD_get_block_size(s->md);
    unsigned il = 0, ol = 0;
    EVP_MD_CTX *x = EVP_MD_CTX_new();
    int ok = x != NULL && bs <= sizeof pad && s->hash_len <= bs;
    for (int round = 0; ok && round < 2; round++) {
        memset(pad, round == 0 ? 0x36 : 0x5c, bs);
        for (size_t i = 0; i < s->hash_len; i++)
            pad[i] ^= key[i];
        ok = EVP_DigestInit_ex(x, s->md, NULL) == 1 && EVP_DigestUpdate(x, pad, bs) == 1 &&
             (round == 0 ? EVP_DigestUpdate(x, msg, n) : EVP_DigestUpdate(x, inner, il)) == 1 &&
             EVP_DigestFinal_ex(x, round == 0 ? inner : out, round == 0 ? &il : &ol) == 1;
    }
    EVP_MD_CTX_free(x);
    OPENSSL_cleanse(pad, sizeof pad);
    OPENSSL_cleanse(inner, sizeof inner);
    return ok && ol == s->hash_len ? 0 : -1;
}

/* HKDF-Expand-Label(secret, label, "", len) (RFC 8446 §7.1). Every length we ask for (key, iv,
 * next secret) is at most the hash length, so HKDF-Expand (RFC 5869 §2.3) is the single block
 * T(1) = HMAC(secret, HkdfLabel || 0x01). */
static int expand_label(const kh_tls13_suite *s, const uint8_t *secret, const char *label,
                        uint8_t *out, size_t len)
{
    uint8_t info[2 + 1 + 6 + 16 + 1 + 1], md[EVP_MAX_MD_SIZE];
    size_t ll = strlen(label), n = 0;
    info[n++] = (uint8_t)(len >> 8);
    info[n++] = (uint8_t)len;
    info[n++] = (uint8_t)(6 + ll);
    memcpy(info + n, "tls13 ", 6);
    n += 6;
    memcpy(info + n, label, ll);
    n += ll;
    info[n++] = 0; /* empty context */
    info[n++] = 1; /* the block counter */
    if (hmac(s, secret, info, n, md) != 0 || len > s->hash_len)
        return -1;
    memcpy(out, md, len);
    OPENSSL_cleanse(md, sizeof md);
    return 0;
}

/* Keys one direction from its traffic secret, kept for the next KeyUpdate. */
static int dir_key(kh_tls13 *r, kh_tls13_dir *d, const uint8_t *secret, int enc)
{
    const kh_tls13_suite *s = r->suite;
    uint8_t key[32];
    if (secret != d->secret)
        memcpy(d->secret, secret, s->hash_len);
    if (expand_label(s, d->secret, "key", key, s->key_len) || expand_label(s, d->secret, "iv", d->iv, 12))
        return -1;
    if (d->aead == NULL) {
        d->aead = EVP_CIPHER_CTX_new();
        if (d->aead == NULL || EVP_CipherInit_ex(d->aead, s->cipher, NULL, NULL, NULL, enc) != 1)
            return -1;
    }
    int ok = EVP_CipherInit_ex(d->aead, NULL, NULL, key, NULL, enc) == 1;
    OPENSSL_cleanse(key, sizeof key);
    d->seq = 0;
    return ok ? 0 : -1;
}

/* The next secret of a direction (RFC 8446 §7.2). */
static int dir_update(kh_tls13 *r, kh_tls13_dir *d, int enc)
{
    uint8_t next[KH_TLS13_MAX_SECRET];
    if (expand_label(r->suite, d->secret, "traffic upd", next, r->suite->hash_len))
        return -1;
    memcpy(d->secret, next, r->suite->hash_len);
    OPENSSL_cleanse(next, sizeof next);
    return dir_key(r, d, d->secret, enc);
}

/* The per-record nonce: the IV XOR the 64-bit sequence number, left-padded (RFC 8446 §5.3). */
static void nonce(const kh_tls13_dir *d, uint8_t out[12])
{
    memcpy(out, d->iv, 12);
    for (int i = 0; i < 8; i++)
        out[11 - i] ^= (uint8_t)(d->seq >> (8 * i));
}

int kh_tls13_init(kh_tls13 *r, const kh_tls13_algs *a, uint16_t suite_id, const uint8_t *rx_secret,
                  const uint8_t *tx_secret, size_t secret_len, uint64_t tx_seq)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < 3; i++)
        if (a->suites[i].id == suite_id)
            r->suite = &a->suites[i];
    if (r->suite == NULL || secret_len != r->suite->hash_len)
        return -1;
    r->tx_rekey_at = REKEY_RECORDS;
    if (dir_key(r, &r->rx, rx_secret, 0) || dir_key(r, &r->tx, tx_secret, 1)) {
        kh_tls13_free(r, NULL);
        return -1;
    }
    r->tx.seq = tx_seq;
    return 0;
}

void kh_tls13_free(kh_tls13 *r, kh_bufcache *bufs)
{
    EVP_CIPHER_CTX_free(r->rx.aead);
    EVP_CIPHER_CTX_free(r->tx.aead);
    r->rx.aead = r->tx.aead = NULL;
    OPENSSL_cleanse(r->rx.secret, sizeof r->rx.secret);
    OPENSSL_cleanse(r->tx.secret, sizeof r->tx.secret);
    kh_buf_release(&r->partial, bufs);
}

/* ---------------------------------------------------------------------------------------- */
/* writing */

/* One record: header, content, inner type, tag (RFC 8446 §5.2), sealed in place in `cipher`. */
int kh_tls13_seal(kh_tls13 *r, uint8_t type, const char *p, size_t n, kh_buf *cipher,
                  kh_bufcache *bufs)
{
    kh_tls13_dir *d = &r->tx;
    size_t clen = n + 1 + TAG_LEN;
    uint8_t *o = (uint8_t *)kh_buf_reserve(cipher, bufs, REC_HEADER + clen), iv[12];
    int l = 0;
    o[0] = TYPE_APPDATA;
    o[1] = 3;
    o[2] = 3; /* legacy_record_version 0x0303 */
    o[3] = (uint8_t)(clen >> 8);
    o[4] = (uint8_t)clen;
    memcpy(o + REC_HEADER, p, n);
    o[REC_HEADER + n] = type;
    nonce(d, iv);
    EVP_CIPHER_CTX *x = d->aead;
    if (EVP_CipherInit_ex(x, NULL, NULL, NULL, iv, 1) != 1 ||
        EVP_CipherUpdate(x, NULL, &l, o, REC_HEADER) != 1 ||
        EVP_CipherUpdate(x, o + REC_HEADER, &l, o + REC_HEADER, (int)(n + 1)) != 1 ||
        EVP_CipherFinal_ex(x, o + REC_HEADER + n + 1, &l) != 1 ||
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, TAG_LEN, o + REC_HEADER + n + 1) != 1)
        return KH_EPROTO;
    cipher->len += REC_HEADER + clen;
    d->seq++;
    return 0;
}

int kh_tls13_send_key_update(kh_tls13 *r, int request_update, kh_buf *cipher, kh_bufcache *bufs)
{
    const char msg[5] = {HS_KEY_UPDATE, 0, 0, 1, (char)(request_update ? 1 : 0)};
    if (kh_tls13_seal(r, TYPE_HANDSHAKE, msg, sizeof msg, cipher, bufs) || dir_update(r, &r->tx, 1))
        return KH_EPROTO;
    r->tx_updated = 1;
    return 0;
}

int kh_tls13_write(kh_tls13 *r, const char *p, size_t n, kh_buf *cipher, kh_bufcache *bufs)
{
    while (n > 0) {
        if (r->tx.seq >= r->tx_rekey_at && kh_tls13_send_key_update(r, 0, cipher, bufs))
            return KH_EPROTO;
        size_t k = KH_MIN(n, (size_t)MAX_PLAIN);
        if (kh_tls13_seal(r, TYPE_APPDATA, p, k, cipher, bufs))
            return KH_EPROTO;
        r->tx_updated = 0;
        p += k;
        n -= k;
    }
    return 0;
}

int kh_tls13_send_alert(kh_tls13 *r, uint8_t desc, kh_buf *cipher, kh_bufcache *bufs)
{
    /* RFC 8446 §6: close_notify and user_canceled are warnings, everything else fatal. */
    uint8_t level = (desc == KH_TLS_ALERT_CLOSE_NOTIFY || desc == KH_TLS_ALERT_USER_CANCELED) ? 1 : 2;
    const char msg[2] = {(char)level, (char)desc};
    r->alert = desc;
    r->alert_sent = 1;
    return kh_tls13_seal(r, TYPE_ALERT, msg, sizeof msg, cipher, bufs);
}

/* ---------------------------------------------------------------------------------------- */
/* reading */

static int fatal(kh_tls13 *r, uint8_t desc, kh_buf *cipher, kh_bufcache *bufs)
{
    kh_tls13_send_alert(r, desc, cipher, bufs);
    r->done = 1;
    return KH_EPROTO;
}

/* Post-handshake messages from a client: only KeyUpdate is legal here. NewSessionTicket is the
 * server's to send, and we never ask for post-handshake authentication (§4.6). `m` is one
 * record's handshake content (n > 0): a whole KeyUpdate, or a piece of one (§5.1 lets a message
 * span records). The message is checked byte by byte against the only one we accept,
 * 0x18 00 00 01 <request_update>, so a fragment needs no buffer, only its position hs_len. */
static int on_handshake(kh_tls13 *r, const uint8_t *m, size_t n, kh_buf *cipher, kh_bufcache *bufs)
{
    static const uint8_t want[4] = {HS_KEY_UPDATE, 0, 0, 1};
    size_t i = 0;
    for (; i < n && r->hs_len < 4; i++, r->hs_len++) {
        if (m[i] != want[r->hs_len])
            return fatal(r, r->hs_len == 0 ? KH_TLS_ALERT_UNEXPECTED_MESSAGE
                                            : KH_TLS_ALERT_DECODE_ERROR,
                         cipher, bufs); /* not a KeyUpdate; a KeyUpdate not of length 1 */
    }
    if (i == n)
        return 0; /* the rest comes in the next handshake record */
    uint8_t req = m[i++];
    r->hs_len = 0;
    if (req > 1)
        return fatal(r, KH_TLS_ALERT_ILLEGAL_PARAMETER, cipher, bufs);
    /* A key change must end its record (§5.1: handshake messages MUST NOT span key changes), so
     * nothing may follow a KeyUpdate in its record; and a run of them with no data is a flood. */
    if (i != n || ++r->key_updates > MAX_KEY_UPDATES)
        return fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs);
    if (dir_update(r, &r->rx, 0))
        return fatal(r, KH_TLS_ALERT_INTERNAL_ERROR, cipher, bufs);
    /* update_requested: ours goes out before any further application data (§4.6.3); one since
     * our last data answers every request ("multiple KeyUpdates while it is silent [get] a
     * single update"): answering each, a client sending 33 requests with data between them but
     * nothing from us got 33 KeyUpdates in a row, which a peer with BoringSSL's limit refuses
     * (found by fuzz_tls13; core/fuzz/regress/tls13). */
    if (req == 1 && !r->tx_updated && kh_tls13_send_key_update(r, 0, cipher, bufs))
        return fatal(r, KH_TLS_ALERT_INTERNAL_ERROR, cipher, bufs);
    return 0;
}

/* One whole record (header included): decrypts into the free space of `plain`, then keeps it
 * there (application data) or acts on it (alert, handshake). */
static int open_record(kh_tls13 *r, const uint8_t *rec, size_t clen, kh_buf *plain, kh_buf *cipher,
                       kh_bufcache *bufs)
{
    kh_tls13_dir *d = &r->rx;
    size_t mlen = clen - TAG_LEN;
    uint8_t *o = (uint8_t *)kh_buf_reserve(plain, bufs, mlen), iv[12];
    int l = 0, l2 = 0;
    nonce(d, iv);
    EVP_CIPHER_CTX *x = d->aead;
    if (EVP_CipherInit_ex(x, NULL, NULL, NULL, iv, 0) != 1 ||
        EVP_CipherUpdate(x, NULL, &l, rec, REC_HEADER) != 1 ||
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_SET_TAG, TAG_LEN,
                            (void *)(rec + REC_HEADER + mlen)) != 1 ||
        EVP_CipherUpdate(x, o, &l, rec + REC_HEADER, (int)mlen) != 1 ||
        EVP_CipherFinal_ex(x, o + l, &l2) != 1)
        return fatal(r, KH_TLS_ALERT_BAD_RECORD_MAC, cipher, bufs);
    d->seq++;
    /* TLSInnerPlaintext: content, type, zero padding; the type is the last non-zero byte. Its
     * whole length (padding included) was bounded by header() before any of this. */
    size_t i = mlen;
    while (i > 0 && o[i - 1] == 0)
        i--;
    if (i == 0)
        return fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs);
    uint8_t type = o[i - 1];
    size_t n = i - 1;
    /* §5.1: a handshake message split across records has nothing between its pieces. */
    if (r->hs_len && type != TYPE_HANDSHAKE)
        return fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs);
    if (n > 0) {
        r->empty_records = 0;
        if (type != TYPE_ALERT)
            r->warn_alerts = 0;
    }
    switch (type) {
    case TYPE_APPDATA:
        if (n == 0)
            return ++r->empty_records > MAX_EMPTY_RECORDS
                       ? fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs)
                       : 0;
        plain->len += n;
        r->key_updates = 0;
        return 0;
    case TYPE_ALERT:
        /* §5.4: no empty alert; §5.1: exactly one two-byte alert per record */
        if (n == 0)
            return fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs);
        if (n != 2)
            return fatal(r, KH_TLS_ALERT_DECODE_ERROR, cipher, bufs);
        r->alert = o[1];
        r->alert_sent = 0;
        /* §6: the level is implied by the description. user_canceled is the one warning (a
         * close_notify should follow, §6.1); everything but it and close_notify is fatal. */
        if (o[1] == KH_TLS_ALERT_USER_CANCELED)
            return ++r->warn_alerts >= MAX_WARN_ALERTS
                       ? fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs)
                       : 0;
        r->done = 1;
        return o[1] == KH_TLS_ALERT_CLOSE_NOTIFY ? 1 : KH_EPROTO;
    case TYPE_HANDSHAKE:
        /* §5.4: no zero-length handshake fragment */
        if (n == 0)
            return fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs);
        return on_handshake(r, o, n, cipher, bufs); /* `o` is scratch space: not kept */
    default:
        return fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs);
    }
}

/* Checks a record header; returns the ciphertext length or a fatal alert. Every record after the
 * handshake is protected and claims application_data (§5.2); a ChangeCipherSpec or plaintext
 * alert now is unexpected (§5). legacy_record_version is ignored, as §5.1 says. */
static int header(kh_tls13 *r, const uint8_t *h, size_t *clen, kh_buf *cipher, kh_bufcache *bufs)
{
    size_t n = (size_t)h[3] << 8 | h[4];
    if (h[0] != TYPE_APPDATA)
        return fatal(r, KH_TLS_ALERT_UNEXPECTED_MESSAGE, cipher, bufs);
    /* §5.2: over 2^14 + 256 is record_overflow; so is a TLSInnerPlaintext over 2^14 + 1
     * (§5.4), padding included, which the length tells before anything is decrypted: an AEAD
     * adds exactly its tag. */
    if (n > MAX_INNER + TAG_LEN)
        return fatal(r, KH_TLS_ALERT_RECORD_OVERFLOW, cipher, bufs);
    if (n < TAG_LEN + 1)
        return fatal(r, KH_TLS_ALERT_BAD_RECORD_MAC, cipher, bufs);
    *clen = n;
    return 0;
}

int kh_tls13_read(kh_tls13 *r, const char *p, size_t n, kh_buf *plain, kh_buf *cipher,
                  kh_bufcache *bufs)
{
    const uint8_t *u = (const uint8_t *)p;
    size_t clen = 0;
    int rc;
    if (r->done)
        return 0;
    /* First complete a record an earlier read cut. */
    if (r->partial.len) {
        kh_buf *b = &r->partial;
        if (b->len < REC_HEADER) {
            size_t k = KH_MIN(REC_HEADER - b->len, n);
            kh_buf_append(b, bufs, u, k);
            u += k;
            n -= k;
            if (b->len < REC_HEADER)
                return 0;
        }
        if ((rc = header(r, (const uint8_t *)b->base, &clen, cipher, bufs)) != 0)
            return rc;
        size_t k = KH_MIN(REC_HEADER + clen - b->len, n);
        kh_buf_append(b, bufs, u, k);
        u += k;
        n -= k;
        if (b->len < REC_HEADER + clen)
            return 0;
        rc = open_record(r, (const uint8_t *)b->base, clen, plain, cipher, bufs);
        kh_buf_release(b, bufs);
        if (rc != 0)
            return rc;
    }
    while (n >= REC_HEADER) {
        if ((rc = header(r, u, &clen, cipher, bufs)) != 0)
            return rc;
        if (n < REC_HEADER + clen)
            break;
        if ((rc = open_record(r, u, clen, plain, cipher, bufs)) != 0)
            return rc;
        u += REC_HEADER + clen;
        n -= REC_HEADER + clen;
    }
    if (n > 0)
        kh_buf_append(&r->partial, bufs, u, n); /* at most one record: its header was checked */
    return 0;
}
