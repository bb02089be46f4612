/* sluice batch: placeholder until its module lands. */
#include "cli.h"

int cmd_batch(sl_cli *cli, int argc, char **argv)
{
    return sl_cli_fail("batch", "not implemented yet");
}
