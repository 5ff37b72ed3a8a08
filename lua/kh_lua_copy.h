/* kh_lua_copy.h: Lua values copied between states as flat bytes (k.blocking arguments and
 * results, publish values, cross-worker resolves), in the spirit of ngx_http_lua_xcopy.
 * Owns:  nothing but the kh_copybuf the caller hands in.
 * In:    nil, booleans, numbers, strings and tables of them (nested, without cycles).
 * Out:   one byte string; decoded back onto any lua_State.
 * Never: moves a Lua object between states (no lua_xmove), keeps a pointer into a state, or
 *        copies a function, userdata, thread or a table that contains itself: those are refused
 *        with a message that names the value's place ("argument 2.key.3: cannot copy a function").
 */
#ifndef KH_LUA_COPY_H
#define KH_LUA_COPY_H

#include <lua.h>
#include <stddef.h>

typedef struct kh_copybuf {
    char *p;
    size_t len, cap;
    size_t max; /* refuse past this many bytes */
} kh_copybuf;

/* Encodes the values at stack indexes first..last (inclusive; last < first encodes nothing)
 * onto b (malloc'd; the caller frees b->p even on failure). 0, or -1 with a message in err.
 * `what` and `number` name the values in messages: the value at `first` is "<what> <number>",
 * the next "<what> <number + 1>" (the numbers the user sees: k.blocking's first value after
 * the function is "argument 2"). */
int kh_lua_copy_encode(lua_State *L, int first, int last, int number, kh_copybuf *b,
                       const char *what, char *err, size_t errlen);
/* Pushes the values encoded in p..p+n. Returns how many, or -1 (corrupt input, no stack). */
int kh_lua_copy_decode(lua_State *L, const char *p, size_t n);

#endif
