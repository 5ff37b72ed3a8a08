/* kh_tls13.h: the TLS 1.3 record layer after the handshake (RFC 8446 §5, §4.6.3, §6), sans-io.
 * Why our own: OpenSSL 3.0 keeps ~8 KB per SSL object for the life of a connection, which alone
 * breaks the 4 KiB budget of an idle TLS connection. OpenSSL does the handshake; once it is done,
 * kh_tls hands the traffic secrets to this layer and frees the SSL object. What is left per
 * connection is two AEAD contexts (~1.1 KB each) and this struct (the same split QUIC stacks and
 * kTLS make: the handshake library derives secrets, the record protection lives elsewhere).
 * Owns:  the traffic secrets, keys and sequence numbers of both directions, and the bytes of a
 *        record cut by a read (only until its rest arrives: an idle connection holds none).
 * In:    ciphertext bytes in any cut; plaintext to protect.
 * Out:   application data appended to a caller's kh_buf; records appended to another.
 * Never: touches a socket, an SSL object or a log; accepts anything after close_notify.
 * Bounds (a peer cannot make us spin or buffer without progress; OpenSSL's figures): 32 empty
 *        application-data records in a row, 5 user_canceled alerts in a row (the one warning
 *        TLS 1.3 has besides close_notify; every other alert is fatal whatever its level says),
 *        32 KeyUpdates in a row (BoringSSL's figure); a handshake message split across records
 *        is reassembled, and since KeyUpdate (5 bytes) is the only one a client may send us, that
 *        costs a 3-bit position, no buffer. Any number of update requests while we send no data
 *        gets one KeyUpdate from us (RFC 8446 §4.6.3), so we never exceed a peer's own bound. */
#ifndef KH_TLS13_H
#define KH_TLS13_H

#include <stddef.h>
#include <stdint.h>

#include "kh_buf.h"

#define KH_TLS13_MAX_SECRET 48 /* SHA-384 */

/* The AEADs and hashes of the three TLS 1.3 suites OpenSSL enables by default, fetched once at
 * start-up (an implicit fetch per connection would take a lock in OpenSSL 3.0). */
typedef struct kh_tls13_algs kh_tls13_algs;
typedef struct kh_tls13_suite kh_tls13_suite;

typedef struct kh_tls13_dir {
    void *aead;        /* EVP_CIPHER_CTX keyed with this direction's key */
    uint64_t seq;      /* records protected under the current key (RFC 8446 §5.3) */
    uint8_t iv[12];
    uint8_t secret[KH_TLS13_MAX_SECRET];
} kh_tls13_dir;

typedef struct kh_tls13 {
    const kh_tls13_suite *suite;
    kh_tls13_dir rx, tx;
    kh_buf partial;        /* a record cut by a read */
    uint64_t tx_rekey_at;  /* records under one write key before we send KeyUpdate (§5.5) */
    uint8_t key_updates;   /* KeyUpdates received since the last application data */
    uint8_t tx_updated;    /* we sent a KeyUpdate since our last application data record */
    uint8_t empty_records; /* empty application-data records in a row */
    uint8_t warn_alerts;   /* user_canceled alerts in a row */
    uint8_t hs_len;        /* bytes of a KeyUpdate split across records seen so far (0..4) */
    uint8_t alert;         /* the last alert sent or received, for the caller's log */
    uint8_t alert_sent;    /* 1: we sent it; 0: the peer did */
    uint8_t done;          /* close_notify or a fatal alert seen: input is ignored */
} kh_tls13;

/* Start-up (main thread). NULL if OpenSSL lacks one of the algorithms. */
kh_tls13_algs *kh_tls13_algs_new(void);
void kh_tls13_algs_free(kh_tls13_algs *a);

/* After the handshake: `suite_id` is the IANA id (0x1301..0x1303), the secrets are
 * {client,server}_application_traffic_secret_0, `tx_seq` the records the handshake library
 * already protected with the server's (the NewSessionTickets). Returns 0, or -1 for a suite we
 * do not implement (the caller keeps its handshake library's record layer). */
int kh_tls13_init(kh_tls13 *r, const kh_tls13_algs *a, uint16_t suite_id, const uint8_t *rx_secret,
                  const uint8_t *tx_secret, size_t secret_len, uint64_t tx_seq);
void kh_tls13_free(kh_tls13 *r, kh_bufcache *bufs);

/* Feeds n bytes of ciphertext: appends application data to `plain`; a KeyUpdate answer or a
 * fatal alert goes to `cipher`. Returns 0; 1 once the peer sent close_notify (bytes after it are
 * ignored); KH_EPROTO when the connection must close (r->alert says why). */
int kh_tls13_read(kh_tls13 *r, const char *p, size_t n, kh_buf *plain, kh_buf *cipher,
                  kh_bufcache *bufs);
/* Protects n bytes as application-data records (at most 16 KiB of plaintext each) appended to
 * `cipher`. Returns 0, or KH_EPROTO if the AEAD failed. */
int kh_tls13_write(kh_tls13 *r, const char *p, size_t n, kh_buf *cipher, kh_bufcache *bufs);
/* Appends one record of inner content type `type` (RFC 8446 §5.2; no padding). */
int kh_tls13_seal(kh_tls13 *r, uint8_t type, const char *p, size_t n, kh_buf *cipher,
                  kh_bufcache *bufs);
/* Appends an alert record: close_notify (0) as a warning, anything else as fatal. */
int kh_tls13_send_alert(kh_tls13 *r, uint8_t desc, kh_buf *cipher, kh_bufcache *bufs);
/* Appends KeyUpdate (request_update as given) and switches the write key (RFC 8446 §4.6.3). */
int kh_tls13_send_key_update(kh_tls13 *r, int request_update, kh_buf *cipher, kh_bufcache *bufs);

/* Alert descriptions we send (RFC 8446 §6). */
enum {
    KH_TLS_ALERT_CLOSE_NOTIFY = 0,
    KH_TLS_ALERT_UNEXPECTED_MESSAGE = 10,
    KH_TLS_ALERT_BAD_RECORD_MAC = 20,
    KH_TLS_ALERT_RECORD_OVERFLOW = 22,
    KH_TLS_ALERT_ILLEGAL_PARAMETER = 47,
    KH_TLS_ALERT_DECODE_ERROR = 50,
    KH_TLS_ALERT_INTERNAL_ERROR = 80,
    KH_TLS_ALERT_USER_CANCELED = 90,
};

#endif
