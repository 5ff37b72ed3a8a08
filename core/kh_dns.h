/* kh_dns.h: host names to addresses for outbound sockets, without blocking the loop.
 * Owns:  a per-worker cache of answers (host -> up to KH_DNS_MAX_ADDRS addresses, kept
 *        dns_cache_ms), the lookups in flight (uv_getaddrinfo, which runs getaddrinfo on libuv's
 *        thread pool, off the loop).
 * In:    a host (name or IP literal) and a port from kh_out.
 * Out:   addresses with the port set, at once (literal, cache hit) or through a callback.
 * Never: calls the callback from inside kh_dns_resolve; calls it after kh_dns_cancel or
 *        kh_dns_free; shares its cache with another worker. */
#ifndef KH_DNS_H
#define KH_DNS_H

#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#define KH_DNS_MAX_ADDRS 8

typedef struct kh_dns kh_dns;
typedef struct kh_dns_req kh_dns_req;

/* status 0: n addresses (n >= 1); else a UV_E* code (UV_EAI_NONAME: no such host). */
typedef void (*kh_dns_cb)(void *arg, int status, const struct sockaddr_storage *addrs, int n);

kh_dns *kh_dns_new(uv_loop_t *loop, uint64_t cache_ms);
/* Lookups still in flight are orphaned: their callbacks never run, their memory is freed when
 * libuv reports them. */
void kh_dns_free(kh_dns *d);
/* Returns n >= 1 (addresses written to out) when answered now, 0 when a lookup started (cb
 * later; *req names it for kh_dns_cancel), or a UV_E* code. */
int kh_dns_resolve(kh_dns *d, const char *host, int port, struct sockaddr_storage out[KH_DNS_MAX_ADDRS],
                   kh_dns_cb cb, void *arg, kh_dns_req **req);
void kh_dns_cancel(kh_dns_req *req);
/* Counters for k.socket.stats(). */
void kh_dns_counts(const kh_dns *d, uint64_t *hits, uint64_t *lookups);

/* 1 if the address is loopback, private (RFC 1918, RFC 4193 fc00::/7), link-local, CGNAT
 * (100.64/10), unspecified, or IPv4-mapped one of those: what a server fetching user-supplied
 * URLs usually refuses (SSRF). */
int kh_dns_is_private(const struct sockaddr *sa);

#endif
