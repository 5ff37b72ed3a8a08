/* kh_router.h: radix tree of routes, matched in C before any Lua runs.
 * Owns:  its nodes and copies of every pattern and method string it was given.
 * In:    routes at load time (method, pattern, opaque value); method + path at request time.
 * Out:   the value, the captured params (slices into the caller's path), or a 404 / 405 with Allow.
 * Never: knows what a value is (the Lua binding stores registry refs), touches I/O or Lua. */
#ifndef KH_ROUTER_H
#define KH_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "kh_common.h"

#define KH_ROUTER_MAX_PARAMS 16

typedef struct kh_router kh_router;

typedef struct kh_route_param {
    kh_str name;  /* points into the router (valid while the router lives) */
    kh_str value; /* points into the path given to kh_router_match (raw, not percent-decoded) */
} kh_route_param;

typedef struct kh_route_match {
    intptr_t value;    /* set when status == 0 */
    int status;        /* 0 found, 404 no such path, 405 path exists but not for this method */
    const char *allow; /* with 405 (and 0): "GET, HEAD, POST" for the matched node; NUL-terminated,
                          owned by the router. NULL with 404. */
    size_t num_params;
    kh_route_param params[KH_ROUTER_MAX_PARAMS];
} kh_route_match;

kh_router *kh_router_new(void);
void kh_router_free(kh_router *r);

/* Adds a route. method: an HTTP method token ("GET", "PURGE", ...) or "*" for any method.
 * pattern: starts with '/'; segments are literal, ":name" (one non-empty segment) or, as the last
 * segment only, "*name" (the rest of the path, possibly empty, may contain '/').
 * Precedence at match time: literal segment > :param > *splat, with backtracking.
 * A GET route also answers HEAD unless a HEAD route is set for the same pattern.
 * Returns 0, or KH_EINVAL with *err set to a static message (bad pattern, duplicate route,
 * conflicting param names at the same position, too many params).
 * Also refused (kh_router.c's header has the details): a method that is not an RFC 9110 token,
 * a param name outside [A-Za-z0-9_]+ or repeated within the pattern, a NULL argument. *err may be
 * NULL; it is set to NULL on success. A failed add leaves the router unchanged. */
int kh_router_add(kh_router *r, const char *method, size_t method_len, const char *pattern,
                  size_t pattern_len, intptr_t value, const char **err);

/* Matches a path (no query string). Fills *m. Returns m->status.
 * Never allocates and never writes to r, so a built router may be matched from several threads.
 * A HEAD request takes the HEAD route, else the GET route, else the "*" route. Params are set only
 * with status 0 (num_params is 0 with 404 and 405). Allow lists GET, HEAD, POST, PUT, PATCH,
 * DELETE, OPTIONS, CONNECT, TRACE in that order, then other methods in byte order; never "*". */
int kh_router_match(const kh_router *r, kh_str method, kh_str path, kh_route_match *m);

#endif
