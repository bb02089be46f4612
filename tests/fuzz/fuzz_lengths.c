/* Fuzz target: the lengths-file parsers of `sluice batch` (text and raw u32 records, in
 * client/cli/cmd_batch.c), then the batch planner (common/batch) over what they accept.
 *
 * The parsers are static in cmd_batch.c, so the file is included here; the CLI helpers it calls
 * are replaced by quiet stubs. The first input byte picks the format and the plan's shape; the
 * rest is the file. */
#include "fuzz.h"

#include "../../client/cli/cmd_batch.c"

#include <stdarg.h>

int sl_cli_fail(const char *cmd, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    (void)cmd;
    /* Format the message anyway: a bad format argument is a finding too. */
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return SL_CLI_ERROR;
}

int sl_cli_common_opt(sl_cli *cli, const char *cmd, int c, const char *arg)
{
    (void)cli, (void)cmd, (void)c, (void)arg;
    return SL_CLI_USAGE;
}

int sl_cli_bad_opt(const char *cmd, int c, char **argv)
{
    (void)cmd, (void)c, (void)argv;
    return SL_CLI_USAGE;
}

/* Plans stay small: the planner's own cost is not what is being fuzzed. */
#define FUZZ_MAX_PLAN 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lengths l = {0};
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
    if (((mode & 1) ? read_u32(&l, f, "fuzz") : read_text(&l, f, "fuzz")) == 0 && l.n &&
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
