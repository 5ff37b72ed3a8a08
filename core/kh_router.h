/* kh_router.h: radix tree of routes, matched in C before any Lua runs.
 * Owns:  its nodes and copies of every pattern and method string it was given.
 * In:    routes at load time (method, pattern, opaque value); method + path at request time
 *        (the path normalised by kh_path_normalize: the router does not resolve dot segments).
 * Out:   the value, the captured params (slices into the caller's path), or a 404 / 405 with
 *        Allow, or 400 when a captured param would decode to a ".." segment.
 * Never: knows what a value is (the Lua binding stores registry refs), touches I/O or Lua. */
#ifndef KH_ROUTER_H
#define KH_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "kh_common.h"

#define KH_ROUTER_MAX_PARAMS 16
/* Room for the longest Allow value: kh_router_add refuses a method that would make the list of
 * every distinct method of the router longer than this (NUL included), or a 65th method. */
#define KH_ROUTER_ALLOW_MAX 512

typedef struct kh_router kh_router;

typedef struct kh_route_param {
    kh_str name;  /* points into the router (valid while the router lives) */
    kh_str value; /* points into the path given to kh_router_match (raw, not percent-decoded) */
} kh_route_param;

typedef struct kh_route_match {
    intptr_t value;    /* set when status == 0 */
    int status;        /* 0 found, 404 no such path, 405 path exists but not for this method,
                          400 the route found captured a param that decodes to a ".." segment */
    const char *allow; /* NUL-terminated. 405: every method that some route matching the path
                          answers (in allow_buf). 0: the matched route's own methods (owned by
                          the router). NULL with 404 and 400. */
    size_t num_params;
    kh_route_param params[KH_ROUTER_MAX_PARAMS];
    char allow_buf[KH_ROUTER_ALLOW_MAX];
} kh_route_match;

kh_router *kh_router_new(void);
void kh_router_free(kh_router *r);

/* Adds a route. method: an HTTP method token ("GET", "PURGE", ...) or "*" for any method, or
 * "@" + a tunnel protocol ("@websocket"): a route kind of its own, matched only for a stream
 * the protocol marked as a tunnel request (kh_stream_mark_tunnel: an h1 GET + Upgrade, an h2
 * extended CONNECT with :protocol), never by "*", never listed in Allow, never reachable by a
 * request method (no HTTP method can start with '@'). Same patterns as other routes.
 * pattern: starts with '/'; segments are literal, ":name" (one non-empty segment) or, as the last
 * segment only, "*name" (the rest of the path, possibly empty, may contain '/'). The pattern is
 * put in kh_path's normal form first (KH_PATH_PATTERN: "%7e" is "~", "/café" is "/caf%C3%A9");
 * a "." or ".." segment, an empty segment before the last, a bad escape or non-UTF-8 is refused.
 * Precedence at match time: literal segment > :param > *splat, with backtracking.
 * A GET route also answers HEAD unless a HEAD route is set for the same pattern.
 * Returns 0, or KH_EINVAL with *err set to a static message (bad pattern, duplicate route,
 * conflicting param names at the same position, too many params, too many distinct methods).
 * Also refused (kh_router.c's header has the details): a method that is not an RFC 9110 token,
 * a param name outside [A-Za-z0-9_]+ or repeated within the pattern, a NULL argument. *err may be
 * NULL; it is set to NULL on success. A failed add leaves the router unchanged. */
int kh_router_add(kh_router *r, const char *method, size_t method_len, const char *pattern,
                  size_t pattern_len, intptr_t value, const char **err);

/* Matches a path (no query string). Fills *m. Returns m->status.
 * Never allocates and never writes to r, so a built router may be matched from several threads.
 * A HEAD request takes the HEAD route, else the GET route, else the "*" route. Params are set only
 * with status 0 (num_params is 0 with 404, 405 and 400). Allow lists GET, HEAD, POST, PUT, PATCH,
 * DELETE, OPTIONS, CONNECT, TRACE in that order, then other methods in byte order; never "*".
 * With 405 it is the union over every route whose pattern matches the path (a GET route on
 * "/health" and an OPTIONS splat route on "/": DELETE /health is 405, Allow "GET, HEAD, OPTIONS"). */
int kh_router_match(const kh_router *r, kh_str method, kh_str path, kh_route_match *m);

/* The app's value for requests no route answers (404, 405), or 0 (the default: the engine
 * answers those itself, without entering the app). The Lua binding sets it when the app has
 * middleware or error handlers (k.use, k.on_error). kh_router_match does not look at it. */
void kh_router_set_fallback(kh_router *r, intptr_t value);
intptr_t kh_router_fallback(const kh_router *r);

#endif
