/* kh_err.h: error codes of the engine.
 * Owns:  the KH_E* numbering (-5000 and down), kept apart from libuv's UV_E* (negative errno).
 * Out:   kh_strerror() for both families. */
#ifndef KH_ERR_H
#define KH_ERR_H

enum {
    KH_EAGAIN = -5000,   /* need more input */
    KH_EPROTO = -5001,   /* peer broke the protocol */
    KH_ELIMIT = -5002,   /* a configured limit was passed */
    KH_ENOMEM = -5003,   /* a bounded pool is exhausted */
    KH_ECLOSED = -5004,  /* the stream or connection is gone */
    KH_EFULL = -5005,    /* a bounded queue is full */
    KH_ETIMEDOUT = -5006,
    KH_EINVAL = -5007,   /* bad argument from the programmer */
};

const char *kh_strerror(int err);

#endif
