/* Clocks: wall time for timestamps that are stored or shown, monotonic time for intervals.
 * Thread-safe. See docs/util.md.
 */
#ifndef SL_UTIL_CLOCK_H
#define SL_UTIL_CLOCK_H

#include <stdint.h>

/* Wall-clock time (CLOCK_REALTIME) in milliseconds since the Unix epoch: for created/committed
 * timestamps and log lines. It can jump; never measure intervals with it. */
int64_t sl_now_ms(void);

/* Monotonic time (CLOCK_MONOTONIC) in nanoseconds since an arbitrary start: for intervals,
 * deadlines and rates. Comparable only within one boot. */
uint64_t sl_mono_ns(void);

#endif
