/* The calling thread's last error (sl_client_error): every file of libsluice records its failures
 * here, the lowest file of the library (it calls none of the others). */
#include "sluice.h"

#include "internal.h"

#include "err.h"
#include "rpc/client.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1100];

static int record(int err, const sl_rpc_status *st)
{
    if (err)
        snprintf(last_error, sizeof(last_error), "%s: %s", sl_rpc_code_name(st->code),
                 st->message[0] ? st->message : sl_strerror(err));
    return err;
}

int sl_client_record(int err, const sl_rpc_status *st)
{
    return record(err, st);
}

int sl_client_set_error(int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return err;
}

const char *sl_client_error(void)
{
    return last_error;
}
