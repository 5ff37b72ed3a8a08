/* kh_router.c: route matcher; a tree with one node per path segment.
 * Owns:  every node; a copy of each literal segment, param name and method string it was given.
 * In:    routes at load time (kh_router_add); a method and a raw path per request (match).
 * Out:   the route's value, params as slices into the caller's path, or 404/405 with Allow.
 * Never: allocates, calls strlen/strcmp or writes to the router while matching; decodes '%XX';
 *        knows what a value is.
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
 * The caller normalizes paths first; this is only the safe, deterministic fallback. A path that
 * is empty or does not start with '/' ("*", absolute form) is a 404.
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
 * but some node's path matched, the result is 405 with the Allow string of the first such node;
 * it is not a union over every matching node, so overlapping routes that split methods between
 * them list only the higher-precedence node's methods.
 *
 * Allow order: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, CONNECT, TRACE (those present), then
 * other methods in ascending byte order. HEAD is listed when GET or HEAD is registered. "*" is
 * never listed (a node with only an "any" route has Allow ""). Rebuilt on each add to the node. */
#include "kh_router.h"
#include "kh_err.h"

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
    char *allow; /* NULL until the node has a handler */
};

struct kh_router {
    route_node root; /* the node before the first segment; never holds handlers */
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
    const route_node *first; /* first node whose path matched, for the 405 */
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
    if (n->has_any)
        return &n->any_value;
    return NULL;
}

/* The path is used up at node n (which holds np params). */
static int match_end(const route_node *n, size_t np, match_ctx *cx)
{
    if (n->allow == NULL) /* no route ends here */
        return 0;
    const intptr_t *v = node_lookup(n, cx);
    if (v == NULL) {
        if (cx->first == NULL)
            cx->first = n;
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
        .first = NULL,
    };
    if (match_node(&r->root, path.ptr + 1, 0, &cx)) {
        m->status = 0;
        return 0;
    }
    m->value = 0;
    m->num_params = 0;
    if (cx.first) {
        m->allow = cx.first->allow;
        m->status = 405;
    } else {
        m->status = 404;
    }
    return m->status;
}

/* ---- building (load time) ---- */

kh_router *kh_router_new(void)
{
    return kh_xcalloc(1, sizeof(kh_router));
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

void kh_router_free(kh_router *r)
{
    if (r == NULL)
        return;
    node_free_children(&r->root);
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

/* The well-known methods, in the order Allow lists them; others follow in byte order. */
static const char *const allow_order[] = {"GET",    "HEAD",    "POST",    "PUT",  "PATCH",
                                          "DELETE", "OPTIONS", "CONNECT", "TRACE"};

static size_t method_rank(kh_str m)
{
    for (size_t i = 0; i < KH_ARRAY_LEN(allow_order); i++)
        if (kh_str_eq(m, allow_order[i], strlen(allow_order[i])))
            return i;
    return KH_ARRAY_LEN(allow_order);
}

static int allow_cmp(const void *a, const void *b)
{
    const kh_str *x = a, *y = b;
    size_t rx = method_rank(*x), ry = method_rank(*y);
    if (rx != ry)
        return rx < ry ? -1 : 1;
    size_t n = KH_MIN(x->len, y->len);
    int c = memcmp(x->ptr, y->ptr, n);
    if (c != 0)
        return c;
    return x->len < y->len ? -1 : x->len > y->len ? 1 : 0;
}

static void node_build_allow(route_node *n)
{
    kh_str *list = kh_xmalloc(sizeof(kh_str) * (n->nhandlers + 1));
    size_t count = 0, bytes = 1;
    int has_get = 0, has_head = 0;
    for (uint32_t i = 0; i < n->nhandlers; i++) {
        kh_str m = {n->handlers[i].method, n->handlers[i].method_len};
        has_get |= kh_str_eq(m, "GET", 3);
        has_head |= kh_str_eq(m, "HEAD", 4);
        list[count++] = m;
    }
    if (has_get && !has_head)
        list[count++] = KH_STR_LIT("HEAD");
    qsort(list, count, sizeof(kh_str), allow_cmp);
    for (size_t i = 0; i < count; i++)
        bytes += list[i].len + 2;
    char *s = kh_xmalloc(bytes), *w = s;
    for (size_t i = 0; i < count; i++) {
        if (i) {
            memcpy(w, ", ", 2);
            w += 2;
        }
        memcpy(w, list[i].ptr, list[i].len);
        w += list[i].len;
    }
    *w = '\0';
    free(list);
    free(n->allow);
    n->allow = s;
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
    for (size_t i = 0; i < method_len; i++)
        if (!is_tchar((unsigned char)method[i]))
            return fail(err, "invalid method token");
    int is_any = method_len == 1 && method[0] == '*';
    if (pattern_len == 0 || pattern[0] != '/')
        return fail(err, "pattern must start with '/'");

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
    }
    node_build_allow(w);
    return 0;
}
