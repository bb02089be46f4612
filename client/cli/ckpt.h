/* sluice ckpt: what its files share (cmd_ckpt.c: the family, its options and the metadata
 * subcommands; ckpt_xfer.c: upload and download). Main thread, except where marked. */
#ifndef SL_CLI_CKPT_H
#define SL_CLI_CKPT_H

#include "cli.h"

#include <stddef.h>
#include <stdint.h>

/* Ranks and world sizes the options accept. */
#define CKPT_MAX_RANKS 65536

/* The options of every ckpt subcommand (each takes its own subset). */
typedef struct ckpt_opts {
    uint64_t step;
    int32_t world, rank;
    int have_rank;
    const char *meta, *dir, *output, *sha, *feed_job;
    int jobs, deep, state, resume, no_verify, no_progress, no_feed, auto_commit;
    size_t chunk;
    uint64_t offset, length; /* download: a range of one rank's data (length 0: to its end) */
    int have_range;
} ckpt_opts;

struct sl_client;

/* sluice ckpt upload, download (ckpt_xfer.c). */
int ckpt_upload(sl_cli *cli, struct sl_client *c, void *o, int argc, char **argv);
int ckpt_download(sl_cli *cli, struct sl_client *c, void *o, int argc, char **argv);

#endif
