/* test_tls13.c: our TLS 1.3 record layer against OpenSSL's as the peer. An in-process OpenSSL
 * server and client shake hands over a BIO pair; then the server side is handed to kh_tls13 (as
 * kh_tls does) and the OpenSSL client must read what we write and we what it writes: every
 * suite, record sizes around 16 KiB, input cut at every byte, KeyUpdate both ways, our own
 * rekeying, close_notify, and the alerts for tampered, oversized and unexpected records; then
 * RFC 8446's size limits (padding included), KeyUpdates split across records, and the caps on
 * empty records and warning alerts. */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "kh_err.h"
#include "kh_test.h"
#include "kh_tls13.h"

static kh_bufcache bufs;
static kh_tls13_algs *algs;

typedef struct secrets {
    uint8_t c[48], s[48];
    size_t len;
} secrets;
static int secrets_idx;

static int unhex(const char *h, uint8_t *out, size_t max)
{
    size_t n = strlen(h) / 2;
    if (n > max)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return (int)n;
}

static void keylog(const SSL *ssl, const char *line)
{
    secrets *s = SSL_get_ex_data(ssl, secrets_idx);
    const char *hex = strrchr(line, ' ') + 1;
    if (strncmp(line, "CLIENT_TRAFFIC_SECRET_0 ", 24) == 0)
        s->len = (size_t)unhex(hex, s->c, 48);
    else if (strncmp(line, "SERVER_TRAFFIC_SECRET_0 ", 24) == 0)
        s->len = (size_t)unhex(hex, s->s, 48);
}

static SSL_CTX *server_ctx(const char *suite)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    EVP_PKEY *pk = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, pk);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                               (const unsigned char *)"localhost", -1, -1, 0);
    X509_set_issuer_name(x, X509_get_subject_name(x));
    X509_sign(x, pk, EVP_sha256());
    SSL_CTX_use_certificate(ctx, x);
    SSL_CTX_use_PrivateKey(ctx, pk);
    X509_free(x);
    EVP_PKEY_free(pk);
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_ciphersuites(ctx, suite);
    SSL_CTX_set_num_tickets(ctx, 0); /* our write sequence starts at 0 */
    SSL_CTX_set_keylog_callback(ctx, keylog);
    return ctx;
}

typedef struct pair {
    SSL_CTX *sctx, *cctx;
    SSL *server, *client;
    BIO *sbio; /* our end of the pair: what we read is the client's, what we write goes to it */
    secrets sec;
    kh_tls13 rec;
    kh_buf plain, cipher;
} pair;

/* Everything waiting in our end of the BIO pair, appended to out. */
static void pump(BIO *b, kh_buf *out)
{
    char tmp[4096];
    int n;
    while ((n = BIO_read(b, tmp, sizeof tmp)) > 0)
        kh_buf_append(out, &bufs, tmp, (size_t)n);
}

/* Handshake over a BIO pair, then hand the server side to kh_tls13. */
static int pair_open(pair *p, const char *suite)
{
    memset(p, 0, sizeof *p);
    p->sctx = server_ctx(suite);
    p->cctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(p->cctx, TLS1_3_VERSION);
    p->server = SSL_new(p->sctx);
    p->client = SSL_new(p->cctx);
    SSL_set_ex_data(p->server, secrets_idx, &p->sec);
    BIO *cb;
    BIO_new_bio_pair(&cb, 1 << 20, &p->sbio, 1 << 20); /* room for 70000-byte writes */
    /* the server SSL talks through its own pair during the handshake */
    BIO *s_io, *s_net;
    BIO_new_bio_pair(&s_io, 0, &s_net, 0);
    SSL_set_bio(p->server, s_io, s_io);
    SSL_set_bio(p->client, cb, cb);
    SSL_set_connect_state(p->client);
    SSL_set_accept_state(p->server);
    char tmp[16384];
    for (int i = 0; i < 20; i++) {
        int rc = SSL_do_handshake(p->client);
        int rs = SSL_do_handshake(p->server);
        int n;
        while ((n = BIO_read(p->sbio, tmp, sizeof tmp)) > 0) /* client -> server */
            BIO_write(s_net, tmp, n);
        while ((n = BIO_read(s_net, tmp, sizeof tmp)) > 0) /* server -> client */
            BIO_write(p->sbio, tmp, n);
        if (rc == 1 && rs == 1)
            break;
    }
    BIO_free(s_net);
    if (!SSL_is_init_finished(p->server) || !SSL_is_init_finished(p->client) || p->sec.len == 0)
        return -1;
    uint16_t id = SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(p->server));
    int r = kh_tls13_init(&p->rec, algs, id, p->sec.c, p->sec.s, p->sec.len, 0);
    SSL_free(p->server);
    p->server = NULL;
    return r;
}

static void pair_close(pair *p)
{
    kh_tls13_free(&p->rec, &bufs);
    kh_buf_release(&p->plain, &bufs);
    kh_buf_release(&p->cipher, &bufs);
    SSL_free(p->client);
    BIO_free(p->sbio);
    SSL_CTX_free(p->sctx);
    SSL_CTX_free(p->cctx);
}

/* Our records to the client; returns what SSL_read gives (up to cap). */
static int client_read(pair *p, char *out, int cap)
{
    if (p->cipher.len) {
        BIO_write(p->sbio, p->cipher.base, (int)p->cipher.len);
        p->cipher.len = 0;
    }
    int got = 0;
    while (got < cap) {
        int n = SSL_read(p->client, out + got, cap - got);
        if (n <= 0)
            break;
        got += n;
    }
    return got;
}

/* The client's records, fed to us in one piece (or cut at `cut` when > 0). */
static int server_read(pair *p, size_t cut)
{
    kh_buf wire = {0};
    pump(p->sbio, &wire);
    int r = 0;
    if (cut && cut < wire.len) {
        r = kh_tls13_read(&p->rec, wire.base, cut, &p->plain, &p->cipher, &bufs);
        if (r == 0)
            r = kh_tls13_read(&p->rec, wire.base + cut, wire.len - cut, &p->plain, &p->cipher, &bufs);
    } else {
        r = kh_tls13_read(&p->rec, wire.base, wire.len, &p->plain, &p->cipher, &bufs);
    }
    kh_buf_release(&wire, &bufs);
    return r;
}

static void fill(char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (char)((i * 131 + seed) & 0xff);
}

static void test_suite(const char *suite)
{
    static char big[70000], back[70000];
    pair p;
    kh_subtest(suite);
    if (!kh_ok(pair_open(&p, suite) == 0, "%s: handshake and hand-off", suite))
        return;
    /* server -> client at sizes around the 16 KiB record limit */
    const size_t sizes[] = {0, 1, 100, 16383, 16384, 16385, 32768, 70000};
    for (size_t i = 0; i < KH_ARRAY_LEN(sizes); i++) {
        fill(big, sizes[i], (unsigned)i);
        kh_is_int(kh_tls13_write(&p.rec, big, sizes[i], &p.cipher, &bufs), 0, "write %zu", sizes[i]);
        int got = client_read(&p, back, (int)sizeof back);
        kh_ok(got == (int)sizes[i] && memcmp(big, back, sizes[i]) == 0, "%s: client reads %zu bytes",
              suite, sizes[i]);
    }
    /* client -> server, also a 70000-byte write (five records) */
    fill(big, sizeof big, 7);
    SSL_write(p.client, big, (int)sizeof big);
    kh_is_int(server_read(&p, 0), 0, "%s: we read the client's 70000 bytes", suite);
    kh_ok(p.plain.len == sizeof big && memcmp(p.plain.base, big, sizeof big) == 0,
          "%s: ... all of them, intact", suite);
    p.plain.len = 0;
    /* every cut point of a two-record message */
    int all_cuts = 1;
    for (size_t cut = 1; cut < 2 * (5 + 17 + 16) + 40; cut++) {
        SSL_write(p.client, "hello", 5);
        SSL_write(p.client, "world!", 6);
        if (server_read(&p, cut) != 0 || p.plain.len != 11 || memcmp(p.plain.base, "helloworld!", 11))
            all_cuts = 0;
        p.plain.len = 0;
    }
    kh_ok(all_cuts, "%s: records cut at every byte are reassembled", suite);
    kh_ok(p.rec.partial.base == NULL, "%s: no buffer kept between records", suite);

    /* the client asks for a KeyUpdate: we switch our read key and answer with ours */
    SSL_key_update(p.client, SSL_KEY_UPDATE_REQUESTED);
    SSL_write(p.client, "after", 5);
    kh_is_int(server_read(&p, 0), 0, "%s: KeyUpdate(update_requested) accepted", suite);
    kh_is_str(p.plain.base, p.plain.len, "after", "%s: data under the client's next key", suite);
    p.plain.len = 0;
    kh_ok(p.cipher.len > 0, "%s: our KeyUpdate is queued", suite);
    kh_tls13_write(&p.rec, "reply", 5, &p.cipher, &bufs);
    char r5[16];
    int got = client_read(&p, r5, 5);
    kh_ok(got == 5 && memcmp(r5, "reply", 5) == 0, "%s: the client reads under our next key", suite);
    /* and once more without a request: nothing from us */
    SSL_key_update(p.client, SSL_KEY_UPDATE_NOT_REQUESTED);
    SSL_write(p.client, "again", 5);
    kh_is_int(server_read(&p, 0), 0, "%s: KeyUpdate(update_not_requested)", suite);
    kh_is_int(p.cipher.len, 0, "%s: ... gets no answer", suite);
    p.plain.len = 0;

    /* a KeyUpdate flood: 32 in a row pass, data resets the count, the 33rd in a row is refused */
    {
        kh_tls13 peer, me;
        uint16_t id = SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(p.client));
        kh_tls13_init(&peer, algs, id, p.sec.s, p.sec.c, p.sec.len, 0);
        kh_tls13_init(&me, algs, id, p.sec.c, p.sec.s, p.sec.len, 0);
        kh_buf wire = {0}, plain = {0}, out = {0};
        for (int i = 0; i < 32; i++)
            kh_tls13_send_key_update(&peer, 0, &wire, &bufs);
        kh_tls13_write(&peer, "x", 1, &wire, &bufs);
        for (int i = 0; i < 32; i++)
            kh_tls13_send_key_update(&peer, 0, &wire, &bufs);
        kh_is_int(kh_tls13_read(&me, wire.base, wire.len, &plain, &out, &bufs), 0,
                  "%s: 32 KeyUpdates, data, 32 more: accepted", suite);
        wire.len = 0;
        kh_tls13_send_key_update(&peer, 0, &wire, &bufs);
        kh_is_int(kh_tls13_read(&me, wire.base, wire.len, &plain, &out, &bufs), KH_EPROTO,
                  "%s: the 33rd KeyUpdate in a row is refused", suite);
        kh_is_int(me.alert, KH_TLS_ALERT_UNEXPECTED_MESSAGE, "%s: ... with unexpected_message", suite);
        kh_buf_release(&wire, &bufs);
        kh_buf_release(&plain, &bufs);
        kh_buf_release(&out, &bufs);
        kh_tls13_free(&peer, &bufs);
        kh_tls13_free(&me, &bufs);
    }

    /* 40 KeyUpdate(update_requested), each followed by data, while we send nothing: one answer
     * (§4.6.3), not 40 in a row, which a peer counting KeyUpdates (32, as BoringSSL and we do)
     * refuses; after our data, the next request is answered again */
    {
        kh_tls13 peer, me;
        uint16_t id = SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(p.client));
        kh_tls13_init(&peer, algs, id, p.sec.s, p.sec.c, p.sec.len, 0);
        kh_tls13_init(&me, algs, id, p.sec.c, p.sec.s, p.sec.len, 0);
        kh_buf wire = {0}, plain = {0}, out = {0};
        int rc = 0;
        for (int i = 0; i < 40 && rc == 0; i++) {
            kh_tls13_send_key_update(&peer, 1, &wire, &bufs);
            kh_tls13_write(&peer, "x", 1, &wire, &bufs);
            rc = kh_tls13_read(&me, wire.base, wire.len, &plain, &out, &bufs);
            wire.len = 0;
        }
        kh_is_int(rc, 0, "%s: 40 requested KeyUpdates with data between: accepted", suite);
        kh_is_int(plain.len, 40, "%s: ... and the data under each new key", suite);
        /* one record: header 5, KeyUpdate 4 + 1, content type 1, tag 16 */
        kh_is_int(out.len, 27, "%s: ... answered by one KeyUpdate while we were silent", suite);
        kh_tls13_write(&me, "reply", 5, &out, &bufs);
        plain.len = 0;
        kh_is_int(kh_tls13_read(&peer, out.base, out.len, &plain, &wire, &bufs), 0,
                  "%s: ... which the peer reads, then our data under the new key", suite);
        kh_is_str(plain.base, plain.len, "reply", "%s: ... the data", suite);
        out.len = plain.len = wire.len = 0;
        kh_tls13_send_key_update(&peer, 1, &wire, &bufs);
        kh_is_int(kh_tls13_read(&me, wire.base, wire.len, &plain, &out, &bufs), 0,
                  "%s: a request after our data", suite);
        kh_is_int(out.len, 27, "%s: ... is answered again", suite);
        kh_buf_release(&wire, &bufs);
        kh_buf_release(&plain, &bufs);
        kh_buf_release(&out, &bufs);
        kh_tls13_free(&peer, &bufs);
        kh_tls13_free(&me, &bufs);
    }

    /* we rekey on our own after tx_rekey_at records (2^24 in production) */
    p.rec.tx_rekey_at = p.rec.tx.seq + 3;
    int ok = 1;
    for (int i = 0; i < 10; i++) {
        char m[8];
        snprintf(m, sizeof m, "m%d", i);
        kh_tls13_write(&p.rec, m, strlen(m), &p.cipher, &bufs);
        char in[8];
        int k = client_read(&p, in, (int)strlen(m));
        if (k != (int)strlen(m) || memcmp(in, m, (size_t)k))
            ok = 0;
    }
    kh_ok(ok && p.rec.tx.seq < 4, "%s: the client follows our own KeyUpdates", suite);

    /* close_notify both ways */
    SSL_shutdown(p.client);
    kh_is_int(server_read(&p, 0), 1, "%s: the client's close_notify is the end of input", suite);
    kh_tls13_send_alert(&p.rec, KH_TLS_ALERT_CLOSE_NOTIFY, &p.cipher, &bufs);
    char z[4];
    got = client_read(&p, z, 4);
    kh_ok(got == 0 && SSL_get_error(p.client, 0) == SSL_ERROR_ZERO_RETURN,
          "%s: the client sees our close_notify", suite);
    pair_close(&p);
}

/* A record the client sent, tampered with by `how`, must close with `alert`. */
static void test_refusal(const char *name, int how, uint8_t alert)
{
    pair p;
    if (pair_open(&p, "TLS_AES_128_GCM_SHA256") != 0) {
        kh_ok(0, "%s: handshake", name);
        return;
    }
    SSL_write(p.client, "GET / HTTP/1.1\r\n\r\n", 18);
    kh_buf wire = {0};
    pump(p.sbio, &wire);
    uint8_t *w = (uint8_t *)wire.base;
    switch (how) {
    case 0: w[wire.len - 1] ^= 1; break;          /* tag */
    case 1: w[10] ^= 0x80; break;                  /* ciphertext */
    case 2: w[0] = 20; break;                      /* ChangeCipherSpec after the handshake */
    case 3: w[3] = 0x41; w[4] = 0x01; break;       /* 16641 > 2^14 + 256 */
    case 4: w[3] = 0; w[4] = 16; break;            /* too short for a tag and a type */
    case 5: w[0] = 21; break;                      /* a plaintext alert */
    case 6: w[3] = 0x40; w[4] = 0x12; break;       /* 16402: inner plaintext 2^14 + 2 */
    }
    int r = kh_tls13_read(&p.rec, wire.base, wire.len, &p.plain, &p.cipher, &bufs);
    kh_is_int(r, KH_EPROTO, "%s: refused", name);
    kh_is_int(p.rec.alert, alert, "%s: alert %u", name, alert);
    kh_ok(p.rec.alert_sent && p.cipher.len > 0, "%s: our alert is queued", name);
    kh_is_int(p.plain.len, 0, "%s: no plaintext delivered", name);
    /* the client reads the alert as a fatal error */
    char z[4];
    int got = client_read(&p, z, 4);
    kh_ok(got == 0 && SSL_get_error(p.client, 0) == SSL_ERROR_SSL, "%s: the client gets the alert",
          name);
    ERR_clear_error();
    kh_is_int(kh_tls13_read(&p.rec, "x", 1, &p.plain, &p.cipher, &bufs), 0,
              "%s: input after it is ignored", name);
    kh_buf_release(&wire, &bufs);
    pair_close(&p);
}

/* Inner plaintexts the client's OpenSSL would never send, sealed by a mirror of its write
 * direction (kh_tls13_seal with type 0 lets a case write the type and padding bytes itself). */
static void test_inner(void)
{
    pair p;
    kh_subtest("inner plaintexts");
    if (pair_open(&p, "TLS_CHACHA20_POLY1305_SHA256") != 0) {
        kh_ok(0, "handshake");
        return;
    }
    static const struct {
        const char *name;
        const char *inner; /* content || type || padding, sealed as is */
        size_t len;
        int want;
        int alert;
        const char *plain;
    } cases[] = {
        {"padding is stripped", "abc\x17\0\0\0", 7, 0, -1, "abc"},
        {"an empty application-data record", "\x17", 1, 0, -1, ""},
        {"padding only (no type)", "\0\0", 2, KH_EPROTO, KH_TLS_ALERT_UNEXPECTED_MESSAGE, NULL},
        {"unknown inner type", "x\x63", 2, KH_EPROTO, KH_TLS_ALERT_UNEXPECTED_MESSAGE, NULL},
        {"empty handshake", "\x16", 1, KH_EPROTO, KH_TLS_ALERT_UNEXPECTED_MESSAGE, NULL},
        {"NewSessionTicket from a client", "\x04\0\0\x01\0\x16", 6, KH_EPROTO,
         KH_TLS_ALERT_UNEXPECTED_MESSAGE, NULL},
        {"a KeyUpdate's first four bytes: the rest may follow (§5.1)", "\x18\0\0\x01\x16", 5,
         0, -1, ""},
        {"KeyUpdate with a 3-byte length of 65537", "\x18\x01\0\x01\0\x16", 6, KH_EPROTO,
         KH_TLS_ALERT_DECODE_ERROR, NULL},
        {"KeyUpdate with request 2", "\x18\0\0\x01\x02\x16", 6, KH_EPROTO,
         KH_TLS_ALERT_ILLEGAL_PARAMETER, NULL},
        {"KeyUpdate of length 2", "\x18\0\0\x02\0\0\x16", 7, KH_EPROTO,
         KH_TLS_ALERT_DECODE_ERROR, NULL},
        {"KeyUpdate not last in its record", "\x18\0\0\x01\0\x18\x16", 7, KH_EPROTO,
         KH_TLS_ALERT_UNEXPECTED_MESSAGE, NULL},
        {"a 3-byte alert", "\x02\x28\0\x15", 4, KH_EPROTO, KH_TLS_ALERT_DECODE_ERROR, NULL},
        {"a 1-byte alert", "\x01\x15", 2, KH_EPROTO, KH_TLS_ALERT_DECODE_ERROR, NULL},
        {"an empty alert (§5.4)", "\x15\0\0", 3, KH_EPROTO, KH_TLS_ALERT_UNEXPECTED_MESSAGE, NULL},
        {"user_canceled is a warning", "\x01\x5a\x15", 3, 0, KH_TLS_ALERT_USER_CANCELED, ""},
        {"user_canceled sent as fatal is still a warning (§6: the level is implied)",
         "\x02\x5a\x15", 3, 0, KH_TLS_ALERT_USER_CANCELED, ""},
        {"handshake_failure sent as a warning is still fatal", "\x01\x28\x15", 3, KH_EPROTO, 40,
         NULL},
        {"the peer's fatal alert", "\x02\x28\x15", 3, KH_EPROTO, 40, NULL},
        {"the peer's close_notify", "\x01\x00\x15", 3, 1, KH_TLS_ALERT_CLOSE_NOTIFY, ""},
    };
    uint16_t id = SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(p.client));
    for (size_t i = 0; i < KH_ARRAY_LEN(cases); i++) {
        kh_tls13 peer, me;
        kh_tls13_init(&peer, algs, id, p.sec.s, p.sec.c, p.sec.len, 0);
        kh_tls13_init(&me, algs, id, p.sec.c, p.sec.s, p.sec.len, 0);
        kh_buf wire = {0}, plain = {0}, out = {0};
        /* seal() appends the type byte after the content: a type of 0 is one more padding
         * byte, so the case's own bytes decide the type */
        kh_tls13_seal(&peer, 0, cases[i].inner, cases[i].len, &wire, &bufs);
        int r = kh_tls13_read(&me, wire.base, wire.len, &plain, &out, &bufs);
        kh_is_int(r, cases[i].want, "%s", cases[i].name);
        if (cases[i].alert >= 0)
            kh_is_int(me.alert, cases[i].alert, "%s: alert %d", cases[i].name, cases[i].alert);
        if (cases[i].plain)
            kh_is_str(plain.base ? plain.base : "", plain.len, cases[i].plain, "%s: plaintext",
                      cases[i].name);
        if (r == KH_EPROTO)
            kh_ok(me.alert_sent == (out.len > 0), "%s: an alert is sent only for our own verdicts",
                  cases[i].name);
        kh_buf_release(&wire, &bufs);
        kh_buf_release(&plain, &bufs);
        kh_buf_release(&out, &bufs);
        kh_tls13_free(&peer, &bufs);
        kh_tls13_free(&me, &bufs);
    }
    pair_close(&p);
}

/* Two mirrored ends for hand-made records: `peer` writes as the client, `me` reads as us. */
typedef struct ends {
    kh_tls13 peer, me;
    kh_buf wire, plain, out;
} ends;

static void ends_open(ends *e, const pair *p)
{
    uint16_t id = SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(p->client));
    memset(e, 0, sizeof *e);
    kh_tls13_init(&e->peer, algs, id, p->sec.s, p->sec.c, p->sec.len, 0);
    kh_tls13_init(&e->me, algs, id, p->sec.c, p->sec.s, p->sec.len, 0);
}

/* Feeds everything the peer wrote since the last call. */
static int ends_read(ends *e)
{
    int r = kh_tls13_read(&e->me, e->wire.base, e->wire.len, &e->plain, &e->out, &bufs);
    e->wire.len = 0;
    return r;
}

static void ends_close(ends *e)
{
    kh_buf_release(&e->wire, &bufs);
    kh_buf_release(&e->plain, &bufs);
    kh_buf_release(&e->out, &bufs);
    kh_tls13_free(&e->peer, &bufs);
    kh_tls13_free(&e->me, &bufs);
}

/* The peer sends KeyUpdate(req) cut after byte `at`, in two handshake records, then switches its
 * write key as a real KeyUpdate would. */
static void split_key_update(ends *e, int req, size_t at)
{
    const char msg[5] = {24, 0, 0, 1, (char)req};
    kh_buf scratch = {0};
    kh_tls13_seal(&e->peer, 22, msg, at, &e->wire, &bufs);
    kh_tls13_seal(&e->peer, 22, msg + at, 5 - at, &e->wire, &bufs);
    kh_tls13_send_key_update(&e->peer, 0, &scratch, &bufs); /* only to switch the key */
    kh_buf_release(&scratch, &bufs);
}

/* RFC 8446 §5.1, §5.2, §5.4 limits, and the caps on records that carry no progress. */
static void test_limits(void)
{
    static char big[16386];
    pair p;
    ends e;
    kh_subtest("limits");
    if (pair_open(&p, "TLS_AES_128_GCM_SHA256") != 0) {
        kh_ok(0, "handshake");
        return;
    }
    fill(big, sizeof big, 3);

    /* the inner plaintext (content, type, padding) may be 2^14 + 1 bytes, not one more */
    ends_open(&e, &p);
    kh_tls13_seal(&e.peer, 23, big, 16384, &e.wire, &bufs);
    kh_is_int(ends_read(&e), 0, "2^14 bytes of content and the type: accepted");
    kh_ok(e.plain.len == 16384 && memcmp(e.plain.base, big, 16384) == 0, "... all delivered");
    big[16384] = 23; /* content || type, and seal's type 0 is one byte of padding */
    kh_tls13_seal(&e.peer, 0, big, 16385, &e.wire, &bufs);
    kh_is_int(ends_read(&e), KH_EPROTO, "2^14 bytes of content, the type and one byte of padding");
    kh_is_int(e.me.alert, KH_TLS_ALERT_RECORD_OVERFLOW, "... refused with record_overflow");
    kh_is_int(e.plain.len, 16384, "... and nothing of it delivered");
    ends_close(&e);
    /* a short content with long padding: refused by its length, padding included */
    ends_open(&e, &p);
    memset(big, 0, sizeof big);
    memcpy(big, "short", 5);
    big[5] = 23;
    kh_tls13_seal(&e.peer, 0, big, 16384, &e.wire, &bufs); /* 16385 in all */
    kh_is_int(ends_read(&e), 0, "5 bytes padded to 2^14 + 1 in all: accepted");
    kh_is_str(e.plain.base, e.plain.len, "short", "... padding stripped");
    kh_tls13_seal(&e.peer, 0, big, 16385, &e.wire, &bufs); /* 16386 in all */
    kh_is_int(ends_read(&e), KH_EPROTO, "5 bytes padded to 2^14 + 2 in all: refused");
    kh_is_int(e.me.alert, KH_TLS_ALERT_RECORD_OVERFLOW, "... with record_overflow");
    ends_close(&e);

    /* a KeyUpdate split across records, at every byte, with request_update 0 and 1 */
    for (int req = 0; req < 2; req++) {
        for (size_t at = 1; at < 5; at++) {
            ends_open(&e, &p);
            split_key_update(&e, req, at);
            kh_tls13_write(&e.peer, "after", 5, &e.wire, &bufs);
            int r = ends_read(&e);
            kh_ok(r == 0 && e.plain.len == 5 && memcmp(e.plain.base, "after", 5) == 0,
                  "KeyUpdate(%d) split after byte %zu: accepted, data under the next key", req, at);
            kh_ok(req ? e.out.len > 0 : e.out.len == 0, "... %s", req ? "answered" : "no answer");
            ends_close(&e);
        }
    }
    /* one byte per record, each record fed in its own read */
    ends_open(&e, &p);
    {
        const char msg[5] = {24, 0, 0, 1, 0};
        kh_buf scratch = {0};
        int r = 0;
        for (int i = 0; i < 5 && r == 0; i++) {
            kh_tls13_seal(&e.peer, 22, msg + i, 1, &e.wire, &bufs);
            r = ends_read(&e);
        }
        kh_tls13_send_key_update(&e.peer, 0, &scratch, &bufs);
        kh_buf_release(&scratch, &bufs);
        kh_tls13_write(&e.peer, "x", 1, &e.wire, &bufs);
        kh_ok(r == 0 && ends_read(&e) == 0 && e.plain.len == 1,
              "KeyUpdate in five one-byte records over five reads: accepted");
    }
    ends_close(&e);
    /* nothing may come between the pieces (§5.1), nor follow the KeyUpdate in its record */
    static const struct {
        const char *name;
        uint8_t type;
        const char *rest;
        size_t len;
        uint8_t alert;
    } between[] = {
        {"application data between the pieces", 23, "x", 1, KH_TLS_ALERT_UNEXPECTED_MESSAGE},
        {"an empty record between the pieces", 23, "", 0, KH_TLS_ALERT_UNEXPECTED_MESSAGE},
        {"close_notify between the pieces", 21, "\x01\x00", 2, KH_TLS_ALERT_UNEXPECTED_MESSAGE},
        {"a wrong length in the second piece", 22, "\x00\x02\x00", 3, KH_TLS_ALERT_DECODE_ERROR},
        {"a second message after the KeyUpdate's last byte", 22, "\x00\x01\x00\x18", 4,
         KH_TLS_ALERT_UNEXPECTED_MESSAGE},
    };
    for (size_t i = 0; i < KH_ARRAY_LEN(between); i++) {
        ends_open(&e, &p);
        kh_tls13_seal(&e.peer, 22, "\x18\x00", 2, &e.wire, &bufs);
        kh_tls13_seal(&e.peer, between[i].type, between[i].rest, between[i].len, &e.wire, &bufs);
        kh_is_int(ends_read(&e), KH_EPROTO, "%s: refused", between[i].name);
        kh_is_int(e.me.alert, between[i].alert, "%s: alert %u", between[i].name, between[i].alert);
        ends_close(&e);
    }

    /* empty application-data records: 32 in a row pass, data resets the count, the 33rd in a
     * row is refused (OpenSSL's MAX_EMPTY_RECORDS) */
    ends_open(&e, &p);
    for (int i = 0; i < 32; i++)
        kh_tls13_seal(&e.peer, 23, "", 0, &e.wire, &bufs);
    kh_tls13_write(&e.peer, "x", 1, &e.wire, &bufs);
    for (int i = 0; i < 32; i++)
        kh_tls13_seal(&e.peer, 23, "", 0, &e.wire, &bufs);
    kh_is_int(ends_read(&e), 0, "32 empty records, data, 32 more: accepted");
    kh_is_str(e.plain.base, e.plain.len, "x", "... the data delivered");
    kh_tls13_seal(&e.peer, 23, "", 0, &e.wire, &bufs);
    kh_is_int(ends_read(&e), KH_EPROTO, "the 33rd empty record in a row is refused");
    kh_is_int(e.me.alert, KH_TLS_ALERT_UNEXPECTED_MESSAGE, "... with unexpected_message");
    ends_close(&e);

    /* user_canceled, the one warning alert: 4 in a row pass, data resets the count, the 5th in
     * a row is refused (OpenSSL's MAX_WARN_ALERT_COUNT); empty records do not reset it */
    ends_open(&e, &p);
    for (int i = 0; i < 4; i++)
        kh_tls13_seal(&e.peer, 21, "\x01\x5a", 2, &e.wire, &bufs);
    kh_tls13_write(&e.peer, "y", 1, &e.wire, &bufs);
    for (int i = 0; i < 4; i++) {
        kh_tls13_seal(&e.peer, 21, "\x01\x5a", 2, &e.wire, &bufs);
        kh_tls13_seal(&e.peer, 23, "", 0, &e.wire, &bufs);
    }
    kh_is_int(ends_read(&e), 0, "4 user_canceled, data, 4 more (between empty records): accepted");
    kh_is_str(e.plain.base, e.plain.len, "y", "... the data delivered");
    kh_is_int(e.out.len, 0, "... and nothing sent back");
    kh_tls13_seal(&e.peer, 21, "\x01\x5a", 2, &e.wire, &bufs);
    kh_is_int(ends_read(&e), KH_EPROTO, "the 5th user_canceled in a row is refused");
    kh_is_int(e.me.alert, KH_TLS_ALERT_UNEXPECTED_MESSAGE, "... with unexpected_message");
    kh_ok(e.me.alert_sent && e.out.len > 0, "... which is sent");
    ends_close(&e);
    /* user_canceled then close_notify: the orderly end §6.1 describes */
    ends_open(&e, &p);
    kh_tls13_seal(&e.peer, 21, "\x01\x5a", 2, &e.wire, &bufs);
    kh_tls13_send_alert(&e.peer, KH_TLS_ALERT_CLOSE_NOTIFY, &e.wire, &bufs);
    kh_is_int(ends_read(&e), 1, "user_canceled then close_notify: the end of input");
    ends_close(&e);
    pair_close(&p);
}

int main(void)
{
    kh_bufcache_init(&bufs, 8);
    secrets_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
    algs = kh_tls13_algs_new();
    if (!kh_ok(algs != NULL, "the three TLS 1.3 AEADs are available"))
        return kh_test_done();
    test_suite("TLS_AES_128_GCM_SHA256");
    test_suite("TLS_AES_256_GCM_SHA384");
    test_suite("TLS_CHACHA20_POLY1305_SHA256");
    kh_subtest("refusals");
    test_refusal("tampered tag", 0, KH_TLS_ALERT_BAD_RECORD_MAC);
    test_refusal("tampered ciphertext", 1, KH_TLS_ALERT_BAD_RECORD_MAC);
    test_refusal("ChangeCipherSpec after the handshake", 2, KH_TLS_ALERT_UNEXPECTED_MESSAGE);
    test_refusal("record longer than 2^14+256", 3, KH_TLS_ALERT_RECORD_OVERFLOW);
    test_refusal("record too short for its tag", 4, KH_TLS_ALERT_BAD_RECORD_MAC);
    test_refusal("plaintext alert", 5, KH_TLS_ALERT_UNEXPECTED_MESSAGE);
    test_refusal("ciphertext of 2^14 + 18 (inner over 2^14 + 1)", 6, KH_TLS_ALERT_RECORD_OVERFLOW);
    test_inner();
    test_limits();
    kh_tls13_algs_free(algs);
    kh_bufcache_destroy(&bufs);
    return kh_test_done();
}
