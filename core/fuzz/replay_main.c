/* replay_main.c: runs a fuzz target's LLVMFuzzerTestOneInput over files, without libFuzzer.
 * Owns:  one heap copy of the file being replayed, exactly its size (so ASan sees over-reads).
 * In:    argv: files and directories (directories are read one level deep, dot files skipped;
 *        a missing path or an empty directory is not an error: a target may have no regressions).
 * Out:   "replayed N inputs" on stdout; exit 1 if a path cannot be read. A crash is the target's
 *        own trap or sanitizer report.
 * Never: links libFuzzer, so gcc builds run the corpus and regressions under ctest. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path, size_t *count)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *data = malloc(cap);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            data = realloc(data, cap);
            if (data == NULL)
                abort();
        }
        size_t got = fread(data + n, 1, cap - n, f);
        if (got == 0)
            break;
        n += got;
    }
    int err = ferror(f);
    fclose(f);
    if (err || data == NULL) {
        fprintf(stderr, "replay: %s: read error\n", path);
        free(data);
        return -1;
    }
    /* An exact-size copy: a read past the input is then past the allocation. */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, data, n);
    free(data);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    (*count)++;
    return 0;
}

static int replay_path(const char *path, size_t *count)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode))
        return replay_file(path, count);
    DIR *dir = opendir(path);
    if (dir == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue; /* ., .., .gitkeep */
        size_t need = strlen(path) + strlen(e->d_name) + 2;
        char *full = malloc(need);
        snprintf(full, need, "%s/%s", path, e->d_name);
        struct stat fst;
        if (stat(full, &fst) == 0 && S_ISREG(fst.st_mode) && replay_file(full, count) != 0)
            rc = -1;
        free(full);
    }
    closedir(dir);
    return rc;
}

int main(int argc, char **argv)
{
    size_t count = 0;
    int rc = 0;
    for (int i = 1; i < argc; i++)
        if (replay_path(argv[i], &count) != 0)
            rc = 1;
    printf("replayed %zu inputs\n", count);
    return rc;
}
