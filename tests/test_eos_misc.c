/*
 * test_eos_misc.c - error messages, clocks, filesystem and memory sizes,
 * thread priority and names.
 */
#include "eos_test.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

static char *tmp;

static void cleanup(void)
{
	if (tmp)
		test_rmtree(tmp);
}

/* ---- errors --------------------------------------------------------------- */

static void *other_thread_msg(void *arg)
{
	(void)arg;
	/* A fresh thread starts with no message, and its failures stay its own. */
	bool empty = eos_errmsg()[0] == '\0';
	eos_fail(-EIO, "other thread");
	return (void *)(uintptr_t)(empty && strcmp(eos_errmsg(), "other thread") == 0);
}

static void test_errors(void)
{
	eos_errclear();
	CHECK(strcmp(eos_errmsg(), "") == 0);
	errno = EAGAIN;
	CHECK(eos_fail(-ENOENT, "size '%s': %d", "8X", 42) == -ENOENT);
	CHECK(errno == EAGAIN); /* preserved */
	CHECK(strcmp(eos_errmsg(), "size '8X': 42") == 0);
	CHECK(eos_fail(0, "not a failure") == 0);

	/* Wrapping the previous message in a new one. */
	eos_fail(-EIO, "inner");
	eos_fail(-EIO, "outer: %s", eos_errmsg());
	CHECK(strcmp(eos_errmsg(), "outer: inner") == 0);
	eos_fail(-EIO, "%s%s", eos_errmsg(), eos_errmsg());
	CHECK(strcmp(eos_errmsg(), "outer: innerouter: inner") == 0);

	/* Long messages are cut at 511 bytes... */
	char big[1000];
	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	eos_fail(-EIO, "%s", big);
	CHECK(strlen(eos_errmsg()) == EOS_ERRMSG_MAX - 1);
	/* ...never inside a UTF-8 sequence ("\xc3\xa9" is e-acute). */
	memset(big, 'a', 510);
	memcpy(big + 510, "\xc3\xa9 tail", 8);
	eos_fail(-EIO, "%s", big);
	CHECK(strlen(eos_errmsg()) == 510);
	memset(big, 'a', 509);
	memcpy(big + 509, "\xc3\xa9 tail", 8);
	eos_fail(-EIO, "%s", big);
	CHECK(strlen(eos_errmsg()) == 511);
	CHECK(memcmp(eos_errmsg() + 509, "\xc3\xa9", 2) == 0);

	eos_fail(-EIO, "main thread");
	pthread_t t;
	void *ok;
	CHECK(pthread_create(&t, NULL, other_thread_msg, NULL) == 0);
	CHECK(pthread_join(t, &ok) == 0);
	CHECK(ok == (void *)1);
	CHECK(strcmp(eos_errmsg(), "main thread") == 0);
}

/* ---- clocks --------------------------------------------------------------- */

static void test_clocks(void)
{
	uint64_t prev = eos_now_ns(), prev_coarse = eos_now_coarse_ns();
	for (int i = 0; i < 100000; i++) {
		uint64_t now = eos_now_ns(), coarse = eos_now_coarse_ns();
		CHECK(now >= prev);
		CHECK(coarse >= prev_coarse);
		prev = now;
		prev_coarse = coarse;
	}
	/* The coarse clock lags the fine one by at most a few ticks. */
	uint64_t coarse = eos_now_coarse_ns(), fine = eos_now_ns();
	CHECKF(coarse <= fine && fine - coarse < 100000000, "fine %" PRIu64 " coarse %" PRIu64,
	       fine, coarse);
	/* Wall clock: after 2020, and agrees with time(). */
	uint64_t wall = eos_wall_ns();
	CHECK(wall > 1577836800ull * 1000000000u);
	int64_t d = (int64_t)(wall / 1000000000u) - (int64_t)time(NULL);
	CHECK(d >= -2 && d <= 2);

	uint64_t t0 = eos_now_ns();
	eos_sleep_ns(2000000);
	uint64_t slept = eos_now_ns() - t0;
	CHECKF(slept >= 2000000, "slept %" PRIu64 " ns", slept);
	t0 = eos_now_ns();
	eos_sleep_ns(0);
	CHECK(eos_now_ns() - t0 < 1000000000u);
}

/* ---- capacity ------------------------------------------------------------- */

static void test_capacity(void)
{
	uint64_t avail = 0, total = 0;
	CHECK_OK(eos_fs_space(tmp, &avail, &total));
	CHECK(total > 0 && avail <= total);
	uint64_t a2 = 0;
	CHECK_OK(eos_fs_space(tmp, &a2, NULL));
	CHECK_OK(eos_fs_space(tmp, NULL, NULL));
	char sa[16], st[16];
	printf("fs %s: %s available of %s\n", tmp, eos_format_size(avail, sa, sizeof sa),
	       eos_format_size(total, st, sizeof st));

	char missing[4200];
	snprintf(missing, sizeof missing, "%s/missing", tmp);
	CHECK_RC(eos_fs_space(missing, &avail, &total), -ENOENT);
	CHECK_MSG(missing);
	CHECK_RC(eos_fs_space("", &avail, &total), -EINVAL);

	uint64_t mt = 0, ma = 0;
	CHECK_OK(eos_mem_info(&mt, &ma));
	CHECK(mt > 0 && ma > 0 && ma <= mt);
	printf("memory: %s available of %s\n", eos_format_size(ma, sa, sizeof sa),
	       eos_format_size(mt, st, sizeof st));
	/* MemTotal is the kernel's total RAM, as sysconf reports it. */
	uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	CHECKF(mt >= phys / 2 && mt <= phys * 2, "MemTotal %" PRIu64 " vs sysconf %" PRIu64, mt,
	       phys);
	CHECK_OK(eos_mem_info(NULL, &ma));
	CHECK_OK(eos_mem_info(&mt, NULL));
}

/* ---- priority and names --------------------------------------------------- */

struct prio_result {
	int rc;
	char msg[EOS_ERRMSG_MAX];
	int policy, nice;
	int preset; /* nice set before the call, or 0 */
	int want;   /* nice asked for */
};

static void *lower_in_thread(void *arg)
{
	struct prio_result *r = arg;
	if (r->preset)
		setpriority(PRIO_PROCESS, (id_t)gettid(), r->preset);
	r->rc = eos_thread_lower_priority(r->want);
	snprintf(r->msg, sizeof r->msg, "%s", r->rc ? eos_errmsg() : "");
	r->policy = sched_getscheduler(0);
	errno = 0;
	r->nice = getpriority(PRIO_PROCESS, (id_t)gettid());
	return NULL;
}

static void run_lower(struct prio_result *r)
{
	pthread_t t;
	CHECK(pthread_create(&t, NULL, lower_in_thread, r) == 0);
	CHECK(pthread_join(t, NULL) == 0);
}

/* eos_grow: no-op when large enough, doubling from 16, contents kept,
 * -ENOMEM (array unchanged) when the size overflows. */
static void test_grow(void)
{
	uint32_t *a = NULL;
	size_t cap = 0;
	CHECK_OK(eos_grow((void **)&a, &cap, 1, sizeof(*a)));
	CHECK(a && cap == 16);
	for (uint32_t i = 0; i < 16; i++)
		a[i] = i * 7;
	uint32_t *before = a;
	CHECK_OK(eos_grow((void **)&a, &cap, 16, sizeof(*a)));
	CHECK(a == before && cap == 16);
	CHECK_OK(eos_grow((void **)&a, &cap, 33, sizeof(*a)));
	CHECK(cap == 64);
	for (uint32_t i = 0; i < 16; i++)
		CHECK(a[i] == i * 7);
	size_t cap2 = cap;
	uint32_t *keep = a;
	CHECK_RC(eos_grow((void **)&a, &cap2, SIZE_MAX / 2 + 2, sizeof(*a)), -ENOMEM);
	CHECK_RC(eos_grow((void **)&a, &cap2, SIZE_MAX / 4 + 1, 8), -ENOMEM);
	CHECK(a == keep && cap2 == 64 && a[15] == 105);
	free(a);
}

/* The scheduling class every offload thread gets (eos_offload_sched_set). */
static void check_class(enum eos_sched_class c, int want_policy)
{
	eos_offload_sched_set(c);
	CHECK(eos_offload_sched() == c);
	struct prio_result r = {.want = 10};
	run_lower(&r);
	if (r.rc == 0) {
		CHECKF(r.policy == want_policy, "class %s: policy %d after success",
		       eos_sched_class_name(c), r.policy);
		CHECKF(r.nice >= 10, "nice %d after success", r.nice);
	} else {
		/* Refused: the error names the step, and what was applied shows. */
		printf("note: kernel refused: %d: %s\n", r.rc, r.msg);
		CHECK(r.rc < 0);
		CHECK(strstr(r.msg, "SCHED_") || strstr(r.msg, "nice"));
		if (strstr(r.msg, "nice value 10 applied"))
			CHECK(r.nice >= 10);
	}
}

static void test_priority(void)
{
	int policy0 = sched_getscheduler(0);
	errno = 0;
	int nice0 = getpriority(PRIO_PROCESS, (id_t)gettid());
	CHECK(errno == 0);

	CHECK(eos_offload_sched() == EOS_SCHED_OTHER); /* the default */
	check_class(EOS_SCHED_BATCH, SCHED_BATCH);
	check_class(EOS_SCHED_IDLE, SCHED_IDLE);
	check_class(EOS_SCHED_OTHER, SCHED_OTHER);
	eos_offload_sched_set((enum eos_sched_class)7); /* ignored */
	CHECK(eos_offload_sched() == EOS_SCHED_OTHER);
	enum eos_sched_class c = EOS_SCHED_IDLE;
	CHECK_RC(eos_sched_class_parse("batch", &c), 0);
	CHECK(c == EOS_SCHED_BATCH && !strcmp(eos_sched_class_name(c), "batch"));
	CHECK_RC(eos_sched_class_parse("Batch", &c), -EINVAL);
	CHECK_RC(eos_sched_class_parse(NULL, &c), -EINVAL);
	CHECK(c == EOS_SCHED_BATCH);
	/* Only that thread changed. */
	CHECK(sched_getscheduler(0) == policy0);
	errno = 0;
	CHECK(getpriority(PRIO_PROCESS, (id_t)gettid()) == nice0);

	/* Never lowers a nicer thread's nice value (root could). */
	struct prio_result r2 = {.want = 5, .preset = 15};
	run_lower(&r2);
	CHECKF(r2.nice >= 15 || nice0 > 15, "nice %d: lowered from 15 by asking for 5", r2.nice);

	CHECK_RC(eos_thread_lower_priority(0), -EINVAL);
	CHECK_MSG("nice 0 out of range");
	CHECK_RC(eos_thread_lower_priority(20), -EINVAL);
	CHECK_RC(eos_thread_lower_priority(-5), -EINVAL);
	CHECK(sched_getscheduler(0) == policy0);
}

static void *name_thread(void *arg)
{
	char *got = arg;
	eos_thread_name("eos-test-thread-with-a-long-name");
	pthread_getname_np(pthread_self(), got, 16);
	return NULL;
}

static void test_thread_name(void)
{
	char got[16] = {0};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, name_thread, got) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	CHECKF(strcmp(got, "eos-test-thread") == 0, "name '%s'", got);
	eos_thread_name(NULL); /* ignored */
}

int main(void)
{
	tmp = test_mkdtemp("eos-misc");
	CHECK(tmp != NULL);
	test_fail_cb = cleanup;

	test_errors();
	test_clocks();
	test_capacity();
	test_grow();
	test_priority();
	test_thread_name();

	test_fail_cb = NULL;
	cleanup();
	printf("ok\n");
	return 0;
}
