/* grpc.health.v1.Health: Check and Watch, from the system's health.proto.
 *
 * Services are registered by name ("" is the whole server). Watch streams get the current status
 * at once and again on every change; they are ended with UNAVAILABLE when the server shuts down.
 * Loop thread only.
 */
#ifndef SL_HEALTH_H
#define SL_HEALTH_H

#include "rpc/server.h"

typedef struct sl_health sl_health;

/* Health calls open at once (Check and Watch, with or without a token), counted apart from
 * --max-calls; of them, at most SL_HEALTH_MAX_WATCHES Watch streams. More are refused
 * RESOURCE_EXHAUSTED. */
#define SL_HEALTH_MAX_CALLS   256
#define SL_HEALTH_MAX_WATCHES 64

typedef enum sl_health_status {
    SL_HEALTH_UNKNOWN = 0,
    SL_HEALTH_SERVING = 1,
    SL_HEALTH_NOT_SERVING = 2,
} sl_health_status;

/* Create the health state with `names` (n of them, copied) all NOT_SERVING. Returns 0 or -ENOMEM.
 * Free with sl_health_free after the RPC server is freed. */
int sl_health_new(sl_health **out, const char *const *names, size_t n);

void sl_health_free(sl_health *h);

/* Set every registered service's status and notify watchers. */
void sl_health_set_all(sl_health *h, sl_health_status status);

/* Set one registered service's status (a name nobody registered: nothing) and notify
 * watchers. */
void sl_health_set(sl_health *h, const char *name, sl_health_status status);

/* The service table to hand to sl_rpc_server_new; valid while h is. */
const sl_rpc_service *sl_health_service(sl_health *h);

#endif
