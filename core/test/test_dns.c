/* test_dns.c: kh_dns answers IP literals at once with the port set, resolves a name off the
 * loop and then from its cache, drops the answer of a cancelled lookup, and classifies private
 * and loopback addresses (deny_private). */
#include <arpa/inet.h>
#include <string.h>

#include "kh_dns.h"
#include "kh_test.h"

static int calls, last_status, last_n;
static struct sockaddr_storage last[KH_DNS_MAX_ADDRS];

static void on_answer(void *arg, int status, const struct sockaddr_storage *a, int n)
{
    (void)arg;
    calls++;
    last_status = status;
    last_n = n;
    if (n > 0)
        memcpy(last, a, (size_t)n * sizeof *a);
}

static int priv(const char *ip)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    if (inet_pton(AF_INET, ip, &((struct sockaddr_in *)&ss)->sin_addr) == 1)
        ss.ss_family = AF_INET;
    else if (inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1)
        ss.ss_family = AF_INET6;
    return kh_dns_is_private((struct sockaddr *)&ss);
}

int main(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    kh_dns *d = kh_dns_new(&loop, 10000);
    struct sockaddr_storage out[KH_DNS_MAX_ADDRS];
    kh_dns_req *req;

    kh_subtest("literals");
    kh_is_int(kh_dns_resolve(d, "127.0.0.1", 6379, out, on_answer, NULL, &req), 1, "IPv4 at once");
    kh_is_int(ntohs(((struct sockaddr_in *)&out[0])->sin_port), 6379, "with the port");
    kh_is_int(kh_dns_resolve(d, "[::1]", 80, out, on_answer, NULL, &req), 1, "[::1] at once");
    kh_is_int(out[0].ss_family, AF_INET6, "an IPv6 address");
    kh_is_int(calls, 0, "no callback for an answer given at once");

    kh_subtest("a name: off the loop, then cached");
    int r = kh_dns_resolve(d, "localhost", 8080, out, on_answer, NULL, &req);
    kh_is_int(r, 0, "localhost starts a lookup");
    uv_run(&loop, UV_RUN_DEFAULT);
    kh_is_int(calls, 1, "one callback");
    kh_is_int(last_status, 0, "found");
    kh_ok(last_n >= 1, "at least one address");
    kh_is_int(last[0].ss_family, AF_INET, "IPv4 first");
    kh_is_int(ntohs(((struct sockaddr_in *)&last[0])->sin_port), 8080, "with the port");
    r = kh_dns_resolve(d, "localhost", 9090, out, on_answer, NULL, &req);
    kh_ok(r >= 1, "the second time from the cache");
    kh_is_int(ntohs(((struct sockaddr_in *)&out[0])->sin_port), 9090, "with this call's port");
    uint64_t hits, lookups;
    kh_dns_counts(d, &hits, &lookups);
    kh_is_int((int)hits, 1, "one cache hit");
    kh_is_int((int)lookups, 1, "one lookup");

    kh_subtest("cancel");
    r = kh_dns_resolve(d, "ip6-localhost", 1, out, on_answer, NULL, &req);
    if (r == 0) {
        kh_dns_cancel(req);
        uv_run(&loop, UV_RUN_DEFAULT);
        kh_is_int(calls, 1, "a cancelled lookup calls nobody");
    } else {
        kh_ok(1, "ip6-localhost answered at once (cached by the system): nothing to cancel");
    }
    kh_ok(kh_dns_resolve(d, "", 1, out, on_answer, NULL, &req) < 0, "an empty name is refused");

    kh_subtest("private and loopback addresses");
    const char *yes[] = {"127.0.0.1", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
                         "169.254.1.1", "100.64.0.1", "0.0.0.0", "::1", "::", "fc00::1",
                         "fd12::1", "fe80::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1"};
    const char *no[] = {"8.8.8.8", "172.32.0.1", "172.15.255.255", "100.128.0.1", "1.1.1.1",
                        "2001:db8::1", "::ffff:8.8.8.8", "192.169.0.1"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        kh_ok(priv(yes[i]), "%s is private", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        kh_ok(!priv(no[i]), "%s is public", no[i]);

    kh_dns_free(d);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return kh_test_done();
}
