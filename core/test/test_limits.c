/* test_limits.c: defaults, names with dashes or underscores, and range errors that name the
 * limit and its range. */
#include "kh_limits.h"
#include "kh_test.h"

int main(void)
{
    kh_limits l;
    char err[256];
    kh_limits_init(&l);
    kh_is_int(l.header_bytes, 16384, "header_bytes default");
    kh_is_int(l.body_bytes, 8388608, "body_bytes default");
    kh_is_int(kh_limits_set(&l, "header-bytes", "2048", err, sizeof err), 0, "dashes work");
    kh_is_int(l.header_bytes, 2048, "and set the value");
    kh_is_int(kh_limits_set(&l, "header_bytes", "4096", err, sizeof err), 0, "underscores work");
    kh_is_int(l.header_bytes, 4096, "and set the value");
    kh_is_int(kh_limits_set(&l, "header_bytes", "1", err, sizeof err), -1, "below min refused");
    kh_ok(strstr(err, "header_bytes") && strstr(err, "256") && strstr(err, "1048576"),
          "the message names the limit and its range: %s", err);
    kh_is_int(l.header_bytes, 4096, "a refused value changes nothing");
    kh_is_int(kh_limits_set(&l, "header_bytes", "12x", err, sizeof err), -1, "junk refused");
    kh_is_int(kh_limits_set(&l, "header_bytes", "-5", err, sizeof err), -1, "negative refused");
    kh_is_int(kh_limits_set(&l, "header_bytes", "", err, sizeof err), -1, "empty refused");
    kh_is_int(kh_limits_set(&l, "nope", "1", err, sizeof err), -1, "unknown name refused");
    kh_ok(strstr(err, "nope") != NULL, "the message names it: %s", err);
    kh_ok(kh_limits_is_name("keepalive-timeout-ms"), "is_name knows dashed names");
    kh_ok(!kh_limits_is_name("workers"), "and not other flags");
    return kh_test_done();
}
