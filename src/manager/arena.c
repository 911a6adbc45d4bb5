/*
 * arena.c - the pool manager's arena: the shared memory instances map, its
 * header and the allocator of windows (design 2.15 "the manager's regions
 * are its memory"; docs/pool.md "Arena").
 *
 * DESIGN
 *
 * The arena is a memfd (default) or a named file (--arena, normally under
 * /dev/shm), allocated whole at startup (fallocate: memory is committed up
 * front, so no client later faults on a missing page), and handed to each
 * client with SCM_RIGHTS.  A memfd is sealed against shrinking and growing:
 * a client cannot truncate it under the others.  The manager itself never
 * maps it; it writes only its header, with pwrite.
 *
 * The first MGR_ARENA_HEADER bytes are the header: magic, version, the
 * region generation, the sizes, and the table of live sessions (instance
 * id, pid, pid start time), with an XXH3 checksum.  A named file whose
 * header checks out and matches --memory keeps its generation when the
 * manager restarts, so attached instances keep their mapping (and their
 * registrations); the sessions of the previous run are then loaded so that
 * the new manager waits for them to reconnect or exit before it hands out
 * windows they may still be writing (design 2.15 "The manager holds reused
 * regions until previous clients reconnect or exit").  Anything else gets a
 * fresh random generation.
 *
 * Windows are runs of slots of the asking scope's slot_bytes, each starting
 * on a multiple of slot_bytes from the start of the mapping, so a client can
 * name any slot by number (offset / slot_bytes) exactly as it names slab
 * slots.  A bitmap holds one bit per 4 KiB granule; allocation is next-fit
 * over aligned slot positions from a cursor, all or nothing.
 *
 * INVARIANTS
 *   1. used == the number of set bits; no bit below data_start is ever set.
 *   2. Every granted window lies in [data_start, bytes) on a multiple of its
 *      slot_bytes, and its granules are set.
 */
#include "manager/manager.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>
#include "xxh.h"

#include "internal.h"

#define MAGIC "FLAREPOOLARENA1\0"
#define HDR_VERSION 1u
#define OFF_MAGIC 0
#define OFF_VERSION 16
#define OFF_GENERATION 24
#define OFF_BYTES 32
#define OFF_DATA 40
#define OFF_NSESS 48
#define OFF_CKSUM 56
#define OFF_SESS 64
#define SESS_BYTES 32u
#define HDR_USED (OFF_SESS + MGR_PREV_MAX * SESS_BYTES)

_Static_assert(HDR_USED <= MGR_ARENA_HEADER, "session table fits the header");

uint64_t mgr_pid_start(int32_t pid)
{
	if (pid <= 0)
		return 0;
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* comm may hold spaces and parentheses: fields follow the last ')'. */
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	p++;
	char state = 0;
	unsigned long long start = 0;
	/* state is field 3; starttime field 22. */
	if (sscanf(p, " %c", &state) != 1 || state == 'Z' || state == 'X')
		return 0;
	for (int f = 3; f < 22 && p; f++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p, " %llu", &start) != 1)
		return 0;
	return start ? (uint64_t)start : 1;
}

/* XXH3 of the header with its checksum field read as zero. */
static uint64_t header_cksum(uint8_t *h)
{
	uint8_t saved[8];
	memcpy(saved, h + OFF_CKSUM, 8);
	memset(h + OFF_CKSUM, 0, 8);
	uint64_t v = XXH3_64bits(h, HDR_USED);
	memcpy(h + OFF_CKSUM, saved, 8);
	return v;
}

static int write_header(struct mgr_arena *a, const struct mgr_prev *s, uint32_t n)
{
	uint8_t *h = calloc(1, HDR_USED);
	if (!h)
		return -ENOMEM;
	memcpy(h + OFF_MAGIC, MAGIC, 16);
	sel_put_u32(h + OFF_VERSION, HDR_VERSION);
	sel_put_u64(h + OFF_GENERATION, a->generation);
	sel_put_u64(h + OFF_BYTES, a->bytes);
	sel_put_u64(h + OFF_DATA, a->data_start);
	if (n > MGR_PREV_MAX)
		n = MGR_PREV_MAX;
	sel_put_u32(h + OFF_NSESS, n);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *e = h + OFF_SESS + (size_t)i * SESS_BYTES;
		memcpy(e, s[i].instance, SEL_POOL_ID_BYTES);
		sel_put_u32(e + 16, (uint32_t)s[i].pid);
		sel_put_u64(e + 24, s[i].start);
	}
	sel_put_u64(h + OFF_CKSUM, header_cksum(h));
	ssize_t w = pwrite(a->fd, h, HDR_USED, 0);
	free(h);
	return w == (ssize_t)HDR_USED ? 0 : -EIO;
}

/* A named file's header: 1 when it is ours, of this size, and intact
 * (generation and sessions loaded). */
static int read_header(struct mgr_arena *a)
{
	uint8_t *h = malloc(HDR_USED);
	if (!h)
		return -ENOMEM;
	int ok = 0;
	if (pread(a->fd, h, HDR_USED, 0) == (ssize_t)HDR_USED && !memcmp(h, MAGIC, 16) &&
	    sel_get_u32(h + OFF_VERSION) == HDR_VERSION && sel_get_u64(h + OFF_BYTES) == a->bytes &&
	    sel_get_u64(h + OFF_DATA) == a->data_start && sel_get_u64(h + OFF_GENERATION) &&
	    sel_get_u32(h + OFF_NSESS) <= MGR_PREV_MAX &&
	    sel_get_u64(h + OFF_CKSUM) == header_cksum(h)) {
		a->generation = sel_get_u64(h + OFF_GENERATION);
		uint32_t n = sel_get_u32(h + OFF_NSESS);
		a->prev = calloc(n ? n : 1, sizeof *a->prev);
		if (a->prev) {
			for (uint32_t i = 0; i < n; i++) {
				const uint8_t *e = h + OFF_SESS + (size_t)i * SESS_BYTES;
				memcpy(a->prev[i].instance, e, SEL_POOL_ID_BYTES);
				a->prev[i].pid = (int32_t)sel_get_u32(e + 16);
				a->prev[i].start = sel_get_u64(e + 24);
			}
			a->n_prev = n;
			ok = 1;
		}
	}
	free(h);
	return ok;
}

int mgr_arena_open(struct mgr_arena *a, const struct mgr_options *o, char *err, size_t errlen)
{
	memset(a, 0, sizeof *a);
	a->fd = a->share_fd = -1;
	a->data_start = (uint64_t)MGR_ARENA_HEADER;
	a->bytes = o->memory / MGR_GRANULE * MGR_GRANULE;
	if (a->bytes < a->data_start + MGR_GRANULE) {
		snprintf(err, errlen,
			 "--memory %" PRIu64 ": the arena needs more than its %u-byte header",
			 o->memory, MGR_ARENA_HEADER);
		return -EINVAL;
	}
	int rc = 0;
	if (o->arena[0]) {
		a->file = true;
		snprintf(a->path, sizeof a->path, "%s", o->arena);
		a->fd = open(o->arena, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
			     o->group_set ? 0660 : 0600);
		if (a->fd < 0) {
			rc = -errno;
			snprintf(err, errlen, "--arena '%s': %s", o->arena, strerror(errno));
			return rc;
		}
		struct stat st;
		if (fstat(a->fd, &st) || !S_ISREG(st.st_mode)) {
			snprintf(err, errlen, "--arena '%s': not a regular file", o->arena);
			rc = -EINVAL;
			goto fail;
		}
		if (flock(a->fd, LOCK_EX | LOCK_NB)) {
			rc = -errno;
			snprintf(err, errlen, "--arena '%s': another manager holds it (%s)",
				 o->arena, strerror(errno));
			goto fail;
		}
		if (o->group_set)
			(void)!fchown(a->fd, (uid_t)-1, o->gid);
		if ((uint64_t)st.st_size == a->bytes) {
			int r = read_header(a);
			if (r < 0) {
				rc = r;
				snprintf(err, errlen, "--arena '%s': out of memory", o->arena);
				goto fail;
			}
			a->reused = r == 1;
		}
		if (!a->reused && ftruncate(a->fd, (off_t)a->bytes)) {
			rc = -errno;
			snprintf(err, errlen,
				 "--arena '%s': cannot size it to %" PRIu64 " bytes: %s", o->arena,
				 a->bytes, strerror(errno));
			goto fail;
		}
	} else {
		char name[96];
		snprintf(name, sizeof name, "flare-pool-%s", o->name);
		a->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (a->fd < 0) {
			rc = -errno;
			snprintf(err, errlen, "memfd_create: %s", strerror(errno));
			return rc;
		}
		if (ftruncate(a->fd, (off_t)a->bytes)) {
			rc = -errno;
			snprintf(err, errlen, "cannot size the arena to %" PRIu64 " bytes: %s",
				 a->bytes, strerror(errno));
			goto fail;
		}
	}
	/* Commit the memory now: a later shortage would be a client's SIGBUS. */
	if (fallocate(a->fd, 0, 0, (off_t)a->bytes) && errno != EOPNOTSUPP) {
		rc = -errno;
		char sz[32];
		snprintf(err, errlen, "cannot reserve the arena's %s%s%s: %s",
			 eos_format_size(a->bytes, sz, sizeof sz), a->file ? " in " : "",
			 a->file ? a->path : "", strerror(errno));
		goto fail;
	}
	if (!a->file && fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		rc = -errno;
		snprintf(err, errlen, "cannot seal the arena: %s", strerror(errno));
		goto fail;
	}
	if (a->file) {
		/* A separate open file description: one passed to clients would
		 * share fd's lock, and a client alive after the manager died
		 * would keep it. */
		struct stat s1, s2;
		a->share_fd = open(a->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
		if (a->share_fd < 0 || fstat(a->fd, &s1) || fstat(a->share_fd, &s2) ||
		    s1.st_ino != s2.st_ino || s1.st_dev != s2.st_dev) {
			rc = -EIO;
			snprintf(err, errlen, "--arena '%s': it changed while opening it", a->path);
			goto fail;
		}
	} else {
		a->share_fd = a->fd;
	}
	while (!a->reused && !a->generation)
		randombytes_buf(&a->generation, sizeof a->generation);
	a->granules = (a->bytes - a->data_start) / MGR_GRANULE;
	a->bits = calloc((size_t)(a->bytes / MGR_GRANULE + 63) / 64, sizeof *a->bits);
	if (!a->bits) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory for the arena's bitmap");
		goto fail;
	}
	a->cursor = a->data_start / MGR_GRANULE;
	/* Keep the previous run's sessions in the header until they are done. */
	if ((rc = write_header(a, a->prev, a->n_prev))) {
		snprintf(err, errlen, "cannot write the arena header: %s", strerror(-rc));
		goto fail;
	}
	return 0;
fail:
	mgr_arena_close(a);
	return rc;
}

void mgr_arena_close(struct mgr_arena *a)
{
	if (a->share_fd >= 0 && a->share_fd != a->fd)
		close(a->share_fd);
	if (a->fd >= 0)
		close(a->fd);
	a->fd = a->share_fd = -1;
	free(a->bits);
	a->bits = NULL;
	free(a->prev);
	a->prev = NULL;
	a->n_prev = 0;
}

void mgr_arena_write_sessions(struct mgr_arena *a, const struct mgr_prev *s, uint32_t n)
{
	if (a->fd >= 0)
		(void)write_header(a, s, n);
}

/* ---- the bitmap ------------------------------------------------------------------------ */

static bool range_free(const struct mgr_arena *a, uint64_t g, uint64_t n)
{
	while (n) {
		uint64_t w = g / 64, b = g % 64, k = 64 - b < n ? 64 - b : n;
		uint64_t mask = k == 64 ? ~0ull : ((1ull << k) - 1) << b;
		if (a->bits[w] & mask)
			return false;
		g += k;
		n -= k;
	}
	return true;
}

static void range_set(struct mgr_arena *a, uint64_t g, uint64_t n, bool on)
{
	while (n) {
		uint64_t w = g / 64, b = g % 64, k = 64 - b < n ? 64 - b : n;
		uint64_t mask = k == 64 ? ~0ull : ((1ull << k) - 1) << b;
		if (on)
			a->bits[w] |= mask;
		else
			a->bits[w] &= ~mask;
		g += k;
		n -= k;
	}
}

int mgr_arena_alloc(struct mgr_arena *a, uint64_t slot_bytes, uint32_t slots, uint32_t max_slots,
		    uint8_t kind, struct sel_pool_window *w, uint32_t *n, uint32_t cap)
{
	if (!slots)
		return 0;
	if (!slot_bytes || slot_bytes % MGR_GRANULE || !max_slots)
		return -EINVAL;
	uint64_t sg = slot_bytes / MGR_GRANULE;
	uint64_t first = (a->data_start + slot_bytes - 1) / slot_bytes; /* first slot position */
	uint64_t end = a->bytes / slot_bytes;                           /* one past the last */
	if (first >= end || (uint64_t)slots * sg > a->granules - a->used)
		return -ENOSPC;
	uint64_t positions = end - first;
	uint64_t start = a->cursor * MGR_GRANULE / slot_bytes;
	if (start < first || start >= end)
		start = first;
	uint32_t n0 = *n, left = slots;
	uint64_t last_end = 0;
	for (uint64_t i = 0; i < positions && left; i++) {
		uint64_t s = first + (start - first + i) % positions;
		if (!range_free(a, s * sg, sg))
			continue;
		/* Extend the run while slots are free, contiguous and wanted. */
		uint32_t run = 1;
		while (run < left && run < max_slots && s + run < end &&
		       range_free(a, (s + run) * sg, sg))
			run++;
		if (*n >= cap)
			break;
		w[(*n)++] = (struct sel_pool_window){s * slot_bytes, run, kind};
		range_set(a, s * sg, (uint64_t)run * sg, true);
		a->used += (uint64_t)run * sg;
		left -= run;
		last_end = (s + run) * slot_bytes;
		i += run - 1;
	}
	if (left) {
		mgr_arena_free(a, w + n0, *n - n0, slot_bytes);
		*n = n0;
		return -ENOSPC;
	}
	a->cursor = last_end / MGR_GRANULE;
	return 0;
}

void mgr_arena_free(struct mgr_arena *a, const struct sel_pool_window *w, uint32_t n,
		    uint64_t slot_bytes)
{
	uint64_t sg = slot_bytes / MGR_GRANULE;
	for (uint32_t i = 0; i < n; i++) {
		range_set(a, w[i].off / MGR_GRANULE, (uint64_t)w[i].slots * sg, false);
		a->used -= (uint64_t)w[i].slots * sg;
	}
}

int mgr_arena_check(const struct mgr_arena *a)
{
	uint64_t set = 0, words = (a->bytes / MGR_GRANULE + 63) / 64;
	for (uint64_t i = 0; i < words; i++)
		set += (uint64_t)__builtin_popcountll(a->bits[i]);
	if (set != a->used)
		return eos_fail(SEL_ECORRUPT,
				"arena: %" PRIu64 " granules marked, %" PRIu64 " counted", set,
				a->used);
	if (!range_free(a, 0, a->data_start / MGR_GRANULE))
		return eos_fail(SEL_ECORRUPT, "arena: a header granule is marked in use");
	return 0;
}
