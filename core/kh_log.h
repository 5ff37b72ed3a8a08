/* kh_log.h: leveled logging to stderr, one write(2) per line.
 * Owns:  the process log level (set once at start-up, read-only afterwards) and a per-thread name.
 * Out:   `2026-11-29T18:41:02.123Z [error] w1: msg` lines on fd 2.
 * Never: blocks on a full pipe (fd 2 is written non-blocking; a line that does not fit is dropped
 *        and counted) or takes a lock. */
#ifndef KH_LOG_H
#define KH_LOG_H

#include <stdarg.h>
#include <stdint.h>

enum { KH_LOG_ERROR = 0, KH_LOG_WARN = 1, KH_LOG_INFO = 2, KH_LOG_DEBUG = 3 };

extern int kh_log_level;

/* "error" | "warn" | "info" | "debug" -> level, or -1. */
int kh_log_parse_level(const char *s);
/* Names the calling thread in every line it logs ("main", "w0", "pool1"). At most 15 bytes. */
void kh_log_set_thread_name(const char *name);
void kh_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kh_log_writev(int level, const char *fmt, va_list ap);
/* Lines dropped because stderr was full. */
uint64_t kh_log_dropped(void);

#define KH_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= kh_log_level)                                                               \
            kh_log_write((level), __VA_ARGS__);                                                    \
    } while (0)
#define KH_LOG_ERROR(...) KH_LOG(KH_LOG_ERROR, __VA_ARGS__)
#define KH_LOG_WARN(...) KH_LOG(KH_LOG_WARN, __VA_ARGS__)
#define KH_LOG_INFO(...) KH_LOG(KH_LOG_INFO, __VA_ARGS__)
#define KH_LOG_DEBUG(...) KH_LOG(KH_LOG_DEBUG, __VA_ARGS__)

#endif
