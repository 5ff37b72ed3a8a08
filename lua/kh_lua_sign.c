/* kh_lua_sign.c: k.sign / k.unsign, values signed with HMAC-SHA256 (core/kh_sha256.c).
 * Owns:  nothing.
 * In:    sign(key, value) -> value .. "." .. base64url(HMAC-SHA256(key, value)) (43 characters,
 *        no padding); unsign(key, signed) -> value | nil (no '.', a signature that is not 43
 *        base64url characters, or one that does not match: compared in constant time).
 * Never: keeps a copy of the key. */
#include <string.h>

#include "kh_lua_internal.h"
#include "kh_sha256.h"

#define SIG_CHARS 43 /* base64url of 32 bytes, unpadded */

static int l_sign(lua_State *L)
{
    size_t kl, vl;
    const char *key = luaL_checklstring(L, 1, &kl);
    const char *val = luaL_checklstring(L, 2, &vl);
    uint8_t mac[KH_SHA256_LEN];
    char out[SIG_CHARS + 1];
    kh_hmac_sha256(key, kl, val, vl, mac);
    out[0] = '.';
    kh_base64url_encode(mac, sizeof mac, out + 1);
    lua_pushlstring(L, val, vl);
    lua_pushlstring(L, out, sizeof out);
    lua_concat(L, 2);
    return 1;
}

static int l_unsign(lua_State *L)
{
    size_t kl, sl;
    const char *key = luaL_checklstring(L, 1, &kl);
    const char *s = luaL_checklstring(L, 2, &sl);
    if (sl < SIG_CHARS + 1 || s[sl - SIG_CHARS - 1] != '.') {
        lua_pushnil(L);
        return 1;
    }
    size_t vl = sl - SIG_CHARS - 1;
    uint8_t got[KH_SHA256_LEN + 2], want[KH_SHA256_LEN];
    if (kh_base64url_decode(s + vl + 1, SIG_CHARS, got) != KH_SHA256_LEN) {
        lua_pushnil(L);
        return 1;
    }
    kh_hmac_sha256(key, kl, s, vl, want);
    if (!kh_ct_equal(got, want, KH_SHA256_LEN)) {
        lua_pushnil(L);
        return 1;
    }
    lua_pushlstring(L, s, vl);
    return 1;
}

/* Sets sign and unsign on the table on top. */
void kh__lua_open_sign(lua_State *L)
{
    lua_pushcfunction(L, l_sign);
    lua_setfield(L, -2, "sign");
    lua_pushcfunction(L, l_unsign);
    lua_setfield(L, -2, "unsign");
}
