/*
 * sched.c - running offload threads below the serving threads (design 2.10
 * "CPU": transfer and disk threads use SCHED_BATCH with a positive nice
 * value; design 2.12 "offload threads run below the serving threads'
 * priority"), and naming threads for top and gdb.
 *
 * DESIGN
 *   Both calls act on the calling thread only.  Linux schedules threads, not
 *   processes: sched_setscheduler and setpriority(PRIO_PROCESS, id) given a
 *   thread id change that one thread, so the model worker and HTTP threads
 *   keep their policy and nice value.  (POSIX would have setpriority act on
 *   the whole process; Linux does not, and this file relies on it.)
 *
 *   The nice value only ever goes up.  A thread already nicer than asked
 *   keeps its value: for a privileged process setpriority would otherwise
 *   lower it, raising the offload thread's priority, the opposite of the
 *   call's purpose.  Stateless.
 */
#include "eos.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

int eos_thread_lower_priority(int nice)
{
	if (nice < 1 || nice > 19)
		return eos_fail(-EINVAL, "thread priority: nice %d out of range (expected 1..19)",
				nice);
	pid_t tid = gettid();
	int batch_err = 0, nice_err = 0, cur;

	struct sched_param sp = {.sched_priority = 0};
	if (sched_setscheduler(tid, SCHED_BATCH, &sp) != 0)
		batch_err = errno;

	errno = 0;
	cur = getpriority(PRIO_PROCESS, (id_t)tid);
	if (cur == -1 && errno != 0)
		nice_err = errno;
	else if (cur < nice && setpriority(PRIO_PROCESS, (id_t)tid, nice) != 0)
		nice_err = errno;

	if (batch_err && nice_err)
		return eos_fail(-batch_err,
				"thread %d: cannot switch to SCHED_BATCH (%s) nor raise "
				"its nice value to %d (%s)",
				(int)tid, strerror(batch_err), nice, strerror(nice_err));
	if (batch_err)
		return eos_fail(-batch_err,
				"thread %d: cannot switch to SCHED_BATCH: %s (nice "
				"value %d applied)",
				(int)tid, strerror(batch_err), nice);
	if (nice_err)
		return eos_fail(-nice_err,
				"thread %d: cannot raise its nice value to %d: %s "
				"(SCHED_BATCH applied)",
				(int)tid, nice, strerror(nice_err));
	return 0;
}

void eos_thread_name(const char *name)
{
	if (!name)
		return;
	char buf[16]; /* the kernel's TASK_COMM_LEN, NUL included */
	size_t n = strnlen(name, sizeof buf - 1);
	memcpy(buf, name, n);
	buf[n] = '\0';
	pthread_setname_np(pthread_self(), buf);
}
