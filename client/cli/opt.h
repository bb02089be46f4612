/* The `sluice` command's options: declared as tables, parsed by one parser that also writes the
 * --help text, and run by one dispatcher.
 *
 * A command is an sl_cli_cmd: its option table, the struct the options are parsed into, the help
 * text around the generated rows, and the function that runs it with the parsed options and the
 * remaining (positional) arguments. The dispatcher (sl_cli_run) parses, prints help for -h, checks
 * the number of arguments, connects to the daemon when the command asks for it, and runs it. A
 * family (`sluice ckpt`) is a command whose first argument picks one of its subcommands; an
 * option of another member of the family is refused as not applying.
 *
 * Parsing is GNU getopt_long underneath: long options may be abbreviated while unambiguous,
 * options and arguments mix, "--" ends the options. Every option of every command has the same
 * error messages ("sluice batch: --replicas '0' is not an integer in [1, 65536]") and exit code
 * (SL_CLI_USAGE). Main thread only (getopt has global state).
 */
#ifndef SL_CLI_OPT_H
#define SL_CLI_OPT_H

#include "cli.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum sl_cli_kind {
    SL_CLI_END = 0, /* ends a table */
    SL_CLI_FLAG,    /* no value: the field (int, enum or bool) becomes .value, or 1 if that is 0 */
    SL_CLI_STR,     /* the field (const char *) points to the argument, which argv keeps owning */
    SL_CLI_COPY,    /* the argument is copied into the field (a char array); too long: an error */
    SL_CLI_U64,     /* a decimal in [.min, .max] (sl_parse_u64) into an unsigned field of 1, 2, 4 or
                     * 8 bytes (or a signed one the bounds keep non-negative) */
    SL_CLI_ENUM,    /* one of .choices: the field (int or enum) becomes that choice's value */
    SL_CLI_CALL,    /* .call(field, argument) parses the value; without .arg the option takes
                     * none (argument NULL) */
    SL_CLI_HELP,    /* print the command's help; the command stops with SL_CLI_OK */
    SL_CLI_TEXT,    /* not an option, a help line: .help alone, or .arg and .help as a row */
} sl_cli_kind;

typedef struct sl_cli_choice {
    const char *name;
    int value;
} sl_cli_choice;

/* Returned by option callbacks and by the parser: everything is done (help or version printed),
 * the command stops and exits with SL_CLI_OK. Not an exit code. */
#define SL_CLI_DONE 3

/* sl_cli_opt.flags: a bad value is reported without echoing it ("--format must be text or
 * u32"). */
#define SL_CLI_PLAIN 1u

typedef struct sl_cli_opt {
    const char *name; /* long name without "--"; NULL for TEXT rows */
    sl_cli_kind kind;
    const char *arg;   /* what the value is called in the help ("FILE"); a TEXT row's left column */
    const char *help;  /* the help; '\n' continues it on the next line, "" shows the option alone,
                        * NULL leaves it out of the help */
    int letter;        /* short option ('j' for -j), or 0 */
    size_t off, size;  /* the field in the parsed struct: SL_CLI_AT(type, field) */
    size_t seen;       /* SL_CLI_SEEN(type, field): an int set to 1 when the option is given */
    uint64_t min, max; /* U64: the bounds */
    int value;         /* FLAG: the value it sets */
    const sl_cli_choice *choices; /* ENUM: the names, ended by {NULL, 0} */
    /* CALL: parse `arg` into `field`. Returns 0; SL_CLI_USAGE after printing its own message;
     * SL_CLI_DONE to stop with SL_CLI_OK; anything else prints "--name 'arg' <err>". */
    int (*call)(void *field, const char *arg);
    const char *err; /* what follows "--name 'arg' " when the value is bad (CALL, COPY; ENUM
                      * defaults to "is not a, b or c", U64 to "is not an integer in [min, max]") */
    unsigned flags;  /* SL_CLI_PLAIN */
} sl_cli_opt;

#define SL_CLI_AT(type, field)   .off = offsetof(type, field), .size = sizeof(((type *)0)->field)
#define SL_CLI_SEEN(type, field) .seen = offsetof(type, field) + 1
#define SL_CLI_OPTS_END                                                                            \
    {                                                                                              \
        .kind = SL_CLI_END                                                                         \
    }
/* Help-only rows: a line of its own ("Plan:", "" for a blank line), or a row for an option
 * described elsewhere, or for several at once ("-h, --help", "--rank R -o FILE"). */
#define SL_CLI_LINE(text)                                                                          \
    {                                                                                              \
        .kind = SL_CLI_TEXT, .help = text                                                          \
    }
#define SL_CLI_ROW(left, text)                                                                     \
    {                                                                                              \
        .kind = SL_CLI_TEXT, .arg = left, .help = text                                             \
    }

/* sl_cli_cmd.flags */
#define SL_CLI_CONNECT        1u /* connect before run (the client is closed after it) */
#define SL_CLI_NO_COMMON_HELP 2u /* the help leaves out the common options (it lists its own) */
#define SL_CLI_TERSE          4u /* bad values read "bad value 'x' for --opt" (sluice ckpt) */
#define SL_CLI_STOP_AT_ARG    8u /* options end at the first argument (sluice's own options) */

struct sl_client;

typedef struct sl_cli_cmd {
    const char *name;       /* "batch"; a subcommand's own name ("upload") */
    const char *summary;    /* one line for `sluice --help` */
    const char *args;       /* a subcommand's arguments ("JOB NAME [FILE]"): its usage line */
    int min_args, max_args; /* how many arguments; max_args -1: run checks them itself */
    const sl_cli_opt *opts; /* its options, ended by SL_CLI_OPTS_END; NULL: only the common ones */
    size_t opts_size;       /* the struct they are parsed into (zeroed, then init) */
    void (*init)(void *o);  /* its defaults; NULL: all zero */
    void (*fini)(void *o);  /* frees what option callbacks allocated; NULL: nothing */
    /* Run with the parsed options and the arguments left (argv[0] is the first of them); c is
     * connected with SL_CLI_CONNECT, else NULL. Returns an exit code. */
    int (*run)(sl_cli *cli, struct sl_client *c, void *o, int argc, char **argv);
    const char *head;      /* help: before the option rows */
    const char *mid;       /* help: between them and the common options */
    const char *tail;      /* help: at the end */
    int width;             /* help: width of the option column (0: 19) */
    void (*help)(FILE *f); /* help: written by the command instead of generated (sluice's own) */
    unsigned flags;        /* SL_CLI_CONNECT, ...; a family's apply to its subcommands */
    const struct sl_cli_cmd *subs; /* a family: its subcommands */
    size_t n_subs;
} sl_cli_cmd;

/* The options every command accepts (--addr, --json, --timeout, TLS, token, -h/--help), parsed
 * into the sl_cli itself. */
extern const sl_cli_opt sl_cli_common_opts[];

/* Run `cmd` (argv[0] is its name) as described above. Returns the exit code. */
int sl_cli_run(sl_cli *cli, const sl_cli_cmd *cmd, int argc, char **argv);

/* Parse the options of argv[1..argc) for `cmd` (of `family`, or NULL) into `o` and the common
 * ones into `cli`. Returns 0 with *first the index of the first argument left, SL_CLI_USAGE after
 * printing why, or SL_CLI_DONE (help printed). */
int sl_cli_parse(sl_cli *cli, const sl_cli_cmd *cmd, const sl_cli_cmd *family, void *o, int argc,
                 char **argv, int *first);

/* Print the help rows of table t with an option column `width` wide. */
void sl_cli_help_rows(FILE *f, const sl_cli_opt *t, int width);

#endif
