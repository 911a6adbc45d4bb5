/*
 * test_store_crash.c - crash consistency of the record directory (design
 * 2.5: "Only records renamed into place survive a process restart; partial
 * temporary files are discarded"; the recovery scan; design 2.12).
 *
 * Each cycle forks a child that opens a store on one record directory --
 * the disk store, or on odd cycles the composite with a warm pool small
 * enough that it writes what it parks at once -- and publishes chains of
 * checkpoints (a 2-page root, a child of +3 pages, a grandchild of +8 or,
 * every fourth chain, +70 pages: two windows) as fast as it can, reporting
 * each conversation's tag through a pipe.  The parent SIGKILLs it after a
 * random delay (sometimes during its startup scan), then opens a disk store
 * on the directory and checks: no temporary file remains after the scan;
 * every indexed record is one the oracle knows (its key was derived from a
 * reported tag); every record with a row restores byte-exact against the
 * oracle's content (page j of a tag, the row of a tag and endpoint), which
 * also checks every page-only ancestor; no restore fails, so nothing torn
 * is ever served.  50 cycles in make check, 1,000 with SELENE_SOAK=1.
 */
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "record.h"
#include "store_disk.h"
#include "storefx.h"
#include "recutil.h"

#define PT SFX_PT
#define LIMIT (24ull << 20)

static test_rng rng;
static const uint64_t units2[] = {4096, 1000};

static int check(sel_store *s) { return sel_disk_store_check(s); }

static void chain_ends(uint64_t tag, uint64_t c[3])
{
	c[0] = 2 * PT + 2;
	c[1] = 5 * PT + 7;
	c[2] = (tag % 4 == 0 ? 75 : 13) * PT + 9;
}

static uint32_t first_id(uint64_t tag) { return (uint32_t)(tag % 8) * 80; }

/* ---- the child ------------------------------------------------------------------------- */

/* The child reports each conversation's tag before its puts, and the tag
 * with STORED_MARK once its chain's events came. */
#define STORED_MARK (1ull << 63)

/* Sleep on the store's descriptor (at most 1 ms). */
static void nap(sel_store *s)
{
	struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
	(void)poll(&pfd, 1, 1);
}

static void wait_stored(sel_store *s, int want)
{
	int got = 0;
	while (got < want) {
		sel_event ev[4];
		int n = sel_store_poll(s, ev, 4);
		if (n < 0)
			_exit(3);
		for (int i = 0; i < n; i++) /* not PROGRESS: a put's own end */
			got += ev[i].type == SEL_EV_STORED || ev[i].type == SEL_EV_STORE_FAILED;
		if (got < want)
			nap(s);
	}
}

static void child(struct sfx *f, const char *base, uint64_t cycle, bool composite, int wfd)
{
	sel_store_config cfg = sfx_config(f, false);
	cfg.disk_dir = base;
	cfg.disk_limit = LIMIT;
	cfg.memory_bytes = composite ? 64 * f->slot_bytes : 0;
	sel_store *s;
	if (sel_store_open(&cfg, &s) != 0)
		_exit(2);
	for (uint64_t i = 0;; i++) {
		uint64_t tag = cycle * 100000 + i;
		if (write(wfd, &tag, sizeof tag) != sizeof tag)
			_exit(4);
		struct sfx_conv cv;
		uint64_t c[3];
		chain_ends(tag, c);
		sfx_conv_init(f, &cv, tag, c[2] + 5, first_id(tag));
		/* The chain back to back: children link under pending parents. */
		int queued = 0;
		for (int k = 0; k < 3; k++) {
			sel_published cp = sfx_ckpt(f, &cv, c[k], k ? c[k - 1] : 0, (uint32_t)k + 1,
						    tag * 4 + (uint64_t)k);
			sel_retry_reason why;
			sel_outcome o;
			while ((o = sel_store_put(s, &cp, &why)) == SEL_RETRY) {
				nap(s);
				(void)sel_store_poll(s, NULL, 0); /* progress, events kept */
			}
			queued += o == SEL_QUEUED;
		}
		wait_stored(s, queued);
		tag |= STORED_MARK;
		if (write(wfd, &tag, sizeof tag) != sizeof tag)
			_exit(4);
		sfx_conv_free(&cv);
	}
}

/* ---- the oracle --------------------------------------------------------------------------- */

struct known {
	sel_key key;
	uint64_t tag, c;
};
static struct known *known;
static size_t n_known, cap_known;

static void learn(struct sfx *f, uint64_t tag)
{
	struct sfx_conv cv;
	uint64_t c[3];
	chain_ends(tag, c);
	sfx_conv_init(f, &cv, tag, c[2] + 5, first_id(tag));
	for (int k = 0; k < 3; k++) {
		if (n_known == cap_known) {
			cap_known = cap_known ? cap_known * 2 : 256;
			known = realloc(known, cap_known * sizeof(*known));
			CHECK(known);
		}
		known[n_known++] = (struct known){sfx_key(&cv, c[k]), tag, c[k]};
	}
	sfx_conv_free(&cv);
}

static const struct known *lookup_known(const sel_key *k)
{
	for (size_t i = n_known; i-- > 0;)
		if (sel_key_eq(&known[i].key, k))
			return &known[i];
	return NULL;
}

/* Read the child's reports (learning its tags) until one says a chain
 * was stored, at most 20 s.  Returns 1. */
static uint64_t wait_for_stored(struct sfx *f, int fd)
{
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		CHECKF(eos_now_ns() < deadline, "the child stored no chain in 20 s");
		if (poll(&p, 1, 100) <= 0)
			continue;
		uint64_t tag;
		CHECK(read(fd, &tag, sizeof tag) == sizeof tag);
		if (tag & STORED_MARK)
			return 1;
		learn(f, tag);
	}
}

/* Open the directory as a disk store and check everything in it. */
static uint64_t verify(struct sfx *f, const char *base)
{
	sel_store_config cfg = sfx_config(f, false);
	cfg.disk_dir = base;
	cfg.disk_limit = LIMIT;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK_OK(check(s));
	CHECK(test_count_tmp(test_store_dir(s)) == 0);
	size_t n = sel_disk_store_keys(s, NULL, 0);
	sel_key *keys = malloc((n + 1) * sizeof(*keys));
	CHECK(keys);
	sel_disk_store_keys(s, keys, n);
	uint64_t restored = 0;
	for (size_t i = 0; i < n; i++) {
		const struct known *k = lookup_known(&keys[i]);
		CHECKF(k, "an indexed record at %" PRIu64 " tokens no child ever wrote",
		       keys[i].consumed);
		struct sel_disk_record_info ri;
		CHECK_OK(sel_disk_store_record(s, &keys[i], &ri));
		CHECK(ri.ready && ri.file);
		if (!ri.has_row)
			continue; /* page-only: checked through its descendants */
		struct sfx_conv cv;
		uint64_t c[3];
		chain_ends(k->tag, c);
		sfx_conv_init(f, &cv, k->tag, c[2] + 5, first_id(k->tag));
		sel_event ev =
			sfx_restore(f, s, &cv, 0, k->c, k->c, 700, 9, SEL_TIER_DISK, true, check);
		CHECK(ev.type == SEL_EV_FETCHED);
		sfx_conv_free(&cv);
		restored++;
	}
	sel_stats st;
	sel_store_stats(s, &st);
	CHECK(st.tier[SEL_TIER_DISK].corrupt == 0 && st.fetch_failures == 0);
	free(keys);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	return restored;
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	unsetenv("SELENE_DISK_IO");
	unsetenv("SELENE_DISK_DIRECT");
	int cycles = test_soak() ? 1000 : 50;
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *base = test_mkdtemp("crash");
	uint64_t restored = 0, max_records = 0, stored = 0;
	uint64_t t0 = eos_now_ns();
	for (int cyc = 0; cyc < cycles; cyc++) {
		int pfd[2];
		CHECK(pipe(pfd) == 0);
		bool composite = cyc % 2;
		fflush(NULL);
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			close(pfd[0]);
			child(&fx, base, (uint64_t)cyc + 1, composite, pfd[1]);
			_exit(0);
		}
		close(pfd[1]);
		/* Every fourth cycle the kill waits until a chain was stored, so
		 * that restores happen however busy the machine (a test that
		 * restored nothing proved nothing). */
		if (cyc % 4 == 3)
			stored += wait_for_stored(&fx, pfd[0]);
		/* Sometimes during the child's startup scan, usually mid-write:
		 * the moment of the crash is the random input here, not a wait
		 * for a result. */
		uint64_t ms = test_rng_below(&rng, 8) == 0 ? test_rng_below(&rng, 5)
							   : 10 + test_rng_below(&rng, 70);
		eos_sleep_ns(ms * 1000000);
		kill(pid, SIGKILL);
		int status;
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %#x",
		       status);
		uint64_t tag;
		while (read(pfd[0], &tag, sizeof tag) == sizeof tag) {
			if (tag & STORED_MARK)
				stored++;
			else
				learn(&fx, tag);
		}
		close(pfd[0]);
		restored += verify(&fx, base);
		if (n_known > max_records)
			max_records = n_known;
	}
	printf("%d crash cycles: %" PRIu64 " restores byte-exact, %zu checkpoints offered, %" PRIu64
	       " chains stored, %.1f s\n",
	       cycles, restored, n_known / 3 * 3, stored, (double)(eos_now_ns() - t0) / 1e9);
	CHECKF(restored > 0, "no restore in %d cycles: the crash checks verified nothing", cycles);
	test_rmtree(base);
	free(base);
	free(known);
	sfx_free(&fx);
	printf("test_store_crash: ok\n");
	return 0;
}
