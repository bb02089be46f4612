/* Private to libsluice: the client's layout and error recording, shared by its source files. */
#ifndef SLUICE_INTERNAL_H
#define SLUICE_INTERNAL_H

#include "rpc/client.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Addresses one client takes at most. */
#define SL_CLIENT_MAX_REPLICAS 64

struct sl_client {
    sl_rpc_client **rpc; /* one channel per address, in the list's order */
    char **addr;         /* the addresses, as given (blanks around them removed) */
    size_t n;            /* how many (at least 1) */
    atomic_size_t cur;   /* the replica new calls go to (replicas.c) */
    int64_t timeout_ms;
};

/* Split `list` ("h1:p1,h2:p2", or one address; a gRPC URI such as "ipv4:a:1,b:2" or
 * "dns:///name:7700" is one address) into *out, *n strings, checking that no element is empty
 * and that every port is in [1, 65535]. Returns 0 (free with sl_client_addrs_free), or SL_EINVAL
 * or -ENOMEM recorded as this thread's last error. */
int sl_client_addrs_parse(char ***out, size_t *n, const char *list);
void sl_client_addrs_free(char **addrs, size_t n);

/* The replica a client of n replicas starts on: the rank (SLUICE_RANK, else torchrun's RANK) mod
 * n, 0 without one. Thread-safe (reads the environment). */
size_t sl_client_first_replica(size_t n);

/* The replica new calls go to. Thread-safe. */
size_t sl_client_pick(sl_client *c);

/* A call on replica i ended with err after `tries` replicas were tried for it. If err is
 * SL_EUNAVAILABLE and the client has several replicas, new calls go to the next replica from now
 * on (unless another thread moved on already); returns 1 if the call should be tried on the next
 * replica (tries < the number of replicas), else 0. Thread-safe. */
int sl_client_fail_over(sl_client *c, size_t i, int err, size_t tries);

/* Record a failed call as sl_client_record does; an UNAVAILABLE of a client with several replicas
 * also names the `tries` replicas tried from `first` on. Returns err. */
int sl_client_record_tried(int err, const sl_rpc_status *st, const sl_client *c, size_t first,
                           size_t tries);

/* A unary call with the replicas' failover (replicas.c); failures are recorded as this thread's
 * last error. Returns 0 with *resp, or the error. Thread-safe. */
int sl_client_unary(sl_client *c, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp,
                    int64_t timeout_ms);

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
