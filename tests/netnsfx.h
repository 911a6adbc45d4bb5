/*
 * netnsfx.h - network namespaces for multi-host tests: rank zero in one
 * namespace, each peer in its own, joined by one veth pair per peer on a
 * private range, so ranks talk over a real interface and never over
 * loopback (design 2.14; the guide's "ip netns for multi-host tests").
 *
 * Topology for n peers (the test's pid P):
 *     namespace selnx-P-0 (rank zero)        namespace selnx-P-i (peer i)
 *     sxPa<i>  10.77.<i>.1/24   <-- veth -->  sxPb<i>  10.77.<i>.2/24
 * Rank zero is multi-homed (one interface per peer) and a peer reaches
 * only its own interface of rank zero's.
 *
 * Everything is named after the test's pid and torn down by name:
 * nfx_destroy deletes the namespaces (which deletes the veths in them); a
 * reaper process in its own session, started by nfx_create, does the same
 * when the test dies (PR_SET_PDEATHSIG); and every nfx_create first
 * deletes the namespaces of test processes that are gone (nfx_sweep).
 * Needs root and `ip netns` (iproute2): nfx_create returns -1 with the
 * reason in why when either is missing (the test then exits 77).
 */
#ifndef NETNSFX_H
#define NETNSFX_H

#include <stdbool.h>
#include <sys/types.h>

#define NFX_MAX_PEERS 8

struct nfx {
	int peers;
	char ns[NFX_MAX_PEERS + 1][40];    /* [0] rank zero's, [i] peer i's */
	char if0[NFX_MAX_PEERS + 1][16];   /* rank zero's end of peer i's veth */
	char ifp[NFX_MAX_PEERS + 1][16];   /* peer i's end */
	char addr0[NFX_MAX_PEERS + 1][24]; /* 10.77.<i>.1 */
	char addrp[NFX_MAX_PEERS + 1][24]; /* 10.77.<i>.2 */
	pid_t reaper;
};

/* Create the namespaces and veths for peers peers: 0, or -1 with why. */
int nfx_create(struct nfx *x, int peers, char *why, size_t len);
/* In a child process: move into namespace i (0: rank zero's).  0 or -errno. */
int nfx_enter(const struct nfx *x, int i);
/* Delete everything nfx_create made (by name) and stop the reaper. */
void nfx_destroy(struct nfx *x);
/* Delete the namespaces of test processes that no longer run. */
void nfx_sweep(void);
/* Bytes received and sent on interface ifname of the calling process's
 * namespace (/proc/self/net/dev): 0, or -1 if it is not there. */
int nfx_if_bytes(const char *ifname, unsigned long long *rx, unsigned long long *tx);

#endif
