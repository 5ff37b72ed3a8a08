/* test_h1_parse.c: unit tests of the request-head parser and the chunked decoder.
 * Owns:  the case tables.
 * In:    kh_h1_parse.h only (tested through the interface).
 * Out:   TAP. Every head case runs whole, at every split point (each proper prefix gives
 *        KH_EAGAIN or the same error; the rest fed with prev_len as a real caller does), byte by
 *        byte, and on guarded copies (kh_test_guarded_copy) so that any over-read faults.
 *        Every chunked case runs whole, in two pieces split at every point, and byte by byte.
 * Never: depends on the order of the cases. */
#include "kh_h1_parse.h"
#include "kh_test.h"

#include <inttypes.h>

static const kh_h1_limits lim_def = {16384, 100, 8192, UINT64_MAX};
static const kh_h1_limits lim_small = {128, 4, 32, 1000};
static const kh_h1_limits lim_body10 = {16384, 100, 8192, 10};
static const kh_h1_limits lim_body0 = {16384, 100, 8192, 0};
static const kh_h1_limits lim_body8m = {16384, 100, 8192, 8388608};

#define OK 1 /* want: success, the head is the whole input minus .tail bytes */
#define MAXF 128

typedef struct pcase {
    const char *name;
    const char *in;
    size_t len; /* 0: strlen(in) */
    ssize_t want;
    size_t tail;
    const kh_h1_limits *lim; /* NULL: lim_def */
    /* on success: */
    const char *method, *target, *path;
    const char *query;     /* NULL: no '?' (ptr NULL) */
    const char *authority; /* NULL: empty */
    const char *host;      /* NULL: empty */
    const char *upgrade;   /* NULL: empty */
    int minor, form, body;
    uint64_t cl;
    unsigned flags;
    size_t nf;
} pcase;

#define H11 "HTTP/1.1\r\n"
#define HA "Host: a\r\n"
#define D10 "0123456789"
#define D30 D10 D10 D10
#define D90 D30 D30 D30
#define CRLF8 "\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n"
#define NUL_IN "GET / " H11 HA "X: a\0z\r\n\r\n"

static const pcase pcases[] = {
    /* ---- valid heads ---- */
    {.name = "simple GET",
     .in = "GET / " H11 HA "\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "path and query",
     .in = "GET /p/a?x=1&y=2 " H11 "Host: example.com\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/p/a?x=1&y=2",
     .path = "/p/a",
     .query = "x=1&y=2",
     .host = "example.com",
     .minor = 1,
     .nf = 1},
    {.name = "empty query",
     .in = "GET /p? " H11 HA "\r\n",
     .want = OK,
     .method = "GET",
     .target = "/p?",
     .path = "/p",
     .query = "",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "second ? stays in query",
     .in = "GET /a?b?c " H11 HA "\r\n",
     .want = OK,
     .method = "GET",
     .target = "/a?b?c",
     .path = "/a",
     .query = "b?c",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "HTTP/1.0 without Host",
     .in = "GET /x HTTP/1.0\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/x",
     .path = "/x",
     .minor = 0},
    {.name = "HTTP/1.0 with Host",
     .in = "HEAD / HTTP/1.0\r\nHost: h:80\r\n\r\n",
     .want = OK,
     .method = "HEAD",
     .target = "/",
     .path = "/",
     .host = "h:80",
     .minor = 0,
     .nf = 1},
    {.name = "HTTP/1.9 is 1.1",
     .in = "GET / HTTP/1.9\r\n" HA "\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "leading empty lines skipped",
     .in = "\r\n\r\nGET / " H11 HA "\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "POST with Content-Length and body",
     .in = "POST /u " H11 HA "Content-Length: 5\r\n\r\nhello",
     .want = OK,
     .tail = 5,
     .method = "POST",
     .target = "/u",
     .path = "/u",
     .host = "a",
     .minor = 1,
     .body = KH_H1_BODY_LENGTH,
     .cl = 5,
     .nf = 2},
    {.name = "Content-Length list of equal values",
     .in = "POST / " H11 HA "content-length: 5 ,5,  5\r\n\r\n",
     .want = OK,
     .method = "POST",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .body = KH_H1_BODY_LENGTH,
     .cl = 5,
     .nf = 2},
    {.name = "identical duplicate Content-Length lines",
     .in = "POST / " H11 HA "Content-Length: 7\r\nCONTENT-LENGTH: 007\r\n\r\n",
     .want = OK,
     .method = "POST",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .body = KH_H1_BODY_LENGTH,
     .cl = 7,
     .nf = 3},
    {.name = "Content-Length 0",
     .in = "POST / " H11 HA "Content-Length: 0\r\n\r\n",
     .want = OK,
     .method = "POST",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .body = KH_H1_BODY_LENGTH,
     .cl = 0,
     .nf = 2},
    {.name = "Content-Length 2^53",
     .in = "PUT / " H11 HA "Content-Length: 9007199254740992\r\n\r\n",
     .want = OK,
     .method = "PUT",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .body = KH_H1_BODY_LENGTH,
     .cl = UINT64_C(9007199254740992),
     .nf = 2},
    {.name = "chunked",
     .in = "POST / " H11 HA "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
     .want = OK,
     .tail = 15,
     .method = "POST",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .body = KH_H1_BODY_CHUNKED,
     .nf = 2},
    {.name = "chunked, any case, empty list elements",
     .in = "POST / " H11 HA "transfer-encoding: , CHUNKED ,\r\n\r\n",
     .want = OK,
     .method = "POST",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .body = KH_H1_BODY_CHUNKED,
     .nf = 2},
    {.name = "absolute-form with port, path, query",
     .in = "GET http://example.com:8080/p?q " H11 "Host: example.com:8080\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "http://example.com:8080/p?q",
     .path = "/p",
     .query = "q",
     .authority = "example.com:8080",
     .host = "example.com:8080",
     .minor = 1,
     .form = KH_H1_ABSOLUTE_FORM,
     .nf = 1},
    {.name = "absolute-form, scheme case, empty path",
     .in = "GET HTTP://a.b " H11 HA "\r\n",
     .want = OK,
     .method = "GET",
     .target = "HTTP://a.b",
     .path = "/",
     .authority = "a.b",
     .host = "a",
     .minor = 1,
     .form = KH_H1_ABSOLUTE_FORM,
     .nf = 1},
    {.name = "absolute-form https, query without path",
     .in = "GET https://a?x " H11 HA "\r\n",
     .want = OK,
     .method = "GET",
     .target = "https://a?x",
     .path = "/",
     .query = "x",
     .authority = "a",
     .host = "a",
     .minor = 1,
     .form = KH_H1_ABSOLUTE_FORM,
     .nf = 1},
    {.name = "absolute-form IPv6",
     .in = "GET http://[::1]:80/i " H11 "Host: [::1]:80\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "http://[::1]:80/i",
     .path = "/i",
     .authority = "[::1]:80",
     .host = "[::1]:80",
     .minor = 1,
     .form = KH_H1_ABSOLUTE_FORM,
     .nf = 1},
    {.name = "OPTIONS *",
     .in = "OPTIONS * " H11 HA "\r\n",
     .want = OK,
     .method = "OPTIONS",
     .target = "*",
     .path = "*",
     .host = "a",
     .minor = 1,
     .form = KH_H1_ASTERISK_FORM,
     .nf = 1},
    {.name = "CONNECT authority-form",
     .in = "CONNECT a.example:443 " H11 "Host: a.example:443\r\n\r\n",
     .want = OK,
     .method = "CONNECT",
     .target = "a.example:443",
     .path = NULL,
     .authority = "a.example:443",
     .host = "a.example:443",
     .minor = 1,
     .form = KH_H1_AUTHORITY_FORM,
     .nf = 1},
    {.name = "Connection tokens and Upgrade",
     .in = "GET /ws " H11 HA "Connection: keep-alive, Upgrade\r\nconnection: ,CLOSE\r\n"
           "Upgrade: websocket\r\nUpgrade: h2c\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/ws",
     .path = "/ws",
     .host = "a",
     .upgrade = "websocket",
     .minor = 1,
     .flags =
         KH_H1_F_CONN_CLOSE | KH_H1_F_CONN_KEEPALIVE | KH_H1_F_CONN_UPGRADE | KH_H1_F_HAS_UPGRADE,
     .nf = 5},
    {.name = "unknown Connection options ignored",
     .in = "GET / " H11 HA "Connection: foo, closed\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .nf = 2},
    {.name = "Expect: 100-continue",
     .in = "PUT / " H11 HA "Expect: 100-Continue\r\nContent-Length: 3\r\n\r\n",
     .want = OK,
     .method = "PUT",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .body = KH_H1_BODY_LENGTH,
     .cl = 3,
     .flags = KH_H1_F_EXPECT_CONTINUE,
     .nf = 3},
    {.name = "Expect: 100-continue ignored in HTTP/1.0",
     .in = "PUT / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n",
     .want = OK,
     .method = "PUT",
     .target = "/",
     .path = "/",
     .minor = 0,
     .nf = 1},
    {.name = "OWS trimmed, empty value, obs-text",
     .in = "GET / " H11 HA "X-A: \t a b \t\r\nX-B:\r\nX-C: \x80\xff\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .nf = 4},
    {.name = "every tchar in a name",
     .in = "GET / " H11 HA "!#$%&'*+-.^_`|~09azAZ: v\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .nf = 2},
    {.name = "M-SEARCH with * (only OPTIONS)",
     .in = "M-SEARCH * " H11 HA "\r\n",
     .want = KH_H1_ETARGET},
    {.name = "token method",
     .in = "PROPFIND /d " H11 HA "\r\n",
     .want = OK,
     .method = "PROPFIND",
     .target = "/d",
     .path = "/d",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "every visible char in a target",
     .in = "GET /a!$&'()*+,;=:@-._~%20\"<>[]^`{|}\\ " H11 HA "\r\n",
     .want = OK,
     .method = "GET",
     .target = "/a!$&'()*+,;=:@-._~%20\"<>[]^`{|}\\",
     .path = "/a!$&'()*+,;=:@-._~%20\"<>[]^`{|}\\",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "Host forms",
     .in = "GET / " H11 "Host: 10.0.0.1:65535\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "10.0.0.1:65535",
     .minor = 1,
     .nf = 1},
    {.name = "Host pct-encoded, empty port",
     .in = "GET / " H11 "Host: a%2Db.c:\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a%2Db.c:",
     .minor = 1,
     .nf = 1},
    {.name = "empty Host (RFC 9110 7.2)",
     .in = "GET / " H11 "Host:\r\n\r\n",
     .want = OK,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "",
     .minor = 1,
     .nf = 1},
    {.name = "pipelined request after the head",
     .in = "GET /1 " H11 HA "\r\nGET /2 " H11 HA "\r\n",
     .want = OK,
     .tail = 28,
     .method = "GET",
     .target = "/1",
     .path = "/1",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "exactly header_fields fields",
     .in = "GET / " H11 HA "b:1\r\nc:2\r\nd:3\r\n\r\n",
     .want = OK,
     .lim = &lim_small,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .nf = 4},
    {.name = "target of exactly target_bytes",
     .in = "GET /" D30 "0 " H11 HA "\r\n",
     .want = OK,
     .lim = &lim_small,
     .method = "GET",
     .target = "/" D30 "0",
     .path = "/" D30 "0",
     .host = "a",
     .minor = 1,
     .nf = 1},
    {.name = "head of exactly header_bytes",
     .in = "GET / " H11 HA "X: " D90 "012345\r\n\r\n",
     .want = OK,
     .lim = &lim_small,
     .method = "GET",
     .target = "/",
     .path = "/",
     .host = "a",
     .minor = 1,
     .nf = 2},

    /* ---- incomplete: KH_EAGAIN ---- */
    {.name = "no blank line yet", .in = "GET / " H11 HA, .want = KH_EAGAIN},
    {.name = "method only", .in = "GET", .want = KH_EAGAIN},
    {.name = "only empty lines", .in = "\r\n\r\n\r", .want = KH_EAGAIN},
    {.name = "bad field line waits for an event", .in = "GET / " H11 "X: \x01\r\n" HA, .want = KH_EAGAIN},
    {.name = "bad request line without its CRLF waits", .in = "GET /\x01 " H11, .len = 16,
     .want = KH_EAGAIN},

    /* ---- a bad request line is an event at its CRLF ---- */
    {.name = "rl event: bad target, no blank line", .in = "GET /\x01 " H11 HA, .want = KH_H1_ETARGET},
    {.name = "rl event: HTTP/0.9 line alone", .in = "GET /\r\n", .want = KH_H1_EBADREQ},
    {.name = "rl event: version with a trailing SP", .in = "GET / HTTP/1.1 \r\n", .want = KH_H1_EBADVERSION},
    {.name = "rl event: HTTP/2.0", .in = "GET / HTTP/2.0\r\n", .want = KH_H1_EVERSION},
    {.name = "rl event: bad method", .in = "G(T / " H11, .want = KH_H1_EMETHOD},
    {.name = "rl event: bare CR in the line", .in = "GET /\rx " H11, .want = KH_H1_EBARECR},
    {.name = "rl event: after leading CRLFs", .in = "\r\n\r\nGET /a b " H11, .want = KH_H1_EBADVERSION},
    {.name = "rl event: target over target_bytes within the room", .in = "GET /" D30 D10 " " H11,
     .lim = &lim_small, .want = KH_H1_ETARGETLEN},

    /* ---- request line errors ---- */
    {.name = "bad method char", .in = "G(T / " H11 HA "\r\n", .want = KH_H1_EMETHOD},
    {.name = "empty method", .in = " / " H11 HA "\r\n", .want = KH_H1_EMETHOD},
    {.name = "HTAB after method", .in = "GET\t/ " H11 HA "\r\n", .want = KH_H1_EMETHOD},
    {.name = "no version (HTTP/0.9)", .in = "GET /\r\n" HA "\r\n", .want = KH_H1_EBADREQ},
    {.name = "CTL in target", .in = "GET /a\x01z " H11 HA "\r\n", .want = KH_H1_ETARGET},
    {.name = "8-bit byte in target", .in = "GET /\x80 " H11 HA "\r\n", .want = KH_H1_ETARGET},
    {.name = "fragment in target", .in = "GET /a#f " H11 HA "\r\n", .want = KH_H1_ETARGET},
    {.name = "two SP before target", .in = "GET  / " H11 HA "\r\n", .want = KH_H1_ETARGET},
    {.name = "two SP before version", .in = "GET /  " H11 HA "\r\n", .want = KH_H1_EBADVERSION},
    {.name = "* with GET", .in = "GET * " H11 HA "\r\n", .want = KH_H1_ETARGET},
    {.name = "authority-form without CONNECT",
     .in = "GET a.com:80 " H11 HA "\r\n",
     .want = KH_H1_ETARGET},
    {.name = "CONNECT with origin-form", .in = "CONNECT / " H11 HA "\r\n", .want = KH_H1_ETARGET},
    {.name = "CONNECT without port", .in = "CONNECT a.com " H11 HA "\r\n", .want = KH_H1_ETARGET},
    {.name = "unknown scheme", .in = "GET ftp://a/ " H11 HA "\r\n", .want = KH_H1_ETARGET},
    {.name = "absolute-form empty host",
     .in = "GET http:///p " H11 HA "\r\n",
     .want = KH_H1_ETARGET},
    {.name = "absolute-form userinfo",
     .in = "GET http://u@a/ " H11 HA "\r\n",
     .want = KH_H1_ETARGET},
    {.name = "absolute-form bad port",
     .in = "GET http://a:99999/ " H11 HA "\r\n",
     .want = KH_H1_ETARGET},
    {.name = "HTTP/2.0", .in = "GET / HTTP/2.0\r\n" HA "\r\n", .want = KH_H1_EVERSION},
    {.name = "HTTP/0.9 version", .in = "GET / HTTP/0.9\r\n" HA "\r\n", .want = KH_H1_EVERSION},
    {.name = "lower-case http", .in = "GET / http/1.1\r\n" HA "\r\n", .want = KH_H1_EBADVERSION},
    {.name = "SP after version", .in = "GET / HTTP/1.1 \r\n" HA "\r\n", .want = KH_H1_EBADVERSION},
    {.name = "short version", .in = "GET / HTTP/1\r\n" HA "\r\n", .want = KH_H1_EBADVERSION},
    {.name = "two-digit major", .in = "GET / HTTP/11.1\r\n" HA "\r\n", .want = KH_H1_EBADVERSION},
    {.name = "CR CR LF after version",
     .in = "GET / HTTP/1.1\r\r\n" HA "\r\n",
     .want = KH_H1_EBARECR},
    {.name = "target longer than target_bytes",
     .in = "GET /" D30 "01 " H11 HA "\r\n",
     .want = KH_H1_ETARGETLEN,
     .lim = &lim_small},
    {.name = "huge request line, no CRLF yet (early 414)",
     .in = "GET /" D90 "01",
     .want = KH_H1_ETARGETLEN,
     .lim = &lim_small},
    {.name = "huge method, no SP yet (early 414)",
     .in = "GET" D90 "012",
     .want = KH_H1_ETARGETLEN,
     .lim = &lim_small},

    /* ---- line framing ---- */
    {.name = "bare LF everywhere", .in = "GET / HTTP/1.1\nHost: a\n\n", .want = KH_H1_EBARELF},
    {.name = "bare LF in a header", .in = "GET / " H11 "X: a\n" HA "\r\n", .want = KH_H1_EBARELF},
    {.name = "bare LF before the request line",
     .in = "\nGET / " H11 HA "\r\n",
     .want = KH_H1_EBARELF},
    {.name = "bare CR in a value",
     .in = "GET / " H11 "X: a\rb\r\n" HA "\r\n",
     .want = KH_H1_EBARECR},
    {.name = "bare CR before the request line",
     .in = "\r\rGET / " H11 HA "\r\n",
     .want = KH_H1_EBARECR},
    {.name = "bare CR at a line start",
     .in = "GET / " H11 HA "\rX: a\r\n\r\n",
     .want = KH_H1_EBARECR},
    {.name = "first bad line wins over a later bare LF",
     .in = "GET /\x01 " H11 "X: a\n\r\n",
     .want = KH_H1_ETARGET},
    {.name = "bare LF line wins over a later bad line",
     .in = "GET / " H11 "X: a\nY: \x01\r\n\r\n",
     .want = KH_H1_EBARELF},

    /* ---- header lines ---- */
    {.name = "empty field name", .in = "GET / " H11 HA ": b\r\n\r\n", .want = KH_H1_EFIELDNAME},
    {.name = "bad char in field name",
     .in = "GET / " H11 HA "X\"y: a\r\n\r\n",
     .want = KH_H1_EFIELDNAME},
    {.name = "line without colon", .in = "GET / " H11 HA "Xy\r\n\r\n", .want = KH_H1_EFIELDNAME},
    {.name = "SP inside field name",
     .in = "GET / " H11 HA "X y: a\r\n\r\n",
     .want = KH_H1_EFIELDNAME},
    {.name = "whitespace before colon",
     .in = "GET / " H11 "Host : a\r\n\r\n",
     .want = KH_H1_EWSCOLON},
    {.name = "CTL in value", .in = "GET / " H11 HA "X: a\x01z\r\n\r\n", .want = KH_H1_EFIELDVALUE},
    {.name = "NUL in value", .in = NUL_IN, .len = sizeof(NUL_IN) - 1, .want = KH_H1_EFIELDVALUE},
    {.name = "DEL in value", .in = "GET / " H11 HA "X: a\x7fz\r\n\r\n", .want = KH_H1_EFIELDVALUE},
    {.name = "obs-fold", .in = "GET / " H11 HA "X: a\r\n b\r\n\r\n", .want = KH_H1_EOBSFOLD},
    {.name = "whitespace before the first field",
     .in = "GET / " H11 " Host: a\r\n\r\n",
     .want = KH_H1_EOBSFOLD},
    {.name = "too many fields",
     .in = "GET / " H11 HA "b:1\r\nc:2\r\nd:3\r\ne:4\r\n\r\n",
     .want = KH_H1_EFIELDS,
     .lim = &lim_small},
    {.name = "head one byte over header_bytes",
     .in = "GET / " H11 HA "X: " D90 "0123456\r\n\r\n",
     .want = KH_H1_EHEADLEN,
     .lim = &lim_small},
    {.name = "incomplete head past header_bytes (early 431)",
     .in = "GET / " H11 HA "X: " D90 D90,
     .want = KH_H1_EHEADLEN,
     .lim = &lim_small},
    {.name = "flood of empty lines (431)",
     .in = CRLF8 CRLF8 CRLF8 CRLF8 CRLF8 CRLF8 CRLF8 CRLF8,
     .want = KH_H1_EHEADLEN,
     .lim = &lim_small},
    /* the same verdict as the first header_bytes alone give (fuzz_h1_parse found a 400 here) */
    {.name = "empty lines fill header_bytes, then a bare LF (431, not 400)",
     .in = CRLF8 CRLF8 CRLF8 CRLF8 CRLF8 CRLF8 CRLF8 CRLF8 "\nGET / " H11 HA "\r\n",
     .want = KH_H1_EHEADLEN,
     .lim = &lim_small},

    /* ---- framing (RFC 9112 §6) ---- */
    {.name = "CL and TE",
     .in = "POST / " H11 HA "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "differing CL lines",
     .in = "POST / " H11 HA "Content-Length: 5\r\nContent-Length: 6\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "differing CL list",
     .in = "POST / " H11 HA "Content-Length: 5, 6\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "TE in HTTP/1.0",
     .in = "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "TE gzip alone (final not chunked)",
     .in = "POST / " H11 HA "Transfer-Encoding: gzip\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "TE chunked, gzip",
     .in = "POST / " H11 HA "Transfer-Encoding: chunked, gzip\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "TE chunked twice in one line",
     .in = "POST / " H11 HA "Transfer-Encoding: chunked, chunked\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "TE chunked on two lines",
     .in = "POST / " H11 HA "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "TE empty",
     .in = "POST / " H11 HA "Transfer-Encoding:\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "TE with parameters",
     .in = "POST / " H11 HA "Transfer-Encoding: chunked;q=1\r\n\r\n",
     .want = KH_H1_EFRAMING},
    {.name = "TE gzip, chunked (501)",
     .in = "POST / " H11 HA "Transfer-Encoding: gzip, chunked\r\n\r\n",
     .want = KH_H1_ETE},
    {.name = "TE gzip then chunked on two lines (501)",
     .in = "POST / " H11 HA "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
     .want = KH_H1_ETE},
    {.name = "CL with sign",
     .in = "POST / " H11 HA "Content-Length: +5\r\n\r\n",
     .want = KH_H1_EBADCL},
    {.name = "CL negative",
     .in = "POST / " H11 HA "Content-Length: -1\r\n\r\n",
     .want = KH_H1_EBADCL},
    {.name = "CL with inner space",
     .in = "POST / " H11 HA "Content-Length: 5 5\r\n\r\n",
     .want = KH_H1_EBADCL},
    {.name = "CL empty", .in = "POST / " H11 HA "Content-Length:\r\n\r\n", .want = KH_H1_EBADCL},
    {.name = "CL hex", .in = "POST / " H11 HA "Content-Length: 0x10\r\n\r\n", .want = KH_H1_EBADCL},
    {.name = "CL 2^53 + 1",
     .in = "POST / " H11 HA "Content-Length: 9007199254740993\r\n\r\n",
     .want = KH_H1_EBADCL},
    {.name = "CL past uint64",
     .in = "POST / " H11 HA "Content-Length: 99999999999999999999999\r\n\r\n",
     .want = KH_H1_EBADCL},
    {.name = "CL trailing comma",
     .in = "POST / " H11 HA "Content-Length: 5,\r\n\r\n",
     .want = KH_H1_EBADCL},

    /* ---- Host, Expect ---- */
    {.name = "HTTP/1.1 without Host", .in = "GET / " H11 "X: a\r\n\r\n", .want = KH_H1_ENOHOST},
    {.name = "two Host lines", .in = "GET / " H11 HA HA "\r\n", .want = KH_H1_ENOHOST},
    {.name = "Host with a space", .in = "GET / " H11 "Host: a b\r\n\r\n", .want = KH_H1_ENOHOST},
    {.name = "Host bad port", .in = "GET / " H11 "Host: a:8x\r\n\r\n", .want = KH_H1_ENOHOST},
    {.name = "Host port too big",
     .in = "GET / " H11 "Host: a:65536\r\n\r\n",
     .want = KH_H1_ENOHOST},
    {.name = "Host unclosed IPv6", .in = "GET / " H11 "Host: [::1\r\n\r\n", .want = KH_H1_ENOHOST},
    {.name = "Host port without host",
     .in = "GET / " H11 "Host: :80\r\n\r\n",
     .want = KH_H1_ENOHOST},
    {.name = "Host with userinfo", .in = "GET / " H11 "Host: u@a\r\n\r\n", .want = KH_H1_ENOHOST},
    {.name = "Host bad pct-encoding",
     .in = "GET / " H11 "Host: a%zz\r\n\r\n",
     .want = KH_H1_ENOHOST},
    {.name = "Expect other", .in = "GET / " H11 HA "Expect: foo\r\n\r\n", .want = KH_H1_EEXPECT},
    {.name = "Expect list",
     .in = "GET / " H11 HA "Expect: 100-continue, x\r\n\r\n",
     .want = KH_H1_EEXPECT},
};

/* ---- head checks ---- */

static int slice_is(kh_str s, const char *want)
{
    if (want == NULL)
        return s.len == 0;
    return s.ptr != NULL && s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

/* Every non-empty slice must point into buf[0..n), even the "/" of an absolute-form without a
 * path: a caller may copy the head and rebase the slices. */
static int slice_inside(kh_str s, const char *buf, size_t n)
{
    if (s.len == 0)
        return 1;
    return s.ptr >= buf && s.ptr + s.len <= buf + n;
}

/* Returns a text naming the first mismatch, or NULL when the head is as the case says. */
static const char *head_mismatch(const pcase *c, const kh_h1_head *h, const char *buf, size_t n)
{
    if (!slice_is(h->method, c->method))
        return "method";
    if (!slice_is(h->target, c->target))
        return "target";
    if (!slice_is(h->path, c->path))
        return "path";
    if (c->query == NULL ? h->query.ptr != NULL : !slice_is(h->query, c->query))
        return "query";
    if (!slice_is(h->authority, c->authority))
        return "authority";
    if (!slice_is(h->host, c->host))
        return "host";
    if (!slice_is(h->upgrade, c->upgrade))
        return "upgrade";
    if (h->minor_version != c->minor)
        return "minor_version";
    if (h->target_form != c->form)
        return "target_form";
    if (h->body_kind != c->body)
        return "body_kind";
    if (h->content_length != c->cl)
        return "content_length";
    if (h->flags != c->flags)
        return "flags";
    if (h->num_fields != c->nf)
        return "num_fields";
    kh_str all[] = {h->method, h->target, h->path, h->query, h->authority, h->host, h->upgrade};
    for (size_t i = 0; i < KH_ARRAY_LEN(all); i++)
        if (!slice_inside(all[i], buf, n))
            return "slice outside the head";
    for (size_t i = 0; i < h->num_fields; i++) {
        kh_str nm = h->fields[i].name, v = h->fields[i].value;
        if (nm.len == 0 || !slice_inside(nm, buf, n) || !slice_inside(v, buf, n))
            return "field slice";
        if (v.len && (v.ptr[0] == ' ' || v.ptr[0] == '\t' || v.ptr[v.len - 1] == ' ' ||
                      v.ptr[v.len - 1] == '\t'))
            return "field value not trimmed";
    }
    return NULL;
}

/* One guarded region per case: g[0..cap) ends where the PROT_NONE page begins. Copies in[0..k)
 * so that it ends there too, and returns where it starts (one mmap per case, not per split). */
static char *place_at_end(char *g, size_t cap, const char *in, size_t k)
{
    char *p = g + (cap - k);
    memmove(p, in, k);
    return p;
}

static ssize_t parse(const char *in, size_t len, size_t prev_len, kh_h1_head *h, kh_h1_field *f,
                     const kh_h1_limits *lim)
{
    memset(h, 0xA5, sizeof(*h)); /* garbage in: the parser must set every output it promises */
    h->fields = f;
    return kh_h1_parse_request(in, len, prev_len, h, lim);
}

static void run_pcase(const pcase *c)
{
    size_t len = c->len ? c->len : strlen(c->in);
    const kh_h1_limits *lim = c->lim ? c->lim : &lim_def;
    ssize_t want = c->want == OK ? (ssize_t)(len - c->tail) : c->want;
    kh_h1_field f[MAXF];
    kh_h1_head h;
    void *base;
    size_t maplen;

    kh_subtest(c->name);

    /* (a) whole, on a guarded copy */
    char *g = kh_test_guarded_copy(c->in, len, &base, &maplen);
    ssize_t r = parse(g, len, 0, &h, f, lim);
    kh_is_int(r, want, "%s: whole input", c->name);
    if (want >= 0 && r == want) {
        const char *bad = head_mismatch(c, &h, g, (size_t)want);
        kh_ok(bad == NULL, "%s: head fields%s%s", c->name, bad ? " differ: " : "", bad ? bad : "");
    }
    if (want < 0 && want != KH_EAGAIN)
        kh_ok(kh_h1_error_status((int)want) >= 400 && kh_h1_error_reason((int)want)[0] != '\0',
              "%s: status %d, reason \"%s\"", c->name, kh_h1_error_status((int)want),
              kh_h1_error_reason((int)want));

    /* (b) every split point: prefix alone, then the whole with prev_len = prefix length */
    int prefix_bad = 0, resume_bad = 0;
    for (size_t k = 0; k < len; k++) {
        char *pg = place_at_end(g, len, c->in, k);
        ssize_t a = parse(pg, k, 0, &h, f, lim);
        int ok = a == KH_EAGAIN || a == want;
        if (want >= 0 && k >= (size_t)want)
            ok = a == want; /* the head is all there: the result cannot wait */
        if (!ok && prefix_bad++ == 0)
            printf("#   prefix of %zu bytes gave %zd, want %zd or KH_EAGAIN\n", k, a, want);
        memcpy(g, c->in, len);
        if (a != KH_EAGAIN)
            continue;
        ssize_t b = parse(g, len, k, &h, f, lim);
        const char *bad = b != want   ? "result"
                          : want >= 0 ? head_mismatch(c, &h, g, (size_t)want)
                                      : NULL;
        if (bad && resume_bad++ == 0)
            printf("#   split at %zu: %s differs (got %zd, want %zd)\n", k, bad, b, want);
    }
    kh_ok(prefix_bad == 0, "%s: every proper prefix gives KH_EAGAIN or the same result", c->name);
    kh_ok(resume_bad == 0, "%s: every two-piece feed (prev_len = first piece) gives the result",
          c->name);

    /* byte by byte, as a slow peer sends it: prev_len is the previous call's length */
    ssize_t last = KH_EAGAIN;
    size_t prev = 0, at = 0;
    char *pk = g;
    for (size_t k = 1; k <= len && last == KH_EAGAIN; k++) {
        pk = place_at_end(g, len, c->in, k); /* so a read past k faults */
        last = parse(pk, k, prev, &h, f, lim);
        prev = k;
        at = k;
    }
    int bw_ok = last == want;
    if (bw_ok && want >= 0)
        bw_ok = at == (size_t)want && head_mismatch(c, &h, pk, (size_t)want) == NULL;
    kh_ok(bw_ok, "%s: byte-by-byte feed (got %zd after %zu bytes)", c->name, last, at);
    kh_test_guarded_free(base, maplen);
}

/* ---- chunked decoder ---- */

typedef struct ccase {
    const char *name;
    const char *in;
    size_t len;   /* 0: strlen(in) */
    ssize_t want; /* consumed bytes when done (OK: all of in minus .tail), error, or KH_EAGAIN:
                     the body is not over, everything consumed */
    size_t tail;
    const char *payload;
    const kh_h1_limits *lim;
} ccase;

static const ccase ccases[] = {
    {.name = "one chunk", .in = "5\r\nhello\r\n0\r\n\r\n", .want = OK, .payload = "hello"},
    {.name = "several chunks, hex digits of both cases",
     .in = "a\r\n0123456789\r\nA\r\nabcdefghij\r\n1\r\n!\r\n0\r\n\r\n",
     .want = OK,
     .payload = "0123456789abcdefghij!"},
    {.name = "leading zeros, 16 digits",
     .in = "0000000000000003\r\nabc\r\n000\r\n\r\n",
     .want = OK,
     .payload = "abc"},
    {.name = "extensions: token, quoted, bare",
     .in = "5;foo=bar\r\nhello\r\n3 ; a = \"q\\\"x;\" ; b;c=d\r\nxyz\r\n0;last\r\n\r\n",
     .want = OK,
     .payload = "helloxyz"},
    {.name = "trailers", .in = "2\r\nhi\r\n0\r\nX-T: 1\r\nY:\r\n\r\n", .want = OK, .payload = "hi"},
    {.name = "payload with CRLF inside",
     .in = "4\r\n\r\n\r\n\r\n0\r\n\r\n",
     .want = OK,
     .payload = "\r\n\r\n"},
    {.name = "pipelined bytes after the body",
     .in = "3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n",
     .want = OK,
     .tail = 16,
     .payload = "abc"},
    {.name = "body not over yet",
     .in = "5\r\nhello\r\n3\r\nab",
     .want = KH_EAGAIN,
     .payload = "helloab"},
    {.name = "non-hex size", .in = "g\r\n", .want = KH_H1_ECHUNK},
    {.name = "empty size", .in = "\r\nhello\r\n", .want = KH_H1_ECHUNK},
    {.name = "0x prefix", .in = "0x5\r\nhello\r\n0\r\n\r\n", .want = KH_H1_ECHUNK},
    {.name = "negative size", .in = "-5\r\nhello\r\n0\r\n\r\n", .want = KH_H1_ECHUNK},
    {.name = "17 hex digits",
     .in = "00000000000000005\r\nhello\r\n0\r\n\r\n",
     .want = KH_H1_ECHUNK},
    {.name = "missing CRLF after data", .in = "5\r\nhelloX\r\n0\r\n\r\n", .want = KH_H1_ECHUNK},
    {.name = "bare LF after data", .in = "5\r\nhello\n0\r\n\r\n", .want = KH_H1_ECHUNK},
    {.name = "bare LF after size", .in = "5\nhello\r\n0\r\n\r\n", .want = KH_H1_ECHUNK},
    {.name = "whitespace before CRLF", .in = "5 \r\nhello\r\n0\r\n\r\n", .want = KH_H1_ECHUNK},
    {.name = "extension without a name", .in = "5;\r\nhello\r\n0\r\n\r\n", .want = KH_H1_ECHUNK},
    {.name = "extension without a value", .in = "5;a=\r\nhello\r\n0\r\n\r\n", .want = KH_H1_ECHUNK},
    {.name = "CTL in quoted extension",
     .in = "5;a=\"\x01\"\r\nhello\r\n0\r\n\r\n",
     .want = KH_H1_ECHUNK},
    {.name = "trailer obs-fold", .in = "0\r\nX: a\r\n b\r\n\r\n", .want = KH_H1_EOBSFOLD},
    {.name = "trailer bare LF", .in = "0\r\nX: a\n\r\n", .want = KH_H1_EBARELF},
    {.name = "trailer space before colon", .in = "0\r\nX : a\r\n\r\n", .want = KH_H1_EWSCOLON},
    {.name = "trailer CTL in value", .in = "0\r\nX: \x01\r\n\r\n", .want = KH_H1_EFIELDVALUE},
    {.name = "trailer bad name", .in = "0\r\n@: a\r\n\r\n", .want = KH_H1_EFIELDNAME},
    {.name = "trailer bare CR at the end", .in = "0\r\n\rx", .want = KH_H1_EBARECR},
    {.name = "too many trailer fields",
     .in = "0\r\na:1\r\nb:2\r\nc:3\r\nd:4\r\ne:5\r\n\r\n",
     .want = KH_H1_EFIELDS,
     .lim = &lim_small},
    /* body_bytes bounds the sum of the chunk sizes: refused at the LF of the size line that
     * passes it, before any of that chunk's data */
    {.name = "sizes adding up to exactly body_bytes",
     .in = "4\r\nabcd\r\n6\r\nefghij\r\n0\r\n\r\n",
     .want = OK,
     .payload = "abcdefghij",
     .lim = &lim_body10},
    {.name = "a second chunk that passes body_bytes, refused before its data",
     .in = "4\r\nabcd\r\n7\r\n",
     .want = KH_H1_EBODYLEN,
     .lim = &lim_body10},
    {.name = "a size line without its LF yet is not judged",
     .in = "4\r\nabcd\r\n7\r",
     .want = KH_EAGAIN,
     .payload = "abcd",
     .lim = &lim_body10},
    {.name = "one size over 8 MiB, no data", .in = "800001\r\n", .want = KH_H1_EBODYLEN, .lim = &lim_body8m},
    {.name = "one size of 8 MiB, no data yet", .in = "800000\r\n", .want = KH_EAGAIN, .payload = "",
     .lim = &lim_body8m},
    {.name = "extensions do not delay the verdict past the LF",
     .in = "800001;a=b\r\n",
     .want = KH_H1_EBODYLEN,
     .lim = &lim_body8m},
    {.name = "body_bytes 0: the last chunk alone", .in = "0\r\n\r\n", .want = OK, .payload = "",
     .lim = &lim_body0},
    {.name = "body_bytes 0: any data", .in = "1\r\nx\r\n0\r\n\r\n", .want = KH_H1_EBODYLEN,
     .lim = &lim_body0},
    {.name = "the largest size after a full budget does not wrap",
     .in = "a\r\n0123456789\r\nffffffffffffffff\r\n",
     .want = KH_H1_EBODYLEN,
     .lim = &lim_body10},
    {.name = "no body limit: the largest size is taken",
     .in = "ffffffffffffffff\r\nab",
     .want = KH_EAGAIN,
     .payload = "ab"},
    {.name = "trailer section past header_bytes",
     .in =
         "0\r\nX: 01234567890123456789012345678901234567890123456789012345678901234567890123456789"
         "0123456789012345678901234567890123456789012345\r\n\r\n",
     .want = KH_H1_EHEADLEN,
     .lim = &lim_small},
};

/* Builds a size line longer than 4096 bytes out of extensions. */
static char long_line[4200];

/* Feeds in[] in pieces that end at the offsets in cuts[] (the last one is len), each piece copied
 * to the end of a guarded region as a reader would receive it. Returns the result of the feed: an
 * error, the total consumed once done, or KH_EAGAIN; the payload is appended to out. */
static ssize_t feed_chunked(const char *in, size_t len, const size_t *cuts, size_t ncuts, char *out,
                            size_t *out_total, const kh_h1_limits *lim)
{
    kh_h1_chunked d;
    memset(&d, 0, sizeof(d));
    size_t from = 0;
    void *base;
    size_t maplen;
    char *region = kh_test_guarded_copy(in, len, &base, &maplen);
    *out_total = 0;
    for (size_t i = 0; i < ncuts; i++) {
        size_t n = cuts[i] - from, olen = 0;
        char *g = place_at_end(region, len, in + from, n);
        ssize_t r = kh_h1_chunked_decode(&d, g, n, &olen, lim);
        if (r >= 0) {
            memcpy(out + *out_total, g, olen);
            *out_total += olen;
        }
        if (r < 0 || d.done || (size_t)r != n)
            kh_test_guarded_free(base, maplen);
        if (r < 0)
            return r;
        if (d.done)
            return (ssize_t)(from + (size_t)r);
        if ((size_t)r != n)
            return -1; /* consumed less without being done: a bug */
        from = cuts[i];
    }
    kh_test_guarded_free(base, maplen);
    return d.done ? (ssize_t)from : KH_EAGAIN;
}

static void run_ccase(const ccase *c)
{
    size_t len = c->len ? c->len : strlen(c->in);
    const kh_h1_limits *lim = c->lim ? c->lim : &lim_def;
    ssize_t want = c->want == OK ? (ssize_t)(len - c->tail) : c->want;
    char *out = malloc(len + 1);
    size_t got, cuts[3];

    kh_subtest(c->name);
    cuts[0] = len;
    ssize_t r = feed_chunked(c->in, len, cuts, 1, out, &got, lim);
    kh_is_int(r, want, "chunked %s: whole", c->name);
    if (c->payload && r == want)
        kh_is_str(out, got, c->payload, "chunked %s: payload", c->name);

    int split_bad = 0;
    for (size_t k = 0; k <= len; k++) {
        cuts[0] = k;
        cuts[1] = len;
        ssize_t s = feed_chunked(c->in, len, cuts, 2, out, &got, lim);
        int ok = s == want &&
                 (!c->payload || (got == strlen(c->payload) && memcmp(out, c->payload, got) == 0));
        if (!ok && split_bad++ == 0)
            printf("#   split at %zu: got %zd, want %zd\n", k, s, want);
    }
    kh_ok(split_bad == 0, "chunked %s: two pieces split at every point", c->name);

    size_t *one = malloc((len ? len : 1) * sizeof(*one));
    for (size_t k = 0; k < len; k++)
        one[k] = k + 1;
    ssize_t s = feed_chunked(c->in, len, one, len, out, &got, lim);
    int ok = s == want &&
             (!c->payload || (got == strlen(c->payload) && memcmp(out, c->payload, got) == 0));
    kh_ok(ok, "chunked %s: one byte at a time (got %zd)", c->name, s);
    free(one);
    free(out);
}

static void test_chunked_extras(void)
{
    /* a size line of 4097 bytes made of extensions is refused; 4096 is fine */
    kh_subtest("chunked: size line cap");
    for (int over = 0; over <= 1; over++) {
        size_t n = 0;
        long_line[n++] = '1';
        while (n < (size_t)(4096 - 1 + over)) {
            long_line[n] = n % 2 ? ';' : 'a';
            n++;
        }
        if (long_line[n - 1] == ';')
            long_line[n - 1] = 'b';
        memcpy(long_line + n, "\r\nx\r\n0\r\n\r\n", 10);
        ssize_t want = over ? KH_H1_ECHUNK : (ssize_t)(n + 10);
        ccase c = {.name = over ? "4097-byte size line" : "4096-byte size line",
                   .in = long_line,
                   .len = n + 10,
                   .want = want,
                   .payload = over ? NULL : "x"};
        run_ccase(&c);
    }

    /* once done, further calls consume nothing */
    kh_h1_chunked d;
    memset(&d, 0, sizeof(d));
    char b[] = "0\r\n\r\nrest";
    size_t olen = 99;
    ssize_t r = kh_h1_chunked_decode(&d, b, sizeof(b) - 1, &olen, &lim_def);
    kh_ok(r == 5 && d.done == 1 && olen == 0, "chunked: last-chunk only, done after 5 bytes");
    r = kh_h1_chunked_decode(&d, b + 5, 4, &olen, &lim_def);
    kh_ok(r == 0 && olen == 0, "chunked: after done, nothing is consumed");
}

static void test_error_table(void)
{
    static const struct {
        int err, status;
    } st[] = {
        {KH_H1_EBADREQ, 400},    {KH_H1_EMETHOD, 400},     {KH_H1_ETARGET, 400},
        {KH_H1_EVERSION, 505},   {KH_H1_EBADVERSION, 400}, {KH_H1_EFIELDNAME, 400},
        {KH_H1_EWSCOLON, 400},   {KH_H1_EFIELDVALUE, 400}, {KH_H1_EOBSFOLD, 400},
        {KH_H1_EBARECR, 400},    {KH_H1_EBARELF, 400},     {KH_H1_EFRAMING, 400},
        {KH_H1_EBADCL, 400},     {KH_H1_ETE, 501},         {KH_H1_ENOHOST, 400},
        {KH_H1_ETARGETLEN, 414}, {KH_H1_EHEADLEN, 431},    {KH_H1_EFIELDS, 431},
        {KH_H1_EEXPECT, 417},    {KH_H1_ECHUNK, 400},      {KH_H1_EBODYLEN, 413},
        {KH_H1_EH2SETTINGS, 400},
    };
    kh_subtest("error table");
    int bad = 0;
    for (size_t i = 0; i < KH_ARRAY_LEN(st); i++) {
        const char *reason = kh_h1_error_reason(st[i].err);
        if (kh_h1_error_status(st[i].err) != st[i].status || reason == NULL || reason[0] == '\0') {
            printf("#   code %d: status %d\n", st[i].err, kh_h1_error_status(st[i].err));
            bad++;
        }
    }
    kh_ok(bad == 0, "every KH_H1_E* code has its status and a reason");
    kh_ok(kh_h1_error_status(KH_EAGAIN) == 400 && kh_h1_error_status(0) == 400 &&
              kh_h1_error_status(-5122) == 400 && kh_h1_error_reason(12345) != NULL,
          "unknown codes map to 400 with a reason");
}

/* base64url (no padding) of n SETTINGS entries {id, value}. */
static void settings_b64(const uint32_t (*e)[2], size_t n, char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    uint8_t raw[64 * 6];
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = raw + 6 * i;
        p[0] = (uint8_t)(e[i][0] >> 8), p[1] = (uint8_t)e[i][0];
        p[2] = (uint8_t)(e[i][1] >> 24), p[3] = (uint8_t)(e[i][1] >> 16);
        p[4] = (uint8_t)(e[i][1] >> 8), p[5] = (uint8_t)e[i][1];
    }
    size_t o = 0;
    for (size_t i = 0; i < 6 * n; i += 3) {
        uint32_t acc = (uint32_t)raw[i] << 16 | (uint32_t)raw[i + 1] << 8 | raw[i + 2];
        for (int k = 0; k < 4; k++)
            out[o++] = abc[(acc >> (18 - 6 * k)) & 63];
    }
    out[o] = '\0';
}

static ssize_t h2s(const char *v)
{
    uint8_t out[KH_H1_H2_SETTINGS_MAX * 6];
    return kh_h1_h2_settings((kh_str){v, strlen(v)}, out);
}

static ssize_t h2s_one(uint32_t id, uint32_t value)
{
    char b[16];
    const uint32_t e[1][2] = {{id, value}};
    settings_b64(e, 1, b);
    return h2s(b);
}

static void test_h2_settings(void)
{
    kh_subtest("HTTP2-Settings");
    uint8_t out[KH_H1_H2_SETTINGS_MAX * 6];
    /* curl's value: MAX_CONCURRENT_STREAMS 100, INITIAL_WINDOW_SIZE 2^30, ENABLE_PUSH 0 */
    const char *curl = "AAMAAABkAARAAAAAAAIAAAAA";
    ssize_t r = kh_h1_h2_settings((kh_str){curl, strlen(curl)}, out);
    kh_ok(r == 18 && out[1] == 3 && out[5] == 100 && out[7] == 4 && out[8] == 0x40 && out[13] == 2,
          "curl's HTTP2-Settings decodes to 3 entries");
    kh_is_int(h2s(""), KH_H1_EH2SETTINGS, "empty: token68 has at least one character");
    kh_is_int(h2s("AAMAAABkAARAAAAAAAIAAAA="), KH_H1_EH2SETTINGS, "padding is not base64url");
    kh_is_int(h2s("AAMAAABkAARAAAAAAAIAAAA"), KH_H1_EH2SETTINGS, "23 characters: not whole entries");
    kh_is_int(h2s("AAMAAABkAARAAAA"), KH_H1_EH2SETTINGS, "15 characters");
    kh_is_int(h2s("AAMAAABk+ARAAAAA"), KH_H1_EH2SETTINGS, "'+' is base64, not base64url");
    kh_is_int(h2s("AAMAAABk/ARAAAAA"), KH_H1_EH2SETTINGS, "'/' is base64, not base64url");
    kh_is_int(h2s("AAMAAABk AARAAAA"), KH_H1_EH2SETTINGS, "a space inside");
    kh_is_int(h2s("AAMAAABk-_-_-_-_"), 12, "'-' and '_' are base64url (unknown id 0xfbff ignored)");
    uint32_t many[33][2];
    for (size_t i = 0; i < 33; i++)
        many[i][0] = 3, many[i][1] = (uint32_t)i;
    char big[33 * 8 + 1];
    settings_b64(many, 32, big);
    kh_is_int(h2s(big), 32 * 6, "32 entries are taken");
    settings_b64(many, 33, big);
    kh_is_int(h2s(big), KH_H1_EH2SETTINGS, "33 entries are refused (nghttp2's cap)");
    kh_is_int(h2s_one(2, 1), 6, "ENABLE_PUSH 1");
    kh_is_int(h2s_one(2, 2), KH_H1_EH2SETTINGS, "ENABLE_PUSH 2");
    kh_is_int(h2s_one(4, 0x7fffffff), 6, "INITIAL_WINDOW_SIZE 2^31-1");
    kh_is_int(h2s_one(4, 0x80000000u), KH_H1_EH2SETTINGS, "INITIAL_WINDOW_SIZE 2^31");
    kh_is_int(h2s_one(5, 16384), 6, "MAX_FRAME_SIZE 2^14");
    kh_is_int(h2s_one(5, 16383), KH_H1_EH2SETTINGS, "MAX_FRAME_SIZE 2^14-1");
    kh_is_int(h2s_one(5, 16777215), 6, "MAX_FRAME_SIZE 2^24-1");
    kh_is_int(h2s_one(5, 16777216), KH_H1_EH2SETTINGS, "MAX_FRAME_SIZE 2^24");
    kh_is_int(h2s_one(8, 2), KH_H1_EH2SETTINGS, "ENABLE_CONNECT_PROTOCOL 2");
    kh_is_int(h2s_one(9, 2), KH_H1_EH2SETTINGS, "NO_RFC7540_PRIORITIES 2");
    kh_is_int(h2s_one(1, 0xffffffffu), 6, "HEADER_TABLE_SIZE 2^32-1");
    kh_is_int(h2s_one(0x1234, 0xffffffffu), 6, "an unknown id with any value");
}

/* kh_h1_parse.h: on an error, out->method is the request line's method once the line got past
 * it (kh_h1 answers a HEAD request's error without content), else what the caller left there. */
static void test_method_on_error(void)
{
    static const struct {
        const char *in;
        ssize_t want;
        const char *method; /* NULL: left as the caller set it */
    } mc[] = {
        {"HEAD / " H11 HA "Expect: x\r\n\r\n", KH_H1_EEXPECT, "HEAD"},
        {"HEAD / " H11 HA "X: a\1b\r\n\r\n", KH_H1_EFIELDVALUE, "HEAD"},
        {"HEAD / HTTP/2.0\r\n" HA "\r\n", KH_H1_EVERSION, "HEAD"},
        {"HEAD /a b " H11 HA "\r\n", KH_H1_EBADVERSION, "HEAD"},
        {"HEAD / " H11 "X: y\r\n\r\n", KH_H1_ENOHOST, "HEAD"},
        {"\r\nHEAD / " H11 HA "Transfer-Encoding: gzip, chunked\r\n\r\n", KH_H1_ETE, "HEAD"},
        {"HE(D / " H11 HA "\r\n", KH_H1_EMETHOD, NULL},
        {" HEAD / " H11 HA "\r\n", KH_H1_EMETHOD, NULL},
        {"HEAD\r\n\r\n", KH_H1_EBADREQ, NULL},
        {"\n", KH_H1_EBARELF, NULL},
    };
    kh_subtest("method on error");
    for (size_t i = 0; i < KH_ARRAY_LEN(mc); i++) {
        kh_h1_field f[MAXF];
        kh_h1_head h;
        memset(&h, 0, sizeof h);
        h.fields = f;
        size_t n = strlen(mc[i].in);
        ssize_t r = kh_h1_parse_request(mc[i].in, n, 0, &h, &lim_def);
        int ok = r == mc[i].want;
        if (mc[i].method)
            ok = ok && h.method.len == strlen(mc[i].method) && h.method.ptr >= mc[i].in &&
                 h.method.ptr + h.method.len <= mc[i].in + n &&
                 memcmp(h.method.ptr, mc[i].method, h.method.len) == 0;
        else
            ok = ok && h.method.len == 0 && h.method.ptr == NULL;
        if (!ok)
            printf("#   case %zu: r %zd, method len %zu\n", i, r, h.method.len);
        kh_ok(ok, "an error leaves the method it got to");
    }
}

static void test_host_ok(void)
{
    static const struct {
        const char *v;
        int ok;
    } hc[] = {
        {"x", 1},        {"x:80", 1},      {"x:", 1},          {"[::1]", 1},     {"[::1]:443", 1},
        {"%41.b", 1},    {"a-b.c_d~e", 1}, {"x:65535", 1},     {"", 0},          {"u@x", 0},
        {"x:99999", 0},  {"x:65536", 0},   {"x:80:80", 0},     {"[::1", 0},      {"x/admin", 0},
        {"x y", 0},      {":80", 0},       {"x:ab", 0},        {"[fe80::1%25eth0]", 0},
        {"x%zz", 0},     {"x\\y", 0},
    };
    kh_subtest("host_ok");
    for (size_t i = 0; i < KH_ARRAY_LEN(hc); i++) {
        int r = kh_h1_host_ok((kh_str){hc[i].v, strlen(hc[i].v)});
        if (r != hc[i].ok)
            printf("#   '%s': %d\n", hc[i].v, r);
        kh_ok(r == hc[i].ok, "kh_h1_host_ok on a Host/authority value");
    }
}

/* Field-value bytes at every offset of values of 1 to 48 bytes (both sides of the 16-byte
 * rounds of the parser's value scan and its byte-loop tail): a control byte or DEL anywhere is
 * refused, HTAB, SP, VCHAR and obs-text anywhere are taken, and the value's slice is whole. */
static void test_value_bytes(void)
{
    static const unsigned char bad[] = {0x00, 0x01, 0x08, 0x0b, 0x0c, 0x1f, 0x7f};
    static const unsigned char good[] = {0x09, 0x20, 0x21, 0x7e, 0x80, 0xa0, 0xff};
    char req[160];
    kh_h1_head h;
    kh_h1_field f[8];
    int bad_ok = 1, good_ok = 1;
    kh_subtest("value bytes at every offset");
    for (size_t len = 1; len <= 48; len++) {
        for (size_t at = 0; at < len; at++) {
            for (int kind = 0; kind < 2; kind++) {
                const unsigned char *set = kind ? good : bad;
                size_t nset = kind ? sizeof good : sizeof bad;
                for (size_t b = 0; b < nset; b++) {
                    size_t n = (size_t)snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: x\r\nX-V: ");
                    memset(req + n, 'a', len);
                    req[n + at] = (char)set[b];
                    n += len;
                    memcpy(req + n, "\r\n\r\n", 4);
                    n += 4;
                    ssize_t r = parse(req, n, 0, &h, f, &lim_def);
                    if (kind == 0 && r != KH_H1_EFIELDVALUE) {
                        printf("#   byte 0x%02x at %zu of %zu: %zd\n", set[b], at, len, r);
                        bad_ok = 0;
                    }
                    int edge_ws = (set[b] == 0x09 || set[b] == 0x20) && (at == 0 || at == len - 1);
                    if (kind == 1 && (r != (ssize_t)n || h.num_fields != 2 ||
                                      (!edge_ws && f[1].value.len != len))) {
                        printf("#   byte 0x%02x at %zu of %zu: %zd\n", set[b], at, len, r);
                        good_ok = 0;
                    }
                }
            }
        }
    }
    kh_ok(bad_ok, "a control byte or DEL at any offset of a value: EFIELDVALUE");
    kh_ok(good_ok, "HTAB, SP, VCHAR, obs-text at any offset of a value: taken whole");
}

int main(void)
{
    size_t nvalid = 0, nerr = 0;
    for (size_t i = 0; i < KH_ARRAY_LEN(pcases); i++) {
        run_pcase(&pcases[i]);
        if (pcases[i].want == OK)
            nvalid++;
        else
            nerr++;
    }
    printf("# %zu head cases (%zu valid, %zu incomplete or error)\n", KH_ARRAY_LEN(pcases), nvalid,
           nerr);
    for (size_t i = 0; i < KH_ARRAY_LEN(ccases); i++)
        run_ccase(&ccases[i]);
    test_chunked_extras();
    test_h2_settings();
    test_error_table();
    test_method_on_error();
    test_host_ok();
    test_value_bytes();
    return kh_test_done();
}
