/*
 * clock.c - clocks in nanoseconds, and sleeping.
 *
 * DESIGN
 *   Durations and deadlines (transfer rates, expiry sweeps, drain limits)
 *   use CLOCK_MONOTONIC, which never jumps with the wall clock.  The coarse
 *   clock reads the vDSO's last tick without touching the hardware, for hot
 *   paths that only need ~4 ms resolution (LRU stamps).  The wall clock is
 *   only for what must agree with other processes: file times.  A uint64 of
 *   nanoseconds lasts 584 years from either epoch.  Stateless.
 */
#include "eos.h"

#include <errno.h>
#include <time.h>

static uint64_t read_clock(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t eos_now_ns(void) { return read_clock(CLOCK_MONOTONIC); }

uint64_t eos_now_coarse_ns(void) { return read_clock(CLOCK_MONOTONIC_COARSE); }

uint64_t eos_wall_ns(void) { return read_clock(CLOCK_REALTIME); }

void eos_sleep_ns(uint64_t ns)
{
	if (ns == 0)
		return;
	/* An absolute deadline, so signals that interrupt the sleep do not
	 * stretch it by the time already slept. */
	uint64_t end = eos_now_ns() + ns;
	if (end < ns)
		end = UINT64_MAX;
	struct timespec ts = {.tv_sec = (time_t)(end / 1000000000u),
			      .tv_nsec = (long)(end % 1000000000u)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}
