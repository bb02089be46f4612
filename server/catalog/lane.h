/* The catalog lane: how the loop thread runs work that waits for a catalog server without ever
 * waiting itself.
 *
 * Work that may run a statement (an RPC handler, a timer's chore, a worker job's completion) is
 * handed to the lane with sl_lane_run. The lane runs it at once if it is idle, on a stack of its
 * own (a fiber); a statement then sends its query and suspends the lane (sl_lane_suspend) until
 * the connection's socket is readable or its deadline passed, and meanwhile the loop goes on with
 * everything else: index streams, health checks, completions, other timers. Work handed over
 * while the lane is busy waits its turn, first come first served: two pieces of work never
 * interleave, so each sees the daemon's state as if it ran alone, as it did when the loop ran
 * statements itself. What runs outside the lane must not free what lane work may hold (calls and
 * jobs: the RPC server queues a call's later events behind its earlier ones in the lane).
 * Loop thread only.
 */
#ifndef SL_CATALOG_LANE_H
#define SL_CATALOG_LANE_H

typedef struct sl_lane sl_lane;
typedef void (*sl_lane_fn)(void *a, int b);

int sl_lane_new(sl_lane **out);
/* After the lane went idle (sl_lane_idle). Accepts NULL. */
void sl_lane_free(sl_lane *l);

/* Run fn(a, b) in the lane: now if it is idle (returning once fn ended or suspended), else after
 * the work queued before it. From inside the lane: queued, run after the current work. */
void sl_lane_run(sl_lane *l, sl_lane_fn fn, void *a, int b);

/* Whether the loop thread is in l's fiber now; NULL: 0. */
int sl_lane_here(const sl_lane *l);
/* Nothing runs, waits or is queued; NULL: 1. */
int sl_lane_idle(const sl_lane *l);

/* From inside the lane: back to the loop's stack until sl_lane_resume. */
void sl_lane_suspend(sl_lane *l);
/* From the loop's stack: continue the suspended lane (until it suspends again or is idle). */
void sl_lane_resume(sl_lane *l);

/* fn(arg) once the lane is idle (now if it is): one at a time. */
void sl_lane_when_idle(sl_lane *l, void (*fn)(void *), void *arg);

#endif
