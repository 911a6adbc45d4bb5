/*
 * netnsfx.c - see netnsfx.h.
 */
#include "netnsfx.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define PREFIX "selnx-"

/* Run ip with argv (NULL-terminated), its output discarded but for the
 * first line of stderr into err: the exit status, or -1. */
static int ip(char *err, size_t len, const char *const *argv)
{
	int p[2];
	if (pipe(p) != 0)
		return -1;
	pid_t pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDWR);
		dup2(devnull, 0);
		dup2(devnull, 1);
		dup2(p[1], 2);
		close(p[0]);
		execvp("ip", (char *const *)argv);
		fprintf(stderr, "cannot run ip: %s\n", strerror(errno));
		_exit(127);
	}
	close(p[1]);
	char buf[512];
	ssize_t n = read(p[0], buf, sizeof buf - 1);
	close(p[0]);
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (err && len) {
		buf[n > 0 ? n : 0] = '\0';
		char *nl = strchr(buf, '\n');
		if (nl)
			*nl = '\0';
		snprintf(err, len, "%.200s", buf);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define IP(err, len, ...)                                                                          \
	({                                                                                         \
		const char *const argv_[] = {"ip", __VA_ARGS__, NULL};                             \
		ip(err, len, argv_);                                                               \
	})

static void delete_ns(const char *name) { IP(NULL, 0, "netns", "delete", name); }

void nfx_sweep(void)
{
	FILE *f = popen("ip netns list 2>/dev/null", "r");
	if (!f)
		return;
	char line[256];
	while (fgets(line, sizeof line, f)) {
		char name[128];
		if (sscanf(line, "%127s", name) != 1 || strncmp(name, PREFIX, strlen(PREFIX)))
			continue;
		long pid = strtol(name + strlen(PREFIX), NULL, 10);
		if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
			delete_ns(name);
	}
	pclose(f);
}

static void delete_all(const struct nfx *x)
{
	for (int i = 0; i <= x->peers; i++)
		if (x->ns[i][0])
			delete_ns(x->ns[i]);
}

int nfx_create(struct nfx *x, int peers, char *why, size_t len)
{
	memset(x, 0, sizeof *x);
	x->reaper = -1;
	if (geteuid() != 0) {
		snprintf(why, len, "network namespaces need root");
		return -1;
	}
	if (peers < 1 || peers > NFX_MAX_PEERS) {
		snprintf(why, len, "%d peers", peers);
		return -1;
	}
	nfx_sweep();
	x->peers = peers;
	pid_t me = getpid();
	for (int i = 0; i <= peers; i++) {
		snprintf(x->ns[i], sizeof x->ns[i], PREFIX "%d-%d", (int)me, i);
		if (i) {
			/* Interface names stay under IFNAMSIZ (16). */
			unsigned p7 = (unsigned)me % 10000000u;
			unsigned char k = (unsigned char)i;
			snprintf(x->if0[i], sizeof x->if0[i], "sx%ua%u", p7, k);
			snprintf(x->ifp[i], sizeof x->ifp[i], "sx%ub%u", p7, k);
			snprintf(x->addr0[i], sizeof x->addr0[i], "10.77.%u.1", k);
			snprintf(x->addrp[i], sizeof x->addrp[i], "10.77.%u.2", k);
		}
	}
	/* The reaper: deletes the namespaces by name if this process dies. */
	pid_t parent = getpid();
	x->reaper = fork();
	if (x->reaper < 0) {
		snprintf(why, len, "fork: %s", strerror(errno));
		return -1;
	}
	if (x->reaper == 0) {
		setsid();
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGTERM);
		sigprocmask(SIG_BLOCK, &set, NULL);
		if (getppid() == parent) {
			int sig;
			sigwait(&set, &sig);
		}
		delete_all(x);
		_exit(0);
	}
	char err[256];
	int rc = 0;
	for (int i = 0; i <= peers && !rc; i++)
		if ((rc = IP(err, sizeof err, "netns", "add", x->ns[i])) != 0) {
			snprintf(why, len, "ip netns add %s failed: %s", x->ns[i], err);
			x->ns[i][0] = '\0'; /* not ours */
		}
	for (int i = 1; i <= peers && !rc; i++) {
		char net0[32], netp[32];
		snprintf(net0, sizeof net0, "%s/24", x->addr0[i]);
		snprintf(netp, sizeof netp, "%s/24", x->addrp[i]);
		if ((rc = IP(err, sizeof err, "link", "add", x->if0[i], "netns", x->ns[0], "type",
			     "veth", "peer", "name", x->ifp[i], "netns", x->ns[i])) ||
		    (rc = IP(err, sizeof err, "-n", x->ns[0], "addr", "add", net0, "dev",
			     x->if0[i])) ||
		    (rc = IP(err, sizeof err, "-n", x->ns[i], "addr", "add", netp, "dev",
			     x->ifp[i])) ||
		    (rc = IP(err, sizeof err, "-n", x->ns[0], "link", "set", x->if0[i], "up")) ||
		    (rc = IP(err, sizeof err, "-n", x->ns[i], "link", "set", x->ifp[i], "up")) ||
		    (rc = IP(err, sizeof err, "-n", x->ns[i], "link", "set", "lo", "up")))
			snprintf(why, len, "setting up peer %d's veth failed: %s", i, err);
	}
	if (!rc && (rc = IP(err, sizeof err, "-n", x->ns[0], "link", "set", "lo", "up")))
		snprintf(why, len, "lo in %s: %s", x->ns[0], err);
	if (rc) {
		nfx_destroy(x);
		return -1;
	}
	return 0;
}

int nfx_enter(const struct nfx *x, int i)
{
	char path[128];
	snprintf(path, sizeof path, "/run/netns/%s", x->ns[i]);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = setns(fd, CLONE_NEWNET) == 0 ? 0 : -errno;
	close(fd);
	return rc;
}

void nfx_destroy(struct nfx *x)
{
	delete_all(x);
	if (x->reaper > 0) {
		kill(x->reaper, SIGKILL);
		while (waitpid(x->reaper, NULL, 0) < 0 && errno == EINTR)
			;
	}
	x->reaper = -1;
	memset(x->ns, 0, sizeof x->ns);
}

int nfx_if_bytes(const char *ifname, unsigned long long *rx, unsigned long long *tx)
{
	FILE *f = fopen("/proc/self/net/dev", "r");
	if (!f)
		return -1;
	char line[512];
	int rc = -1;
	while (fgets(line, sizeof line, f)) {
		char *c = strchr(line, ':');
		if (!c)
			continue;
		*c = '\0';
		char *name = line;
		while (*name == ' ')
			name++;
		if (strcmp(name, ifname))
			continue;
		unsigned long long v[9];
		if (sscanf(c + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
			   &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) == 9) {
			*rx = v[0];
			*tx = v[8];
			rc = 0;
		}
	}
	fclose(f);
	return rc;
}
