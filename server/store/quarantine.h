/* The quarantine: where files the catalog does not know go instead of being removed.
 *
 * A daemon that removed every file its catalog did not know turned the loss of its catalog into
 * the loss of its data: a catalog restored from a backup (or a new empty one after catalog.db was
 * deleted) does not know the checkpoints and lengths written after it, and the startup sweeps
 * deleted them all. Such files are moved instead, by a rename on the data dir's file system
 * (never a copy, never replacing anything), to
 *
 *     <data dir>/quarantine/<batch>/<the file's path relative to the data dir>
 *
 * <batch> is the UTC time of the batch's first move ("20261124T101500Z", then "-2", "-3" if that
 * name is taken). A batch is what one sweep moves; the daemon's startup ends one batch after all
 * its sweeps. Every file moved is logged (`quarantined`), every batch once at its end
 * (`quarantine_batch`: files, bytes, path), and counted (sl_quar_get_counts). A file that cannot
 * be moved (another file system under the data dir, EIO) stays where it is. docs/checkpoints.md
 * ("Backup and restore") says how to bring quarantined files back or discard them.
 *
 * Loop thread, except sl_quar_get_counts (thread-safe).
 */
#ifndef SL_STORE_QUARANTINE_H
#define SL_STORE_QUARANTINE_H

#include <stdint.h>

typedef struct sl_quar sl_quar;

typedef struct sl_quar_counts {
    uint64_t moved; /* files moved into the quarantine since the daemon started */
    uint64_t files; /* files in the quarantine: as of the last walk, plus the moves since */
    uint64_t bytes; /* their sizes */
} sl_quar_counts;

/* A quarantine under `data_dir` (absolute; copied). Nothing is created until a file is moved;
 * an existing quarantine is walked to count its files. Returns 0 and *out (free with
 * sl_quar_free), -ENAMETOOLONG or -ENOMEM. */
int sl_quar_new(sl_quar **out, const char *data_dir);

/* Ends the open batch (sl_quar_end) and frees. Accepts NULL. */
void sl_quar_free(sl_quar *q);

/* "<data dir>/quarantine". Valid while q is. */
const char *sl_quar_path(const sl_quar *q);

/* Move the regular file `name` of directory `dir` (the data dir or a directory under it) into
 * the open batch, opening one if none is, under the same relative path; a name already taken
 * there gets ".1", ".2", ... appended. `why` goes into the log line. The moved file's new
 * directory is fsynced by the next move into another directory or at sl_quar_end; `dir` is the
 * caller's to fsync, as after an unlink. Returns 0, SL_EINVAL if dir is not under the data dir,
 * or -errno (the file stays where it was; -EXDEV: it is on another file system). */
int sl_quar_move(sl_quar *q, const char *dir, const char *name, const char *why);

/* End the open batch, if any: fsync what it moved, log `quarantine_batch`. The next move opens a
 * new batch. */
void sl_quar_end(sl_quar *q);

/* Walk the quarantine again to count its files and bytes (an operator may have removed or
 * restored some), unless the last walk was less than a second ago. Blocking: a walk of the
 * quarantine, which holds only what the daemon moved there. */
void sl_quar_refresh(sl_quar *q);

/* The counters. Thread-safe. */
void sl_quar_get_counts(const sl_quar *q, sl_quar_counts *out);

#endif
