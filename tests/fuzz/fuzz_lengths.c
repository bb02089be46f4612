/* Fuzz target: the lengths-file input forms of `sluice batch` (text and raw u32 records,
 * sl_lengths_parse in common/util/lengths.c, which client/cli/cmd_batch.c reads its file with),
 * then the batch planner (common/batch) over what they accept.
 *
 * The first input byte picks the format and the plan's shape; the rest is the file. */
#include "fuzz.h"

#include "batch/batch.h"
#include "util/lengths.h"

#include <stdio.h>
#include <stdlib.h>

/* The CLI's reader (cmd_batch.c read_form): at most as many lengths as the planner takes. */
static int read_form(uint32_t **v, size_t *n, FILE *f, sl_lengths_form form)
{
    char msg[512];

    return sl_lengths_parse(v, n, f, form, SL_BATCH_MAX_SEQUENCES, "fuzz", msg, sizeof(msg));
}

/* Plans stay small: the planner's own cost is not what is being fuzzed. */
#define FUZZ_MAX_PLAN 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct {
        uint32_t *v;
        size_t n;
    } l = {NULL, 0};
    FILE *f;
    uint8_t mode;
    char msg[256];

    if (size < 1)
        return 0;
    mode = data[0];
    /* fmemopen refuses a zero-sized buffer; an empty file is a read of nothing. */
    f = size > 1 ? fmemopen((void *)(data + 1), size - 1, "rb") : fopen("/dev/null", "rb");
    if (!f)
        return 0;
    if (read_form(&l.v, &l.n, f, (mode & 1) ? SL_LENGTHS_U32 : SL_LENGTHS_TEXT) == 0 && l.n &&
        l.n <= FUZZ_MAX_PLAN) {
        sl_batch_config cfg;
        sl_batch_plan *plan = NULL;

        for (size_t i = 0; i < l.n; i++)
            if (l.v[i] == 0)
                abort(); /* the parsers promise lengths >= 1 */
        sl_batch_config_init(&cfg);
        cfg.strategy = (sl_batch_strategy)((mode >> 1) & 3);
        cfg.max_batch_size = 1u + ((mode >> 3) & 7);
        cfg.max_seq_len = 1u + (l.v[0] & 0xff);
        cfg.overlong = (mode & 0x40) ? SL_BATCH_SKIP : SL_BATCH_TRUNCATE;
        cfg.replicas = 1u + (mode >> 7);
        cfg.keep_order = 1;
        if (sl_batch_config_check(&cfg, msg, sizeof(msg)) == 0 &&
            sl_batch_plan_new(&plan, &cfg, l.v, l.n, NULL, 0, msg, sizeof(msg)) == 0) {
            uint64_t per = sl_batch_plan_batches_per_rank(plan);

            for (uint32_t r = 0; r < cfg.replicas; r++)
                for (uint64_t b = 0; b < per; b++) {
                    sl_batch batch;

                    if (sl_batch_plan_get(plan, r, b, &batch) == 0)
                        for (uint32_t k = 0; k < batch.count; k++)
                            if (batch.indices[k] >= l.n)
                                abort();
                }
            sl_batch_plan_free(plan);
        }
    }
    fclose(f);
    free(l.v);
    return 0;
}
