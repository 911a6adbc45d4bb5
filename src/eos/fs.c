/*
 * fs.c - filesystem capacity and physical memory, for sizing the tiers
 * (design 2.11: the disk limit defaults to one tenth of the free space on
 * the directory's filesystem; the memory tier is checked against host
 * memory).
 *
 * DESIGN
 *   Free space is what an unprivileged writer may use (f_bavail), not
 *   f_bfree, which counts the blocks reserved for root.  Memory comes from
 *   /proc/meminfo's MemTotal and MemAvailable, the kernel's own estimate of
 *   what can be allocated without swapping; kernels before 3.14 lack
 *   MemAvailable and get MemFree, an underestimate.  Neither accounts for a
 *   cgroup memory limit: a container sees the host's memory here.
 *   Stateless.
 */
#include "eos.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

int eos_fs_space(const char *path, uint64_t *avail, uint64_t *total)
{
	if (!path || !*path)
		return eos_fail(-EINVAL, "filesystem space: empty path");
	struct statvfs sv;
	if (statvfs(path, &sv) != 0)
		return eos_fail(-errno, "filesystem space of '%s': %s", path, strerror(errno));
	uint64_t frsize = sv.f_frsize ? sv.f_frsize : sv.f_bsize;
	if (avail)
		*avail = (uint64_t)sv.f_bavail * frsize;
	if (total)
		*total = (uint64_t)sv.f_blocks * frsize;
	return 0;
}

/* The value in kB of a "Name:   1234 kB" line, converted to bytes. */
static int meminfo_field(const char *line, const char *name, uint64_t *bytes)
{
	size_t n = strlen(name);
	if (strncmp(line, name, n) != 0 || line[n] != ':')
		return 0;
	uint64_t kb;
	char unit[8];
	if (sscanf(line + n + 1, "%" SCNu64 " %7s", &kb, unit) != 2 || strcmp(unit, "kB") != 0 ||
	    kb > UINT64_MAX / 1024)
		return eos_fail(-EPROTO, "/proc/meminfo: cannot read %s from '%.60s'", name, line);
	*bytes = kb * 1024;
	return 1;
}

int eos_mem_info(uint64_t *total, uint64_t *avail)
{
	struct {
		const char *name;
		uint64_t bytes;
		bool seen;
	} f[] = {{"MemTotal", 0, false}, {"MemAvailable", 0, false}, {"MemFree", 0, false}};
	FILE *in = fopen("/proc/meminfo", "re");
	if (!in)
		return eos_fail(-errno, "memory size: cannot open /proc/meminfo: %s",
				strerror(errno));
	char line[256];
	int rc = 0;
	while (rc == 0 && fgets(line, sizeof line, in)) {
		for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
			int r = meminfo_field(line, f[i].name, &f[i].bytes);
			if (r < 0)
				rc = r;
			if (r > 0)
				f[i].seen = true;
			if (r != 0)
				break;
		}
	}
	fclose(in);
	if (rc < 0)
		return rc;
	if (!f[0].seen || !(f[1].seen || f[2].seen))
		return eos_fail(-EPROTO,
				"/proc/meminfo: no MemTotal or no MemAvailable/MemFree line");
	if (total)
		*total = f[0].bytes;
	if (avail)
		*avail = f[1].seen ? f[1].bytes : f[2].bytes;
	return 0;
}
