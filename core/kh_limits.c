/* kh_limits.c: parsing and printing of the limits table in kh_limits.h. */
#include "kh_limits.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct limit_def {
    const char *name;
    uint64_t def, min, max;
    const char *doc;
    size_t offset;
} limit_def;

static const limit_def defs[] = {
#define KH_LIMIT_DEF(name, def, min, max, doc)                                                     \
    {#name, (uint64_t)(def), (uint64_t)(min), (uint64_t)(max), doc, offsetof(kh_limits, name)},
    KH_LIMITS(KH_LIMIT_DEF)
#undef KH_LIMIT_DEF
};

void kh_limits_init(kh_limits *l)
{
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        *(uint64_t *)((char *)l + defs[i].offset) = defs[i].def;
}

/* "header-bytes" and "header_bytes" name the same limit. */
static const limit_def *find(const char *name)
{
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof norm)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        norm[i] = name[i] == '-' ? '_' : name[i];
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        if (strcmp(defs[i].name, norm) == 0)
            return &defs[i];
    return NULL;
}

int kh_limits_is_name(const char *name)
{
    return find(name) != NULL;
}

int kh_limits_set(kh_limits *l, const char *name, const char *value, char *err, size_t errlen)
{
    const limit_def *d = find(name);
    if (d == NULL) {
        snprintf(err, errlen, "unknown limit '%s' (see --print-limits)", name);
        return -1;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0' || value[0] == '-' || v < d->min || v > d->max) {
        snprintf(err, errlen, "limit %s: '%s' is not a whole number from %" PRIu64 " to %" PRIu64,
                 d->name, value, d->min, d->max);
        return -1;
    }
    *(uint64_t *)((char *)l + d->offset) = v;
    return 0;
}

void kh_limits_print(const kh_limits *l, FILE *out)
{
    fprintf(out, "%-24s %14s %14s %16s  %s\n", "limit", "value", "min", "max", "meaning");
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        fprintf(out, "%-24s %14" PRIu64 " %14" PRIu64 " %16" PRIu64 "  %s\n", defs[i].name,
                *(const uint64_t *)((const char *)l + defs[i].offset), defs[i].min, defs[i].max,
                defs[i].doc);
}
