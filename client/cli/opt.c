/* The option parser, the help writer and the dispatcher. See opt.h. */
#include "opt.h"

#include "sluice.h"
#include "util/num.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Room for one command's options, the common ones and those of its family (sluice ckpt, the
 * largest, has about 25). */
#define MAX_ROWS 96

#define DEFAULT_WIDTH 19

/* The options one parse knows, in getopt_long's form and ours. */
typedef struct parser {
    struct option lo[MAX_ROWS + 1];
    const sl_cli_opt *row[MAX_ROWS];
    void *base[MAX_ROWS];      /* the struct row i's field lives in */
    const char *who[MAX_ROWS]; /* the command its errors name */
    unsigned char terse[MAX_ROWS];
    unsigned char foreign[MAX_ROWS]; /* another subcommand's: refused as not applying */
    char shorts[2 * MAX_ROWS + 4];
    int n;
    char full[64]; /* "ckpt upload" */
    const sl_cli_cmd *cmd, *family;
} parser;

/* ---- help ---- */

static void help_row(FILE *f, const char *spec, const char *help, int width)
{
    const char *nl;

    if (!*help) {
        fprintf(f, "  %s\n", spec);
        return;
    }
    /* A spec as wide as the column or wider gets its help on the next line, never glued to it. */
    if ((int)strlen(spec) >= width)
        fprintf(f, "  %s\n%*s", spec, width + 2, "");
    else
        fprintf(f, "  %-*s", width, spec);
    while ((nl = strchr(help, '\n')) != NULL) {
        fprintf(f, "%.*s\n%*s", (int)(nl - help), help, width + 2, "");
        help = nl + 1;
    }
    fprintf(f, "%s\n", help);
}

void sl_cli_help_rows(FILE *f, const sl_cli_opt *t, int width)
{
    char spec[80];

    for (; t && t->kind != SL_CLI_END; t++) {
        if (!t->help)
            continue;
        if (t->kind == SL_CLI_TEXT && !t->arg) {
            fprintf(f, "%s\n", t->help);
            continue;
        }
        if (t->kind == SL_CLI_TEXT)
            snprintf(spec, sizeof(spec), "%s", t->arg);
        else if (t->letter)
            snprintf(spec, sizeof(spec), "-%c, --%s%s%s", t->letter, t->name, t->arg ? " " : "",
                     t->arg ? t->arg : "");
        else
            snprintf(spec, sizeof(spec), "--%s%s%s", t->name, t->arg ? " " : "",
                     t->arg ? t->arg : "");
        help_row(f, spec, t->help, width);
    }
}

static void cmd_help(FILE *f, const sl_cli_cmd *cmd, const sl_cli_cmd *family)
{
    if (cmd->help) {
        cmd->help(f);
        return;
    }
    if (family && cmd->args)
        fprintf(f, "Usage: sluice %s %s [options] %s\n\n", family->name, cmd->name, cmd->args);
    fputs(cmd->head ? cmd->head : "", f);
    sl_cli_help_rows(f, cmd->opts, cmd->width ? cmd->width : DEFAULT_WIDTH);
    fputs(cmd->mid ? cmd->mid : "", f);
    if (!(cmd->flags & SL_CLI_NO_COMMON_HELP))
        sl_cli_help_rows(f, sl_cli_common_opts, DEFAULT_WIDTH);
    fputs(cmd->tail ? cmd->tail : "", f);
}

/* A family's help: its subcommands with their arguments. */
static void family_help(FILE *f, const sl_cli_cmd *fam)
{
    fputs(fam->head ? fam->head : "", f);
    for (size_t i = 0; i < fam->n_subs; i++)
        fprintf(f, "  %-10s %s\n", fam->subs[i].name, fam->subs[i].args);
    fputs(fam->tail ? fam->tail : "", f);
}

/* ---- the option tables, as getopt_long sees them ---- */

static int takes_value(const sl_cli_opt *o)
{
    return o->kind == SL_CLI_STR || o->kind == SL_CLI_COPY || o->kind == SL_CLI_U64 ||
           o->kind == SL_CLI_ENUM || (o->kind == SL_CLI_CALL && o->arg);
}

/* Add the options of table t; a name already known keeps its first row. */
static void add_table(parser *p, const sl_cli_opt *t, void *base, const char *who, int terse,
                      int foreign)
{
    for (; t && t->kind != SL_CLI_END; t++) {
        int i = p->n, known = 0;

        if (!t->name)
            continue;
        for (int k = 0; k < p->n && !known; k++)
            known = strcmp(p->lo[k].name, t->name) == 0;
        if (known || p->n == MAX_ROWS)
            continue;
        p->lo[i] = (struct option){t->name, takes_value(t) ? required_argument : no_argument, NULL,
                                   256 + i};
        p->row[i] = t;
        p->base[i] = base;
        p->who[i] = who;
        p->terse[i] = (unsigned char)terse;
        p->foreign[i] = (unsigned char)foreign;
        p->n++;
        if (t->letter && !strchr(p->shorts, t->letter)) {
            size_t k = strlen(p->shorts);

            p->shorts[k++] = (char)t->letter;
            if (takes_value(t))
                p->shorts[k++] = ':';
            p->shorts[k] = '\0';
        }
    }
    p->lo[p->n] = (struct option){NULL, 0, NULL, 0};
}

static void parser_init(parser *p, sl_cli *cli, const sl_cli_cmd *cmd, const sl_cli_cmd *family,
                        void *o)
{
    const char *who = cmd->name;
    int terse = !!((cmd->flags | (family ? family->flags : 0)) & SL_CLI_TERSE);

    memset(p, 0, sizeof(*p));
    p->cmd = cmd;
    p->family = family;
    /* ':' first: a missing value is reported as ':' and not as '?'. */
    strcpy(p->shorts, cmd->flags & SL_CLI_STOP_AT_ARG ? "+:" : ":");
    if (family) {
        snprintf(p->full, sizeof(p->full), "%s %s", family->name, cmd->name);
        who = family->name;
    }
    add_table(p, cmd->opts, o, family ? p->full : who, terse, 0);
    add_table(p, sl_cli_common_opts, cli, who, 0, 0);
    for (size_t i = 0; family && i < family->n_subs; i++)
        add_table(p, family->subs[i].opts, o, p->full, terse, 1);
}

/* ---- values ---- */

/* Store v into a field of `size` bytes. */
static void store(void *field, size_t size, uint64_t v)
{
    uint8_t u8 = (uint8_t)v;
    uint16_t u16 = (uint16_t)v;
    uint32_t u32 = (uint32_t)v;

    if (size == 1)
        memcpy(field, &u8, 1);
    else if (size == 2)
        memcpy(field, &u16, 2);
    else if (size == 4)
        memcpy(field, &u32, 4);
    else
        memcpy(field, &v, sizeof(v));
}

static const sl_cli_choice *choice(const sl_cli_choice *c, const char *name)
{
    for (; c && c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

/* Why a value was refused, after "--name 'value' ". */
static void reason(char *buf, size_t len, const sl_cli_opt *o)
{
    size_t k = 0;

    if (o->err) {
        snprintf(buf, len, "%s", o->err);
    } else if (o->kind == SL_CLI_U64) {
        snprintf(buf, len, "is not an integer in [%" PRIu64 ", %" PRIu64 "]", o->min, o->max);
    } else {
        /* "is not a, b or c" */
        k = (size_t)snprintf(buf, len, "is not");
        for (const sl_cli_choice *c = o->choices; c && c->name && k < len; c++) {
            const char *sep = c == o->choices ? " " : c[1].name ? ", " : " or ";

            k += (size_t)snprintf(buf + k, len - k, "%s%s", sep, c->name);
        }
    }
}

static int bad_value(const parser *p, int i, const char *arg)
{
    const sl_cli_opt *o = p->row[i];
    const char *who = p->who[i];
    char why[160];

    fprintf(stderr, "sluice%s%s: ", *who ? " " : "", who);
    if (p->terse[i]) {
        fprintf(stderr, "bad value '%s' for --%s\n", arg, o->name);
    } else if (o->flags & SL_CLI_PLAIN) {
        fprintf(stderr, "--%s %s\n", o->name, o->err);
    } else {
        reason(why, sizeof(why), o);
        fprintf(stderr, "--%s '%s' %s\n", o->name, arg, why);
    }
    return SL_CLI_USAGE;
}

/* Apply option i with value arg (NULL for flags). */
static int apply(const parser *p, int i, const char *arg)
{
    const sl_cli_opt *o = p->row[i];
    char *field = p->base[i] ? (char *)p->base[i] + o->off : NULL;
    const sl_cli_choice *c;
    uint64_t v;
    int err = 0;

    switch (o->kind) {
    case SL_CLI_HELP:
        cmd_help(stdout, p->cmd, p->family);
        return SL_CLI_DONE;
    case SL_CLI_FLAG:
        store(field, o->size, (uint64_t)(o->value ? o->value : 1));
        break;
    case SL_CLI_STR:
        memcpy(field, &arg, sizeof(arg));
        break;
    case SL_CLI_COPY:
        if (strlen(arg) >= o->size)
            return bad_value(p, i, arg);
        memcpy(field, arg, strlen(arg) + 1);
        break;
    case SL_CLI_U64:
        if (sl_parse_u64(&v, arg, o->min, o->max) != 0)
            return bad_value(p, i, arg);
        store(field, o->size, v);
        break;
    case SL_CLI_ENUM:
        if (!(c = choice(o->choices, arg)))
            return bad_value(p, i, arg);
        store(field, o->size, (uint64_t)(int64_t)c->value);
        break;
    case SL_CLI_CALL:
        err = o->call(field, arg);
        if (err == SL_CLI_USAGE || err == SL_CLI_DONE)
            return err;
        if (err)
            return bad_value(p, i, arg);
        break;
    default:
        break;
    }
    if (o->seen)
        store((char *)p->base[i] + o->seen - 1, sizeof(int), 1);
    return 0;
}

/* The row of short option `letter`. */
static int row_of_letter(const parser *p, int letter)
{
    for (int i = 0; i < p->n; i++)
        if (p->row[i]->letter == letter)
            return i;
    return -1;
}

int sl_cli_parse(sl_cli *cli, const sl_cli_cmd *cmd, const sl_cli_cmd *family, void *o, int argc,
                 char **argv, int *first)
{
    parser p;
    int c, i, r;

    parser_init(&p, cli, cmd, family, o);
    /* 0, not 1: GNU getopt forgets the '+' of an earlier parse (stop at the first argument)
     * only when fully reinitialised. */
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, p.shorts, p.lo, NULL)) != -1) {
        if (c == '?' || c == ':')
            return sl_cli_bad_opt(family ? family->name : cmd->name, c, argv);
        i = c >= 256 ? c - 256 : row_of_letter(&p, c);
        if (i < 0)
            return sl_cli_bad_opt(family ? family->name : cmd->name, '?', argv);
        if (p.foreign[i]) {
            fprintf(stderr, "sluice %s: option '%s' does not apply\n", p.full, argv[optind - 1]);
            return SL_CLI_USAGE;
        }
        if ((r = apply(&p, i, optarg)) != 0)
            return r;
    }
    *first = optind;
    return 0;
}

/* ---- the dispatcher ---- */

static int check_args(const sl_cli_cmd *cmd, const sl_cli_cmd *family, int argc, char **argv)
{
    if (cmd->max_args < 0 || (argc >= cmd->min_args && argc <= cmd->max_args))
        return 0;
    if (family)
        fprintf(stderr, "Usage: sluice %s %s [options] %s\nTry 'sluice %s %s --help'.\n",
                family->name, cmd->name, cmd->args, family->name, cmd->name);
    else if (argc > cmd->max_args)
        fprintf(stderr, "sluice %s: unexpected argument '%s'\n", cmd->name, argv[cmd->max_args]);
    else
        fprintf(stderr, "sluice %s: missing arguments\nTry 'sluice %s --help'.\n", cmd->name,
                cmd->name);
    return SL_CLI_USAGE;
}

static int run_one(sl_cli *cli, const sl_cli_cmd *cmd, const sl_cli_cmd *family, int argc,
                   char **argv)
{
    unsigned flags = cmd->flags | (family ? family->flags : 0);
    void *o = calloc(1, cmd->opts_size ? cmd->opts_size : 1);
    sl_client *c = NULL;
    int first = 0, r;

    if (!o)
        return sl_cli_fail(cmd->name, "out of memory");
    if (cmd->init)
        cmd->init(o);
    r = sl_cli_parse(cli, cmd, family, o, argc, argv, &first);
    if (r == 0)
        r = check_args(cmd, family, argc - first, argv + first);
    if (r == 0 && (flags & SL_CLI_CONNECT))
        r = sl_cli_connect(&c, cli, family ? family->name : cmd->name);
    if (r == 0)
        r = cmd->run(cli, c, o, argc - first, argv + first);
    sl_client_close(c);
    if (cmd->fini)
        cmd->fini(o);
    free(o);
    return r == SL_CLI_DONE ? SL_CLI_OK : r;
}

int sl_cli_run(sl_cli *cli, const sl_cli_cmd *cmd, int argc, char **argv)
{
    const sl_cli_cmd *fam = cmd;

    if (!cmd->subs)
        return run_one(cli, cmd, NULL, argc, argv);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        family_help(argc < 2 ? stderr : stdout, fam);
        return argc < 2 ? SL_CLI_USAGE : SL_CLI_OK;
    }
    for (size_t i = 0; i < fam->n_subs; i++)
        if (strcmp(argv[1], fam->subs[i].name) == 0)
            return run_one(cli, &fam->subs[i], fam, argc - 1, argv + 1);
    fprintf(stderr, "sluice %s: unknown subcommand '%s'\nTry 'sluice %s --help'.\n", fam->name,
            argv[1], fam->name);
    return SL_CLI_USAGE;
}
