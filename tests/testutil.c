/* testutil.c - the shared test harness (see testutil.h). */
#include "testutil.h"

#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void (*test_fail_cb)(void);

void test_fail_hook(void)
{
	if (test_fail_cb) {
		void (*cb)(void) = test_fail_cb;
		test_fail_cb = NULL;
		cb();
	}
}

uint64_t test_seed(void)
{
	static uint64_t seed;
	static bool have;
	if (!have) {
		const char *s = getenv("TEST_SEED");
		if (s && *s) {
			seed = strtoull(s, NULL, 0);
		} else {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^
			       (uint64_t)getpid();
		}
		have = true;
		printf("seed: TEST_SEED=%" PRIu64 "\n", seed);
		fflush(stdout);
	}
	return seed;
}

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void test_rng_init(test_rng *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t test_rng_next(test_rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

void test_rng_fill(test_rng *r, void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len >= 8) {
		uint64_t v = test_rng_next(r);
		memcpy(p, &v, 8);
		p += 8;
		len -= 8;
	}
	if (len) {
		uint64_t v = test_rng_next(r);
		memcpy(p, &v, len);
	}
}

char *test_mkdtemp(const char *tag)
{
	const char *base = getenv("TEST_TMPDIR");
	if (!base || !*base)
		base = getenv("TMPDIR");
	if (!base || !*base)
		base = "/tmp";
	char *path = NULL;
	if (asprintf(&path, "%s/%s.XXXXXX", base, tag ? tag : "t") < 0)
		return NULL;
	if (!mkdtemp(path)) {
		free(path);
		return NULL;
	}
	return path;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(p);
}

int test_rmtree(const char *path) { return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

bool test_soak(void)
{
	const char *s = getenv("SELENE_SOAK");
	return s && *s && strcmp(s, "0") != 0;
}

bool test_aborts(void (*fn)(void *), void *arg, const char *want)
{
	int p[2];
	CHECK(pipe(p) == 0);
	fflush(NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		dup2(p[1], 2);
		fn(arg);
		_exit(0);
	}
	close(p[1]);
	char buf[8192];
	size_t n = 0;
	ssize_t k;
	while ((k = read(p[0], buf + n, sizeof buf - 1 - n)) > 0)
		n += (size_t)k;
	buf[n] = 0;
	close(p[0]);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	bool aborted = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
	if (!aborted || (want && !strstr(buf, want))) {
		fprintf(stderr, "the child %s; it wrote: %s\n",
			aborted           ? "aborted"
			: WIFSIGNALED(st) ? "died of another signal"
					  : "exited",
			buf);
		return false;
	}
	return true;
}

int test_threads_named(const char *name, int *tids, int cap)
{
	DIR *d = opendir("/proc/self/task");
	CHECK(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[300], comm[32] = "";
		snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue; /* it just ended */
		if (fgets(comm, sizeof comm, f))
			comm[strcspn(comm, "\n")] = '\0';
		fclose(f);
		if (strcmp(comm, name) != 0)
			continue;
		if (n < cap)
			tids[n] = atoi(e->d_name);
		n++;
	}
	closedir(d);
	return n;
}

static bool elapsed_20s(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec - t0->tv_sec >= 20;
}

static void nap_1ms(void)
{
	struct timespec nap = {0, 1000000};
	nanosleep(&nap, NULL);
}

int test_new_thread(const char *name, const int *before, int n)
{
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int now[64];
		int k = test_threads_named(name, now, 64);
		for (int i = 0; i < k && i < 64; i++) {
			bool old = false;
			for (int j = 0; j < n && !old; j++)
				old = now[i] == before[j];
			if (!old)
				return now[i];
		}
		CHECKF(!elapsed_20s(&t0), "no new thread '%s' after 20 s", name);
		nap_1ms();
	}
}

void test_wait_thread_gone(int tid)
{
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char path[64];
	snprintf(path, sizeof path, "/proc/self/task/%d", tid);
	while (access(path, F_OK) == 0) {
		CHECKF(!elapsed_20s(&t0), "thread %d still runs after 20 s", tid);
		nap_1ms();
	}
}

static uint64_t mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint64_t test_deadline_ns(unsigned seconds) { return mono_ns() + (uint64_t)seconds * 1000000000u; }

bool test_wait_step(uint64_t deadline_ns)
{
	if (mono_ns() >= deadline_ns)
		return false;
	struct timespec nap = {0, 200 * 1000};
	nanosleep(&nap, NULL);
	return true;
}

const char *test_srcdir(void)
{
	static char dir[4096];
	if (dir[0])
		return dir;
	const char *env = getenv("SELENE_SRCDIR");
	if (env && *env) {
		snprintf(dir, sizeof dir, "%s", env);
		return dir;
	}
	ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
	CHECK(n > 0);
	dir[n] = 0;
	for (;;) {
		char *slash = strrchr(dir, '/');
		CHECK(slash && slash != dir);
		*slash = 0;
		char probe[4096 + 32];
		snprintf(probe, sizeof probe, "%s/cores/tiny.core", dir);
		if (access(probe, R_OK) == 0)
			return dir;
	}
}
