/* Names that become part of a path or a catalog key (datasets, jobs, checkpoints): the one rule
 * for all of them.
 *
 * A name has 1 to SL_NAME_MAX characters of [A-Za-z0-9._-], does not start with '.' and does not
 * contain "..". So it is never "", ".", "..", a hidden file, or a path with a separator.
 * Pure; thread-safe. See docs/util.md.
 */
#ifndef SL_UTIL_NAME_H
#define SL_UTIL_NAME_H

#include <stddef.h>

#define SL_NAME_MAX 128

/* Check `name` (NULL counts as empty). Returns 0, or SL_EINVAL and, if msg is not NULL, a
 * message naming `what` and the bad name in msg[0..len): "job name 'a/b' has a character
 * outside [A-Za-z0-9._-]" (also "... must have 1 to 128 characters", "... must not start with
 * '.' or contain '..'"). */
int sl_name_check(const char *what, const char *name, char *msg, size_t len);

#endif
