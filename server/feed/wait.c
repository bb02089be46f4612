/* Calls parked until a worker-pool product (a batch plan, a torch-mode share) is ready. */
#include "internal.h"
#include "util/array.h"

#include <errno.h>
#include <stdlib.h>

int feed_waiters_add(fwaiters *w, sl_rpc_call *call, feed_ready_cb cb)
{
    if (sl_array_grow((void **)&w->v, &w->cap, w->n, sizeof(*w->v), 4) != 0)
        return -ENOMEM;
    w->v[w->n].call = call;
    w->v[w->n].cb = cb;
    w->n++;
    sl_rpc_call_ref(call);
    return 0;
}

void feed_waiters_run(fwaiters *w, sl_feed *f, const char *job)
{
    fwaiter *v = w->v;
    size_t n = w->n;

    w->v = NULL;
    w->n = w->cap = 0;
    for (size_t i = 0; i < n; i++) {
        v[i].cb(v[i].call, f, job);
        sl_rpc_call_unref(v[i].call);
    }
    free(v);
}
