/* Private to libsluice: the client's layout and error recording, shared by its source files. */
#ifndef SLUICE_INTERNAL_H
#define SLUICE_INTERNAL_H

#include "rpc/client.h"

#include <stdint.h>

struct sl_client {
    sl_rpc_client *rpc;
    int64_t timeout_ms;
};

/* Record a failed call's status as this thread's last error (sl_client_error). Returns err. */
int sl_client_record(int err, const sl_rpc_status *st);

/* Record a local failure (file I/O, bad argument) as this thread's last error. Returns err. */
int sl_client_set_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Check the version field of an option struct named `type`, of which this library knows versions
 * 1 to `known`; 0 (a zeroed struct, as callers wrote before the field existed) reads as 1.
 * Returns 0, or SL_EINVAL recorded as this thread's last error. When a struct gains fields (and
 * its _VERSION rises), its function reads the new fields only from callers of that version: the
 * struct of an older caller is shorter. */
int sl_opts_check(unsigned int version, unsigned int known, const char *type);

#endif
