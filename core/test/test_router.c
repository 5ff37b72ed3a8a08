/* test_router.c: unit tests for kh_router (TAP).
 * Owns:  the routers it builds and the guarded copies of each method and path it matches.
 * In:    -
 * Out:   TAP lines; exit status 0 when every assertion holds.
 * Never: lets an over-read pass: each path ends where a PROT_NONE page begins. */
#include "kh_err.h"
#include "kh_router.h"
#include "kh_test.h"

#include <stdio.h>

/* The last guarded copies; params of the last match point into them until the next match. */
static void *g_path_base, *g_method_base;
static size_t g_path_map, g_method_map;
static kh_route_match g_m;

static void guard_release(void)
{
    if (g_path_base)
        kh_test_guarded_free(g_path_base, g_path_map);
    if (g_method_base)
        kh_test_guarded_free(g_method_base, g_method_map);
    g_path_base = g_method_base = NULL;
}

/* Matches method + path (both guarded) into g_m and returns the status. */
static int match(kh_router *r, const char *method, const char *path)
{
    guard_release();
    size_t ml = strlen(method), pl = strlen(path);
    const char *mp = kh_test_guarded_copy(method, ml, &g_method_base, &g_method_map);
    const char *pp = kh_test_guarded_copy(path, pl, &g_path_base, &g_path_map);
    memset(&g_m, 0xa5, sizeof(g_m)); /* kh_router_match must set every field it promises */
    return kh_router_match(r, (kh_str){mp, ml}, (kh_str){pp, pl}, &g_m);
}

static int add(kh_router *r, const char *method, const char *pattern, intptr_t value)
{
    const char *err = NULL;
    int rc = kh_router_add(r, method, strlen(method), pattern, strlen(pattern), value, &err);
    if (rc != 0)
        printf("# add %s %s: %s\n", method, pattern, err ? err : "(no message)");
    return rc;
}

/* Expects kh_router_add to fail with KH_EINVAL and exactly this message. */
static void add_fails(kh_router *r, const char *method, const char *pattern, const char *want)
{
    const char *err = NULL;
    int rc = kh_router_add(r, method, strlen(method), pattern, strlen(pattern), 99, &err);
    kh_ok(rc == KH_EINVAL && err != NULL && strcmp(err, want) == 0, "add %s %s fails: %s", method,
          pattern, want);
    if (err && strcmp(err, want) != 0)
        printf("#   got '%s'\n", err);
}

/* Param i of the last match has this name and value. */
static void param_is(size_t i, const char *name, const char *value)
{
    if (!kh_ok(i < g_m.num_params, "param %zu exists (%zu params)", i, g_m.num_params))
        return;
    kh_is_str(g_m.params[i].name.ptr, g_m.params[i].name.len, name, "param %zu name", i);
    kh_is_str(g_m.params[i].value.ptr, g_m.params[i].value.len, value, "param %zu value", i);
}

static void test_literals(void)
{
    kh_subtest("literal routes, trailing slash");
    kh_router *r = kh_router_new();
    kh_is_int(add(r, "GET", "/", 1), 0, "add /");
    kh_is_int(add(r, "GET", "/users", 2), 0, "add /users");
    kh_is_int(add(r, "GET", "/users/", 3), 0, "add /users/ (a different route)");
    kh_is_int(add(r, "GET", "/a/b/c", 4), 0, "add /a/b/c");

    kh_is_int(match(r, "GET", "/"), 0, "/ found");
    kh_is_int(g_m.value, 1, "/ value");
    kh_is_int(g_m.num_params, 0, "/ has no params");
    kh_ok(g_m.allow != NULL && strcmp(g_m.allow, "GET, HEAD") == 0, "allow set on a match too");
    kh_is_int(match(r, "GET", "/users"), 0, "/users found");
    kh_is_int(g_m.value, 2, "/users value");
    kh_is_int(match(r, "GET", "/users/"), 0, "/users/ found");
    kh_is_int(g_m.value, 3, "/users/ value differs from /users");
    kh_is_int(match(r, "GET", "/a/b/c"), 0, "/a/b/c found");
    kh_is_int(g_m.value, 4, "/a/b/c value");
    kh_is_int(match(r, "GET", "/a/b"), 404, "/a/b (an inner node) is 404");
    kh_ok(g_m.allow == NULL, "404 has no allow");
    kh_is_int(g_m.value, 0, "404 value is 0");
    kh_is_int(g_m.num_params, 0, "404 has no params");
    kh_is_int(match(r, "GET", "/a/b/c/"), 404, "/a/b/c/ is 404");
    kh_is_int(match(r, "GET", "/user"), 404, "prefix of a literal is 404");
    kh_is_int(match(r, "GET", "/usersx"), 404, "extension of a literal is 404");
    kh_is_int(match(r, "GET", ""), 404, "empty path is 404");
    kh_is_int(match(r, "OPTIONS", "*"), 404, "asterisk form is 404");
    kh_is_int(match(r, "GET", "http://x/"), 404, "absolute form is 404");
    kh_router_free(r);
}

static void test_slashes(void)
{
    kh_subtest("empty segments and consecutive slashes");
    kh_router *r = kh_router_new();
    add(r, "GET", "/a", 1);
    add_fails(r, "GET", "/a//b", "pattern has an empty segment ('//')");
    add(r, "GET", "/p/:x", 3);
    add(r, "GET", "/s/*rest", 4);
    /* Requests come merged by kh_path; given raw, "//" is an empty segment (the fallback). */
    kh_is_int(match(r, "GET", "//a"), 404, "//a does not match /a");
    kh_is_int(match(r, "GET", "/a//b"), 404, "/a//b is 404");
    kh_is_int(match(r, "GET", "/p/"), 404, "a param never matches an empty segment");
    kh_is_int(match(r, "GET", "/p//"), 404, "/p// is 404");
    kh_is_int(match(r, "GET", "/s//x//"), 0, "a splat captures empty segments");
    param_is(0, "rest", "/x//");
    kh_is_int(match(r, "GET", "//"), 404, "// is 404");
    kh_is_int(match(r, "GET", "///////////"), 404, "a run of slashes is 404");
    kh_router_free(r);
}

static void test_params(void)
{
    kh_subtest("params");
    kh_router *r = kh_router_new();
    add(r, "GET", "/users/:id", 1);
    add(r, "GET", "/users/:id/posts/:post_id", 2);
    add(r, "GET", "/users/:id/", 3);
    kh_is_int(match(r, "GET", "/users/42"), 0, "/users/42 found");
    kh_is_int(g_m.value, 1, "value");
    kh_is_int(g_m.num_params, 1, "one param");
    param_is(0, "id", "42");
    kh_is_int(match(r, "GET", "/users/a%2Fb/posts/x:y*z"), 0, "two params found");
    kh_is_int(g_m.value, 2, "value");
    kh_is_int(g_m.num_params, 2, "two params");
    param_is(0, "id", "a%2Fb"); /* raw: never percent-decoded */
    param_is(1, "post_id", "x:y*z");
    kh_is_int(match(r, "GET", "/users/7/"), 0, "param then trailing slash");
    kh_is_int(g_m.value, 3, "value of /users/:id/");
    param_is(0, "id", "7");
    kh_is_int(match(r, "GET", "/users/"), 404, "empty param is 404");
    kh_is_int(match(r, "GET", "/users/1/posts"), 404, "missing second param is 404");
    kh_is_int(match(r, "GET", "/users/1/posts/2/3"), 404, "extra segment is 404");
    kh_router_free(r);
}

static void test_splat(void)
{
    kh_subtest("splat");
    kh_router *r = kh_router_new();
    add(r, "GET", "/static/*path", 1);
    add(r, "GET", "/u/:user/files/*file", 2);
    kh_is_int(match(r, "GET", "/static/"), 0, "/static/ matches with an empty splat");
    param_is(0, "path", "");
    kh_is_int(match(r, "GET", "/static/a/b/c.css"), 0, "deep splat");
    param_is(0, "path", "a/b/c.css");
    kh_is_int(match(r, "GET", "/static"), 404, "/static (no slash) does not match");
    kh_is_int(match(r, "GET", "/u/bob/files/x/y/"), 0, "param + splat");
    kh_is_int(g_m.num_params, 2, "two params");
    param_is(0, "user", "bob");
    param_is(1, "file", "x/y/");

    kh_router *root = kh_router_new();
    add(root, "GET", "/*all", 5);
    add(root, "GET", "/health", 6);
    kh_is_int(match(root, "GET", "/"), 0, "/*all matches /");
    param_is(0, "all", "");
    kh_is_int(match(root, "GET", "/health"), 0, "literal beats the root splat");
    kh_is_int(g_m.value, 6, "value");
    kh_is_int(g_m.num_params, 0, "no params for the literal");
    kh_is_int(match(root, "GET", "/health/x"), 0,
              "the splat takes the rest after a failed literal");
    kh_is_int(g_m.value, 5, "value");
    param_is(0, "all", "health/x");
    kh_router_free(root);
    kh_router_free(r);
}

static void test_precedence(void)
{
    kh_subtest("precedence and backtracking");
    kh_router *r = kh_router_new();
    add(r, "GET", "/a/:x/c", 1);
    add(r, "GET", "/a/b/d", 2);
    add(r, "GET", "/a/*rest", 3);
    add(r, "GET", "/a/b/c/:y", 4);
    kh_is_int(match(r, "GET", "/a/b/c"), 0, "/a/b/c: backtrack from literal b to :x");
    kh_is_int(g_m.value, 1, "value of /a/:x/c");
    param_is(0, "x", "b");
    kh_is_int(g_m.num_params, 1, "one param");
    kh_is_int(match(r, "GET", "/a/b/d"), 0, "/a/b/d: literal");
    kh_is_int(g_m.value, 2, "value");
    kh_is_int(g_m.num_params, 0, "no params");
    kh_is_int(match(r, "GET", "/a/b/e"), 0, "/a/b/e: falls through to the splat");
    kh_is_int(g_m.value, 3, "value");
    kh_is_int(g_m.num_params, 1, "the splat is the only param (stale :x not reported)");
    param_is(0, "rest", "b/e");
    kh_is_int(match(r, "GET", "/a/b/c/z"), 0, "/a/b/c/z: literal chain then :y");
    kh_is_int(g_m.value, 4, "value");
    param_is(0, "y", "z");

    kh_router *s = kh_router_new();
    add(s, "GET", "/x/:p", 10);
    add(s, "GET", "/x/literal", 11);
    add(s, "GET", "/x/*s", 12);
    kh_is_int(match(s, "GET", "/x/literal"), 0, "literal > param");
    kh_is_int(g_m.value, 11, "value");
    kh_is_int(match(s, "GET", "/x/other"), 0, "param > splat");
    kh_is_int(g_m.value, 10, "value");
    kh_is_int(match(s, "GET", "/x/other/more"), 0, "splat when the param cannot finish");
    kh_is_int(g_m.value, 12, "value");
    kh_router_free(s);
    kh_router_free(r);
}

static void test_methods(void)
{
    kh_subtest("404 vs 405, Allow, HEAD, any, custom methods");
    kh_router *r = kh_router_new();
    add(r, "POST", "/items", 1);
    add(r, "GET", "/items", 2);
    kh_is_int(match(r, "DELETE", "/items"), 405, "DELETE /items is 405");
    kh_ok(g_m.allow && strcmp(g_m.allow, "GET, HEAD, POST") == 0, "Allow: GET, HEAD, POST");
    kh_is_int(g_m.value, 0, "405 value is 0");
    kh_is_int(g_m.num_params, 0, "405 has no params");
    kh_is_int(match(r, "GET", "/nope"), 404, "unknown path is 404 whatever the method");
    kh_is_int(match(r, "get", "/items"), 405, "methods are case-sensitive");
    kh_is_int(match(r, "HEAD", "/items"), 0, "HEAD answered by GET");
    kh_is_int(g_m.value, 2, "HEAD uses the GET value");
    kh_is_int(match(r, "", "/items"), 405, "empty method is 405");

    add(r, "HEAD", "/items", 3);
    kh_is_int(match(r, "HEAD", "/items"), 0, "explicit HEAD");
    kh_is_int(g_m.value, 3, "explicit HEAD route wins over GET");
    kh_ok(g_m.allow && strcmp(g_m.allow, "GET, HEAD, POST") == 0, "HEAD listed once");

    add(r, "TRACE", "/items", 4);
    add(r, "BREW", "/items", 5);
    add(r, "PURGE", "/items", 6);
    add(r, "OPTIONS", "/items", 7);
    add(r, "PATCH", "/items", 8);
    add(r, "DELETE", "/items", 9);
    add(r, "PUT", "/items", 10);
    add(r, "CONNECT", "/items", 11);
    add(r, "B", "/items", 12);
    kh_is_int(match(r, "PURGE", "/items"), 0, "custom method PURGE");
    kh_is_int(g_m.value, 6, "PURGE value");
    kh_ok(g_m.allow && strcmp(g_m.allow, "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, CONNECT, "
                                         "TRACE, B, BREW, PURGE") == 0,
          "Allow order: known methods first, then byte order");
    if (g_m.allow)
        printf("#   allow '%s'\n", g_m.allow);

    add(r, "HEAD", "/head-only", 20);
    kh_is_int(match(r, "GET", "/head-only"), 405, "HEAD route does not answer GET");
    kh_ok(g_m.allow && strcmp(g_m.allow, "HEAD") == 0, "Allow: HEAD");

    add(r, "*", "/any", 30);
    kh_is_int(match(r, "FROB", "/any"), 0, "* answers any method");
    kh_is_int(g_m.value, 30, "any value");
    kh_ok(g_m.allow && strcmp(g_m.allow, "") == 0, "Allow is empty for an any-only node");
    add(r, "GET", "/any", 31);
    kh_is_int(match(r, "GET", "/any"), 0, "GET on a node with * and GET");
    kh_is_int(g_m.value, 31, "the exact method beats *");
    kh_is_int(match(r, "HEAD", "/any"), 0, "HEAD on a node with * and GET");
    kh_is_int(g_m.value, 31, "HEAD goes to GET before *");
    kh_is_int(match(r, "POST", "/any"), 0, "POST falls back to *");
    kh_is_int(g_m.value, 30, "any value");

    /* A node that matches the path but not the method must not hide a later one that does. */
    add(r, "GET", "/u/new", 40);
    add(r, "POST", "/u/:id", 41);
    kh_is_int(match(r, "POST", "/u/new"), 0, "POST /u/new backtracks to /u/:id");
    kh_is_int(g_m.value, 41, "value");
    param_is(0, "id", "new");
    kh_is_int(match(r, "DELETE", "/u/new"), 405, "no node answers DELETE");
    kh_ok(g_m.allow && strcmp(g_m.allow, "GET, HEAD, POST") == 0,
          "Allow is the union over every matching node (GET /u/new, POST /u/:id)");
    kh_ok(g_m.allow == g_m.allow_buf, "a 405's Allow lives in the match");
    kh_router_free(r);
}

static void test_allow_union(void)
{
    kh_subtest("405 Allow lists every method some route answers for the path (issue 8.7)");
    kh_router *r = kh_router_new();
    add(r, "GET", "/health", 1);
    add(r, "OPTIONS", "/*any", 2);
    kh_is_int(match(r, "OPTIONS", "/health"), 0, "OPTIONS /health answered by /*any");
    kh_is_int(g_m.value, 2, "value");
    kh_is_int(match(r, "DELETE", "/health"), 405, "DELETE /health is 405");
    kh_ok(g_m.allow && strcmp(g_m.allow, "GET, HEAD, OPTIONS") == 0, "Allow: GET, HEAD, OPTIONS");
    if (g_m.allow)
        printf("#   allow '%s'\n", g_m.allow);
    kh_is_int(match(r, "DELETE", "/other"), 405, "DELETE /other is 405");
    kh_ok(g_m.allow && strcmp(g_m.allow, "OPTIONS") == 0, "Allow: OPTIONS");

    add(r, "PURGE", "/:p", 3);
    add(r, "BREW", "/health", 4);
    add(r, "POST", "/h*", 5); /* a literal "h*", not a splat */
    kh_is_int(match(r, "DELETE", "/health"), 405, "three nodes match /health");
    kh_ok(g_m.allow && strcmp(g_m.allow, "GET, HEAD, OPTIONS, BREW, PURGE") == 0,
          "Allow: the union in Allow order, custom methods in byte order");
    if (g_m.allow)
        printf("#   allow '%s'\n", g_m.allow);
    kh_is_int(match(r, "GET", "/health"), 0, "GET /health");
    kh_ok(g_m.allow && strcmp(g_m.allow, "GET, HEAD, BREW") == 0,
          "a match gives its own node's Allow");
    add(r, "*", "/:p/x", 6);
    kh_is_int(match(r, "TRACE", "/health/x"), 0, "an any route answers: no 405");

    /* 64 distinct methods at most, and their whole list fits KH_ROUTER_ALLOW_MAX */
    kh_router *m = kh_router_new();
    char meth[16];
    int added = 0;
    for (int i = 0; i < 100; i++) {
        snprintf(meth, sizeof meth, "M%02d", i);
        const char *err = NULL;
        if (kh_router_add(m, meth, strlen(meth), "/x", 2, i, &err) == 0)
            added++;
        else if (i == added && strcmp(err, "too many distinct methods") != 0)
            printf("#   %s\n", err);
    }
    kh_is_int(added, 64 - 9, "55 custom methods beside the nine known ones");
    kh_is_int(match(m, "GET", "/x"), 405, "GET /x is 405");
    kh_ok(g_m.allow && strlen(g_m.allow) == 55 * 3 + 54 * 2, "all 55 listed");
    kh_is_int(add(m, "GET", "/x", 1), 0, "a known method is never refused");
    kh_router_free(m);
    kh_router *big = kh_router_new();
    char longm[200];
    memset(longm, 'A', sizeof longm);
    longm[199] = '\0';
    longm[0] = 'B';
    kh_is_int(add(big, longm, "/x", 1), 0, "a 199-byte method");
    longm[0] = 'C';
    kh_is_int(add(big, longm, "/x", 2), 0, "two");
    longm[0] = 'D';
    const char *err = NULL;
    kh_is_int(kh_router_add(big, longm, 199, "/x", 2, 3, &err), KH_EINVAL,
              "a third would not fit KH_ROUTER_ALLOW_MAX");
    kh_is_int(match(big, "GET", "/x"), 405, "405");
    kh_ok(g_m.allow && strlen(g_m.allow) < KH_ROUTER_ALLOW_MAX, "Allow fits");
    kh_router_free(big);
    kh_router_free(r);
}

static void test_traversal(void)
{
    kh_subtest("no :param or *splat holds a '..' segment; patterns are normalised");
    kh_router *r = kh_router_new();
    add(r, "GET", "/files/:name", 1);
    add(r, "GET", "/admin/*rest", 2);
    add(r, "GET", "/%7euser/caf\xc3\xa9", 3);
    add(r, "GET", "/lit/%2f", 4);
    kh_is_int(match(r, "GET", "/files/a%2Fb"), 0, "an encoded slash is one segment");
    param_is(0, "name", "a%2Fb");
    kh_is_int(match(r, "GET", "/files/..%2F..%2Fetc%2Fpasswd"), 400, "..%2F in a :param");
    kh_ok(g_m.allow == NULL && g_m.num_params == 0 && g_m.value == 0, "400 carries nothing");
    kh_is_int(match(r, "GET", "/files/..%5Cwin"), 400, "..%5C in a :param");
    kh_is_int(match(r, "GET", "/files/x%2F.."), 400, "a trailing /.. in a :param");
    kh_is_int(match(r, "GET", "/admin/x%2F..%2F..%2Fy"), 400, "..%2F in a *splat");
    kh_is_int(match(r, "GET", "/admin/a/b%2F..c"), 0, "'..c' is not a dot segment");
    param_is(0, "rest", "a/b%2F..c");
    /* defence in depth: a caller that skipped kh_path still never gets a '..' param */
    kh_is_int(match(r, "GET", "/admin/../x"), 400, "raw .. in a splat (unnormalised caller)");
    kh_is_int(match(r, "GET", "/files/.."), 400, "raw .. as a :param (unnormalised caller)");
    kh_is_int(match(r, "GET", "/~user/caf%C3%A9"), 0, "a pattern is normalised like a path");
    kh_is_int(g_m.value, 3, "value");
    kh_is_int(match(r, "GET", "/lit/%2F"), 0, "escapes in patterns are upper-cased");
    add_fails(r, "GET", "/a/../b", "pattern has a '.' or '..' segment");
    add_fails(r, "GET", "/a/%2e", "pattern has a '.' or '..' segment");
    add_fails(r, "GET", "/a/%zz", "pattern has an invalid %-escape");
    add_fails(r, "GET", "/a/..%2Fb", "pattern has a segment that decodes to '..'");
    add_fails(r, "GET", "/a/%2e%2e%5c", "pattern has a segment that decodes to '..'");
    add_fails(r, "GET", "/a/%00", "pattern has a NUL byte or %00");
    add_fails(r, "GET", "/\xc0\xae", "pattern is not UTF-8");
    kh_router_free(r);
}

static void test_errors(void)
{
    kh_subtest("add errors");
    kh_router *r = kh_router_new();
    add(r, "GET", "/p/:id", 1);
    add(r, "GET", "/s/*rest", 2);
    add(r, "GET", "/dup", 3);
    add(r, "*", "/dupany", 4);
    add_fails(r, "GET", "", "pattern must start with '/'");
    add_fails(r, "GET", "users", "pattern must start with '/'");
    add_fails(r, "GET", "/a/:", "empty param name");
    add_fails(r, "GET", "/a/*", "empty param name");
    add_fails(r, "GET", "/a/:/b", "empty param name");
    add_fails(r, "GET", "/f/:name.json", "param names must be [A-Za-z0-9_]+");
    add_fails(r, "GET", "/a/*rest/b", "splat must be the last segment");
    add_fails(r, "GET", "/a/*rest/", "splat must be the last segment");
    add_fails(r, "GET", "/dup", "duplicate route");
    add_fails(r, "*", "/dupany", "duplicate route");
    add_fails(r, "GET", "/p/:id", "duplicate route");
    add_fails(r, "GET", "/p/:other", "conflicting param names at the same position");
    add_fails(r, "POST", "/p/:other/x", "conflicting param names at the same position");
    add_fails(r, "GET", "/s/*other", "conflicting param names at the same position");
    add_fails(r, "GET", "/d/:a/:a", "duplicate param name in pattern");
    const char *err = "unset";
    add_fails(r, "", "/x", "invalid method token");
    add_fails(r, "GE T", "/x", "invalid method token");
    add_fails(r, "GET,", "/x", "invalid method token");
    kh_is_int(kh_router_add(r, "G\0T", 3, "/x", 2, 1, &err), KH_EINVAL, "NUL in a method");
    add_fails(r, "GÉT", "/x", "invalid method token");
    add_fails(r, "GET", "/:a/:b/:c/:d/:e/:f/:g/:h/:i/:j/:k/:l/:m/:n/:o/:p/:q", "too many params");
    add_fails(r, "GET", "/:a/:b/:c/:d/:e/:f/:g/:h/:i/:j/:k/:l/:m/:n/:o/:p/*q", "too many params");

    kh_is_int(kh_router_add(r, "GET", 3, NULL, 0, 1, &err), KH_EINVAL, "NULL pattern");
    kh_is_int(kh_router_add(r, "GET", 3, "/x", 2, 1, NULL), 0, "err may be NULL");
    kh_is_int(kh_router_add(r, "GET", 3, "/y", 2, 1, &err), 0, "success");
    kh_ok(err == NULL, "*err is NULL on success");

    /* A failed add leaves no trace: the conflicting :other was never created. */
    add_fails(r, "GET", "/q/:a/*b/c", "splat must be the last segment");
    kh_is_int(add(r, "GET", "/q/:z", 5), 0, "no ghost :a left by the failed add");
    add_fails(r, "GET", "/m/:a/:b/:a", "duplicate param name in pattern");
    kh_is_int(add(r, "GET", "/m/:x", 6), 0, "no ghost left by the duplicate-name add");
    kh_is_int(match(r, "GET", "/p/5"), 0, "/p/:id still matches");
    param_is(0, "id", "5");

    /* 16 params is the limit, and all of them come back. */
    kh_is_int(add(r, "GET", "/:a/:b/:c/:d/:e/:f/:g/:h/:i/:j/:k/:l/:m/:n/:o/*p", 7), 0,
              "16 params are accepted");
    kh_is_int(match(r, "GET", "/1/2/3/4/5/6/7/8/9/10/11/12/13/14/15/16/17"), 0, "16-param match");
    kh_is_int(g_m.num_params, 16, "16 params");
    param_is(15, "p", "16/17");
    param_is(9, "j", "10");
    kh_router_free(r);
}

static void test_many(void)
{
    kh_subtest("1000 generated routes");
    kh_router *r = kh_router_new();
    char pat[128], path[128];
    int add_ok = 1, match_ok = 1, param_ok = 1;
    static const char *const methods[] = {"GET", "POST", "PUT", "DELETE"};
    for (int i = 0; i < 1000; i++) {
        switch (i % 4) {
        case 0:
            snprintf(pat, sizeof(pat), "/r%d", i);
            break;
        case 1:
            snprintf(pat, sizeof(pat), "/r%d/:id", i);
            break;
        case 2:
            snprintf(pat, sizeof(pat), "/g/%d/:id/x/*rest", i);
            break;
        default:
            snprintf(pat, sizeof(pat), "/g/%d/%d/", i, i * 7);
            break;
        }
        add_ok &= add(r, methods[i % 4], pat, 1000 + i) == 0;
    }
    kh_ok(add_ok, "all 1000 routes added");
    for (int i = 0; i < 1000; i++) {
        switch (i % 4) {
        case 0:
            snprintf(path, sizeof(path), "/r%d", i);
            break;
        case 1:
            snprintf(path, sizeof(path), "/r%d/v%d", i, i);
            break;
        case 2:
            snprintf(path, sizeof(path), "/g/%d/v%d/x/a/b", i, i);
            break;
        default:
            snprintf(path, sizeof(path), "/g/%d/%d/", i, i * 7);
            break;
        }
        if (match(r, methods[i % 4], path) != 0 || g_m.value != 1000 + i) {
            match_ok = 0;
            printf("#   %s %s -> %d\n", methods[i % 4], path, g_m.status);
        }
        if (i % 4 == 1 || i % 4 == 2) {
            char want[32];
            snprintf(want, sizeof(want), "v%d", i);
            param_ok &= g_m.num_params == (size_t)(i % 4) &&
                        g_m.params[0].value.len == strlen(want) &&
                        memcmp(g_m.params[0].value.ptr, want, strlen(want)) == 0;
        }
    }
    kh_ok(match_ok, "each of the 1000 routes matches its own value");
    kh_ok(param_ok, "each generated param route captures its value");
    kh_is_int(match(r, "POST", "/r0"), 405, "/r0 exists for GET only");
    kh_ok(g_m.allow && strcmp(g_m.allow, "GET, HEAD") == 0, "Allow: GET, HEAD");
    kh_is_int(match(r, "POST", "/r1/x"), 0, "/r1/:id (POST)");
    kh_is_int(match(r, "POST", "/r1"), 404, "/r1 alone is 404");
    kh_is_int(match(r, "GET", "/r1000"), 404, "/r1000 is 404");
    kh_router_free(r);
}

/* Tunnel kinds ("@websocket", kh_router.h): their own routes, reached only by that kind, never
 * by "*", never listed in Allow. */
static void test_tunnel_kind(void)
{
    kh_router *r = kh_router_new();
    kh_ok(add(r, "@websocket", "/ws/:room", 1) == 0, "add @websocket /ws/:room");
    kh_ok(add(r, "GET", "/ws/:room", 2) == 0, "add GET on the same pattern");
    kh_ok(add(r, "*", "/any", 3) == 0, "add * /any");
    kh_ok(add(r, "@websocket", "/only", 4) == 0, "add @websocket /only");
    kh_ok(match(r, "@websocket", "/ws/a") == 0 && g_m.value == 1, "the kind reaches its route");
    param_is(0, "room", "a");
    kh_ok(match(r, "GET", "/ws/a") == 0 && g_m.value == 2, "GET reaches the GET route");
    kh_ok(match(r, "@websocket", "/any") == 405, "'*' does not answer a tunnel kind");
    kh_ok(match(r, "GET", "/only") == 405 && strcmp(g_m.allow, "") == 0,
          "a path with only a tunnel route: 405 with an empty Allow (kh_stream answers 426)");
    kh_ok(match(r, "POST", "/ws/a") == 405 && strcmp(g_m.allow, "GET, HEAD") == 0,
          "Allow never lists the kind: '%s'", g_m.allow);
    add_fails(r, "@", "/x", "invalid method token");
    add_fails(r, "@web socket", "/x", "invalid method token");
    kh_router_free(r);
}

int main(void)
{
    test_tunnel_kind();
    test_literals();
    test_slashes();
    test_params();
    test_splat();
    test_precedence();
    test_methods();
    test_allow_union();
    test_traversal();
    test_errors();
    test_many();
    kh_router_free(NULL);
    guard_release();
    return kh_test_done();
}
