/* test_cond.c: kh_cond: the three HTTP-date forms of RFC 9110 §5.6.7 (its own example, 784111777),
 * entity-tag lists with the weak and the strong comparison (§8.8.3.2's table), the §13.2.2
 * precedence (If-None-Match wins over If-Modified-Since), and the fields a 304 keeps. */
#include <string.h>

#include "kh_cond.h"
#include "kh_stream.h"
#include "kh_test.h"

static kh_str S(const char *s)
{
    return s ? (kh_str){s, strlen(s)} : (kh_str){NULL, 0};
}

static int64_t date(const char *s)
{
    return kh_cond_parse_date(s, strlen(s));
}

int main(void)
{
    kh_subtest("dates");
    kh_is_int(date("Sun, 06 Nov 1994 08:49:37 GMT"), 784111777, "IMF-fixdate");
    kh_is_int(date("Sunday, 06-Nov-94 08:49:37 GMT"), 784111777, "rfc850");
    kh_is_int(date("Sun Nov  6 08:49:37 1994"), 784111777, "asctime");
    kh_is_int(date("Thu, 01 Jan 1970 00:00:00 GMT"), 0, "the epoch");
    kh_is_int(date("Tue, 29 Feb 2028 23:59:59 GMT"), 1835481599, "a leap day");
    kh_is_int(date("Sun, 06 Nov 1994 08:49:37 UTC"), -1, "not GMT");
    kh_is_int(date("Sun, 6 Nov 1994 08:49:37 GMT"), -1, "one-digit day");
    kh_is_int(date("Sun, 06 Nov 1994 24:49:37 GMT"), -1, "hour 24");
    kh_is_int(date("Sun, 31 Nov 1994 08:49:37 GMT"), -1, "31 November");
    kh_is_int(date("Xyz, 06 Nov 1994 08:49:37 GMT"), -1, "bad day name");
    kh_is_int(date("Sun, 06 Nov 1994 08:49:37 GMT "), -1, "trailing space");
    kh_is_int(date(""), -1, "empty");
    kh_is_int(date("Sun, 06-Nov-94 08:49:37 GMT"), -1, "rfc850 needs the full day name");

    kh_subtest("entity-tags");
    /* §8.8.3.2: W/"1" vs W/"1": weak only; W/"1" vs "1": weak only; "1" vs "1": both */
    kh_ok(kh_cond_etag_match(S("W/\"1\""), S("W/\"1\""), 1), "weak: W/1 W/1");
    kh_ok(!kh_cond_etag_match(S("W/\"1\""), S("W/\"1\""), 0), "strong: W/1 W/1");
    kh_ok(!kh_cond_etag_match(S("W/\"1\""), S("W/\"2\""), 1), "weak: W/1 W/2");
    kh_ok(kh_cond_etag_match(S("W/\"1\""), S("\"1\""), 1), "weak: W/1 1");
    kh_ok(!kh_cond_etag_match(S("W/\"1\""), S("\"1\""), 0), "strong: W/1 1");
    kh_ok(kh_cond_etag_match(S("\"1\""), S("\"1\""), 0), "strong: 1 1");
    kh_ok(kh_cond_etag_match(S(" \"a\" ,, W/\"b\",\"c\" "), S("\"b\""), 1), "in a list");
    kh_ok(kh_cond_etag_match(S("*"), S("\"x\""), 1), "*");
    kh_ok(kh_cond_etag_match(S(" * "), S(NULL), 1), "* without an etag");
    kh_ok(!kh_cond_etag_match(S("\"a\""), S(NULL), 1), "no etag");
    kh_ok(!kh_cond_etag_match(S("\"a\" \"b\""), S("\"b\""), 1), "no comma: malformed");
    kh_ok(!kh_cond_etag_match(S("\"a"), S("\"a\""), 1), "unclosed");
    kh_ok(!kh_cond_etag_match(S("a"), S("a"), 1), "unquoted");
    kh_ok(!kh_cond_etag_match(S("\"a\""), S("\"a\"x"), 1), "etag with trailing bytes");

    kh_subtest("precedence");
    const char *lm = "Sun, 06 Nov 1994 08:49:37 GMT";
    kh_ok(kh_cond_not_modified(S(NULL), S(lm), S(NULL), S(lm)), "IMS equal");
    kh_ok(kh_cond_not_modified(S(NULL), S("Mon, 07 Nov 1994 08:49:37 GMT"), S(NULL), S(lm)), "IMS later");
    kh_ok(!kh_cond_not_modified(S(NULL), S("Sat, 05 Nov 1994 08:49:37 GMT"), S(NULL), S(lm)), "IMS earlier");
    kh_ok(!kh_cond_not_modified(S(NULL), S("garbage"), S(NULL), S(lm)), "IMS unparsable");
    kh_ok(!kh_cond_not_modified(S(NULL), S(lm), S(NULL), S(NULL)), "no Last-Modified");
    kh_ok(!kh_cond_not_modified(S("\"x\""), S(lm), S("\"y\""), S(lm)), "INM wins (no match)");
    kh_ok(kh_cond_not_modified(S("\"y\""), S("Sat, 05 Nov 1994 08:49:37 GMT"), S("\"y\""), S(lm)),
          "INM wins (match)");

    kh_subtest("304 fields");
    kh_header h[] = {
        {KH_STR_LIT("Content-Type"), KH_STR_LIT("text/plain")},
        {KH_STR_LIT("ETag"), KH_STR_LIT("\"1\"")},
        {KH_STR_LIT("cache-control"), KH_STR_LIT("max-age=60")},
        {KH_STR_LIT("Set-Cookie"), KH_STR_LIT("a=1")},
        {KH_STR_LIT("Vary"), KH_STR_LIT("Origin")},
        {KH_STR_LIT("Access-Control-Allow-Origin"), KH_STR_LIT("*")},
        {KH_STR_LIT("Last-Modified"), KH_STR_LIT("x")},
    };
    kh_header out[7];
    size_t k = kh_cond_304_headers(h, 7, out);
    kh_is_int((int)k, 5, "five kept");
    kh_is_str(out[0].name.ptr, out[0].name.len, "ETag", "ETag first");
    kh_is_str(out[4].name.ptr, out[4].name.len, "Last-Modified", "Last-Modified last");
    return kh_test_done();
}
