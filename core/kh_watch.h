/* kh_watch.h: the --dev file watch: directories watched with uv_fs_event, a debounced callback.
 * Owns:  its uv_fs_event_t handles and the debounce timer, on one loop (main's supervisor loop).
 * In:    the set of files to watch (kh_watch_set: "path\n" each, e.g. what the app loaded).
 * Out:   on_change(ud), once per burst of changes to a *.lua file in a watched directory
 *        (debounce_ms after the last event of the burst).
 * Never: watches a file itself: editors save by writing another file and renaming it over the
 *        old one, which an inotify watch on the file would lose; the directory's watch sees the
 *        rename (and plain writes) under the file's name. */
#ifndef KH_WATCH_H
#define KH_WATCH_H

#include <stdint.h>
#include <uv.h>

typedef struct kh_watch kh_watch;

kh_watch *kh_watch_new(uv_loop_t *loop, uint64_t debounce_ms, void (*on_change)(void *ud),
                       void *ud);
/* Watches the directories of `files` ("path\n" each) and `dir` (may be NULL); directories not
 * named any more stop being watched. Returns how many directories are watched. */
int kh_watch_set(kh_watch *w, const char *files, const char *dir);
/* Closes the handles; the loop frees them as it runs. */
void kh_watch_free(kh_watch *w);

#endif
