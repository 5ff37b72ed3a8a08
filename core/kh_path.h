/* kh_path.h: request-path normalisation (RFC 3986 §6.2.2 and §5.2.4), sans-io.
 * Owns:  nothing; every function works on caller-owned bytes.
 * In:    a raw path (no query) from the request target or h2 :path; a route pattern; a param value.
 * Out:   the normalised path the router matches and req.path shows, or a KH_PATH_E* code (400).
 * Never: allocates, reads past len, writes more than the documented bound into out.
 *
 * The normal form (kh_path.c's header has the reasons, attack by attack):
 * - '%XX' with XX an unreserved character (ALPHA DIGIT - . _ ~) is decoded ("%61dmin" is
 *   "admin", "%2e%2E" is ".."); every other escape stays encoded with upper-case hex ("%2f" is
 *   "%2F"): an encoded '/' or '\' never becomes a separator here.
 * - runs of '/' are merged (nginx's merge_slashes on), then "." and ".." segments are removed
 *   (RFC 3986 §5.2.4); a ".." with nothing left to remove climbs above the root: KH_PATH_EROOT;
 *   a ".." that would remove a segment holding "%2F" or "%5C" is KH_PATH_EPOP (a proxy that
 *   decodes "%2F" sees two segments there, and its ".." removes only one).
 * - refused: '%' without two hex digits, "%00", decoded bytes that are not UTF-8 (overlong,
 *   surrogate, above U+10FFFF, truncated), a raw byte outside 0x21-0x7E, a raw '\' or '#'.
 * - "" and "*" (CONNECT, OPTIONS *) are returned as they are; anything else must start with '/'. */
#ifndef KH_PATH_H
#define KH_PATH_H

#include <stddef.h>
#include <sys/types.h>

#include "kh_common.h"

enum {
    KH_PATH_EESCAPE = -1, /* '%' not followed by two hex digits */
    KH_PATH_ENUL = -2,    /* %00 (or a NUL byte in a pattern) */
    KH_PATH_EUTF8 = -3,   /* the decoded bytes are not UTF-8 */
    KH_PATH_EBYTE = -4,   /* a raw byte a request path may not hold */
    KH_PATH_EROOT = -5,   /* ".." above the root */
    KH_PATH_EFORM = -6,   /* not "", "*" nor starting with '/' */
    KH_PATH_EDOT = -7,    /* KH_PATH_PATTERN: a "." or ".." segment */
    KH_PATH_EEMPTY = -8,  /* KH_PATH_PATTERN: an empty segment before the last ("//") */
    KH_PATH_EPOP = -9,    /* ".." would remove a segment holding "%2F" or "%5C" */
};

/* Pattern mode (route patterns, at load time): raw bytes a request path may not hold are
 * percent-encoded instead of refused ("/café" matches "/caf%C3%A9"), and dot segments and
 * empty inner segments are errors instead of being resolved (such a route could never match). */
#define KH_PATH_PATTERN 1u

/* Writes the normal form of in[0..len) to out and returns its length, or a KH_PATH_E* code.
 * out must hold len bytes (3 * len in pattern mode); the result is never longer than that, and
 * out must not overlap in. A path with no '%', no "//", no "/." and only plain bytes is copied
 * as it is, checked on the way by one table lookup per byte (the fast path). */
ssize_t kh_path_normalize(const char *in, size_t len, char *out, unsigned flags);

/* A short static text for a KH_PATH_E* code ("invalid %-escape", ...). */
const char *kh_path_strerror(ssize_t code);

/* 1 when the value, once percent-decoded, holds no ".." segment, taking '/', '\', "%2F" and
 * "%5C" (any hex case) as separators and "%2E" as '.'; else 0. The router calls it on every
 * param it captures: a :param or *splat never holds a traversal, whatever the path was. */
int kh_path_param_ok(const char *p, size_t n);

#endif
