/* sluice sample: placeholder until its module lands. */
#include "cli.h"

int cmd_sample(sl_cli *cli, int argc, char **argv)
{
    return sl_cli_fail("sample", "not implemented yet");
}
