/* test_http_decode.c: kh_http_decode, the HTTP client's Content-Encoding decoders: every input
 * fed whole and one byte at a time gives the same bytes and the same verdict. zstd: frames with
 * each size of content-size field, two frames, skippable frames (RFC 8878 §3.1.2), trailing
 * bytes, a truncated frame, and the frame headers refused before libzstd sees them, each of which
 * libzstd judged one way fed whole and another fed split (the inputs fuzz_h2_client found are in
 * core/fuzz/regress/h2_client/): the pre-1.0 "legacy" frames Debian's libzstd reads, a
 * dictionary ID, the reserved bit, a window over RFC 9659's 8 MiB. gzip: two members, trailing
 * garbage; deflate (zlib-wrapped); the max_out bound. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "kh_http_decode.h"
#include "kh_test.h"

typedef struct {
    char p[1 << 17];
    size_t n;
} sink;

static void out(void *arg, const char *p, size_t n)
{
    sink *s = arg;
    if (s->n + n <= sizeof s->p)
        memcpy(s->p + s->n, p, n);
    s->n += n;
}

/* in fed whole (step 0) or step bytes at a time; the verdict of the feeds, then of finish */
static int decode(int kind, uint64_t max, const void *in, size_t len, size_t step, sink *s)
{
    kh_hd *d = kh_hd_new(kind, max);
    const char *p = in;
    int e = 0;
    memset(s, 0, sizeof *s);
    for (size_t off = 0; e == 0 && off < len;) {
        size_t k = step && step < len - off ? step : len - off;
        e = kh_hd_feed(d, p + off, k, out, s);
        off += k;
    }
    if (e == 0)
        e = kh_hd_finish(d);
    kh_hd_free(d);
    return e;
}

/* the same verdict and bytes fed whole and byte by byte; returns the verdict */
static int both(int kind, uint64_t max, const void *in, size_t len, const char *want,
                const char *what)
{
    static sink a, b;
    int ea = decode(kind, max, in, len, 0, &a);
    int eb = decode(kind, max, in, len, 1, &b);
    kh_is_int(eb, ea, "%s: the same verdict byte by byte", what);
    if (ea == 0 && want) {
        kh_is_str(a.p, a.n, want, "%s: decoded whole", what);
        kh_is_str(b.p, b.n, want, "%s: decoded byte by byte", what);
    }
    return ea;
}

static size_t zstd_of(const char *text, unsigned char *buf, size_t cap)
{
    size_t n = ZSTD_compress(buf, cap, text, strlen(text), 3);
    return ZSTD_isError(n) ? 0 : n;
}

static size_t gzip_of(const char *text, unsigned char *buf, size_t cap, int wbits)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 6, Z_DEFLATED, wbits, 8, Z_DEFAULT_STRATEGY);
    z.next_in = (Bytef *)(uintptr_t)text;
    z.avail_in = (uInt)strlen(text);
    z.next_out = buf;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    size_t n = cap - z.avail_out;
    deflateEnd(&z);
    return n;
}

int main(void)
{
    static unsigned char b[4096];
    const char *hello = "hello zstd hello zstd hello zstd";

    kh_subtest("zstd: one frame, two frames, a skippable frame first");
    size_t n1 = zstd_of(hello, b, sizeof b);
    kh_ok(n1 > 0, "compressed");
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, b, n1, hello, "one frame"), 0, "one frame decodes");
    size_t n2 = zstd_of("second", b + n1, sizeof b - n1);
    char two[128];
    snprintf(two, sizeof two, "%ssecond", hello);
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, b, n1 + n2, two, "two frames"), 0, "two frames decode");
    static unsigned char sk[4096];
    /* magic 0x184D2A5A, little-endian; 3 bytes of user data */
    memcpy(sk, "\x5a\x2a\x4d\x18\x03\x00\x00\x00xyz", 11);
    size_t n3 = zstd_of(hello, sk + 11, sizeof sk - 11);
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, sk, 11 + n3, hello, "skippable + frame"), 0,
              "a skippable frame is skipped");

    kh_subtest("zstd: each size of content-size field, an empty skippable frame");
    static char big[70000];
    for (size_t i = 0; i < sizeof big - 1; i++)
        big[i] = (char)('a' + i * 7 % 26);
    static unsigned char zb[80000];
    static const size_t sizes[] = {10, 300, 69999};
    for (int i = 0; i < 3; i++) {
        char keep = big[sizes[i]];
        big[sizes[i]] = 0;
        size_t zn = zstd_of(big, zb, sizeof zb);
        kh_is_int(both(KH_HD_ZSTD, 1 << 20, zb, zn, big, "content size"), 0,
                  "%zu bytes (the frame's own header) decode", sizes[i]);
        big[sizes[i]] = keep;
    }
    memcpy(sk, "\x50\x2a\x4d\x18\x00\x00\x00\x00", 8);
    n3 = zstd_of(hello, sk + 8, sizeof sk - 8);
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, sk, 8, "", "empty skippable"), 0,
              "an empty skippable frame alone is a whole (empty) body");
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, sk, 8 + n3, hello, "empty skippable + frame"), 0,
              "an empty skippable frame, then a frame");
    memcpy(sk + 8, "\x27\xb5\x2f\xfd\x04\x58\x00\x00\x00", 9);
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, sk, 17, NULL, "empty skippable + legacy"), KH_HD_EDATA,
              "an empty skippable frame, then a legacy one: refused");

    kh_subtest("zstd: frame headers refused or let through");
    struct {
        const char *h;
        size_t n;
        int want;
        const char *what;
    } hs[] = {
        /* FHD 0x00: window descriptor, no content size; exponent 13 -> 8 MiB, 14 -> 16 MiB */
        {"\x28\xb5\x2f\xfd\x00\x68", 6, KH_HD_ETRUNC, "an 8 MiB window is let through"},
        {"\x28\xb5\x2f\xfd\x00\x69", 6, KH_HD_EDATA, "9 MiB: over RFC 9659's bound"},
        {"\x28\xb5\x2f\xfd\x00\x70", 6, KH_HD_EDATA, "16 MiB: over RFC 9659's bound"},
        /* single segment, 4-byte content size: the window is the content size */
        {"\x28\xb5\x2f\xfd\xa0\x00\x00\x80\x00", 9, KH_HD_ETRUNC, "single segment 8 MiB"},
        {"\x28\xb5\x2f\xfd\xa0\x01\x00\x80\x00", 9, KH_HD_EDATA, "single segment 8 MiB + 1"},
        /* single segment, 2-byte field: value + 256 */
        {"\x28\xb5\x2f\xfd\x60\xff\xff", 7, KH_HD_ETRUNC, "2-byte content size (65791)"},
        /* dictionary ID fields, 1 byte: 0 means none */
        {"\x28\xb5\x2f\xfd\x01\x00\x00", 7, KH_HD_ETRUNC, "dictionary ID 0 (none)"},
        {"\x28\xb5\x2f\xfd\x01\x00\x05", 7, KH_HD_EDATA, "dictionary ID 5"},
        {"\x28\xb5\x2f\xfd\x23\x00\x01\x00\x00\x28", 10, KH_HD_EDATA, "dictionary ID 256"},
        {"\x28\xb5\x2f\xfd\x08\x00", 6, KH_HD_EDATA, "the reserved bit"},
    };
    /* whole frames naming dictionary 256: libzstd refused them fed whole ("Dictionary
     * mismatch") and decoded 8,160 bytes fed split (fuzz_h2_client's zstd_dictionary_id_frame) */
    static const unsigned char dict_frames[] = {
        0x28, 0xb5, 0x2f, 0xfd, 0x23, 0x00, 0x01, 0x00, 0x00, 0x28, 0xb5, 0x2f, 0xfd, 0x00,
        0x00, 0x01, 0x00, 0x00, 0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x37, 0x03, 0xff, 0x00, 0x00};
    kh_is_int(both(KH_HD_ZSTD, 1 << 24, dict_frames, sizeof dict_frames, NULL, "dictionary frames"),
              KH_HD_EDATA, "whole frames with a dictionary ID are refused");
    static sink split9;
    kh_is_int(decode(KH_HD_ZSTD, 1 << 24, dict_frames, sizeof dict_frames, 9, &split9),
              KH_HD_EDATA, "and refused fed 9 bytes at a time (the split the fuzzer found)");
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        kh_is_int(both(KH_HD_ZSTD, 1 << 20, hs[i].h, hs[i].n, NULL, hs[i].what), hs[i].want,
                  "%s", hs[i].what);

    kh_subtest("zstd: truncated, trailing bytes, legacy frames");
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, b, n1 - 1, NULL, "truncated"), KH_HD_ETRUNC,
              "a frame cut short is truncated");
    memcpy(b + n1, "\x28\xb5", 2);
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, b, n1 + 2, NULL, "2 trailing bytes"), KH_HD_ETRUNC,
              "the start of another frame and no more: truncated");
    memcpy(b + n1, "junk", 4);
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, b, n1 + 4, NULL, "trailing junk"), KH_HD_EDATA,
              "4 bytes that are no frame's magic after a frame: corrupt");
    static const unsigned char v07[] = {0x27, 0xb5, 0x2f, 0xfd, 0x04, 0x58, 0x00, 0x00, 0x00};
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, v07, sizeof v07, NULL, "v0.7 frame"), KH_HD_EDATA,
              "a legacy v0.7 frame (magic 0xFD2FB527) is refused");
    for (unsigned m = 0x21; m <= 0x27; m++) { /* v0.1 (0x1EB52FFD) aside, 0xFD2FB521..27 */
        unsigned char f[16] = {(unsigned char)m, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0};
        kh_is_int(both(KH_HD_ZSTD, 1 << 20, f, sizeof f, NULL, "legacy"), KH_HD_EDATA,
                  "legacy magic 0xFD2FB5%02X is refused", m);
    }
    static const unsigned char v01[] = {0x1e, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0};
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, v01, sizeof v01, NULL, "v0.1"), KH_HD_EDATA,
              "legacy v0.1 magic is refused");
    memcpy(b + n1, v07, sizeof v07);
    kh_is_int(both(KH_HD_ZSTD, 1 << 20, b, n1 + sizeof v07, NULL, "frame + legacy"),
              KH_HD_EDATA, "a legacy frame after a good one is refused too");

    kh_subtest("zstd: max_out");
    kh_is_int(both(KH_HD_ZSTD, 10, b, n1, NULL, "max_out 10"), KH_HD_ETOOBIG,
              "over max_out: too big");

    kh_subtest("gzip and deflate");
    size_t g1 = gzip_of("first ", b, sizeof b, 16 + MAX_WBITS);
    size_t g2 = gzip_of("second", b + g1, sizeof b - g1, 16 + MAX_WBITS);
    kh_is_int(both(KH_HD_GZIP, 1 << 20, b, g1 + g2, "first second", "two members"), 0,
              "two gzip members decode, as gzip(1) does");
    memcpy(b + g1, "junk", 4);
    kh_ok(both(KH_HD_GZIP, 1 << 20, b, g1 + 4, NULL, "gzip + junk") != 0,
          "trailing garbage after a gzip member fails");
    size_t d1 = gzip_of("deflated", b, sizeof b, MAX_WBITS);
    kh_is_int(both(KH_HD_DEFLATE, 1 << 20, b, d1, "deflated", "deflate"), 0,
              "deflate (zlib-wrapped) decodes");
    kh_is_int(both(KH_HD_DEFLATE, 1 << 20, b, d1 - 2, NULL, "deflate cut"), KH_HD_ETRUNC,
              "a cut deflate body is truncated");
    return kh_test_done();
}
