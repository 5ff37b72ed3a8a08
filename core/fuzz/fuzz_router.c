/* fuzz_router.c: libFuzzer target for kh_router.
 * Owns:  two routers per input (the fixed route set, and a scratch copy that also gets the input
 *        as a pattern), both freed before returning; exact-size copies of the method and path.
 * In:    "METHOD\0PATH" (no NUL: the whole input is a GET path).
 * Out:   a trap on any broken property, for the raw path and for its kh_path normal form:
 *        - status is 0, 400, 404 or 405; allow is NULL exactly with 404 and 400; num_params <=
 *          the maximum;
 *        - every param value lies inside the path, every name inside the router;
 *        - the result equals a brute-force reference matcher (the first route in precedence order
 *          whose pattern matches and which answers the method; 400 when one of its params fails
 *          kh_path_param_ok; else 405 with the union of the methods of every matching pattern);
 *        - no param of a status-0 match decodes to a ".." segment;
 *        - a pattern that kh_router_add accepts, in its normal form (KH_PATH_PATTERN), matches
 *          itself taken as a path, with that method.
 * Never: keeps state between inputs. */
#include "kh_err.h"
#include "kh_path.h"
#include "kh_router.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static const struct {
    const char *method, *pattern;
} routes[] = {
    {"GET", "/"},
    {"GET", "/users"},
    {"GET", "/users/"},
    {"POST", "/users"},
    {"GET", "/users/me"},
    {"GET", "/users/:id"},
    {"PUT", "/users/:id"},
    {"DELETE", "/users/:id"},
    {"GET", "/users/:id/posts/:post"},
    {"GET", "/users/:id/files/*path"},
    {"*", "/any/:x"},
    {"GET", "/h"},
    {"HEAD", "/h"},
    {"PURGE", "/cache/*key"},
    {"GET", "/static/*file"},
    {"GET", "/a/:x/c"},
    {"GET", "/a/b/d"},
    {"GET", "/a/*rest"},
    {"GET", "/a/b/"},
    {"GET", "/health"},
    {"OPTIONS", "/*any"},
    {"GET", "/:lang/docs"},
    {"GET", "/u/new"},
    {"POST", "/u/:id"},
    {"OPTIONS", "/x/*all"},
};
#define NROUTES KH_ARRAY_LEN(routes)

static kh_router *build(void)
{
    kh_router *r = kh_router_new();
    for (size_t i = 0; i < NROUTES; i++) {
        const char *err = NULL;
        int rc = kh_router_add(r, routes[i].method, strlen(routes[i].method), routes[i].pattern,
                               strlen(routes[i].pattern), (intptr_t)(i + 1), &err);
        CHECK(rc == 0);
    }
    return r;
}

/* ---- reference matcher: each route on its own, no tree ---- */

typedef struct ref_result {
    int kinds[64]; /* 0 literal, 1 param, 2 splat, per pattern segment */
    size_t nkinds;
    kh_str vals[KH_ROUTER_MAX_PARAMS];
    size_t nvals;
} ref_result;

static int ref_pattern_matches(const char *pat, const char *path, size_t len, ref_result *out)
{
    out->nkinds = out->nvals = 0;
    if (len == 0 || path[0] != '/')
        return 0;
    const char *end = path + len, *p = path + 1; /* p == NULL: path used up */
    const char *s = pat + 1;
    for (;;) {
        const char *slash = strchr(s, '/');
        size_t slen = slash ? (size_t)(slash - s) : strlen(s);
        if (p == NULL)
            return 0;
        const char *q = memchr(p, '/', (size_t)(end - p));
        size_t plen = q ? (size_t)(q - p) : (size_t)(end - p);
        if (slen > 0 && s[0] == '*') {
            out->kinds[out->nkinds++] = 2;
            out->vals[out->nvals++] = (kh_str){p, (size_t)(end - p)};
            return 1; /* the splat is last */
        }
        if (slen > 0 && s[0] == ':') {
            if (plen == 0)
                return 0;
            out->kinds[out->nkinds++] = 1;
            out->vals[out->nvals++] = (kh_str){p, plen};
        } else {
            if (plen != slen || memcmp(p, s, slen) != 0)
                return 0;
            out->kinds[out->nkinds++] = 0;
        }
        p = q ? q + 1 : NULL;
        if (slash == NULL)
            return p == NULL;
        s = slash + 1;
    }
}

static int kinds_cmp(const ref_result *a, const ref_result *b)
{
    size_t n = KH_MIN(a->nkinds, b->nkinds);
    for (size_t i = 0; i < n; i++)
        if (a->kinds[i] != b->kinds[i])
            return a->kinds[i] < b->kinds[i] ? -1 : 1;
    return (a->nkinds > b->nkinds) - (a->nkinds < b->nkinds);
}

static int method_is(kh_str m, const char *s)
{
    return kh_str_eq(m, s, strlen(s));
}

/* The value the pattern's node answers method with, or 0. */
static intptr_t ref_node_answer(const char *pat, kh_str method)
{
    intptr_t get = 0, any = 0;
    for (size_t i = 0; i < NROUTES; i++) {
        if (strcmp(routes[i].pattern, pat) != 0)
            continue;
        if (method_is(method, routes[i].method))
            return (intptr_t)(i + 1);
        if (strcmp(routes[i].method, "GET") == 0)
            get = (intptr_t)(i + 1);
        if (strcmp(routes[i].method, "*") == 0)
            any = (intptr_t)(i + 1);
    }
    if (get && method_is(method, "HEAD"))
        return get;
    /* "*" answers request methods, not route kinds: an "@websocket" tunnel must not land on a
     * catch-all route that expects a plain request. */
    if (method.len && method.ptr[0] == '@')
        return 0;
    return any;
}

/* Allow for a set of patterns (pats[i] set: pattern of routes[i] matched), written out
 * independently of kh_router.c: the fixed routes use only these methods, so listing them in the
 * documented order is enough. */
static void ref_allow(const int *pats, char *out, size_t cap)
{
    static const char *const order[] = {"GET",    "HEAD",    "POST",    "PUT",   "PATCH",
                                        "DELETE", "OPTIONS", "CONNECT", "TRACE", "PURGE"};
    int present[KH_ARRAY_LEN(order)] = {0};
    for (size_t i = 0; i < NROUTES; i++)
        for (size_t j = 0; j < KH_ARRAY_LEN(order); j++)
            if (pats[i] && strcmp(routes[i].method, order[j]) == 0)
                present[j] = 1;
    present[1] |= present[0]; /* HEAD with GET */
    out[0] = '\0';
    for (size_t j = 0; j < KH_ARRAY_LEN(order); j++) {
        if (!present[j])
            continue;
        if (out[0])
            strncat(out, ", ", cap - strlen(out) - 1);
        strncat(out, order[j], cap - strlen(out) - 1);
    }
}

static void check_against_reference(const kh_route_match *m, kh_str method, kh_str path)
{
    ref_result cur, best_answer = {0}; /* gcc -O3 cannot see the have_* guards */
    const char *answer_pat = NULL;
    char allow[128];
    int have_answer = 0, have_match = 0;
    int matched[NROUTES] = {0}, own[NROUTES] = {0};
    intptr_t answer = 0;
    for (size_t i = 0; i < NROUTES; i++) {
        if (!ref_pattern_matches(routes[i].pattern, path.ptr, path.len, &cur))
            continue;
        matched[i] = 1;
        have_match = 1;
        intptr_t v = ref_node_answer(routes[i].pattern, method);
        if (v && (!have_answer || kinds_cmp(&cur, &best_answer) < 0)) {
            best_answer = cur;
            answer = v;
            answer_pat = routes[i].pattern;
            have_answer = 1;
        }
    }
    if (have_answer) {
        int bad = 0;
        for (size_t i = 0; i < best_answer.nvals; i++)
            bad |= !kh_path_param_ok(best_answer.vals[i].ptr, best_answer.vals[i].len);
        if (bad) {
            CHECK(m->status == 400 && m->value == 0 && m->num_params == 0);
            return;
        }
        CHECK(m->status == 0);
        CHECK(m->value == answer);
        CHECK(m->num_params == best_answer.nvals);
        for (size_t i = 0; i < m->num_params; i++)
            CHECK(m->params[i].value.ptr == best_answer.vals[i].ptr &&
                  m->params[i].value.len == best_answer.vals[i].len);
        for (size_t i = 0; i < NROUTES; i++)
            own[i] = strcmp(routes[i].pattern, answer_pat) == 0;
        ref_allow(own, allow, sizeof(allow));
        CHECK(strcmp(m->allow, allow) == 0);
    } else if (have_match) {
        CHECK(m->status == 405);
        ref_allow(matched, allow, sizeof(allow));
        CHECK(strcmp(m->allow, allow) == 0);
    } else {
        CHECK(m->status == 404);
    }
}

static void check_match(const kh_route_match *m, int rc, kh_str path)
{
    CHECK(rc == m->status);
    CHECK(m->status == 0 || m->status == 400 || m->status == 404 || m->status == 405);
    CHECK((m->allow == NULL) == (m->status == 404 || m->status == 400));
    if (m->allow)
        CHECK(strlen(m->allow) < 4096);
    CHECK(m->num_params <= KH_ROUTER_MAX_PARAMS);
    if (m->status != 0)
        CHECK(m->num_params == 0 && m->value == 0);
    for (size_t i = 0; i < m->num_params; i++) {
        kh_str v = m->params[i].value, n = m->params[i].name;
        CHECK(v.ptr >= path.ptr && v.len <= path.len &&
              (size_t)(v.ptr - path.ptr) <= path.len - v.len);
        CHECK(n.ptr != NULL && n.len > 0);
        CHECK(kh_path_param_ok(v.ptr, v.len));
        for (size_t j = 0; j < n.len; j++) /* names come from valid patterns */
            CHECK(n.ptr[j] != '/' && n.ptr[j] != ':' && n.ptr[j] != '*');
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    size_t mlen = nul ? (size_t)(nul - data) : 3;
    size_t plen = nul ? size - mlen - 1 : size;
    /* Exact-size copies: ASan sees any read past either end. */
    char *mbuf = malloc(mlen ? mlen : 1), *pbuf = malloc(plen ? plen : 1);
    memcpy(mbuf, nul ? (const char *)data : "GET", mlen);
    if (plen)
        memcpy(pbuf, nul ? (const char *)nul + 1 : (const char *)data, plen);
    kh_str method = {mbuf, mlen}, path = {pbuf, plen};

    kh_router *r = build();
    kh_route_match m;
    int rc = kh_router_match(r, method, path, &m);
    check_match(&m, rc, path);
    check_against_reference(&m, method, path);
    /* what the engine matches: the normal form (exact size, again for ASan) */
    char *nbuf = malloc(plen ? plen : 1);
    ssize_t nlen = kh_path_normalize(pbuf, plen, nbuf, 0);
    if (nlen >= 0) {
        char *exact = malloc(nlen ? (size_t)nlen : 1);
        memcpy(exact, nbuf, (size_t)nlen);
        kh_str npath = {exact, (size_t)nlen};
        rc = kh_router_match(r, method, npath, &m);
        check_match(&m, rc, npath);
        check_against_reference(&m, method, npath);
        free(exact);
    }
    free(nbuf);
    kh_router_free(r);

    /* The input as a pattern beside the fixed routes (duplicates and name conflicts are likely). */
    kh_router *scratch = build();
    const char *err = NULL;
    rc = kh_router_add(scratch, mbuf, mlen, pbuf, plen, -1, &err);
    CHECK(rc == 0 ? err == NULL : rc == KH_EINVAL && err != NULL);
    if (rc == 0) {
        /* literals match themselves, ":name" is a non-empty segment, "*name" is the rest */
        char *pat = malloc(plen * 3);
        ssize_t patlen = kh_path_normalize(pbuf, plen, pat, KH_PATH_PATTERN);
        CHECK(patlen > 0);
        kh_str ppath = {pat, (size_t)patlen};
        rc = kh_router_match(scratch, method, ppath, &m);
        check_match(&m, rc, ppath);
        CHECK(rc == 0);
        free(pat);
    }
    kh_router_free(scratch);

    free(mbuf);
    free(pbuf);
    return 0;
}
