/*
 * test_store_lying.c - files that lie: a restore is byte-exact for the
 * request's own prefix or a miss, and nothing the store opens, truncates or
 * deletes is outside its directory (issue 12; design 2.3 lookup, 2.5 record
 * files, scan and directory lock, 2.11 the unusable directory, 2.12).
 *
 * Each test is named after what broke, and fails on the code before the fix:
 *   forged_parent_gives_wrong_answer   a child's parent key rewritten (and the
 *       v3 parent check with it, then resealed) to an unrelated record of
 *       the same consumed count: the child's history was answered from the
 *       unrelated prefix.  Now the lookup passes over the forged chain
 *       (chains_rejected) and restores the true parent, byte-exact; in the
 *       disk store and the composite.  The naive forgery (the parent key
 *       only) is removed by the scan as a bad parent link.
 *   compaction_truncates_through_symlink  a record replaced by a symbolic
 *       link to a file outside: the next compaction truncated the target.
 *   read_follows_symlink_and_replaced_file  reads opened whatever the name
 *       held: a link outside, or another file renamed over the indexed one.
 *   symlinked_namespace_scanned  the scan deleted files in a symbolic
 *       link's target.
 *   fifo_hangs_records_tool  a FIFO named like a record hung `flare records`
 *       forever; and, on a filesystem without d_type (ext4 -O ^filetype, on
 *       a loop device where one can be mounted), the store's startup.
 *   tmp_directory_fails_gc  a '.tmp-*' directory made gc fail every run.
 *   gc_and_server_disagree  gc deleted every good record and kept the
 *       corrupt one (a v1 header with a flipped plane size, first by name);
 *       gc and a server start on copies of the same directory now keep the
 *       same set, and gc removes nothing when the layout cannot be decided.
 *   sparse_record_evicts_everything  a sparse file claiming a huge tail made
 *       the startup evict every good record; verify allocated and read for
 *       every claimed page, and read on past the first bad page.
 *   unusable_namespace_fails_start  mode 0555 (checked with
 *       CAP_DAC_OVERRIDE dropped when run as root, so the test is real) or a
 *       regular file at the namespace's path failed the open instead of
 *       selecting no disk store (SEL_EDIRECTORY).
 *   direct_io_fallback_silent  a refused O_DIRECT (injected at the open) or
 *       a forced pread path was not visible: the store now names its I/O
 *       path and why, and the gauge exports it.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flare/metrics.h"
#include "flare/records.h"
#include "internal.h"
#include "recutil.h"
#include "store_composite.h"
#include "store_disk.h"
#include "storefx.h"

#define PT SFX_PT
static test_rng rng;
static const uint64_t units1[] = {4096};

static int check_any(sel_store *s)
{
	return !strcmp(s->ops->name, "composite") ? sel_composite_store_check(s)
						  : sel_disk_store_check(s);
}

static sel_store *open_at(struct sfx *f, const char *base, uint64_t memory, uint64_t limit)
{
	sel_store_config cfg = sfx_config(f, false);
	cfg.disk_dir = base;
	cfg.disk_limit = limit ? limit : 256ull << 20;
	cfg.memory_bytes = memory;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	return s;
}

static void close_store(sel_store *s)
{
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
}

/* Put cp and wait for its copy to land (a composite parks it). */
static void put_wait(sel_store *s, const sel_published *cp)
{
	sel_retry_reason why;
	sel_outcome o = sel_store_put(s, cp, &why);
	CHECKF(o == SEL_QUEUED, "put %" PRIu64 ": %s (%s)", cp->key.consumed, sel_outcome_name(o),
	       sel_errmsg());
	sel_event ev = sfx_one_event(s, check_any);
	CHECKF(ev.type == SEL_EV_STORED, "event %d error %d", ev.type, ev.error);
}

static void name_of(const sel_key *k, char out[SEL_RECORD_NAME_MAX]) { sel_record_name(k, out); }

static int dir_fd(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECKF(fd >= 0, "open %s: %s", dir, strerror(errno));
	return fd;
}

/* The namespace directory a store on fx opens under base. */
static void ns_dir(struct sfx *f, const char *base, char *out, size_t len)
{
	sel_store_config cfg = sfx_config(f, false);
	sel_record_ns ns;
	CHECK_OK(sel_record_ns_init(&ns, f->g, cfg.identity));
	snprintf(out, len, "%s/%s", base, ns.dirname);
	sel_record_ns_free(&ns);
}

/* Run `flare records ARGS` in-process; its stdout in *out (JSON). */
static int records_json(json_t **out, const char *a0, const char *a1, const char *a2,
			const char *a3, const char *a4)
{
	const char *argv[8] = {"records", a0, a1, a2, a3, a4, NULL};
	int argc = 1;
	while (argv[argc])
		argc++;
	char *buf = NULL;
	size_t len = 0;
	FILE *o = open_memstream(&buf, &len);
	FILE *e = fopen("/dev/null", "w");
	CHECK(o && e);
	int rc = flare_records(argc, (char **)argv, o, e);
	fclose(o);
	fclose(e);
	json_error_t err;
	*out = json_loads(buf, 0, &err);
	CHECKF(*out, "records %s: not JSON: %s", a0, buf);
	free(buf);
	return rc;
}

/* The problems verify reported, as "file kind" lines. */
static bool problem(json_t *j, const char *file, const char *kind)
{
	size_t i, k;
	json_t *ns, *p;
	json_array_foreach(json_object_get(j, "namespaces"), i, ns)
	{
		json_array_foreach(json_object_get(ns, "problems"), k, p)
		{
			const char *f = json_string_value(json_object_get(p, "file"));
			const char *kd = json_string_value(json_object_get(p, "kind"));
			if (f && !strcmp(f, file) && (!kind || (kd && !strcmp(kd, kind))))
				return true;
		}
	}
	return false;
}

/* ---- item 1: forged parent links ------------------------------------------------------------ */

static void forged_parent_gives_wrong_answer(bool composite)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char *base = test_mkdtemp("forged");
	struct sfx_conv a, b;
	sfx_conv_init(&fx, &a, 11, 400, 0);
	sfx_conv_init(&fx, &b, 22, 400, 20);
	sel_store *s = open_at(&fx, base, 0, 0);
	sel_published a1 = sfx_ckpt(&fx, &a, 130, 0, 1, 1);
	put_wait(s, &a1);
	sel_published a2 = sfx_ckpt(&fx, &a, 330, 130, 2, 2);
	put_wait(s, &a2);
	sel_published b1 = sfx_ckpt(&fx, &b, 130, 0, 3, 3);
	put_wait(s, &b1);
	char dir[4096];
	snprintf(dir, sizeof dir, "%s", test_store_dir(s));
	close_store(s);

	/* A2 links under A1.  Make it name B1 (same consumed count), with
	 * the parent check B1's bucket gives, resealed: a forgery the scan
	 * cannot tell from an honest link. */
	int dfd = dir_fd(dir);
	char n2[SEL_RECORD_NAME_MAX];
	name_of(&a2.key, n2);
	sel_record_header h;
	test_header_read(dfd, n2, &h);
	CHECK(sel_key_eq(&h.d.parent, &a1.key) && h.version == SEL_RECORD_VERSION &&
	      h.d.parent_check == sel_record_parent_check(&a1.bucket));
	test_forge_parent(dfd, n2, &b1.key, sel_record_parent_check(&b1.bucket));

	s = open_at(&fx, base, composite ? 64 * fx.slot_bytes : 0, 0);
	CHECK(test_store_scanned(s) == 3);
	/* A's history: A2's chain fails at its parent; A1 itself is the hit,
	 * and its bytes are A's.  (Before: A2 restored with B1's pages.) */
	sfx_restore(&fx, s, &a, 0, UINT64_MAX, 130, 40, 5, SEL_TIER_DISK, true, check_any);
	sel_stats st;
	sel_store_stats(s, &st);
	CHECKF(st.chains_rejected >= 1, "%" PRIu64 " chains rejected", st.chains_rejected);
	/* B's own history still finds B1 exactly. */
	sfx_restore(&fx, s, &b, 0, UINT64_MAX, 130, 60, 6, SEL_TIER_NONE, true, check_any);
	close_store(s);

	/* The naive forgery (parent key only): its link check names A1's
	 * bucket, not B1's, so the scan removes it, and verify says why. */
	test_forge_parent(dfd, n2, &b1.key, sel_record_parent_check(&a1.bucket));
	sel_record_header hc; /* B1's key, A1's check: as the key-only forgery leaves it */
	test_header_read(dfd, n2, &hc);
	CHECK(sel_key_eq(&hc.d.parent, &b1.key) &&
	      hc.d.parent_check == sel_record_parent_check(&a1.bucket));
	json_t *j;
	CHECK(records_json(&j, "verify", dir, "--json", NULL, NULL) == 1);
	CHECKF(problem(j, n2, "parent link"), "verify did not report %s", n2);
	json_decref(j);
	s = open_at(&fx, base, composite ? 64 * fx.slot_bytes : 0, 0);
	CHECK(test_store_scanned(s) == 2 && !test_has_file(dir, n2));
	sfx_restore(&fx, s, &a, 0, UINT64_MAX, 130, 40, 5, SEL_TIER_DISK, true, check_any);
	close_store(s);
	close(dfd);
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	printf("  forged parent (%s): the lookup passes over it and restores the true parent; "
	       "the naive forgery is removed at the scan\n",
	       composite ? "composite" : "disk");
}

/* ---- item 2: symbolic links and replaced files ---------------------------------------------- */

static void compaction_truncates_through_symlink(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char *base = test_mkdtemp("symlink-trunc");
	char decoy_dir[4096], decoy[4200];
	snprintf(decoy_dir, sizeof decoy_dir, "%s/decoy", base);
	CHECK(mkdir(decoy_dir, 0755) == 0);
	struct sfx_conv a;
	sfx_conv_init(&fx, &a, 5, 400, 0);
	sel_store *s = open_at(&fx, base, 0, 0);
	/* P must not be a root: a root keeps its row (design 2.3). */
	sel_published q = sfx_ckpt(&fx, &a, 70, 0, 3, 3);
	put_wait(s, &q);
	sel_published p = sfx_ckpt(&fx, &a, 200, 70, 1, 1);
	put_wait(s, &p);
	char dir[4096], name[SEL_RECORD_NAME_MAX], path[4200];
	snprintf(dir, sizeof dir, "%s", test_store_dir(s));
	close_store(s);
	s = open_at(&fx, base, 0, 0); /* P indexed from the scan, with its row */
	struct sel_disk_record_info ri;
	CHECK_OK(sel_disk_store_record(s, &p.key, &ri));
	CHECK(ri.has_row && !ri.is_root);
	name_of(&p.key, name);
	snprintf(path, sizeof path, "%s/%s", dir, name);
	snprintf(decoy, sizeof decoy, "%s/precious", decoy_dir);
	test_copy_file(path, decoy); /* a file of exactly the record's length */
	uint8_t before[16], after[16];
	test_tree_hash(decoy_dir, before);
	CHECK(unlink(path) == 0 && symlink(decoy, path) == 0);
	/* P's only child commits: P's row goes, and its file is truncated. */
	sel_published c = sfx_ckpt(&fx, &a, 330, 200, 2, 2);
	put_wait(s, &c);
	CHECK_OK(sel_disk_store_record(s, &p.key, &ri));
	CHECK(!ri.has_row); /* compacted: the truncation job was submitted */
	close_store(s);     /* and drained */
	test_tree_hash(decoy_dir, after);
	CHECKF(!memcmp(before, after, 16), "the file behind the link changed");
	struct stat st;
	CHECK(stat(decoy, &st) == 0);
	printf("  compaction through a symbolic link: refused, the %lld-byte file outside "
	       "untouched\n",
	       (long long)st.st_size);
	sfx_conv_free(&a);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

static void read_follows_symlink_and_replaced_file(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char *base = test_mkdtemp("symlink-read");
	char decoy_dir[4096];
	snprintf(decoy_dir, sizeof decoy_dir, "%s/decoy", base);
	CHECK(mkdir(decoy_dir, 0755) == 0);
	struct sfx_conv a, b;
	sfx_conv_init(&fx, &a, 6, 400, 0);
	sfx_conv_init(&fx, &b, 7, 400, 20);
	sel_store *s = open_at(&fx, base, 0, 0);
	sel_published pa = sfx_ckpt(&fx, &a, 200, 0, 1, 1);
	put_wait(s, &pa);
	sel_published pb = sfx_ckpt(&fx, &b, 200, 0, 2, 2);
	put_wait(s, &pb);
	char dir[4096];
	snprintf(dir, sizeof dir, "%s", test_store_dir(s));
	close_store(s);
	s = open_at(&fx, base, 0, 0);
	char na[SEL_RECORD_NAME_MAX], nb[SEL_RECORD_NAME_MAX], pa_path[4200], pb_path[4200],
		decoy[4200], tmp[4300];
	name_of(&pa.key, na);
	name_of(&pb.key, nb);
	snprintf(pa_path, sizeof pa_path, "%s/%s", dir, na);
	snprintf(pb_path, sizeof pb_path, "%s/%s", dir, nb);
	/* A: a link to a valid copy of itself outside the directory. */
	snprintf(decoy, sizeof decoy, "%s/a-copy", decoy_dir);
	test_copy_file(pa_path, decoy);
	uint8_t before[16], after[16];
	test_tree_hash(decoy_dir, before);
	CHECK(unlink(pa_path) == 0 && symlink(decoy, pa_path) == 0);
	/* B: the same bytes, another file (renamed over the indexed one). */
	snprintf(tmp, sizeof tmp, "%s/other", dir);
	test_copy_file(pb_path, tmp);
	CHECK(rename(tmp, pb_path) == 0);
	sel_event ev =
		sfx_restore(&fx, s, &a, 0, UINT64_MAX, 200, 40, 5, SEL_TIER_DISK, false, check_any);
	CHECKF(ev.type == SEL_EV_FETCH_FAILED && ev.error == SEL_ECORRUPT,
	       "a read through a symbolic link: event %d error %d", ev.type, ev.error);
	ev = sfx_restore(&fx, s, &b, 0, UINT64_MAX, 200, 40, 5, SEL_TIER_DISK, false, check_any);
	CHECKF(ev.type == SEL_EV_FETCH_FAILED && ev.error == SEL_ECORRUPT,
	       "a read of a replaced file: event %d error %d", ev.type, ev.error);
	sel_hit h;
	CHECK(sel_store_lookup(s, &a.h, 0, UINT64_MAX, &h) == 0); /* doomed, never again */
	close_store(s);
	test_tree_hash(decoy_dir, after);
	CHECK(!memcmp(before, after, 16));
	printf("  reads: a symbolic link and a file renamed over the record refused (corrupt), "
	       "nothing outside read\n");
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

static void symlinked_namespace_scanned(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char *base = test_mkdtemp("symlink-ns");
	char target[4096], ns[4200], p[4400];
	snprintf(target, sizeof target, "%s/elsewhere", base);
	CHECK(mkdir(target, 0755) == 0);
	/* Files the scan would remove: a temporary and an invalid record. */
	snprintf(p, sizeof p, "%s/.tmp-precious", target);
	FILE *f = fopen(p, "w");
	CHECK(f && fputs("keep me", f) >= 0 && fclose(f) == 0);
	snprintf(p, sizeof p, "%s/0000000000000100-00112233445566778899aabbccddeeff.ckpt", target);
	f = fopen(p, "w");
	CHECK(f && fputs("not a record", f) >= 0 && fclose(f) == 0);
	uint8_t before[16], after[16];
	test_tree_hash(target, before);
	ns_dir(&fx, base, ns, sizeof ns);
	CHECK(symlink(target, ns) == 0);
	sel_store_config cfg = sfx_config(&fx, false);
	cfg.disk_dir = base;
	cfg.disk_limit = 64 << 20;
	sel_store *s = NULL;
	CHECK_RC(sel_store_open(&cfg, &s), SEL_EDIRECTORY);
	CHECKF(strstr(sel_errmsg(), "symbolic link"), "%s", sel_errmsg());
	test_tree_hash(target, after);
	CHECK(!memcmp(before, after, 16));
	/* The tool refuses it the same way. */
	json_t *j;
	CHECK(records_json(&j, "gc", ns, "--limit", "0", "--json") == 1);
	json_decref(j);
	test_tree_hash(target, after);
	CHECK(!memcmp(before, after, 16));
	printf("  a symbolic link at the namespace's name: refused by the store and gc, its target "
	       "untouched\n");
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- item 3: FIFOs, filesystems without d_type, .tmp-* directories ----------------------------- */

/* Run fn in a child; false when it did not end within the deadline
 * (killed).  *status receives its exit status. */
static bool in_child(int (*fn)(void *), void *arg, int seconds, int *status)
{
	fflush(NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		_exit(fn(arg));
	uint64_t end = eos_now_ns() + (uint64_t)seconds * 1000000000ull;
	for (;;) {
		int st;
		pid_t w = waitpid(pid, &st, WNOHANG);
		if (w == pid) {
			*status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
			return true;
		}
		if (eos_now_ns() >= end) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return false;
		}
		eos_sleep_ns(5000000);
	}
}

struct tool_run {
	const char *cmd, *dir;
};

static int run_tool_child(void *arg)
{
	const struct tool_run *t = arg;
	const char *argv[6] = {"records", t->cmd, t->dir, NULL, NULL, NULL};
	int argc = 3;
	if (!strcmp(t->cmd, "gc")) {
		argv[argc++] = "--limit";
		argv[argc++] = "1TiB";
	}
	FILE *n = fopen("/dev/null", "w");
	return flare_records(argc, (char **)argv, n, n);
}

struct open_run {
	struct sfx *fx;
	const char *base;
};

static int open_child(void *arg)
{
	struct open_run *o = arg;
	sel_store_config cfg = sfx_config(o->fx, false);
	cfg.disk_dir = o->base;
	cfg.disk_limit = 64 << 20;
	sel_store *s;
	if (sel_store_open(&cfg, &s) != 0)
		return 2;
	int kept = (int)test_store_scanned(s);
	close_store(s);
	return kept;
}

/* Records, plus a FIFO named like one, under base (a fresh store). */
static void with_fifo(struct sfx *fx, const char *base, char *fifo, size_t len)
{
	struct sfx_conv a;
	sfx_conv_init(fx, &a, 9, 400, 0);
	sel_store *s = open_at(fx, base, 0, 0);
	sel_published p = sfx_ckpt(fx, &a, 200, 0, 1, 1);
	put_wait(s, &p);
	snprintf(fifo, len, "%s/0000000000000180-ffeeddccbbaa99887766554433221100.ckpt",
		 test_store_dir(s));
	close_store(s);
	CHECK(mkfifo(fifo, 0644) == 0);
	sfx_conv_free(&a);
}

static void fifo_hangs_records_tool(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char *base = test_mkdtemp("fifo");
	char fifo[4300];
	with_fifo(&fx, base, fifo, sizeof fifo);
	static const char *const cmds[] = {"ls", "stat", "verify", "gc"};
	for (size_t i = 0; i < 4; i++) {
		struct tool_run t = {cmds[i], base};
		int status = -1;
		CHECKF(in_child(run_tool_child, &t, 30, &status),
		       "flare records %s hung on a FIFO named like a record", cmds[i]);
		CHECKF(status == (!strcmp(cmds[i], "verify") ? 1 : 0), "%s: exit %d", cmds[i],
		       status);
	}
	json_t *j;
	CHECK(records_json(&j, "verify", base, "--json", NULL, NULL) == 1);
	CHECK(problem(j, strrchr(fifo, '/') + 1, "not a file"));
	json_decref(j);
	struct stat st;
	CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode)); /* left alone */
	struct open_run o = {&fx, base};
	int status = -1;
	CHECK(in_child(open_child, &o, 30, &status) && status == 1);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	printf("  a FIFO named like a record: ls, stat, verify (reports it) and gc return; the "
	       "store's scan passes over it\n");
}

/* A loop-mounted ext4 without d_type; false (and nothing mounted) where that
 * cannot be made here (not root, no loop devices, no mkfs.ext4). */
static bool mount_no_dtype(const char *img, const char *mnt)
{
	char cmd[20000];
	snprintf(cmd, sizeof cmd,
		 "truncate -s 16M '%s' && mkfs.ext4 -q -F -O ^filetype '%s' "
		 ">/dev/null 2>&1 && mount -o loop '%s' '%s' >/dev/null 2>&1",
		 img, img, img, mnt);
	if (geteuid() != 0 || system(cmd) != 0)
		return false;
	/* Prove the filesystem reports DT_UNKNOWN. */
	char f[8300];
	snprintf(f, sizeof f, "%s/probe", mnt);
	FILE *x = fopen(f, "w");
	if (x)
		fclose(x);
	DIR *d = opendir(mnt);
	bool unknown = false;
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (!strcmp(e->d_name, "probe"))
			unknown = e->d_type == DT_UNKNOWN;
	if (d)
		closedir(d);
	unlink(f);
	if (!unknown) {
		umount(mnt);
		return false;
	}
	return true;
}

static char mounted_at[4200];

/* A failing check exits at once: never leave the loop mount behind. */
static void unmount_on_failure(void)
{
	if (mounted_at[0])
		umount2(mounted_at, MNT_DETACH);
}

static void fifo_hangs_startup_without_dtype(void)
{
	char *base = test_mkdtemp("nodtype");
	char img[4200], mnt[4200];
	snprintf(img, sizeof img, "%s/img", base);
	snprintf(mnt, sizeof mnt, "%s/mnt", base);
	CHECK(mkdir(mnt, 0755) == 0);
	if (!mount_no_dtype(img, mnt)) {
		printf("  (no ext4 without d_type can be mounted here: that case is not run)\n");
		test_rmtree(base);
		free(base);
		return;
	}
	snprintf(mounted_at, sizeof mounted_at, "%s", mnt);
	test_fail_cb = unmount_on_failure;
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char fifo[4300];
	with_fifo(&fx, mnt, fifo, sizeof fifo);
	struct open_run o = {&fx, mnt};
	int status = -1;
	bool ended = in_child(open_child, &o, 30, &status);
	struct tool_run t = {"verify", mnt};
	int vstatus = -1;
	bool vended = in_child(run_tool_child, &t, 30, &vstatus);
	CHECK(umount(mnt) == 0);
	mounted_at[0] = '\0';
	test_fail_cb = NULL;
	CHECKF(ended, "the store's startup hung on a FIFO where d_type is DT_UNKNOWN");
	CHECKF(status == 1, "startup exit %d (1 record kept expected)", status);
	CHECKF(vended && vstatus == 1, "verify: ended %d, exit %d", vended, vstatus);
	sfx_free(&fx);
	test_rmtree(base);
	free(base);
	printf("  no d_type (ext4 -O ^filetype on a loop device): the startup and verify pass over "
	       "the FIFO\n");
}

static void tmp_directory_fails_gc(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char *base = test_mkdtemp("tmpdir");
	struct sfx_conv a;
	sfx_conv_init(&fx, &a, 3, 400, 0);
	sel_store *s = open_at(&fx, base, 0, 0);
	sel_published p = sfx_ckpt(&fx, &a, 200, 0, 1, 1);
	put_wait(s, &p);
	char td[4300];
	snprintf(td, sizeof td, "%s/.tmp-someones-directory", test_store_dir(s));
	close_store(s);
	CHECK(mkdir(td, 0755) == 0);
	for (int round = 0; round < 2; round++) {
		json_t *j;
		int rc = records_json(&j, "gc", base, "--limit", "1TiB", "--json");
		CHECKF(rc == 0, "gc exit %d with a .tmp-* directory", rc);
		json_t *alone = json_object_get(json_array_get(json_object_get(j, "namespaces"), 0),
						"left_alone");
		CHECK(json_array_size(alone) == 1 &&
		      !strcmp(json_string_value(json_array_get(alone, 0)), strrchr(td, '/') + 1));
		json_decref(j);
	}
	struct stat st;
	CHECK(stat(td, &st) == 0 && S_ISDIR(st.st_mode));
	s = open_at(&fx, base, 0, 0); /* and the server starts */
	CHECK(test_store_scanned(s) == 1);
	close_store(s);
	sfx_conv_free(&a);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	printf("  a .tmp-* directory: reported and left alone; gc exits 0 run after run\n");
}

/* ---- item 4: one recovery for gc and the server ------------------------------------------------- */

/* A version-1 header of the same record with one bit of its row size
 * flipped (no header checksum to catch it): 1000 -> 1016 bytes, the same
 * padded segment, so the header still decodes -- with another layout. */
static void to_v1_flipped(uint8_t *h, void *ctx)
{
	(void)ctx;
	sel_put_u32(h + 8, 1);
	sel_put_u32(h + 16, 0);
	memset(h + 176, 0, 16); /* v1: no header checksum, no parent check */
	h[200] ^= 0x10;         /* rank 0's row bytes (u64 at 192 + 8) */
}

static void list_ckpt(const char *dir, char ***out, size_t *n)
{
	*out = NULL;
	*n = 0;
	size_t cap = 0;
	DIR *d = opendir(dir);
	CHECK(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l < 5 || strcmp(e->d_name + l - 5, ".ckpt"))
			continue;
		if (*n == cap)
			CHECK((*out = realloc(*out, (cap = cap ? 2 * cap : 16) * sizeof **out)));
		CHECK(((*out)[(*n)++] = strdup(e->d_name)));
	}
	closedir(d);
}

static bool same_sets(char **a, size_t na, char **b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < na; i++) {
		bool found = false;
		for (size_t k = 0; k < nb && !found; k++)
			found = !strcmp(a[i], b[k]);
		if (!found)
			return false;
	}
	return true;
}

static void free_list(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static void gc_and_server_disagree(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, (uint64_t[]){4096, 4096}, 1000, 512, 16);
	char *base = test_mkdtemp("disagree");
	sel_store *s = open_at(&fx, base, 0, 0);
	struct sfx_conv cv[6];
	sel_published first = {0};
	for (int i = 0; i < 6; i++) {
		sfx_conv_init(&fx, &cv[i], 100 + (uint64_t)i, 700, 0);
		/* The first record by name (the smallest consumed count) is the
		 * one about to be damaged. */
		uint64_t c = i == 0 ? 70 : 200 + 60 * (uint64_t)i;
		sel_published p = sfx_ckpt(&fx, &cv[i], c, 0, 1, (uint64_t)i + 1);
		put_wait(s, &p);
		if (i == 0)
			first = p;
		if (i == 3) { /* and a chain: a child linked under cv[3]'s record */
			sel_published q = sfx_ckpt(&fx, &cv[i], 600, c, 2, 50);
			put_wait(s, &q);
		}
	}
	char dir[4096];
	snprintf(dir, sizeof dir, "%s", test_store_dir(s));
	close_store(s);
	int dfd = dir_fd(dir);
	char nf[SEL_RECORD_NAME_MAX];
	name_of(&first.key, nf);
	test_header_edit(dfd, nf, to_v1_flipped, NULL);
	sel_record_header fh;
	test_header_read(dfd, nf, &fh); /* it decodes, on its own */
	CHECK(fh.version == 1);
	close(dfd);
	/* Copies of the damaged directory: gc on one, a server start on the
	 * other. */
	char *b1 = test_mkdtemp("disagree-gc"), *b2 = test_mkdtemp("disagree-server");
	const char *nsname = strrchr(dir, '/') + 1;
	char d1[4200], d2[4200];
	snprintf(d1, sizeof d1, "%s/%s", b1, nsname);
	snprintf(d2, sizeof d2, "%s/%s", b2, nsname);
	test_copy_dir(dir, d1);
	test_copy_dir(dir, d2);
	json_t *j;
	CHECK(records_json(&j, "gc", d1, "--limit", "1TiB", "--json") == 0);
	json_decref(j);
	s = open_at(&fx, b2, 0, 0);
	close_store(s);
	char **k1, **k2;
	size_t n1, n2;
	list_ckpt(d1, &k1, &n1);
	list_ckpt(d2, &k2, &n2);
	CHECKF(same_sets(k1, n1, k2, n2), "gc kept %zu records, the server %zu", n1, n2);
	CHECKF(n1 == 6 && !test_has_file(d1, nf), "gc kept %zu (the corrupt one %s)", n1,
	       test_has_file(d1, nf) ? "too" : "not");
	free_list(k1, n1);
	free_list(k2, n2);

	/* One good file against one bad: no majority, gc removes nothing. */
	char *b3 = test_mkdtemp("undecided");
	char d3[4200];
	snprintf(d3, sizeof d3, "%s/%s", b3, nsname);
	CHECK(mkdir(d3, 0755) == 0);
	char from[4300], to[4300], good[SEL_RECORD_NAME_MAX];
	sel_key gk = sfx_key(&cv[1], 260);
	name_of(&gk, good);
	snprintf(from, sizeof from, "%s/%s", dir, nf);
	snprintf(to, sizeof to, "%s/%s", d3, nf);
	test_copy_file(from, to);
	snprintf(from, sizeof from, "%s/%s", dir, good);
	snprintf(to, sizeof to, "%s/%s", d3, good);
	test_copy_file(from, to);
	CHECK(records_json(&j, "gc", d3, "--limit", "0", "--json") == 1);
	json_decref(j);
	CHECK(test_has_file(d3, nf) && test_has_file(d3, good));
	CHECK(records_json(&j, "verify", d3, "--json", NULL, NULL) == 1);
	CHECK(problem(j, nsname, "layout"));
	json_decref(j);
	for (int i = 0; i < 6; i++)
		sfx_conv_free(&cv[i]);
	test_rmtree(base);
	test_rmtree(b1);
	test_rmtree(b2);
	test_rmtree(b3);
	free(base);
	free(b1);
	free(b2);
	free(b3);
	sfx_free(&fx);
	printf("  damaged v1 header first by name: gc and a server start keep the same 6 records; "
	       "1 against 1: gc removes nothing\n");
}

/* ---- item 5: sparse and huge records -------------------------------------------------------- */

static void sparse_record_evicts_everything(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 512, 16);
	char *base = test_mkdtemp("sparse");
	const uint64_t limit = 4ull << 20;
	sel_store *s = open_at(&fx, base, 0, limit);
	struct sfx_conv cv[8];
	for (int i = 0; i < 8; i++) {
		sfx_conv_init(&fx, &cv[i], 300 + (uint64_t)i, 700, 0);
		sel_published p = sfx_ckpt(&fx, &cv[i], 330, 0, 1, (uint64_t)i + 1);
		put_wait(s, &p);
	}
	char dir[4096];
	snprintf(dir, sizeof dir, "%s", test_store_dir(s));
	close_store(s);
	sel_store_config cfg = sfx_config(&fx, false);
	sel_record_ns ns;
	CHECK_OK(sel_record_ns_init(&ns, fx.g, cfg.identity));
	int dfd = dir_fd(dir);
	/* Two of the eight become sparse: one claiming 2^26 pages (far beyond
	 * the limit), one claiming most of the limit; both valid headers. */
	char n6[SEL_RECORD_NAME_MAX], n7[SEL_RECORD_NAME_MAX], huge_name[SEL_RECORD_NAME_MAX],
		mid_name[SEL_RECORD_NAME_MAX];
	sel_key k6 = sfx_key(&cv[6], 330), k7 = sfx_key(&cv[7], 330);
	name_of(&k6, n6);
	name_of(&k7, n7);
	sel_key kh, km;
	uint64_t huge_len = test_make_sparse(dfd, n6, &ns, 1u << 26, &kh);
	uint64_t mid_len = test_make_sparse(dfd, n7, &ns, (uint32_t)(limit / 4096 * 3 / 4), &km);
	CHECK(huge_len > limit && mid_len < limit);
	name_of(&kh, huge_name);
	name_of(&km, mid_name);
	json_t *j;
	CHECK(records_json(&j, "verify", dir, "--json", NULL, NULL) == 1);
	CHECK(problem(j, huge_name, "sparse") && problem(j, mid_name, "sparse"));
	json_t *n0 = json_array_get(json_object_get(j, "namespaces"), 0);
	json_int_t read = json_integer_value(json_object_get(n0, "bytes_read"));
	CHECKF(read < (json_int_t)(1 << 20), "verify read %lld bytes", (long long)read);
	json_decref(j);
	s = open_at(&fx, base, 0, limit);
	CHECKF(test_store_scanned(s) == 6,
	       "the startup kept %" PRIu64 " records of the 6 good ones", test_store_scanned(s));
	sel_stats st;
	sel_store_stats(s, &st);
	CHECK(st.tier[SEL_TIER_DISK].evicted == 0);
	for (int i = 0; i < 6; i++)
		sfx_restore(&fx, s, &cv[i], 0, UINT64_MAX, 330, 40, 5, SEL_TIER_DISK, true,
			    check_any);
	close_store(s);
	CHECK(!test_has_file(dir, huge_name) && !test_has_file(dir, mid_name));

	/* verify stops at the first bad page of a long record. */
	s = open_at(&fx, base, 0, 0);
	struct sfx_conv lc;
	sfx_conv_init(&fx, &lc, 999, 64 * 60 + 5, 0);
	sel_published lp = sfx_ckpt(&fx, &lc, 64 * 60 + 3, 0, 1, 77);
	put_wait(s, &lp);
	close_store(s);
	char ln[SEL_RECORD_NAME_MAX], lpath[4300];
	name_of(&lp.key, ln);
	snprintf(lpath, sizeof lpath, "%s/%s", dir, ln);
	sel_record_header lh;
	test_header_read(dfd, ln, &lh);
	int fd = open(lpath, O_RDWR | O_CLOEXEC);
	uint8_t x = 0x5a;
	CHECK(fd >= 0 && pwrite(fd, &x, 1, (off_t)lh.span.page_off + 100) == 1);
	close(fd);
	CHECK(records_json(&j, "verify", dir, "--json", NULL, NULL) == 1);
	CHECK(problem(j, ln, "page checksum"));
	n0 = json_array_get(json_object_get(j, "namespaces"), 0);
	read = json_integer_value(json_object_get(n0, "bytes_read"));
	/* headers of 7 files, one checksum window, one page record (plus the
	 * 6 other files read whole). */
	CHECKF(read < 7 * 40960 + (json_int_t)lh.span.page_off + 2 * 4096, "verify read %lld bytes",
	       (long long)read);
	json_decref(j);
	close(dfd);
	sel_record_ns_free(&ns);
	for (int i = 0; i < 8; i++)
		sfx_conv_free(&cv[i]);
	sfx_conv_free(&lc);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	printf("  sparse records (%llu and %llu bytes claimed): refused at the scan, nothing "
	       "evicted; verify reads %lld bytes and stops at a bad page\n",
	       (unsigned long long)huge_len, (unsigned long long)mid_len, (long long)read);
}

/* ---- item 7: the unusable namespace directory ------------------------------------------------------ */

/* Drop the capabilities that let root ignore permissions. */
static bool drop_dac(void)
{
	struct __user_cap_header_struct hd = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &hd, d) != 0)
		return false;
	uint32_t drop = (1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH) | (1u << CAP_FOWNER);
	d[0].effective &= ~drop;
	return syscall(SYS_capset, &hd, d) == 0;
}

struct ro_run {
	struct sfx *fx;
	const char *base;
	uint64_t memory;
};

static int ro_child(void *arg)
{
	struct ro_run *o = arg;
	if (geteuid() == 0 && !drop_dac())
		return 77;
	sel_store_config cfg = sfx_config(o->fx, false);
	cfg.disk_dir = o->base;
	cfg.disk_limit = 64 << 20;
	cfg.memory_bytes = o->memory;
	sel_store *s = NULL;
	int rc = sel_store_open(&cfg, &s);
	if (rc == 0)
		close_store(s);
	if (rc != SEL_EDIRECTORY) {
		fprintf(stderr, "open: %d (%s): %s\n", rc, sel_strerror(rc), sel_errmsg());
		return 1;
	}
	if (!strstr(sel_errmsg(), o->base) || !strstr(sel_errmsg(), "not writable")) {
		fprintf(stderr, "message: %s\n", sel_errmsg());
		return 3;
	}
	return 0;
}

static void unusable_namespace_fails_start(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char *base = test_mkdtemp("unusable");
	char ns[4200];
	ns_dir(&fx, base, ns, sizeof ns);
	/* Mode 0555: as root, with CAP_DAC_OVERRIDE dropped in the child. */
	CHECK(mkdir(ns, 0555) == 0);
	for (int composite = 0; composite < 2; composite++) {
		struct ro_run o = {&fx, base, composite ? 64 * fx.slot_bytes : 0};
		int status = -1;
		CHECK(in_child(ro_child, &o, 30, &status));
		if (status == 77) {
			printf("  (capabilities cannot be dropped here: the 0555 case is not run)\n");
			break;
		}
		CHECKF(status == 0, "a 0555 namespace directory (%s): child exit %d",
		       composite ? "composite" : "disk", status);
	}
	CHECK(rmdir(ns) == 0);
	/* A regular file at the namespace's path. */
	FILE *f = fopen(ns, "w");
	CHECK(f && fclose(f) == 0);
	sel_store_config cfg = sfx_config(&fx, false);
	cfg.disk_dir = base;
	cfg.disk_limit = 64 << 20;
	sel_store *s = NULL;
	CHECK_RC(sel_store_open(&cfg, &s), SEL_EDIRECTORY);
	CHECKF(strstr(sel_errmsg(), ns), "%s", sel_errmsg());
	cfg.memory_bytes = 64 * fx.slot_bytes;
	CHECK_RC(sel_store_open(&cfg, &s), SEL_EDIRECTORY);
	/* Another owner is not "unusable": it still fails the start. */
	CHECK(unlink(ns) == 0);
	cfg.memory_bytes = 0;
	sel_store *a = open_at(&fx, base, 0, 0);
	CHECK_RC(sel_store_open(&cfg, &s), -EBUSY);
	close_store(a);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	printf("  unusable namespace directory (0555 without CAP_DAC_OVERRIDE, a regular file): "
	       "SEL_EDIRECTORY naming it; another owner still -EBUSY\n");
}

/* ---- item 9: the I/O path ----------------------------------------------------------------------- */

static int refuse_direct_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	if (flags & O_DIRECT) {
		errno = EINVAL;
		return -1;
	}
	return openat(dirfd, path, flags, mode);
}

static void expect_path(sel_store *s, const char *want_sub, const char *note_sub)
{
	sel_store_info si;
	sel_store_describe(s, &si);
	sel_stats st;
	sel_store_stats(s, &st);
	CHECKF(si.disk_io && strstr(si.disk_io, want_sub), "path %s",
	       si.disk_io ? si.disk_io : "-");
	CHECKF(st.disk_io && !strcmp(st.disk_io, si.disk_io), "stats %s", st.disk_io);
	CHECKF(note_sub ? strstr(si.disk_io_note, note_sub) != NULL
			: (!strcmp(si.disk_io, "io_uring+O_DIRECT")) == !*si.disk_io_note,
	       "note '%s'", si.disk_io_note);
	hel_engine_stats es = {.store_enabled = true, .store = st};
	struct flare_buf b = {0};
	flare_metrics_format(&b, &es, NULL, NULL);
	char want[96];
	snprintf(want, sizeof want, "flare_host_cache_disk_io{path=\"%s\"} 1\n", si.disk_io);
	CHECKF(b.data && strstr(b.data, want), "no '%s'", want);
	flare_buf_free(&b);
}

static void direct_io_fallback_silent(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 1, units1, 1000, 256, 16);
	char *base = test_mkdtemp("iopath");
	sel_store *s = open_at(&fx, base, 0, 0);
	expect_path(s, "", NULL); /* whatever this machine allows, named consistently */
	sel_store_info si;
	sel_store_describe(s, &si);
	printf("  this machine: %s%s%s\n", si.disk_io, *si.disk_io_note ? ": " : "",
	       si.disk_io_note);
	close_store(s);
	/* O_DIRECT refused (as tmpfs and some FUSE filesystems do). */
	struct eos_fileops ops = eos_fileops_libc;
	ops.openat = refuse_direct_openat;
	eos_fileops_set(&ops);
	s = open_at(&fx, base, 0, 0);
	expect_path(s, "buffered", "O_DIRECT refused");
	close_store(s);
	eos_fileops_set(NULL);
	/* pread forced. */
	setenv("SELENE_DISK_IO", "pread", 1);
	s = open_at(&fx, base, 64 * fx.slot_bytes, 0);
	expect_path(s, "pread+", "SELENE_DISK_IO=pread");
	close_store(s);
	unsetenv("SELENE_DISK_IO");
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	printf("  I/O path: named at startup with the reason when it is not io_uring+O_DIRECT, "
	       "and exported (flare_host_cache_disk_io)\n");
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	forged_parent_gives_wrong_answer(false);
	forged_parent_gives_wrong_answer(true);
	compaction_truncates_through_symlink();
	read_follows_symlink_and_replaced_file();
	symlinked_namespace_scanned();
	fifo_hangs_records_tool();
	fifo_hangs_startup_without_dtype();
	tmp_directory_fails_gc();
	gc_and_server_disagree();
	sparse_record_evicts_everything();
	unusable_namespace_fails_start();
	direct_io_fallback_silent();
	printf("ok\n");
	return 0;
}
