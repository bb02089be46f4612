/* Bearer tokens with roles, loaded from a file.
 *
 * The token file has one "<role> <token>" per line (roles: reader, trainer, admin); blank lines
 * and lines starting with '#' are ignored. Only SHA-256 digests of the tokens are kept in memory,
 * and a presented token is compared with every known digest in constant time. Tokens are never
 * logged: errors name the line, not the token.
 *
 * Roles nest: trainer can do everything reader can, admin everything.
 *
 * A trainer line may end in " jobs=<job>[,<job>...]" (at most 64 names): the token is bound to
 * those jobs. For a method that acts on a job (the RPC method's `scope`, such as
 * Epochs.ReportProgress) and needs the trainer role, a bound token may call it only for its
 * jobs, and a job that any token is bound to takes it only from its bound tokens; admin tokens
 * and the other methods are not affected. Jobs no token is bound to behave as before.
 */
#ifndef SL_AUTH_H
#define SL_AUTH_H

#include <stddef.h>

/* Access levels of RPC methods (the `access` field of sl_rpc_method). 0 is admin so that a method
 * nobody annotated fails closed. */
typedef enum sl_access {
    SL_ACCESS_ADMIN = 0,
    SL_ACCESS_PUBLIC = 1,  /* health probes */
    SL_ACCESS_READER = 2,  /* streams, get, list, verify, download */
    SL_ACCESS_TRAINER = 3, /* reader + progress, upload, commit */
} sl_access;

typedef struct sl_auth sl_auth;

/* Load a token file. Returns 0 and *out (free with sl_auth_free), -errno if unreadable, or
 * SL_EINVAL with msg naming the line and what is wrong with it. Any thread. */
int sl_auth_load(sl_auth **out, const char *path, char *msg, size_t len);

void sl_auth_free(sl_auth *a);

/* Number of tokens loaded. */
size_t sl_auth_count(const sl_auth *a);

/* Decide a call (the sl_rpc_authorize_fn contract) against `a`: `scope` is the job the call acts
 * on (NULL: none, or not known yet), checked against trainer tokens' bindings. `a` NULL allows
 * everything. */
int sl_auth_check(const sl_auth *a, const char *method, unsigned access, const char *token,
                  const char *scope, char *msg, size_t len);

#endif
