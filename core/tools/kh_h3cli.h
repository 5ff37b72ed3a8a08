/* kh_h3cli.h: the QUIC + HTTP/3 client code that kh_h3get.c and kh_h3load.c share, on the
 * ngtcp2 0.12 + GnuTLS + nghttp3 0.8 client APIs (test tools, not part of the server).
 * Owns:  nothing global; a kh_h3cli is the first member of each tool's client_t, so the
 *        callbacks' user data (the tool's client_t *) is a kh_h3cli * too.
 * In:    the tool's ngtcp2/nghttp3 callbacks for what differs (handshake, stream data,
 *        resets, responses); kh_h3cli_callbacks / kh_h3cli_h3_callbacks fill in the rest.
 * Out:   a connected UDP socket, a client ngtcp2_conn with its GnuTLS session (ALPN h3, SNI
 *        localhost, no certificate check: like curl -k), the client nghttp3_conn, the
 *        nghttp3 -> ngtcp2 -> socket write loop, and the URL split into host, port, authority
 *        and path. */
#ifndef KH_H3CLI_H
#define KH_H3CLI_H

#include <gnutls/gnutls.h>
#include <netdb.h>
#include <nghttp3/nghttp3.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <stdint.h>
#include <sys/socket.h>

#define KH_H3CLI_MAX_UDP 1452

typedef struct kh_h3cli {
    ngtcp2_conn *qc;
    nghttp3_conn *h3;
    gnutls_session_t tls;
    gnutls_certificate_credentials_t cred;
    ngtcp2_crypto_conn_ref ref;
    int fd;
    struct sockaddr_storage local, remote;
    socklen_t locallen, remotelen;
} kh_h3cli;

/* https://HOST[:PORT]/PATH ([v6]:PORT too; PORT 443 when absent); points into static storage */
typedef struct {
    const char *host, *port, *authority, *path;
} kh_h3cli_url;

uint64_t kh_h3cli_now_ns(void);
/* 0, or -1 when the URL is not https:// or an IPv6 literal has no ']' */
int kh_h3cli_parse_url(const char *url, kh_h3cli_url *u);
/* A UDP socket (SOCK_DGRAM | SOCK_CLOEXEC | type_flags) connected to ai, and both addresses;
 * -1 with "PROG: connect: ..." on stderr. */
int kh_h3cli_socket(kh_h3cli *c, const struct addrinfo *ai, int type_flags, const char *prog);
/* The callbacks the tools share: GnuTLS crypto, rand, new CIDs, acked stream data, stream close
 * and MAX_STREAM_DATA handed to nghttp3, and a stream reset shutting nghttp3's read side. */
void kh_h3cli_callbacks(ngtcp2_callbacks *cb);
int kh_h3cli_stream_reset(ngtcp2_conn *qc, int64_t sid, uint64_t fs, uint64_t code, void *ud,
                          void *sud);
/* The client connection on c's socket and its TLS session. dcid_byte >= 0: the first byte of the
 * DCID; max_udp 0: ngtcp2's default. ud: the callbacks' user data (c's container). */
int kh_h3cli_connect(kh_h3cli *c, const ngtcp2_callbacks *cb, int dcid_byte, size_t max_udp,
                     uint64_t max_data, double idle_timeout, void *ud);
/* deferred_consume, stop_sending and reset_stream, which the tools share */
void kh_h3cli_h3_callbacks(nghttp3_callbacks *cb);
/* The client nghttp3_conn, its control and QPACK streams bound. */
int kh_h3cli_setup_h3(kh_h3cli *c, const nghttp3_callbacks *cb, void *ud);
/* Stream data to nghttp3, flow control credited; -1 with "PROG: ..." on stderr. */
int kh_h3cli_read_stream(kh_h3cli *c, uint32_t flags, int64_t sid, const uint8_t *d, size_t n,
                         const char *prog);
/* nghttp3's frames and ngtcp2's packets out through send (0 or -1) until ngtcp2 has nothing
 * more; -1 on an error (with "PROG: write: ..." on stderr for an ngtcp2 error when prog). */
int kh_h3cli_write(kh_h3cli *c, int (*send)(kh_h3cli *c, const uint8_t *p, size_t n),
                   const char *prog);
/* A CONNECTION_CLOSE (H3_NO_ERROR) into buf (KH_H3CLI_MAX_UDP bytes); its length, or <= 0 */
ngtcp2_ssize kh_h3cli_close_pkt(kh_h3cli *c, uint8_t *buf);
/* Frees the nghttp3 and ngtcp2 connections, the TLS session and the socket (fd >= 0). */
void kh_h3cli_free(kh_h3cli *c);

#endif
