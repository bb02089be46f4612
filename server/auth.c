#include "auth.h"

#include "err.h"
#include "util/array.h"
#include "util/name.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROLE_READER = 1, ROLE_TRAINER = 2, ROLE_ADMIN = 3 };

#define TOKEN_MIN  16
#define TOKEN_MAX  512
#define TOKENS_MAX 4096
#define JOBS_MAX   64 /* jobs one trainer token may be bound to */

typedef struct entry {
    unsigned char digest[SHA256_DIGEST_LENGTH];
    int role;
    /* The jobs a bound trainer token may report to, as ",a,b," (so that ",<job>," is found
     * whole), or NULL: an unbound token. */
    char *jobs;
} entry;

struct sl_auth {
    entry *e;
    size_t n, cap;
};

static const char *const role_names[] = {NULL, "reader", "trainer", "admin"};

static int parse_role(const char *s)
{
    for (int r = ROLE_READER; r <= ROLE_ADMIN; r++)
        if (strcmp(s, role_names[r]) == 0)
            return r;
    return 0;
}

/* Characters allowed in a token: those of base64url, base64 and hex, plus '.', '~'. */
static int token_ok(const char *t, size_t n)
{
    if (n < TOKEN_MIN || n > TOKEN_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)t[i]) && !strchr("-._~+/=", t[i]))
            return 0;
    return 1;
}

/* "a,b,c" (after "jobs=") into *out as ",a,b,c,": each a job name, none twice, at most
 * JOBS_MAX. SL_EINVAL with msg naming the line, or -ENOMEM. */
static int parse_jobs(char **out, const char *list, const char *path, int lineno, char *msg,
                      size_t len)
{
    size_t n = strlen(list), count = 0;
    char *jobs = malloc(n + 3), *p, *next, why[200];
    int err = 0;

    *out = NULL;
    if (!jobs)
        return -ENOMEM;
    jobs[0] = ',';
    memcpy(jobs + 1, list, n);
    memcpy(jobs + 1 + n, ",", 2);
    for (p = jobs + 1; !err && *p; p = next + 1) {
        next = strchr(p, ',');
        *next = 0;
        if (sl_name_check("job", p, why, sizeof(why)) != 0) {
            snprintf(msg, len, "%s line %d: %s", path, lineno, why);
            err = SL_EINVAL;
        } else if (++count > JOBS_MAX) {
            snprintf(msg, len, "%s line %d: a token is bound to at most %d jobs", path, lineno,
                     JOBS_MAX);
            err = SL_EINVAL;
        }
        *next = ',';
        if (!err) {
            /* Seen before: ",<job>," occurs earlier in the list. */
            size_t k = (size_t)(next - p);
            for (const char *q = jobs; q < p - 1; q = strchr(q + 1, ','))
                if (strncmp(q + 1, p, k) == 0 && q[1 + k] == ',') {
                    snprintf(msg, len, "%s line %d: job '%.*s' named twice", path, lineno, (int)k,
                             p);
                    err = SL_EINVAL;
                    break;
                }
        }
    }
    if (err)
        free(jobs);
    else
        *out = jobs;
    return err;
}

int sl_auth_load(sl_auth **out, const char *path, char *msg, size_t len)
{
    sl_auth *a = NULL;
    char line[TOKEN_MAX + 80 + JOBS_MAX * (SL_NAME_MAX + 1)];
    entry e = {.jobs = NULL};
    int lineno = 0, err = 0;
    FILE *f;

    *out = NULL;
    f = fopen(path, "r");
    if (!f) {
        err = -errno;
        snprintf(msg, len, "cannot read token file %s: %s", path, sl_strerror(err));
        return err;
    }
    a = calloc(1, sizeof(*a));
    if (!a) {
        err = -ENOMEM;
        goto out;
    }
    while (fgets(line, sizeof(line), f)) {
        char *role, *token, *rest, *save = NULL;
        size_t tlen;

        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(msg, len, "%s line %d: longer than %zu characters", path, lineno,
                     sizeof(line) - 2);
            err = SL_EINVAL;
            goto out;
        }
        role = strtok_r(line, " \t\r\n", &save);
        if (!role || role[0] == '#')
            continue;
        token = strtok_r(NULL, " \t\r\n", &save);
        rest = strtok_r(NULL, " \t\r\n", &save);
        e.jobs = NULL;
        if (rest && strncmp(rest, "jobs=", 5) == 0) {
            if ((err = parse_jobs(&e.jobs, rest + 5, path, lineno, msg, len)) != 0)
                goto out;
            rest = strtok_r(NULL, " \t\r\n", &save);
        }
        if (!(e.role = parse_role(role))) {
            snprintf(msg, len, "%s line %d: unknown role '%.32s' (reader, trainer or admin)", path,
                     lineno, role);
            err = SL_EINVAL;
            goto out;
        }
        tlen = token ? strlen(token) : 0;
        if (e.jobs && e.role != ROLE_TRAINER) {
            snprintf(msg, len, "%s line %d: only a trainer token can be bound to jobs", path,
                     lineno);
            err = SL_EINVAL;
            goto out;
        }
        if (!token || rest || !token_ok(token, tlen)) {
            snprintf(msg, len,
                     "%s line %d: expected '<role> <token>' (a trainer's may end in "
                     "' jobs=<job>[,<job>...]') with a token of %d to %d characters "
                     "from [A-Za-z0-9-._~+/=]",
                     path, lineno, TOKEN_MIN, TOKEN_MAX);
            err = SL_EINVAL;
            goto out;
        }
        SHA256((const unsigned char *)token, tlen, e.digest);
        OPENSSL_cleanse(token, tlen);
        for (size_t i = 0; i < a->n; i++) {
            if (memcmp(a->e[i].digest, e.digest, sizeof(e.digest)) == 0) {
                snprintf(msg, len, "%s line %d: duplicate token", path, lineno);
                err = SL_EINVAL;
                goto out;
            }
        }
        if (a->n == TOKENS_MAX) {
            snprintf(msg, len, "%s: more than %d tokens", path, TOKENS_MAX);
            err = SL_ELIMIT;
            goto out;
        }
        if (sl_array_grow((void **)&a->e, &a->cap, a->n, sizeof(*a->e), 8) != 0) {
            err = -ENOMEM;
            goto out;
        }
        a->e[a->n++] = e;
        e.jobs = NULL;
    }
    if (ferror(f))
        err = -EIO;
out:
    if (err)
        free(e.jobs);
    OPENSSL_cleanse(line, sizeof(line));
    fclose(f);
    if (err) {
        if (err == -ENOMEM || err == -EIO)
            snprintf(msg, len, "cannot read token file %s: %s", path, sl_strerror(err));
        sl_auth_free(a);
        return err;
    }
    *out = a;
    return 0;
}

void sl_auth_free(sl_auth *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++)
        free(a->e[i].jobs);
    free(a->e);
    free(a);
}

size_t sl_auth_count(const sl_auth *a)
{
    return a ? a->n : 0;
}

static const char *access_name(unsigned access)
{
    switch (access) {
    case SL_ACCESS_READER:
        return "reader";
    case SL_ACCESS_TRAINER:
        return "trainer";
    default:
        return "admin";
    }
}

/* 1 if the job list `jobs` (",a,b,") names `job`. */
static int names_job(const char *jobs, const char *job)
{
    size_t k = strlen(job);

    for (const char *q = jobs; q && q[1]; q = strchr(q + 1, ','))
        if (strncmp(q + 1, job, k) == 0 && q[1 + k] == ',')
            return 1;
    return 0;
}

/* A trainer token's binding against the job a call acts on: a bound token reports only to its
 * jobs, and a job that some token is bound to takes reports only from its bound tokens (and
 * admin tokens). `me` is the presented token's entry. */
static int check_binding(const sl_auth *a, const entry *me, const char *method, const char *job,
                         char *msg, size_t len)
{
    if (me->jobs) {
        if (names_job(me->jobs, job))
            return 0;
        snprintf(msg, len, "this trainer token is bound to other jobs than '%.128s' (%s)", job,
                 method);
        return SL_EPERM;
    }
    for (size_t i = 0; i < a->n; i++) {
        if (a->e[i].jobs && names_job(a->e[i].jobs, job)) {
            snprintf(msg, len, "job '%.128s' takes %s only from the trainer tokens bound to it",
                     job, method);
            return SL_EPERM;
        }
    }
    return 0;
}

int sl_auth_check(const sl_auth *a, const char *method, unsigned access, const char *token,
                  const char *scope, char *msg, size_t len)
{
    unsigned char digest[SHA256_DIGEST_LENGTH];
    const entry *me = NULL;
    int role = 0, need;

    if (!a || access == SL_ACCESS_PUBLIC)
        return 0;
    if (!token || !*token) {
        snprintf(msg, len, "%s requires a bearer token (authorization metadata)", method);
        return SL_EAUTH;
    }
    SHA256((const unsigned char *)token, strlen(token), digest);
    /* Look at every entry whatever matches, so the time taken says nothing about the table. */
    for (size_t i = 0; i < a->n; i++) {
        int eq = CRYPTO_memcmp(digest, a->e[i].digest, sizeof(digest)) == 0;
        role |= eq ? a->e[i].role : 0;
        me = eq ? &a->e[i] : me;
    }
    if (!role) {
        snprintf(msg, len, "unknown bearer token for %s", method);
        return SL_EAUTH;
    }
    need = access == SL_ACCESS_READER    ? ROLE_READER
           : access == SL_ACCESS_TRAINER ? ROLE_TRAINER
                                         : ROLE_ADMIN;
    if (role < need) {
        snprintf(msg, len, "role %s may not call %s (needs %s)", role_names[role], method,
                 access_name(access));
        return SL_EPERM;
    }
    if (scope && access == SL_ACCESS_TRAINER && role == ROLE_TRAINER)
        return check_binding(a, me, method, scope, msg, len);
    return 0;
}
