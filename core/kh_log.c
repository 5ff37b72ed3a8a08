/* kh_log.c: see kh_log.h. A line is formatted into a stack buffer and written with one write(2),
 * so lines from different workers never interleave (writes below PIPE_BUF are atomic). */
#include "kh_log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int kh_log_level = KH_LOG_INFO;
static _Thread_local char thread_name[16] = "main";
static atomic_uint_fast64_t dropped;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int kh_log_parse_level(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

void kh_log_set_thread_name(const char *name)
{
    snprintf(thread_name, sizeof thread_name, "%s", name);
}

uint64_t kh_log_dropped(void)
{
    return atomic_load(&dropped);
}

void kh_log_writev(int level, const char *fmt, va_list ap)
{
    char line[4096];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ [%s] %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), level_names[level & 3], thread_name);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t room = sizeof line - (size_t)n - 2;
    size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < room ? (size_t)m : room));
    line[len++] = '\n';
    ssize_t w = write(2, line, len);
    if (w != (ssize_t)len)
        atomic_fetch_add(&dropped, 1);
}

void kh_log_write(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kh_log_writev(level, fmt, ap);
    va_end(ap);
}
