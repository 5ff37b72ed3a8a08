/* kh_router.c: route matcher; a tree with one node per path segment.
 * Owns:  every node; a copy of each literal segment, param name and method string it was given.
 * In:    routes at load time (kh_router_add); a method and a normalised path per request (match).
 * Out:   the route's value, params as slices into the caller's path, or 404/405 with Allow, or
 *        400 for a param that would decode to "..".
 * Never: allocates, calls strlen/strcmp or writes to the router while matching; decodes '%XX'
 *        (a param is only checked by kh_path_param_ok); knows what a value is.
 *
 * Why a segment tree rather than a compressed radix tree: params and the splat are whole
 * segments, so keying nodes by segment makes the three kinds of edge (literal, :param, *splat)
 * explicit and the precedence rule a plain "try in that order". Each node consumes exactly one
 * segment, so the node at depth d is only ever compared with segment d of the path: a match
 * visits each node at most once, and backtracking cannot blow up, whatever the routes. Literal
 * children are kept sorted by (length, bytes) and binary searched; lengths are compared before
 * any memcmp.
 *
 * Segments. What follows the leading '/' of a pattern or path is split on every '/'. "/" is one
 * empty segment, "/a" is {"a"}, "/a/" is {"a", ""}: the trailing slash is significant. The same
 * rule makes consecutive slashes deterministic: "//a" is {"", "a"}, "/a//b" is {"a", "", "b"}.
 * An empty segment matches only an empty literal segment of a pattern (a route written "/a//b"),
 * never a :param (which needs one non-empty segment); a splat captures it like any other byte.
 * The caller normalises paths first (kh_path_normalize merges "//" and removes dot segments), so
 * a request never has an inner empty segment; this rule is the safe, deterministic fallback for
 * a caller that did not. Patterns are normalised by kh_path too (KH_PATH_PATTERN), which refuses
 * dot segments and inner empty segments in them: a route "/a//b" or "/a/../b" could never match.
 * A path that is empty or does not start with '/' ("*", absolute form) is a 404.
 *
 * Params. A param or splat value is a slice of the (normalised) path: no raw ".." segment is
 * left in it, but "%2F" and "%5C" are kept encoded by kh_path, so "..%2F.." could decode to one.
 * After a match, every captured value goes through kh_path_param_ok, and one that fails makes
 * the result 400 (no backtracking to another route: the request names a traversal).
 *
 * Patterns. A segment starting with ':' is a param, one starting with '*' a splat (last segment
 * only); anything else is literal, ':' and '*' included when not first. Names are [A-Za-z0-9_]+
 * and unique within a pattern. The splat counts towards KH_ROUTER_MAX_PARAMS. Two routes may not
 * give the param (or the splat) at the same tree position different names: the name lives on the
 * shared node.
 *
 * Methods. Case-sensitive tokens (RFC 9110 §9.1, tchar of §5.6.2); "*" sets the node's "any"
 * route. A node answers a request with: the exact method, else GET when the request is HEAD
 * (RFC 9110 §9.3.2), else "any". The match is the first node, in precedence order (literal >
 * param > splat, depth first), whose path matches and which answers the method. If none answers
 * but some node's path matched, the result is 405, and Allow is the union of the methods of
 * every node whose path matched (a failed match has visited them all): every method listed
 * would be answered for this path, by one route or another.
 *
 * Method sets. The router numbers each distinct method (at most 64; the nine well-known ones
 * are 0-8, in Allow order) and each node keeps a 64-bit set of its methods, so the union is an
 * OR while matching and one formatting pass into kh_route_match.allow_buf at the end. The list
 * of every distinct method must fit KH_ROUTER_ALLOW_MAX, which bounds any union.
 *
 * Allow order: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, CONNECT, TRACE (those present), then
 * other methods in ascending byte order. HEAD is listed when GET or HEAD is registered. "*" is
 * never listed (a node with only an "any" route has Allow ""). A node's own Allow string (given
 * with a match) is rebuilt on each add to the node. */
#include "kh_router.h"
#include "kh_err.h"
#include "kh_path.h"

#include <stdlib.h>
#include <string.h>

typedef struct route_node route_node;

typedef struct route_handler {
    char *method; /* NUL-terminated copy */
    size_t method_len;
    intptr_t value;
} route_handler;

struct route_node {
    kh_str seg;        /* literal child: the segment text; param/splat child: the name (owned) */
    route_node **lits; /* literal children, sorted by (seg.len, bytes) */
    uint32_t nlits;
    uint32_t caplits;
    route_node *param; /* ":name" child */
    route_node *splat; /* "*name" child, always a leaf */
    route_handler *handlers;
    uint32_t nhandlers;
    uint32_t has_any;
    intptr_t any_value;
    uint64_t mset; /* bit i: the node answers method i (GET sets HEAD's bit too) */
    char *allow;   /* NULL until the node has a handler */
};

#define MAX_METHODS 64

struct kh_router {
    route_node root; /* the node before the first segment; never holds handlers */
    kh_str methods[MAX_METHODS]; /* by id; ids >= NKNOWN are owned copies */
    uint8_t order[MAX_METHODS];  /* ids in Allow order */
    uint32_t nmethods;
    size_t allow_all; /* strlen of the Allow list of every method */
    intptr_t fallback; /* kh_router_set_fallback: the app's value for 404/405, or 0 */
};

enum { SEG_LIT, SEG_PARAM, SEG_SPLAT };

/* ---- shared helpers ---- */

static int seg_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    if (alen != blen)
        return alen < blen ? -1 : 1;
    return alen ? memcmp(a, b, alen) : 0;
}

/* Binary search of the literal children: the child or NULL; *pos gets the insert position. */
static route_node *lit_search(const route_node *n, const char *s, size_t len, uint32_t *pos)
{
    uint32_t lo = 0, hi = n->nlits;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const route_node *c = n->lits[mid];
        int cmp = seg_cmp(c->seg.ptr, c->seg.len, s, len);
        if (cmp == 0) {
            *pos = mid;
            return n->lits[mid];
        }
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *pos = lo;
    return NULL;
}

/* ---- matching (hot path: no allocation, no strlen) ---- */

typedef struct match_ctx {
    const char *end; /* one past the last byte of the path */
    kh_str method;
    int is_head;
    kh_route_match *m;
    int matched;      /* some node's path matched (405 rather than 404) */
    uint64_t allow;   /* the union of those nodes' method sets */
} match_ctx;

static const intptr_t *node_lookup(const route_node *n, const match_ctx *cx)
{
    const route_handler *h = n->handlers;
    uint32_t nh = n->nhandlers;
    for (uint32_t i = 0; i < nh; i++)
        if (h[i].method_len == cx->method.len &&
            memcmp(h[i].method, cx->method.ptr, cx->method.len) == 0)
            return &h[i].value;
    if (cx->is_head) /* RFC 9110 §9.3.2: HEAD is GET without the content */
        for (uint32_t i = 0; i < nh; i++)
            if (h[i].method_len == 3 && memcmp(h[i].method, "GET", 3) == 0)
                return &h[i].value;
    if (n->has_any && !(cx->method.len && cx->method.ptr[0] == '@'))
        return &n->any_value; /* "*" answers every HTTP method, never a tunnel kind */
    return NULL;
}

/* The path is used up at node n (which holds np params). */
static int match_end(const route_node *n, size_t np, match_ctx *cx)
{
    if (n->allow == NULL) /* no route ends here */
        return 0;
    const intptr_t *v = node_lookup(n, cx);
    if (v == NULL) {
        cx->matched = 1;
        cx->allow |= n->mset;
        return 0;
    }
    cx->m->value = *v;
    cx->m->allow = n->allow;
    cx->m->num_params = np;
    return 1;
}

/* p: start of the next segment, or NULL when the path is used up. Recursion depth is bounded by the
 * depth of the tree (the longest pattern), not by the path. */
static int match_node(const route_node *n, const char *p, size_t np, match_ctx *cx)
{
    if (p == NULL)
        return match_end(n, np, cx);
    const char *slash = memchr(p, '/', (size_t)(cx->end - p));
    const char *q = slash ? slash : cx->end;
    const char *next = slash ? slash + 1 : NULL;
    size_t len = (size_t)(q - p);

    if (n->nlits) {
        uint32_t pos;
        const route_node *c = lit_search(n, p, len, &pos);
        if (c && match_node(c, next, np, cx))
            return 1;
    }
    /* np < MAX always holds (each node lies on a pattern that passed the limit); checked anyway. */
    if (n->param && len > 0 && np < KH_ROUTER_MAX_PARAMS) {
        cx->m->params[np].name = n->param->seg;
        cx->m->params[np].value = (kh_str){p, len};
        if (match_node(n->param, next, np + 1, cx))
            return 1;
    }
    if (n->splat && np < KH_ROUTER_MAX_PARAMS) {
        cx->m->params[np].name = n->splat->seg;
        cx->m->params[np].value = (kh_str){p, (size_t)(cx->end - p)};
        if (match_end(n->splat, np + 1, cx))
            return 1;
    }
    return 0;
}

/* Writes the methods of set in Allow order into buf (cap >= KH_ROUTER_ALLOW_MAX). */
static void format_allow(const kh_router *r, uint64_t set, char *buf)
{
    char *w = buf;
    for (uint32_t i = 0; i < r->nmethods; i++) {
        uint32_t id = r->order[i];
        if (!(set >> id & 1) || r->methods[id].ptr[0] == '@')
            continue; /* a tunnel kind ("@websocket") is no HTTP method */
        if (w != buf) {
            memcpy(w, ", ", 2);
            w += 2;
        }
        memcpy(w, r->methods[id].ptr, r->methods[id].len);
        w += r->methods[id].len;
    }
    *w = '\0';
}

int kh_router_match(const kh_router *r, kh_str method, kh_str path, kh_route_match *m)
{
    m->value = 0;
    m->allow = NULL;
    m->num_params = 0;
    if (KH_UNLIKELY(path.len == 0 || path.ptr[0] != '/')) {
        m->status = 404;
        return 404;
    }
    match_ctx cx = {
        .end = path.ptr + path.len,
        .method = method,
        .is_head = method.len == 4 && memcmp(method.ptr, "HEAD", 4) == 0,
        .m = m,
        .matched = 0,
        .allow = 0,
    };
    if (match_node(&r->root, path.ptr + 1, 0, &cx)) {
        m->status = 0;
        for (size_t i = 0; i < m->num_params; i++) {
            if (KH_UNLIKELY(!kh_path_param_ok(m->params[i].value.ptr, m->params[i].value.len))) {
                m->value = 0;
                m->num_params = 0;
                m->allow = NULL;
                m->status = 400;
                break;
            }
        }
        return m->status;
    }
    m->value = 0;
    m->num_params = 0;
    if (cx.matched) {
        format_allow(r, cx.allow, m->allow_buf);
        m->allow = m->allow_buf;
        m->status = 405;
    } else {
        m->status = 404;
    }
    return m->status;
}

/* ---- building (load time) ---- */

/* The well-known methods, in the order Allow lists them; others follow in byte order. */
static const char *const allow_order[] = {"GET",    "HEAD",    "POST",    "PUT",  "PATCH",
                                          "DELETE", "OPTIONS", "CONNECT", "TRACE"};
#define NKNOWN ((uint32_t)KH_ARRAY_LEN(allow_order))
enum { ID_GET = 0, ID_HEAD = 1 };

kh_router *kh_router_new(void)
{
    kh_router *r = kh_xcalloc(1, sizeof(kh_router));
    for (uint32_t i = 0; i < NKNOWN; i++) {
        r->methods[i] = (kh_str){allow_order[i], strlen(allow_order[i])};
        r->order[i] = (uint8_t)i;
        r->allow_all += (i ? 2 : 0) + r->methods[i].len;
    }
    r->nmethods = NKNOWN;
    return r;
}

static void node_free_children(route_node *n)
{
    for (uint32_t i = 0; i < n->nlits; i++) {
        node_free_children(n->lits[i]);
        free(n->lits[i]);
    }
    free(n->lits);
    if (n->param) {
        node_free_children(n->param);
        free(n->param);
    }
    if (n->splat) {
        node_free_children(n->splat);
        free(n->splat);
    }
    for (uint32_t i = 0; i < n->nhandlers; i++)
        free(n->handlers[i].method);
    free(n->handlers);
    free(n->allow);
    free((char *)n->seg.ptr);
}

void kh_router_set_fallback(kh_router *r, intptr_t value)
{
    r->fallback = value;
}

intptr_t kh_router_fallback(const kh_router *r)
{
    return r->fallback;
}

void kh_router_free(kh_router *r)
{
    if (r == NULL)
        return;
    node_free_children(&r->root);
    for (uint32_t i = NKNOWN; i < r->nmethods; i++)
        free((char *)r->methods[i].ptr);
    free(r);
}

static route_node *node_new(const char *s, size_t len)
{
    route_node *n = kh_xcalloc(1, sizeof(*n));
    n->seg.ptr = kh_xstrndup(s, len);
    n->seg.len = len;
    return n;
}

/* RFC 9110 §5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" /
 * "`" / "|" / "~" / DIGIT / ALPHA */
static int is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int is_name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* The method's id, or -1. */
static int method_id(const kh_router *r, const char *m, size_t len)
{
    for (uint32_t i = 0; i < r->nmethods; i++)
        if (kh_str_eq(r->methods[i], m, len))
            return (int)i;
    return -1;
}

/* Byte order, a shorter prefix first. */
static int method_cmp(kh_str a, kh_str b)
{
    int c = memcmp(a.ptr, b.ptr, KH_MIN(a.len, b.len));
    if (c != 0)
        return c;
    return a.len < b.len ? -1 : a.len > b.len ? 1 : 0;
}

/* Registers a new method (the caller checked the limits); returns its id. */
static uint32_t method_add(kh_router *r, const char *m, size_t len)
{
    uint32_t id = r->nmethods++;
    r->methods[id] = (kh_str){kh_xstrndup(m, len), len};
    r->allow_all += 2 + len;
    uint32_t pos = id; /* insertion sort among the custom methods, which follow the known ones */
    while (pos > NKNOWN && method_cmp(r->methods[r->order[pos - 1]], r->methods[id]) > 0) {
        r->order[pos] = r->order[pos - 1];
        pos--;
    }
    r->order[pos] = (uint8_t)id;
    return id;
}

static void node_build_allow(const kh_router *r, route_node *n)
{
    char buf[KH_ROUTER_ALLOW_MAX];
    format_allow(r, n->mset, buf);
    free(n->allow);
    n->allow = kh_xstrndup(buf, strlen(buf));
}

typedef struct seg_iter {
    const char *p, *end;
    int done;
} seg_iter;

/* Yields the segments of pattern[1..]; "/" gives one empty segment. */
static int seg_next(seg_iter *it, const char **s, size_t *len, int *last)
{
    if (it->done)
        return 0;
    const char *slash = memchr(it->p, '/', (size_t)(it->end - it->p));
    const char *q = slash ? slash : it->end;
    *s = it->p;
    *len = (size_t)(q - it->p);
    *last = slash == NULL;
    if (slash)
        it->p = slash + 1;
    else
        it->done = 1;
    return 1;
}

static int seg_kind(const char *s, size_t len)
{
    if (len > 0 && s[0] == ':')
        return SEG_PARAM;
    if (len > 0 && s[0] == '*')
        return SEG_SPLAT;
    return SEG_LIT;
}

static int fail(const char **err, const char *msg)
{
    *err = msg;
    return KH_EINVAL;
}

/* kh_router_add after the arguments were checked and the pattern normalised. */
static int add_route(kh_router *r, const char *method, size_t method_len, int is_any,
                     const char *pattern, size_t pattern_len, intptr_t value, const char **err)
{
    int mid = is_any ? -1 : method_id(r, method, method_len);
    if (!is_any && mid < 0 &&
        (r->nmethods == MAX_METHODS || r->allow_all + 2 + method_len >= KH_ROUTER_ALLOW_MAX))
        return fail(err, "too many distinct methods");

    /* Pass 1: check the whole pattern and walk the existing tree read-only, so that a failed add
     * leaves no trace (a half-built branch could later cause false name conflicts). */
    kh_str names[KH_ROUTER_MAX_PARAMS];
    size_t nparams = 0;
    const route_node *n = &r->root;
    seg_iter it = {pattern + 1, pattern + pattern_len, 0};
    const char *s;
    size_t len;
    int last;
    while (seg_next(&it, &s, &len, &last)) {
        int kind = seg_kind(s, len);
        if (kind == SEG_LIT) {
            /* "..%2F.." as a literal would be a traversal that a decoding proxy resolved */
            if (!kh_path_param_ok(s, len))
                return fail(err, "pattern has a segment that decodes to '..'");
            uint32_t pos;
            n = n ? lit_search(n, s, len, &pos) : NULL;
            continue;
        }
        if (kind == SEG_SPLAT && !last)
            return fail(err, "splat must be the last segment");
        kh_str name = {s + 1, len - 1};
        if (name.len == 0)
            return fail(err, "empty param name");
        for (size_t i = 0; i < name.len; i++)
            if (!is_name_char((unsigned char)name.ptr[i]))
                return fail(err, "param names must be [A-Za-z0-9_]+");
        if (nparams == KH_ROUTER_MAX_PARAMS)
            return fail(err, "too many params");
        for (size_t i = 0; i < nparams; i++)
            if (kh_str_eq(names[i], name.ptr, name.len))
                return fail(err, "duplicate param name in pattern");
        names[nparams++] = name;
        const route_node *c = n ? (kind == SEG_PARAM ? n->param : n->splat) : NULL;
        if (c && !kh_str_eq(c->seg, name.ptr, name.len))
            return fail(err, "conflicting param names at the same position");
        n = c;
    }
    if (n && is_any && n->has_any)
        return fail(err, "duplicate route");
    for (uint32_t i = 0; n && !is_any && i < n->nhandlers; i++)
        if (n->handlers[i].method_len == method_len &&
            memcmp(n->handlers[i].method, method, method_len) == 0)
            return fail(err, "duplicate route");

    /* Pass 2: build; nothing below can fail. */
    route_node *w = &r->root;
    it = (seg_iter){pattern + 1, pattern + pattern_len, 0};
    while (seg_next(&it, &s, &len, &last)) {
        int kind = seg_kind(s, len);
        route_node **slot;
        if (kind == SEG_LIT) {
            uint32_t pos;
            route_node *c = lit_search(w, s, len, &pos);
            if (c == NULL) {
                if (w->nlits == w->caplits) {
                    w->caplits = w->caplits ? w->caplits * 2 : 4;
                    w->lits = kh_xrealloc(w->lits, sizeof(*w->lits) * w->caplits);
                }
                memmove(&w->lits[pos + 1], &w->lits[pos], sizeof(*w->lits) * (w->nlits - pos));
                c = node_new(s, len);
                w->lits[pos] = c;
                w->nlits++;
            }
            w = c;
            continue;
        }
        slot = kind == SEG_PARAM ? &w->param : &w->splat;
        if (*slot == NULL)
            *slot = node_new(s + 1, len - 1);
        w = *slot;
    }
    if (is_any) {
        w->has_any = 1;
        w->any_value = value;
    } else {
        w->handlers = kh_xrealloc(w->handlers, sizeof(*w->handlers) * (w->nhandlers + 1));
        w->handlers[w->nhandlers++] =
            (route_handler){kh_xstrndup(method, method_len), method_len, value};
        if (mid < 0)
            mid = (int)method_add(r, method, method_len);
        w->mset |= (uint64_t)1 << mid;
        if (mid == ID_GET)
            w->mset |= (uint64_t)1 << ID_HEAD;
    }
    node_build_allow(r, w);
    return 0;
}

static const char *pattern_error(ssize_t code)
{
    switch (code) {
    case KH_PATH_EDOT: return "pattern has a '.' or '..' segment";
    case KH_PATH_EEMPTY: return "pattern has an empty segment ('//')";
    case KH_PATH_EESCAPE: return "pattern has an invalid %-escape";
    case KH_PATH_ENUL: return "pattern has a NUL byte or %00";
    case KH_PATH_EUTF8: return "pattern is not UTF-8";
    default: return "invalid pattern";
    }
}

int kh_router_add(kh_router *r, const char *method, size_t method_len, const char *pattern,
                  size_t pattern_len, intptr_t value, const char **err)
{
    const char *unused;
    if (err == NULL)
        err = &unused;
    *err = NULL;
    if (r == NULL || method == NULL || pattern == NULL)
        return fail(err, "null argument");
    if (method_len == 0)
        return fail(err, "invalid method token");
    /* "@name": a route of the tunnel kind `name` (kh_router.h) */
    for (size_t i = method[0] == '@' && method_len > 1 ? 1 : 0; i < method_len; i++)
        if (!is_tchar((unsigned char)method[i]))
            return fail(err, "invalid method token");
    int is_any = method_len == 1 && method[0] == '*';
    if (pattern_len == 0 || pattern[0] != '/')
        return fail(err, "pattern must start with '/'");
    if (pattern_len > SIZE_MAX / 4)
        return fail(err, "invalid pattern");
    /* Literal segments are compared with normalised paths byte for byte: normalise them alike. */
    char *norm = kh_xmalloc(pattern_len * 3);
    ssize_t nlen = kh_path_normalize(pattern, pattern_len, norm, KH_PATH_PATTERN);
    int rc = nlen < 0 ? fail(err, pattern_error(nlen))
                      : add_route(r, method, method_len, is_any, norm, (size_t)nlen, value, err);
    free(norm);
    return rc;
}
