/* kh_listen.h: the listening sockets, TCP and UDP, made by hand (libuv 1.44 has no
 * UV_TCP_REUSEPORT): one SO_REUSEPORT socket per worker and address, so the kernel spreads
 * connections (TCP) and datagrams (UDP) and no accept lock is shared.
 * Owns:  nothing after it returns: the fds go into la->fds / la->udp_fds, which the workers'
 *        accept path (kh_accept.c) and the QUIC module take over.
 * In:    a parsed kh_listen_addr (main.c), the number of workers.
 * Out:   bound sockets (TCP ones listening); la->port set to the real port when it was 0.
 * Never: runs on a worker; closes what it did not make. */
#ifndef KH_LISTEN_H
#define KH_LISTEN_H

#include "kh_worker.h"

/* n TCP sockets, bound and listening (backlog 4096), in worker order (the reuseport group's
 * index is the worker id: main.c's steering relies on it). With port 0 the first socket's
 * port is used by the rest and stored in la->port. Returns 0, or -1 after printing why to
 * stderr (the fds made so far stay in la->fds for the caller to close). */
int kh_listen_tcp(kh_listen_addr *la, int n);
/* n UDP sockets on la->port (the port the TCP sockets got, so `:0` serves TCP and QUIC on one
 * number), non-blocking, SO_REUSEPORT, in worker order, into la->udp_fds; with n > 1 a cBPF
 * program (SO_ATTACH_REUSEPORT_CBPF) routes each packet by the worker id in its destination
 * connection ID. Returns 0 or -1 as kh_listen_tcp does. */
int kh_listen_udp(kh_listen_addr *la, int n);
/* kh_listen_tcp, then with udp kh_listen_udp on the same port. With port 0, when the UDP bind
 * finds the port the kernel gave TCP already taken (EADDRINUSE: a client's ephemeral UDP socket),
 * everything is closed and a new pair tried, up to KH_LISTEN_PAIR_ATTEMPTS times. */
#define KH_LISTEN_PAIR_ATTEMPTS 8
int kh_listen_pair(kh_listen_addr *la, int n, int udp);
/* Closes (and frees) every fd of la that is still open. */
void kh_listen_close(kh_listen_addr *la, int n);

#endif
