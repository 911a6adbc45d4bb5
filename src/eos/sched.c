/*
 * sched.c - running offload threads below the serving threads (design 2.10
 * "CPU": transfer and disk threads run with a positive nice value; design
 * 2.12 "offload threads run below the serving threads' priority"), and
 * naming threads for top and gdb.
 *
 * DESIGN
 *   Both calls act on the calling thread only.  Linux schedules threads, not
 *   processes: sched_setscheduler and setpriority(PRIO_PROCESS, id) given a
 *   thread id change that one thread, so the model worker and HTTP threads
 *   keep their policy and nice value.  (POSIX would have setpriority act on
 *   the whole process; Linux does not, and this file relies on it.)
 *
 *   The scheduling class is one process-wide choice (eos_offload_sched_set,
 *   `flare run --offload-sched`), read when an offload thread starts:
 *   SCHED_OTHER (the default), SCHED_BATCH (design 2.10's choice) or
 *   SCHED_IDLE.  Why not SCHED_BATCH by default (docs/architecture.md,
 *   design 2.10 row; docs/performance.md "Scheduling class"): a batch
 *   thread gets no wake-up preemption, so each hand-off of a restore (disk
 *   thread, copy thread, back to the worker) waited for a scheduler tick
 *   while another task ran (a 21 KiB disk restore 8-16 ms at SCHED_BATCH,
 *   under 0.5 ms at SCHED_OTHER), and decode under copy-out measured no
 *   better isolation for it.  The nice value is what keeps offload below
 *   serving in either class.
 *
 *   The nice value only ever goes up.  A thread already nicer than asked
 *   keeps its value: for a privileged process setpriority would otherwise
 *   lower it, raising the offload thread's priority, the opposite of the
 *   call's purpose.  The class is a relaxed atomic: set once at startup.
 */
#include "eos.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static _Atomic int offload_class = EOS_SCHED_OTHER;

static const struct {
	const char *name, *policy_name;
	int policy;
} classes[] = {[EOS_SCHED_OTHER] = {"other", "SCHED_OTHER", SCHED_OTHER},
	       [EOS_SCHED_BATCH] = {"batch", "SCHED_BATCH", SCHED_BATCH},
	       [EOS_SCHED_IDLE] = {"idle", "SCHED_IDLE", SCHED_IDLE}};

static bool known(enum eos_sched_class c) { return (unsigned)c <= EOS_SCHED_IDLE; }

void eos_offload_sched_set(enum eos_sched_class c)
{
	if (known(c))
		atomic_store_explicit(&offload_class, c, memory_order_relaxed);
}

enum eos_sched_class eos_offload_sched(void)
{
	return (enum eos_sched_class)atomic_load_explicit(&offload_class, memory_order_relaxed);
}

const char *eos_sched_class_name(enum eos_sched_class c)
{
	return known(c) ? classes[c].name : "?";
}

int eos_sched_class_parse(const char *s, enum eos_sched_class *out)
{
	for (int c = EOS_SCHED_OTHER; c <= EOS_SCHED_IDLE; c++)
		if (s && !strcmp(s, classes[c].name)) {
			*out = (enum eos_sched_class)c;
			return 0;
		}
	return -EINVAL;
}

int eos_thread_lower_priority(int nice)
{
	if (nice < 1 || nice > 19)
		return eos_fail(-EINVAL, "thread priority: nice %d out of range (expected 1..19)",
				nice);
	pid_t tid = gettid();
	int cls_err = 0, nice_err = 0, cur;
	enum eos_sched_class c = eos_offload_sched();
	const char *pname = classes[c].policy_name;

	struct sched_param sp = {.sched_priority = 0};
	if (sched_setscheduler(tid, classes[c].policy, &sp) != 0)
		cls_err = errno;

	errno = 0;
	cur = getpriority(PRIO_PROCESS, (id_t)tid);
	if (cur == -1 && errno != 0)
		nice_err = errno;
	else if (cur < nice && setpriority(PRIO_PROCESS, (id_t)tid, nice) != 0)
		nice_err = errno;

	if (cls_err && nice_err)
		return eos_fail(-cls_err,
				"thread %d: cannot switch to %s (%s) nor raise "
				"its nice value to %d (%s)",
				(int)tid, pname, strerror(cls_err), nice, strerror(nice_err));
	if (cls_err)
		return eos_fail(-cls_err,
				"thread %d: cannot switch to %s: %s (nice "
				"value %d applied)",
				(int)tid, pname, strerror(cls_err), nice);
	if (nice_err)
		return eos_fail(-nice_err,
				"thread %d: cannot raise its nice value to %d: %s "
				"(%s applied)",
				(int)tid, nice, strerror(nice_err), pname);
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

uint32_t eos_cpus_allowed(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return 0;
	return (uint32_t)CPU_COUNT(&set);
}
