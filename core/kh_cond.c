/* kh_cond.c: conditional requests (see kh_cond.h).
 * Owns:  nothing.
 * In:    slices of request and response fields.
 * Out:   verdicts and a filtered header list.
 * Never: allocates, reads past a slice, or touches I/O. */
#include "kh_cond.h"

#include <string.h>

#include "kh_stream.h"

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int num(const char *p, size_t n, int *out)
{
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(p[i]))
            return 0;
        v = v * 10 + (p[i] - '0');
    }
    *out = v;
    return 1;
}

static int month(const char *p)
{
    static const char names[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    for (int i = 0; i < 12; i++)
        if (memcmp(p, names + 3 * i, 3) == 0)
            return i + 1;
    return 0;
}

/* days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil) */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "HH:MM:SS" */
static int clock_of(const char *p, int *h, int *mi, int *s)
{
    return p[2] == ':' && p[5] == ':' && num(p, 2, h) && num(p + 3, 2, mi) && num(p + 6, 2, s) &&
           *h < 24 && *mi < 60 && *s < 61;
}

static int day_name_ok(const char *p, size_t n)
{
    static const char *const days[] = {"Monday", "Tuesday", "Wednesday", "Thursday",
                                       "Friday", "Saturday", "Sunday"};
    for (int i = 0; i < 7; i++) {
        size_t dl = strlen(days[i]);
        if ((n == 3 && memcmp(p, days[i], 3) == 0) || (n == dl && memcmp(p, days[i], dl) == 0))
            return 1;
    }
    return 0;
}

static int64_t epoch(int y, int mo, int d, int h, int mi, int s)
{
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (mo < 1 || d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap))
        return -1;
    return days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s;
}

int64_t kh_cond_parse_date(const char *p, size_t n)
{
    int y, d, h, mi, s, mo;
    if (n == 29 && p[3] == ',' && p[4] == ' ' && p[7] == ' ' && p[11] == ' ' && p[16] == ' ' &&
        memcmp(p + 25, " GMT", 4) == 0) {
        /* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT" */
        if (!day_name_ok(p, 3) || !num(p + 5, 2, &d) || !(mo = month(p + 8)) ||
            !num(p + 12, 4, &y) || !clock_of(p + 17, &h, &mi, &s))
            return -1;
        return epoch(y, mo, d, h, mi, s);
    }
    if (n == 24 && p[3] == ' ' && p[7] == ' ' && p[10] == ' ' && p[19] == ' ') {
        /* asctime: "Sun Nov  6 08:49:37 1994" */
        if (!day_name_ok(p, 3) || !(mo = month(p + 4)) || !clock_of(p + 11, &h, &mi, &s) ||
            !num(p + 20, 4, &y))
            return -1;
        if (p[8] == ' ' && is_digit(p[9]))
            d = p[9] - '0';
        else if (!num(p + 8, 2, &d))
            return -1;
        return epoch(y, mo, d, h, mi, s);
    }
    /* rfc850: "Sunday, 06-Nov-94 08:49:37 GMT" */
    const char *comma = memchr(p, ',', n < 10 ? n : 10);
    if (comma == NULL)
        return -1;
    size_t dl = (size_t)(comma - p);
    if (n != dl + 24 || !day_name_ok(p, dl) || dl == 3)
        return -1;
    const char *q = comma + 1;
    if (q[0] != ' ' || q[3] != '-' || q[7] != '-' || q[10] != ' ' || memcmp(q + 19, " GMT", 4))
        return -1;
    if (!num(q + 1, 2, &d) || !(mo = month(q + 4)) || !num(q + 8, 2, &y) ||
        !clock_of(q + 11, &h, &mi, &s))
        return -1;
    /* §5.6.7: a two-digit year more than 50 years in the future is in the past century; this
     * fixed pivot (70) is what most servers use and does not depend on the clock */
    y += y < 70 ? 2000 : 1900;
    return epoch(y, mo, d, h, mi, s);
}

/* RFC 9110 §8.8.3: entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE; etagc = %x21 / %x23-7E / obs-text.
 * Reads one at p[*i..n); sets the opaque tag (quotes included) and weakness. */
static int etag_at(const char *p, size_t n, size_t *i, kh_str *opaque, int *weak)
{
    size_t k = *i;
    *weak = 0;
    if (k + 1 < n && p[k] == 'W' && p[k + 1] == '/') {
        *weak = 1;
        k += 2;
    }
    if (k >= n || p[k] != '"')
        return 0;
    size_t start = k++;
    while (k < n && p[k] != '"') {
        unsigned char c = (unsigned char)p[k];
        if (c < 0x21 || c == 0x7f)
            return 0;
        k++;
    }
    if (k >= n)
        return 0;
    k++;
    *opaque = (kh_str){p + start, k - start};
    *i = k;
    return 1;
}

static size_t skip_ows(const char *p, size_t n, size_t i)
{
    while (i < n && (p[i] == ' ' || p[i] == '\t'))
        i++;
    return i;
}

int kh_cond_etag_match(kh_str list, kh_str etag, int weak)
{
    const char *p = list.ptr;
    size_t n = list.len, i = skip_ows(p, n, 0);
    while (n > i && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    if (n - i == 1 && p[i] == '*')
        return 1;
    kh_str want;
    int want_weak;
    size_t j = 0;
    if (etag.ptr == NULL || !etag_at(etag.ptr, etag.len, &j, &want, &want_weak) || j != etag.len)
        return 0;
    if (!weak && want_weak)
        return 0;
    int found = 0, any = 0;
    while (i < n) {
        if (p[i] == ',') { /* empty list elements are allowed (§5.6.1.2) */
            i = skip_ows(p, n, i + 1);
            continue;
        }
        kh_str got;
        int got_weak;
        if (!etag_at(p, n, &i, &got, &got_weak))
            return 0;
        any = 1;
        if ((weak || !got_weak) && got.len == want.len && memcmp(got.ptr, want.ptr, got.len) == 0)
            found = 1;
        i = skip_ows(p, n, i);
        if (i < n && p[i] != ',')
            return 0;
    }
    return any && found;
}

int kh_cond_not_modified(kh_str inm, kh_str ims, kh_str etag, kh_str last_modified)
{
    if (inm.ptr != NULL) /* §13.2.2 step 3; If-Modified-Since is then ignored (§13.1.3) */
        return kh_cond_etag_match(inm, etag, 1);
    if (ims.ptr == NULL || last_modified.ptr == NULL)
        return 0;
    int64_t since = kh_cond_parse_date(ims.ptr, ims.len);
    int64_t lm = kh_cond_parse_date(last_modified.ptr, last_modified.len);
    return since >= 0 && lm >= 0 && lm <= since;
}

static int keep_304(kh_str nm)
{
    static const char *const keep[] = {"cache-control", "content-location", "date", "etag",
                                       "expires", "vary", "last-modified", "x-request-id"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (nm.len == strlen(keep[i]) && kh_str_ieq_lower(nm, keep[i], nm.len))
            return 1;
    return nm.len > 15 && kh_str_ieq_lower((kh_str){nm.ptr, 15}, "access-control-", 15);
}

size_t kh_cond_304_headers(const kh_header *h, size_t n, kh_header *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (keep_304(h[i].name))
            out[k++] = h[i];
    return k;
}
