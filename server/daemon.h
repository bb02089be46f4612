/* The daemon's state, owned by the loop thread. */
#ifndef SL_DAEMON_H
#define SL_DAEMON_H

#include "catalog/catalog.h"
#include "ckpt/ckpt.h"
#include "config.h"
#include "feed/feed.h"
#include "health.h"
#include "memtrim.h"
#include "ops.h"
#include "rpc/server.h"
#include "store/quarantine.h"

#include <stdint.h>
#include <uv.h>

typedef struct sl_daemon {
    sl_config cfg;
    char data_dir[PATH_MAX]; /* absolute */
    char listen[300];        /* with the bound port */
    char replica[300];       /* replica identity (--replica-id, default <hostname>:<port>) */
    char catalog_desc[600];  /* the catalog, for GetInfo (never a password) */
    uv_loop_t loop;
    sl_cat *cat;
    sl_cat *wcat; /* a shared catalog's second connection: the feed's group commits */
    sl_health *health;
    sl_rpc_server *rpc;
    sl_ckpt_svc *ckpt;
    struct sl_sstore *store; /* the shard store the checkpoint service writes to */
    char store_desc[2048];   /* where it is, for GetInfo and the logs (no credentials) */
    sl_feed *feed;
    sl_quar *quar; /* <data dir>/quarantine */
    uint64_t start_ms;
    /* The data dir itself, open and flocked: removing LOCK does not free it, and a data dir
     * removed or replaced under the daemon is told apart by its inode. */
    int lock_fd;
    int lock_file_fd; /* <data dir>/LOCK, flocked too: the lock older daemons take */
    uv_signal_t sigterm, sigint;
    int stopping;
    sl_ops ops;
    sl_memtrim memtrim;
} sl_daemon;

/* The Admin service table; its arg is the daemon. */
const sl_rpc_service *sl_admin_service(sl_daemon *d);

#endif
